"""
Host and device without waiting: pinned non-blocking copies, slot indices, job timing by events.

What lets a control cycle on CUDA run its jobs back to back with the host waiting only twice
(``torch_backend.py``): index tensors go up through pinned memory without blocking, and job
times are CUDA events read after the cycle instead of a sync per job.
"""

from __future__ import annotations

import time
from typing import Callable

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


__all__ = ['CameraUpload', 'JobClock', 'block_slots', 'to_device']
