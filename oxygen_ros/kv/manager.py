"""
KV cache manager: shared prefix segments with reference counts, and per-request tables.

A *segment* is a run of prefix tokens whose K/V is computed once and read by every request
that holds it: the image tokens of a frame, a prompt on top of them, or a whole prefix. A
request (the *owner*) holds a chain of segments, root first, plus private blocks for the
tokens it generates. A segment lives while any owner holds it and is freed, with its blocks,
when the last one lets go (``docs/design.md#kv-cache-oxygen_roskv``).

Which requests may share which segment is decided by the scheduler through segment keys
(``oxygen_ros.sched``): a text request on the action prefix holds the frame's root (the
action's own chain) plus a private causal suffix segment; otherwise, with a bidirectional
prefix only identical prompts of one frame share the whole prefix, and with a causal prompt
every job of a frame shares the image segment.

Allocation is all-or-nothing: a request gets all of its blocks or none (``allocate`` returns
None), so no request is ever preempted half-way.

::

    request A (action):  [ IMAGE(frame 7) ][ TEXT(7, "Task: ..., State: ...") ]
    request B (subtask): [ IMAGE(frame 7) ][ TEXT(7, "Task: ... Subtask: ") ][ B's own blocks ]
                           ^ one segment, ref_cnt 2
    request C (memory):  [ IMAGE(frame 7) ][ TEXT(7, "Task: ..., State: ...") ]
                           [ SUFFIX(C, "Memory: ") ][ C's own blocks ]
                           ^ A's whole chain (the root), ref_cnt 3 and 2
"""

from __future__ import annotations

from dataclasses import dataclass, field
import itertools
from typing import Hashable, Sequence

from oxygen_ros.kv.block_pool import BlockPool


@dataclass(eq=False, slots=True)
class Segment:
    """
    Prefix tokens whose K/V lives in ``block_ids`` (the last block may be partly used).

    :ivar parent: the segment this one continues (its tokens attend to the parent's), or None.
    :ivar ref_cnt: number of owners holding the segment.
    """

    seg_id: int
    key: Hashable
    block_ids: tuple[int, ...]
    num_tokens: int
    parent: Segment | None
    ref_cnt: int = 0

    def chain(self) -> tuple[Segment, ...]:
        """Return this segment and its ancestors, root first."""
        out: list[Segment] = []
        seg: Segment | None = self
        while seg is not None:
            out.append(seg)
            seg = seg.parent
        return tuple(reversed(out))


@dataclass(frozen=True, slots=True)
class SegmentSpec:
    """A segment a request needs: looked up by ``key``, allocated if absent."""

    key: Hashable
    num_tokens: int


@dataclass(frozen=True, slots=True)
class Allocation:
    """
    What one request holds.

    :ivar segments: its prefix chain, root first.
    :ivar new_segments: the segments this allocation created (their K/V must be computed).
    :ivar block_ids: private blocks for generated tokens.
    """

    owner: str
    segments: tuple[Segment, ...]
    new_segments: tuple[Segment, ...]
    block_ids: tuple[int, ...]

    @property
    def num_prefix_tokens(self) -> int:
        return sum(seg.num_tokens for seg in self.segments)


@dataclass(slots=True)
class _OwnerTable:
    segments: tuple[Segment, ...]
    block_ids: tuple[int, ...]


