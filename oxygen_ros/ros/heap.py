"""
The node's heap as glibc malloc holds it, and its free pages given back to the OS.

glibc's malloc keeps memory freed by a thread in that thread's arena (up to 8 per core), and
after a large block mmapped on its own is freed it raises its mmap threshold to that size
(up to 32 MiB), so later blocks that large come from the arenas too and stay there when freed
(torch's CPU allocator caches nothing: it frees to malloc at once). A control cycle's largest
working set (a full decode batch: its logits alone are ``rows x vocabulary x 4`` bytes a step)
thus stays resident after a burst of text requests, free, in the arena of the thread that ran
it (``docs/robustness.md#soak``): in one arena, as the node runs its control cycle on a thread
of its own (``executor.NodeExecutor``), not in each of the executor's workers. The same
happened to freed engines after cleanup (466 to 686 MiB over 20 lifecycle cycles of the tiny
preset).

``malloc_trim(0)`` returns the free pages of every arena to the kernel (``madvise``), the
middle of the heap included. ``HeapTrimmer`` calls it after a burst, off the control cycle;
``release_freed_memory`` at once (after cleanup). ``heap_figures`` is what ``/diagnostics``
shows. On a libc without ``mallinfo2`` or ``malloc_trim`` (musl, macOS, glibc < 2.33) they
report nothing and trim nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass
import functools
import gc
import os
import threading
import time

TRIM_INTERVAL_S = 5.0
"""Least seconds between two trims."""
TRIM_INTERVAL_MAX_S = 30.0
"""The most the interval grows to while trims are undone (a load that goes on)."""
POLL_PERIOD_S = 1.0
"""Seconds between two looks at the heap in the node (``HeapTrimmer.poll``, text group)."""
_MIB = 1 << 20


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (malloc.h, glibc >= 2.33): sizes in bytes."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks', 'uordblks',
        'fordblks', 'keepcost')]


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library('c')
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if libc is None or not hasattr(libc, 'malloc_trim') or not hasattr(libc, 'mallinfo2'):
        return None
    libc.mallinfo2.restype = _MallInfo2
    libc.mallinfo2.argtypes = []
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc


@dataclass(frozen=True, slots=True)
class HeapFigures:
    """
    The process's memory now, bytes: the kernel's view and glibc malloc's (``mallinfo2``).

    ``in_use + free`` is what the arenas hold; ``free`` is what ``malloc_trim`` can give back
    (less what is already given back: a trimmed page stays a free chunk of its arena).
    """

    rss: int
    """Resident set size (``/proc/self/statm``)."""
    arenas: int
    """Bytes the arenas took from the OS (``mallinfo2.arena``: brk heap and mmapped heaps)."""
    in_use: int
    """Bytes in use in the arenas (``uordblks``)."""
    free: int
    """Free chunks held in the arenas (``fordblks``)."""
    mmapped: int
    """Blocks mmapped on their own (``hblkhd``): returned to the OS when freed."""


def heap_figures() -> HeapFigures | None:
    """Return the heap now; None where glibc's ``mallinfo2`` or ``/proc`` is missing."""
    libc = _libc()
    if libc is None:
        return None
    try:
        with open('/proc/self/statm', 'rb') as statm:
            rss = int(statm.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    except (OSError, ValueError, IndexError):
        return None
    info = libc.mallinfo2()
    return HeapFigures(rss, info.arena, info.uordblks, info.fordblks, info.hblkhd)


class HeapTrimmer:
    """
    Give the free pages of malloc's arenas back to the OS once RSS rose above its last level.

    Call :meth:`poll` off the control cycle (the node's text group, every
    ``POLL_PERIOD_S``): it trims when RSS exceeds its level after the previous trim (or its
    lowest since) by a margin while malloc holds at least that much free, and the interval
    since the previous trim has passed. The level becomes RSS after the trim: live growth
    does not make it trim again. When RSS came back to where a trim started within its
    interval (its pages were used again: a load that goes on, not garbage), the next trim
    waits twice as long, up to ``TRIM_INTERVAL_MAX_S``; after one whose release held, the
    interval is ``TRIM_INTERVAL_S`` again. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._level: int | None = None
        self._last_s = -TRIM_INTERVAL_MAX_S
        self._last_before: int | None = None
        self._undone = False
        self.interval_s = TRIM_INTERVAL_S
        """Seconds the next trim waits after the previous one."""
        self.trims = 0
        """Trims so far."""
        self.released = 0
        """RSS bytes the trims gave back (sum of RSS before minus after)."""
        self.last_trim_s = 0.0
        """Seconds the last ``malloc_trim`` took."""
        self.figures: HeapFigures | None = None
        """The figures of the last poll (after its trim)."""

    def poll(self, margin_mib: float, now_s: float | None = None) -> HeapFigures | None:
        """
        Read the heap and trim if due; return the figures (after a trim), None off glibc.

        :param margin_mib: MiB of growth that trigger a trim (``malloc_trim_mb``); 0: never.
        :param now_s: monotonic seconds (default: now).
        """
        now_s = time.monotonic() if now_s is None else now_s
        margin = round(margin_mib * _MIB)
        with self._lock:
            figures = heap_figures()
            if figures is None:
                return None
            if self._level is None:
                self._level = figures.rss
            if self._last_before is not None and now_s - self._last_s <= self.interval_s:
                self._undone |= figures.rss >= self._last_before - margin
            due = margin > 0 and figures.rss > self._level + margin and \
                figures.free >= margin and now_s - self._last_s >= self.interval_s
            if due:
                self.interval_s = min(2 * self.interval_s, TRIM_INTERVAL_MAX_S) \
                    if self._undone else TRIM_INTERVAL_S
                self._last_before, self._undone = figures.rss, False
                t0 = time.perf_counter()
                _libc().malloc_trim(0)
                self.last_trim_s = time.perf_counter() - t0
                after = heap_figures() or figures
                self.trims += 1
                self.released += max(figures.rss - after.rss, 0)
                self._level, self._last_s, figures = after.rss, now_s, after
            self._level = min(self._level, figures.rss)
            self.figures = figures
            return figures


def release_freed_memory(device: str) -> bool:
    """
    Collect garbage, then return free heap pages to the OS (glibc ``malloc_trim(0)``).

    :param device: the released engine's device: on ``cuda*`` torch's cached device blocks go
        back to the driver first (``torch.cuda.empty_cache``).
    :returns: whether ``malloc_trim`` ran and released memory (False on a libc without it,
        e.g. musl or macOS: nothing to do there).
    """
    gc.collect()
    if device.startswith('cuda'):
        import torch
        torch.cuda.empty_cache()
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


__all__ = ['HeapFigures', 'HeapTrimmer', 'POLL_PERIOD_S', 'TRIM_INTERVAL_MAX_S', 'TRIM_INTERVAL_S',
           'heap_figures', 'release_freed_memory']
