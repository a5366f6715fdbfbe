"""
Host and device without waiting: pinned non-blocking copies, slot indices, job timing by events.

What lets a control cycle on CUDA run its jobs back to back with the host waiting only twice
(``torch_backend.py``): index tensors go up through pinned memory without blocking, job
times are CUDA events read after the cycle instead of a sync per job, and the action chunks
and the sampled token ids come back through pinned memory behind an event each.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np
import torch


def to_device(values: torch.Tensor | list | tuple, device: torch.device | str,
              dtype: torch.dtype | None = None) -> torch.Tensor:
    """
    Return ``values`` on ``device``; from the CPU to CUDA through pinned memory, not blocking.

    A plain ``.to('cuda')`` of pageable memory waits for the stream; a pinned source copies
    asynchronously (PyTorch's pinned allocator keeps it until the copy is done).

    :param values: a tensor, or a (nested) list of numbers.
    :param dtype: for lists (default: inferred); tensors keep theirs.
    """
    t = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    device = torch.device(device)
    if device.type != 'cuda' or t.device.type != 'cpu':
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def block_slots(block_ids: tuple[int, ...], num_tokens: int, block_size: int,
                device: torch.device | str = 'cpu') -> torch.Tensor:
    """
    Return the slot of each of ``num_tokens`` tokens stored in ``block_ids``.

    :returns: ``int64 [num_tokens]``.
    """
    blocks = torch.tensor(block_ids, dtype=torch.int64)
    offsets = torch.arange(block_size, dtype=torch.int64)
    return to_device((blocks[:, None] * block_size + offsets).flatten()[:num_tokens], device)


class CameraUpload:
    """
    Camera images to the device through persistent pinned buffers.

    One pinned host buffer and one device buffer per camera, kept while the camera's image
    size stays the same: a frame costs one host copy into pinned memory and one asynchronous
    upload per camera, no allocation of either (the engine's frame inputs,
    ``engine/frame_inputs.py``). Before a host buffer is written again, the upload that read
    it last is waited for (its event), so a slow upload is never overwritten. On the CPU the
    arrays are used as they are.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers: dict[int, tuple[torch.Tensor, torch.Tensor, object]] = {}

    def upload(self, i: int, array: np.ndarray) -> torch.Tensor:
        """
        Return camera ``i``'s image on the device (its device buffer; on the CPU the array).

        :param array: any dtype and shape; the camera's buffers follow a change of either.
        """
        src = torch.from_numpy(array)
        if self.device.type != 'cuda':
            return src
        held = self._buffers.get(i)
        if held is None or held[0].shape != src.shape or held[0].dtype != src.dtype:
            held = (torch.empty(src.shape, dtype=src.dtype, pin_memory=True),
                    torch.empty(src.shape, dtype=src.dtype, device=self.device), None)
        host, dev, event = held
        if event is not None:
            event.synchronize()  # type: ignore[attr-defined]
        host.copy_(src)
        dev.copy_(host, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._buffers[i] = (host, dev, event)
        return dev


class JobClock:
    """Job timing: CUDA events read after the cycle (no sync per job), or a host timer."""

    def __init__(self, device: torch.device, sync: Callable[[], None] | None) -> None:
        self.events = device.type == 'cuda' and sync is None
        self.sync = sync or (lambda: None)

    def mark(self) -> object:
        if self.events:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        self.sync()
        return time.perf_counter()

    def seconds(self, start: object, end: object) -> float:
        """Return the time between two marks (CUDA: after ``end`` has completed)."""
        if self.events:
            end.synchronize()  # type: ignore[attr-defined]
            return start.elapsed_time(end) / 1e3  # type: ignore[attr-defined]
        return end - start  # type: ignore[operator]


class ChunkDelivery:
    """
    A cycle's action chunks to the host, handed back as soon as each call's are there.

    :param defer: hand a call's chunks back after the next call is queued (CUDA with graph
        replays: the device keeps working while the host publishes); else at once.
    :ivar chunks: the chunks handed back so far, by frame id.
    """

    def __init__(self, *, defer: bool) -> None:
        self.chunks: dict[int, torch.Tensor] = {}
        self._defer = defer
        self._pending: tuple[Sequence[int], torch.Tensor, object] | None = None

    def after_call(self, actions: torch.Tensor | None,
                   frame_ids: Sequence[int]) -> list[tuple[int, torch.Tensor]]:
        """
        Start copying this call's chunks; return those ready now (``(frame_id, chunk)``).

        Ready are the previous call's where deferred, else this call's (the host waits for
        their copy).

        :param actions: ``[B, H, A]`` chunks this call made (None: it made none).
        :param frame_ids: their frames, row by row.
        :returns: each ready frame's id and its chunk ``[1, H, A]`` on the host.
        """
        ready = self._deliver() if self._pending is not None else []
        if actions is None:
            return ready
        if actions.device.type != 'cuda':
            self._pending = (frame_ids, actions, None)
        else:
            host = torch.empty(actions.shape, dtype=actions.dtype, pin_memory=True)
            host.copy_(actions, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._pending = (frame_ids, host, event)
        return ready if self._defer else ready + self._deliver()

    def finish(self) -> list[tuple[int, torch.Tensor]]:
        """Return what is still pending (the end of the cycle), as :meth:`after_call`."""
        return self._deliver() if self._pending is not None else []

    def _deliver(self) -> list[tuple[int, torch.Tensor]]:
        assert self._pending is not None
        frame_ids, host, event = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()  # type: ignore[attr-defined]
        ready = [(frame_id, host[row:row + 1]) for row, frame_id in enumerate(frame_ids)]
        self.chunks.update(ready)
        return ready


class TokenCopy:
    """The sampled token ids of a cycle to the host at once (the cycle's one wait for text)."""

    def __init__(self) -> None:
        self._host = torch.empty(0, dtype=torch.int64)
        """Pinned host buffer the ids come back through (CUDA), grown as needed."""

    def to_host(self, sampled: dict[str, list[torch.Tensor]]) -> dict[str, tuple[int, ...]]:
        """
        Return every request's ids, copied to the host in one go.

        On CUDA through the persistent pinned buffer behind an event: one asynchronous copy,
        then the host waits for that event only (not for the whole device).

        :param sampled: per request, its id tensors of the cycle in order.
        """
        parts = [p for ps in sampled.values() for p in ps]
        if not parts:
            return {}
        ids = torch.cat([p.reshape(-1) for p in parts])
        if ids.device.type == 'cuda':
            if self._host.numel() < ids.numel():
                self._host = torch.empty(max(ids.numel(), 2 * self._host.numel()),
                                         dtype=torch.int64, pin_memory=True)
            host = self._host[:ids.numel()]
            host.copy_(ids, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            event.synchronize()
            ids = host
        flat = ids.tolist()
        out, i = {}, 0
        for req_id, ps in sampled.items():
            n = sum(p.numel() for p in ps)
            out[req_id] = tuple(flat[i:i + n])
            i += n
        return out


__all__ = ['CameraUpload', 'ChunkDelivery', 'JobClock', 'TokenCopy', 'block_slots',
           'to_device']
