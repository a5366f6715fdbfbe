"""
Real-time chunking's policy: what a new chunk is guided toward, and how much (RTC).

Black, Galliker, Levine 2025, "Real-Time Execution of Action Chunking Flow Policies"
(arXiv 2506.07339). A chunk of ``H`` points takes ``d`` action steps to arrive (the inference
delay) after its observation; meanwhile the robot executes the previous chunk. RTC *denoises*
the new chunk toward the previous chunk's points for the same times (the guidance target
``Y``), under a soft mask ``W`` over the new chunk: the first ``d`` points, executed before the
new chunk arrives, are frozen to the previous chunk (the prefix), the next ones are pulled with
exponentially decaying weights, the rest is free. The guided sampler, the torch math that
denoises with ``Y`` and ``W`` and the guidance weight ``beta``, is ``model/guidance.py``; this
module decides ``Y``, ``W`` and ``d``, in numpy (no torch, no ROS):

- :func:`soft_mask`, the paper's eq. 5 with hold-last padding past the previous chunk's end;
- :class:`ChunkHistory`, the previous chunk (normalized and in robot units) and the target it
  gives the next one (:class:`GuidanceTarget`): aligned by the two observation stamps,
  re-anchored to the new state where actions are relative to the state;
- :class:`InferenceDelay`, ``d`` measured from the caller's clock, and the
  :class:`RtcRequest` a cycle's caller hands the engine.

The engine keeps a :class:`ChunkHistory` and turns its target into the sampler's
``RtcGuidance``; the node keeps an :class:`InferenceDelay` (``ros/chunk_smoother.py``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
import math
from typing import Protocol

import numpy as np
from oxygen_ros.control.smoothing import interpolation_indices


@dataclass(frozen=True, slots=True)
class RtcRequest:
    """
    Guide a cycle's action chunk toward the previous one (what the engine's ``step`` takes).

    :ivar delay_steps: ``d >= 0``, the inference delay in action steps, measured by the
        caller (observation stamp to chunk publication, :class:`InferenceDelay`): the first
        ``d`` points are frozen. None before it was measured: every point the previous chunk
        covers is frozen (too long a delay makes the new chunk follow the old one a little
        longer; too short a one unfreezes points the robot executes meanwhile: a jump).
    :ivar action_dt_ns: time between chunk points, ``> 0``.
    :ivar max_guidance_weight: ``beta > 0`` (paper: 5).
    :raises ValueError: a field out of those ranges.
    """

    delay_steps: int | None
    action_dt_ns: int
    max_guidance_weight: float = 5.0

    def __post_init__(self) -> None:
        if (self.delay_steps is not None and self.delay_steps < 0) or self.action_dt_ns <= 0 \
                or not self.max_guidance_weight > 0:
            raise ValueError(f'RtcRequest needs delay_steps >= 0, action_dt_ns > 0, '
                             f'max_guidance_weight > 0; got {self}')


def soft_mask(horizon: int, delay: int, overlap: int) -> np.ndarray:
    """
    Return RTC's soft mask ``W`` over a new chunk (paper eq. 5, "exponential" schedule).

    ``W_i = 1`` for ``i < d`` (executed before the chunk arrives: frozen to the previous
    chunk); ``W_i = c_i (e^{c_i} - 1) / (e - 1)`` with ``c_i = (o - i) / (o - d + 1)`` for
    ``d <= i < o``; ``W_i = 0`` for ``i >= max(d, o)``, where ``o = H - s`` (``s`` the
    execution horizon: the previous chunk's points executed since it started) is the number of
    points the previous chunk still has for the new one (its leftover: no target, no pull
    toward zero, which a zero-padded leftover would give). A delay beyond the overlap (dropped
    cycles, a latency near ``H dt``) freezes the points past the previous chunk's end too: the
    robot holds its last point there, which is their target (hold-last padding, LeRobot PRs
    4122 and 4454).

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


class ModelUnits(Protocol):
    """How robot-unit actions are put in the model's units (``model.normalize.Normalizer``)."""

    @property
    def relative_actions(self) -> bool:
        """Return whether some action dims are predicted relative to the frame's state."""

    def actions_to_model(self, actions: np.ndarray,
                         state: np.ndarray | None = None) -> np.ndarray:
        """Return ``float [..., H, robot_action_dim]`` robot-unit actions, normalized."""


@dataclass(frozen=True, slots=True)
class PreviousChunk:
    """
    One published chunk, as the model made it (before limits and smoothing).

    :ivar stamp_ns: its observation stamp: point ``j`` is for ``stamp + j dt``.
    :ivar model: ``float32 [H, A]`` normalized, padded model output.
    :ivar robot: ``float64 [H, robot_action_dim]`` the same in robot units (absolute).
    """

    stamp_ns: int
    model: np.ndarray
    robot: np.ndarray


@dataclass(frozen=True, slots=True)
class GuidanceTarget:
    """
    What RTC guides one new chunk toward (the sampler's ``model.guidance.RtcGuidance``, in numpy).

    :ivar target: ``float32 [H, A]`` ``Y``, normalized model space; 0 where ``soft_mask`` is 0.
    :ivar soft_mask: ``float64 [H]`` ``W`` (:func:`soft_mask`).
    :ivar max_guidance_weight: ``beta``.
    """

    target: np.ndarray
    soft_mask: np.ndarray
    max_guidance_weight: float


class ChunkHistory:
    """
    Keeps the last chunk and builds RTC's guidance target of the next one from it.

    The target must be expressed the way the new chunk's points are. For policies whose actions are
    absolute (positions), velocities or per-step deltas the model space does not move between
    frames, and the previous chunk is read as the model made it. For policies whose actions are
    offsets from the frame's state (``pi05_base``'s ALOHA arm joints) it does: the previous chunk
    is kept in robot units (absolute) and re-expressed against the NEW frame's state
    (``units.actions_to_model``), as strands-labs/robots#779 and huggingface/lerobot#3453 do;
    guided in the old frame, the target would be off by the state's change.

    :param units: the engine's normalizer (model <-> robot units, relative or not).
    """

    def __init__(self, units: ModelUnits) -> None:
        self.units = units
        self.previous: PreviousChunk | None = None

    def reset(self) -> None:
        """Forget the previous chunk (RTC starts over: at activation, after a gap)."""
        self.previous = None

    def record(self, stamp_ns: int, model: np.ndarray, robot: np.ndarray) -> None:
        """
        Keep a published chunk (copies).

        :param model: ``float [H, A]`` normalized, padded model output.
        :param robot: ``float [H, robot_action_dim]`` the same in robot units.
        """
        self.previous = PreviousChunk(int(stamp_ns), np.array(model, dtype=np.float32),
                                      np.array(robot, dtype=np.float64))

    def guidance(self, stamp_ns: int, state: np.ndarray,
                 rtc: RtcRequest) -> GuidanceTarget | None:
        """
        Return the previous chunk's points at the new chunk's times and RTC's soft mask.

        New point ``i`` is for ``stamp + i dt``, previous point ``j`` for ``prev + j dt``:
        the target of ``i`` is the previous chunk at ``j = i + (stamp - prev) / dt``
        (linearly interpolated), for the ``overlap`` points it still covers; re-expressed
        against ``state`` where the actions are relative to the state. Points past its end
        that the robot executes before the new chunk arrives (``delay > overlap``) target its
        last point, which the robot holds there (:func:`soft_mask`). The same frame again
        (a slow or dropping camera: shift 0) is guided over the whole chunk, which the
        previous one covers entirely: an unguided chunk there would switch to an independent
        sample.

        :param stamp_ns: the new observation's stamp.
        :param state: ``float [state_dim]`` its robot state (robot units).
        :returns: None when there is no previous chunk, the new frame is older, or nothing
            of it is left and the delay is 0.
        """
        prev = self.previous
        if prev is None:
            return None
        horizon = prev.model.shape[0]
        shift = (stamp_ns - prev.stamp_ns) / rtc.action_dt_ns
        if shift < 0:
            return None  # time went back (a reordered frame)
        covered, _, _, _ = interpolation_indices(shift + np.arange(horizon), horizon)
        overlap = int(np.count_nonzero(covered))  # a leading run
        delay = overlap if rtc.delay_steps is None else min(rtc.delay_steps, horizon)
        num = max(overlap, delay)  # past the previous chunk's end the robot holds its last point
        if num == 0:
            return None  # nothing is left of it and nothing is executed before this one
        _, lo, hi, frac = interpolation_indices(
            np.minimum(shift + np.arange(num), horizon - 1), horizon)
        frac32 = frac.astype(np.float32)[:, None]   # the float32 arithmetic of the model space
        target = np.zeros_like(prev.model)
        target[:num] = prev.model[lo] * (1 - frac32) + prev.model[hi] * frac32
        if self.units.relative_actions:
            robot = prev.robot[lo] * (1 - frac[:, None]) + prev.robot[hi] * frac[:, None]
            rebased = self.units.actions_to_model(robot, state)
            target[:num, :rebased.shape[1]] = rebased
        return GuidanceTarget(target, soft_mask(horizon, delay, overlap),
                              rtc.max_guidance_weight)


class InferenceDelay:
    """
    The inference delay ``d`` in action steps, measured: observation stamp to chunk publication.

    Keeps the last ``window`` latencies and reports ``ceil(max / action_dt)`` (too short a
    delay unfreezes points the robot already executes: a jump at the splice). The first
    ``skip`` samples after ``reset`` are dropped: a cold start (caches, allocations) would
    inflate the estimate for the whole window. With ``guided_only`` (the chunks are guided)
    only guided chunks are measured: an unguided one (the first after activation) skips the
    guidance's cost and would make the delay too short.

    :param window: latencies kept.
    :param skip: samples dropped after each reset.
    :param guided_only: count only the latencies of guided chunks.
    :raises ValueError: ``window < 1`` or ``skip < 0``.
    """

    def __init__(self, window: int = 10, skip: int = 2, guided_only: bool = False) -> None:
        if window < 1 or skip < 0:
            raise ValueError(f'window must be >= 1 and skip >= 0, got {window}, {skip}')
        self._samples: deque[int] = deque(maxlen=window)
        self._skip = skip
        self._to_skip = skip
        self.guided_only = guided_only

    def reset(self) -> None:
        """Forget every sample (at activation)."""
        self._samples.clear()
        self._to_skip = self._skip

    def record(self, latency_ns: int, guided: bool = False) -> None:
        """
        Add one chunk's latency (caller's clock: publication time - observation stamp), ns.

        :param guided: the chunk was guided (ignored unless ``guided_only``).
        """
        if self.guided_only and not guided:
            return
        if self._to_skip > 0:
            self._to_skip -= 1
            return
        self._samples.append(max(0, int(latency_ns)))

    def steps(self, action_dt_ns: int) -> int | None:
        """Return the delay in whole action steps, or None before any sample counts."""
        if not self._samples:
            return None
        return -(-max(self._samples) // action_dt_ns)

    def rtc_request(self, action_dt_ns: int, max_guidance_weight: float) -> RtcRequest:
        """
        Return the engine's request for the next cycle, with the delay measured so far.

        Its delay is None until a latency counts (the engine then freezes every point the
        previous chunk covers).

        :raises ValueError: see :class:`RtcRequest`.
        """
        return RtcRequest(self.steps(action_dt_ns), action_dt_ns, max_guidance_weight)


__all__ = ['ChunkHistory', 'GuidanceTarget', 'InferenceDelay', 'ModelUnits', 'PreviousChunk',
           'RtcRequest', 'soft_mask']
