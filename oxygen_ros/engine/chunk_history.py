"""
The previous action chunk and what it asks of the next one under real-time chunking.

RTC (``model/rtc.py``) guides a new chunk toward the previous chunk's points for the same
times. Those points must be expressed the way the new chunk's are. For policies whose
actions are absolute (positions), velocities or per-step deltas the model space does not move
between frames, and the previous chunk is read as the model made it. For policies whose
actions are offsets from the frame's state (``pi05_base``'s ALOHA arm joints) it does: the
previous chunk is kept in robot units (absolute) and re-expressed against the NEW frame's
state (``Normalizer.actions_to_model``), as strands-labs robots PR 779 and LeRobot PR 3453
do; guided in the old frame, the target would be off by the state's change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from oxygen_ros.control.smoothing import interpolation_indices, rtc_prefix_weights
from oxygen_ros.engine.config import RtcRequest
from oxygen_ros.model.rtc import RtcGuidance
from oxygen_ros.transforms.normalize import Normalizer
import torch


@dataclass(frozen=True, slots=True)
class PreviousChunk:
    """
    One published chunk, as the model made it (before limits and smoothing).

    :ivar stamp_ns: its observation stamp: point ``j`` is for ``stamp + j dt``.
    :ivar model: ``float32 [H, A]`` normalized, padded model output.
    :ivar robot: ``float [H, robot_action_dim]`` the same in robot units (absolute).
    """

    stamp_ns: int
    model: torch.Tensor
    robot: np.ndarray


class ChunkHistory:
    """
    Keeps the last chunk and builds RTC's guidance of the next one from it.

    :param normalizer: the engine's (model <-> robot units, relative or not).
    """

    def __init__(self, normalizer: Normalizer) -> None:
        self.normalizer = normalizer
        self.previous: PreviousChunk | None = None

    def reset(self) -> None:
        """Forget the previous chunk (RTC starts over: at activation, after a gap)."""
        self.previous = None

    def record(self, stamp_ns: int, model: torch.Tensor, robot: np.ndarray) -> None:
        """Keep a published chunk: ``model`` ``[H, A]`` normalized, ``robot`` robot units."""
        self.previous = PreviousChunk(int(stamp_ns), model.detach().float().clone(),
                                      np.array(robot, dtype=np.float64))

    def guidance(self, stamp_ns: int, state: np.ndarray, rtc: RtcRequest) -> RtcGuidance | None:
        """
        Return the previous chunk's points at the new chunk's times and RTC's soft mask.

        New point ``i`` is for ``stamp + i dt``, previous point ``j`` for ``prev + j dt``:
        the target of ``i`` is the previous chunk at ``j = i + (stamp - prev) / dt``
        (linearly interpolated), for the ``overlap`` points it still covers; re-expressed
        against ``state`` where the actions are relative to the state. Points past its end
        that the robot executes before the new chunk arrives (``delay > overlap``) target its
        last point, which the robot holds there (``rtc_prefix_weights``). The same frame again
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
        frac_t = torch.tensor(frac, dtype=torch.float32, device=prev.model.device)[:, None]
        target = torch.zeros_like(prev.model)
        target[:num] = prev.model[lo] * (1 - frac_t) + prev.model[hi] * frac_t
        if self.normalizer.relative_actions:
            robot = prev.robot[lo] * (1 - frac[:, None]) + prev.robot[hi] * frac[:, None]
            rebased = self.normalizer.actions_to_model(robot, state)
            target[:num, :rebased.shape[1]] = torch.tensor(
                rebased, dtype=torch.float32, device=prev.model.device)
        weights = rtc_prefix_weights(horizon, delay, overlap)
        return RtcGuidance(target[None], torch.tensor(weights, dtype=torch.float32,
                                                      device=prev.model.device),
                           rtc.max_guidance_weight)


__all__ = ['ChunkHistory', 'PreviousChunk']
