"""
Smooth chunk boundaries: naive switching, temporal ensembling (ACT), real-time chunking (RTC).

A new action chunk overlaps the still-to-be-executed tail of the previous one; switching
naively can jump where they disagree. Two remedies, chosen by the node's ``chunk_smoothing``:

- **Temporal ensembling** (Zhao et al. 2023, ACT, arXiv 2304.13705 §3.3): every published
  point is a weighted average of all predictions for that time, ``w_k = exp(-m k)`` with
  ``k = 0`` for the oldest prediction (ACT keeps the oldest heaviest; ``m`` small: 0.01).
  Post-hoc, on robot-unit actions; costs nothing, but averages away fast changes.
- **Real-time chunking** (Black, Galliker, Levine 2025, arXiv 2506.07339, Alg. 1): the new
  chunk is *denoised* toward the previous one's tail by inpainting guidance (``model/rtc.py``);
  the first ``d`` points, which the robot executes before the chunk can arrive (``d`` = the
  inference delay in steps, measured), are frozen to the previous chunk, the next ones are
  soft-masked with exponentially decaying weights, the rest is free. This module holds the
  pure parts: the weight schedule and the delay estimate.

Pure numpy, no ROS, no torch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
import enum
import math

import numpy as np


class ChunkSmoothing(str, enum.Enum):
    """How a new action chunk meets the previous one (node parameter ``chunk_smoothing``)."""

    NONE = 'none'
    """Naive switching: publish each chunk as the model made it."""
    ENSEMBLE = 'ensemble'
    """ACT temporal ensembling of all predictions for a time (:class:`TemporalEnsemble`)."""
    RTC = 'rtc'
    """Real-time chunking: guided denoising toward the previous chunk's tail."""


def rtc_prefix_weights(horizon: int, delay: int, overlap: int) -> np.ndarray:
    """
    Return RTC's soft mask over a new chunk (paper eq. 5, "exponential" schedule).

    ``W_i = 1`` for ``i < d`` (executed before the chunk arrives: frozen to the previous
    chunk); ``W_i = c_i (e^{c_i} - 1) / (e - 1)`` with ``c_i = (o - i) / (o - d + 1)`` for
    ``d <= i < o``; ``W_i = 0`` for ``i >= max(d, o)``, where ``o`` is the number of points
    the previous chunk still has for the new one (its leftover: no target, no pull toward
    zero, which a zero-padded leftover would give). A delay beyond the overlap (dropped
    cycles, a latency near ``H dt``) freezes the points past the previous chunk's end too:
    the robot holds its last point there, which is their target (hold-last padding, LeRobot
    PRs 4122 and 4454).

    :param horizon: ``H``, points of a chunk.
    :param delay: ``d >= 0``, the inference delay in steps (clamped to ``horizon``).
    :param overlap: ``o``, points of the previous chunk that overlap the new one, ``<= H``.
    :returns: ``float64 [H]`` in [0, 1], non-increasing.
    :raises ValueError: negative sizes or ``overlap > horizon``.
    """
    if horizon < 1 or delay < 0 or not 0 <= overlap <= horizon:
        raise ValueError(f'need horizon >= 1, delay >= 0, 0 <= overlap <= horizon; got '
                         f'{horizon}, {delay}, {overlap}')
    d = min(delay, horizon)
    w = np.zeros(horizon)
    w[:d] = 1.0
    i = np.arange(d, overlap)
    c = (overlap - i) / (overlap - d + 1)
    w[d:overlap] = c * np.expm1(c) / (math.e - 1)
    return w


