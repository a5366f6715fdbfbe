"""
Smoothness of a commanded trajectory where action chunks are switched.

Two measures, both per joint (take the max over the joints of one unit, e.g. the arm's rad):

- **position jump** at a switch at time ``t_s``: ``p_new(t_s) - p_prev(t_s)``, the command of
  the new chunk at its first executed point minus what the previous chunk (or the hold) would
  have commanded at the same time (``chunk_executor.Switch.jump``). Naive switching between
  independent chunks jumps; temporal ensembling and real-time chunking should not.
- **jerk** of the command sampled every ``h`` (the joint-command rate): the third backward
  difference ``j_k = (q[k+1] - 3 q[k] + 3 q[k-1] - q[k-2]) / h^3`` (rad/s³), whose stencil
  covers samples ``k-2 .. k+1``. The **boundary jerk** of a switch is the largest ``|j_k|`` over
  the stencils that contain it (``t[k-2] < t_s <= t[k+1]``: three stencils); the **interior
  jerk** is ``|j_k|`` of every stencil that contains no switch, the reference inside chunks. A
  jump ``d`` alone gives a boundary jerk of ``2 d / h^3``; a kink (velocity change ``dv``)
  about ``dv / h^2``. Values depend on ``h``: compare runs at the same rate only.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from oxygen_ros.units import NS_PER_S

_GAP_TOL_NS = 1_000
"""Samples further than this from the sample period apart break a stencil."""


def third_differences(positions: np.ndarray, period_s: float) -> np.ndarray:
    """
    Return ``j_k`` for ``k = 2 .. n-2`` (row ``r`` is the stencil over samples ``r .. r+3``).

    :param positions: ``float [n, J]`` uniformly sampled command.
    :param period_s: the sample period ``h`` in s.
    :returns: ``float64 [max(n - 3, 0), J]`` in units/s³.
    """
    q = np.asarray(positions, dtype=np.float64)
    if q.shape[0] < 4:
        return np.zeros((0,) + q.shape[1:])
    return (q[3:] - 3 * q[2:-1] + 3 * q[1:-2] - q[:-3]) / period_s ** 3


def boundary_jerk(times_ns: Sequence[int], positions: np.ndarray,
                  switch_times_ns: Sequence[int], period_ns: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """
    Return the boundary jerk of each switch and the interior jerk (module docstring).

    Stencils over samples not ``period_ns`` apart (a dropped sample) are left out.

    :param times_ns: ``[n]`` sample times, increasing.
    :param positions: ``float [n, J]`` commanded positions at those times.
    :param switch_times_ns: ``[S]`` switch times.
    :param period_ns: the nominal sample period ``h``.
    :returns: ``(boundary float64 [S, J], interior float64 [M, J])``, absolute values; a
        switch with no complete stencil around it has a NaN row.
    :raises ValueError: lengths differ or ``period_ns`` <= 0.
    """
    t = np.asarray(times_ns, dtype=np.int64)
    q = np.asarray(positions, dtype=np.float64)
    if q.ndim != 2 or q.shape[0] != t.shape[0]:
        raise ValueError(f'positions {q.shape} do not match {t.shape[0]} sample times')
    if period_ns <= 0:
        raise ValueError(f'period_ns must be > 0, got {period_ns}')
    jerk = np.abs(third_differences(q, period_ns / NS_PER_S))
    switches = np.asarray(switch_times_ns, dtype=np.int64)
    boundary = np.full((switches.shape[0], q.shape[1]), np.nan)
    if jerk.shape[0] == 0:
        return boundary, jerk
    gaps = np.abs(np.diff(t) - period_ns) > _GAP_TOL_NS
    uniform = ~(gaps[:-2] | gaps[1:-1] | gaps[2:])
    start, end = t[:-3], t[3:]  # stencil r covers (t[r], t[r + 3]] for a change at t_s
    touched = np.zeros(jerk.shape[0], dtype=bool)
    for s, t_s in enumerate(switches):
        hit = (start < t_s) & (t_s <= end)
        touched |= hit
        hit &= uniform
        if hit.any():
            boundary[s] = jerk[hit].max(axis=0)
    return boundary, jerk[uniform & ~touched]


__all__ = ['boundary_jerk', 'third_differences']
