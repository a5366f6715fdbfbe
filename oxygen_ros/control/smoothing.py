"""
Smooth chunk boundaries: naive switching, temporal ensembling (ACT), real-time chunking (RTC).

A new action chunk overlaps the still-to-be-executed tail of the previous one; switching
naively can jump where they disagree. Two remedies, chosen by the node's ``chunk_smoothing``:

- **Temporal ensembling** (Zhao et al. 2023, ACT, arXiv 2304.13705 §3.3): every published
  point is a weighted average of all predictions for that time, ``w_k = exp(-m k)`` with
  ``k = 0`` for the oldest prediction (ACT keeps the oldest heaviest; ``m`` small: 0.01).
  Post-hoc, on robot-unit actions; costs nothing, but averages away fast changes.
- **Real-time chunking** (Black, Galliker, Levine 2025, arXiv 2506.07339, Alg. 1): the new
  chunk is *denoised* toward the previous one's tail by inpainting guidance; the first ``d``
  points, which the robot executes before the chunk can arrive (``d`` = the inference delay
  in steps, measured), are frozen to the previous chunk, the next ones are soft-masked with
  exponentially decaying weights, the rest is free. Its policy (soft mask, target, delay) is
  ``rtc.py`` beside this module, its guided sampler ``model/guidance.py``.

This module holds the choice and the temporal ensemble. Pure numpy, no ROS, no torch.
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
    """Real-time chunking: guided denoising toward the previous chunk's tail (``rtc.py``)."""


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


__all__ = ['ChunkSmoothing', 'TemporalEnsemble', 'interpolation_indices']