@dataclass(slots=True)
class KVCacheManager:
    """
    Block tables of requests over one ``BlockPool``.

    :param num_blocks: blocks in the pool, the null block included.
    :param block_size: token slots per block.
    :raises ValueError: sizes out of range.
    """

    num_blocks: int
    block_size: int
    pool: BlockPool = field(init=False)
    _segments: dict[Hashable, Segment] = field(init=False, default_factory=dict)
    _owners: dict[str, _OwnerTable] = field(init=False, default_factory=dict)
    _seg_ids: itertools.count = field(init=False, default_factory=itertools.count)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f'block_size must be >= 1, got {self.block_size}')
        self.pool = BlockPool(self.num_blocks)

    # -- queries -------------------------------------------------------------------------
    def blocks_for(self, num_tokens: int) -> int:
        """Return blocks needed for ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used_blocks

    @property
    def capacity_blocks(self) -> int:
        """Return blocks that can ever be handed out (the null block excluded)."""
        return self.num_blocks - 1

    @property
    def usage(self) -> float:
        """Return the fraction of blocks in use, in [0, 1]."""
        return self.pool.num_used_blocks / self.capacity_blocks

    @property
    def num_owners(self) -> int:
        return len(self._owners)

    @property
    def num_segments(self) -> int:
        return len(self._segments)

    def lookup(self, key: Hashable) -> Segment | None:
        return self._segments.get(key)

    def blocks_needed(self, chain: Sequence[SegmentSpec], num_private_tokens: int) -> int:
        """Return blocks ``allocate`` would take now for this chain (hits cost nothing)."""
        new = sum(self.blocks_for(spec.num_tokens) for spec in chain
                  if spec.key not in self._segments)
        return new + self.blocks_for(num_private_tokens)

    # -- updates -------------------------------------------------------------------------
    def allocate(self, owner: str, chain: Sequence[SegmentSpec], num_private_tokens: int = 0,
                 *, keep_free: int = 0) -> Allocation | None:
        """
        Give ``owner`` the segments of ``chain`` (shared where they exist) and private blocks.

        :param chain: the prefix segments, root first; an existing segment must have the
            same token count and the previous chain element as its parent.
        :param num_private_tokens: slots for the tokens the owner will generate.
        :param keep_free: blocks that must remain free afterwards (the action reserve).
        :returns: the allocation, or None if it does not fit (nothing is changed then).
        :raises ValueError: owner already holds blocks, or the chain contradicts a segment.
        """
        if owner in self._owners:
            raise ValueError(f'owner {owner!r} already holds KV blocks')
        if num_private_tokens < 0:
            raise ValueError(f'num_private_tokens must be >= 0, got {num_private_tokens}')
        parent: Segment | None = None
        for spec in chain:
            seg = self._segments.get(spec.key)
            if seg is not None and (seg.num_tokens != spec.num_tokens or seg.parent is not parent):
                raise ValueError(
                    f'segment {spec.key!r} exists with {seg.num_tokens} tokens after '
                    f'{seg.parent.key if seg.parent else None!r}; asked for {spec.num_tokens} '
                    f'tokens after {parent.key if parent else None!r}')
            parent = seg if seg is not None else _PENDING
        if self.num_free_blocks - self.blocks_needed(chain, num_private_tokens) < keep_free:
            return None

        segments: list[Segment] = []
        new_segments: list[Segment] = []
        parent = None
        for spec in chain:
            seg = self._segments.get(spec.key)
            if seg is None:
                block_ids = self.pool.allocate(self.blocks_for(spec.num_tokens))
                assert block_ids is not None
                seg = Segment(next(self._seg_ids), spec.key, tuple(block_ids), spec.num_tokens,
                              parent)
                self._segments[spec.key] = seg
                new_segments.append(seg)
            seg.ref_cnt += 1
            segments.append(seg)
            parent = seg
        private = self.pool.allocate(self.blocks_for(num_private_tokens))
        assert private is not None
        self._owners[owner] = _OwnerTable(tuple(segments), tuple(private))
        return Allocation(owner, tuple(segments), tuple(new_segments), tuple(private))

    def free(self, owner: str) -> tuple[Segment, ...]:
        """
        Release everything ``owner`` holds.

        :returns: the segments freed because ``owner`` was their last holder, leaf first.
        :raises KeyError: unknown owner.
        """
        table = self._owners.pop(owner)
        self.pool.free(table.block_ids)
        freed: list[Segment] = []
        for seg in reversed(table.segments):
            seg.ref_cnt -= 1
            assert seg.ref_cnt >= 0
            if seg.ref_cnt == 0:
                del self._segments[seg.key]
                self.pool.free(seg.block_ids)
                freed.append(seg)
        return tuple(freed)

    def check_consistency(self) -> None:
        """Assert that reference counts, tables and the pool agree (for tests)."""
        self.pool.check_consistency()
        holders: dict[int, int] = {}
        used: set[int] = set()
        for table in self._owners.values():
            for seg in table.segments:
                holders[seg.seg_id] = holders.get(seg.seg_id, 0) + 1
            assert not used & set(table.block_ids), 'private block shared'
            used |= set(table.block_ids)
        for seg in self._segments.values():
            assert holders.get(seg.seg_id, 0) == seg.ref_cnt > 0, seg
            assert not used & set(seg.block_ids), 'segment block shared'
            used |= set(seg.block_ids)
        assert len(used) == self.pool.num_used_blocks, (len(used), self.pool.num_used_blocks)


_PENDING = Segment(-1, None, (), 0, None)
"""Stands for a chain element that ``allocate`` is about to create (parent of the next)."""
