"""
A fixed set of KV blocks, each free or held by one owner (stdlib only; no tensors).

A block is ``block_size`` consecutive token slots of the KV tensors that the engine allocates
once (``oxygen_ros.model.kv_cache.KVCache``); slot = block_id * block_size + offset. As in
vLLM v1 (``v1/core/block_pool.py``) block ids are plain ints and this layer never touches a
tensor.

Block 0 is the *null block*: never handed out, it is where the backend writes the K/V of
padded decode rows so that a batch keeps one shape without touching anybody's data. Sharing is
counted per prefix segment, not per block (``manager.py``): a block belongs to the one segment
or block table that allocated it until that one frees it.
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

NULL_BLOCK_ID = 0


class BlockPool:
    """
    Free list of ``num_blocks`` blocks (block 0 reserved).

    Freed blocks go to the tail of the free list, so recently freed blocks are reused last
    and consecutive allocations from a fresh pool are contiguous.

    :raises ValueError: ``num_blocks`` < 2.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f'a block pool needs at least 2 blocks (one is the null block), '
                             f'got {num_blocks}')
        self.num_blocks = num_blocks
        self._held = [False] * num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))
        self._peak_used = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Return blocks handed out (the null block is not counted)."""
        return self.num_blocks - 1 - len(self._free)

    @property
    def peak_used_blocks(self) -> int:
        return self._peak_used

    def reset_peak(self) -> None:
        """Restart peak tracking from the current use."""
        self._peak_used = self.num_used_blocks

    def allocate(self, num_blocks: int) -> list[int] | None:
        """
        Take ``num_blocks`` free blocks.

        :returns: the block ids, or None (nothing taken) if fewer are free.
        :raises ValueError: negative count.
        """
        if num_blocks < 0:
            raise ValueError(f'cannot allocate {num_blocks} blocks')
        if num_blocks > len(self._free):
            return None
        ids = [self._free.popleft() for _ in range(num_blocks)]
        for block_id in ids:
            assert not self._held[block_id], block_id
            self._held[block_id] = True
        self._peak_used = max(self._peak_used, self.num_used_blocks)
        return ids

    def free(self, block_ids: Iterable[int]) -> int:
        """
        Return held blocks to the tail of the free list.

        :returns: the number of blocks freed.
        """
        freed = 0
        for block_id in block_ids:
            assert block_id != NULL_BLOCK_ID and self._held[block_id], \
                f'free of a free block {block_id}'
            self._held[block_id] = False
            self._free.append(block_id)
            freed += 1
        return freed

    def check_consistency(self) -> None:
        """Assert that the free list and the held blocks agree (for tests)."""
        free = set(self._free)
        assert len(free) == len(self._free), 'block freed twice'
        assert NULL_BLOCK_ID not in free
        for block_id in range(1, self.num_blocks):
            assert self._held[block_id] != (block_id in free), block_id