class DelayEstimator:
    """
    The inference delay in action steps, measured: observation stamp to chunk publication.

    Keeps the last ``window`` latencies and reports ``ceil(max / action_dt)`` (too short a
    delay unfreezes points the robot already executes: a jump at the splice). The first
    ``skip`` samples after ``reset`` are dropped: a cold start (caches, allocations) would
    inflate the estimate for the whole window.

    :param window: latencies kept.
    :param skip: samples dropped after each reset.
    """

    def __init__(self, window: int = 10, skip: int = 2) -> None:
        if window < 1 or skip < 0:
            raise ValueError(f'window must be >= 1 and skip >= 0, got {window}, {skip}')
        self._samples: deque[int] = deque(maxlen=window)
        self._skip = skip
        self._to_skip = skip

    def reset(self) -> None:
        """Forget every sample (at activation)."""
        self._samples.clear()
        self._to_skip = self._skip

    def record(self, latency_ns: int) -> None:
        """Add one latency (node clock: publication time - observation stamp), ns."""
        if self._to_skip > 0:
            self._to_skip -= 1
            return
        self._samples.append(max(0, int(latency_ns)))

    def steps(self, action_dt_ns: int) -> int | None:
        """Return the delay in whole action steps, or None before any sample counts."""
        if not self._samples:
            return None
        return -(-max(self._samples) // action_dt_ns)


@dataclass(frozen=True, slots=True)
class _Prediction:
    stamp_ns: int
    actions: np.ndarray  # float64 [H, A]


class TemporalEnsemble:
    """
    ACT temporal ensembling of action chunks on a common time axis (robot units).

    Point ``i`` of a chunk stamped ``s`` is the prediction for time ``s + i dt``. ``apply``
    returns the new chunk with every point replaced by the weighted mean of all kept
    predictions for its time (older chunks linearly interpolated on the new chunk's grid;
    a chunk covers ``[s, s + (H - 1) dt]``), weights ``exp(-m k)`` with ``k`` the rank of the
    prediction among those for that time, oldest first.

    :param decay: ``m >= 0`` (ACT: 0.01).
    :param max_chunks: predictions kept (older ones cannot overlap a new chunk anyway once
        more than ``H`` chunks were published one step apart).
    """

    def __init__(self, decay: float = 0.01, max_chunks: int = 64) -> None:
        if not (math.isfinite(decay) and decay >= 0) or max_chunks < 1:
            raise ValueError(f'decay must be >= 0 and max_chunks >= 1, got {decay}, '
                             f'{max_chunks}')
        self.decay = float(decay)
        self._chunks: deque[_Prediction] = deque(maxlen=max_chunks)

    def reset(self) -> None:
        """Forget every prediction (at activation, or when the robot was moved by hand)."""
        self._chunks.clear()

    def apply(self, actions: np.ndarray, stamp_ns: int, action_dt_ns: int) -> np.ndarray:
        """
        Keep ``actions`` and return its ensembled version.

        A chunk stamped before the newest kept one restarts the ensemble (time went back).

        :param actions: ``float [H, A]`` robot units.
        :param stamp_ns: the chunk's observation stamp.
        :param action_dt_ns: time between points, ``> 0``.
        :returns: ``float64 [H, A]``.
        """
        new = np.array(actions, dtype=np.float64)
        if self._chunks and stamp_ns < self._chunks[-1].stamp_ns:
            self._chunks.clear()
        self._chunks.append(_Prediction(int(stamp_ns), new))
        horizon = new.shape[0]
        times = stamp_ns + action_dt_ns * np.arange(horizon)
        total = np.zeros_like(new)
        weight = np.zeros((horizon, 1))
        rank = np.zeros((horizon, 1))  # per point: predictions for it seen so far
        for old in self._chunks:  # oldest first: rank 0 weighs most
            covered, lo, hi, frac = interpolation_indices(
                (times - old.stamp_ns) / action_dt_ns, old.actions.shape[0])
            if not covered.any():
                continue
            frac = frac[:, None]
            values = old.actions[lo] * (1 - frac) + old.actions[hi] * frac
            w = np.exp(-self.decay * rank[covered])
            total[covered] += w * values
            weight[covered] += w
            rank[covered] += 1
        return total / weight


def interpolation_indices(
        pos: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """
    Return how to read a chunk of ``length`` points at fractional positions ``pos``.

    Position ``j`` is point ``j`` of the chunk (time ``stamp + j dt``); a position between
    points is linearly interpolated: ``x[lo] * (1 - frac) + x[hi] * frac``.

    :param pos: ``float [N]`` positions (e.g. ``(t - stamp) / dt`` of a newer chunk's times).
    :returns: ``(covered, lo, hi, frac)``: ``bool [N]`` the positions inside ``0..length-1``,
        and for those only ``int64`` ``lo``, ``hi`` and ``float64`` ``frac``.
    """
    covered = (pos >= 0) & (pos <= length - 1)
    lo = np.floor(pos[covered]).astype(np.int64)
    return covered, lo, np.minimum(lo + 1, length - 1), pos[covered] - lo


__all__ = ['ChunkSmoothing', 'DelayEstimator', 'TemporalEnsemble', 'interpolation_indices',
           'rtc_prefix_weights']
