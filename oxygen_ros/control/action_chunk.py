"""
An action chunk as a controller reads it, and the limits it must respect.

``Chunk`` is the ROS-free form of a ``trajectory_msgs/JointTrajectory``
(``trajectory_msg.chunk_from_trajectory`` builds one); ``JointLimits`` are a controller's
position and velocity limits; ``ChunkRefused`` says why a chunk is not executed.
"""

from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np


class ChunkRefused(ValueError):
    """A chunk the executor will not execute; the message says why."""


@dataclass(frozen=True, slots=True)
class JointLimits:
    """
    Limits of the executor's joints, aligned with its ``joint_names``; None = no limit.

    :ivar lower: ``[J]`` lowest position (rad, m, or the gripper's unit).
    :ivar upper: ``[J]`` highest position.
    :ivar velocity: ``[J]`` largest ``|velocity|`` (unit/s), > 0.
    """

    lower: tuple[float, ...] | None = None
    upper: tuple[float, ...] | None = None
    velocity: tuple[float, ...] | None = None

    def check(self, num_joints: int) -> None:
        """
        Check lengths and values.

        :raises ValueError: a length other than ``num_joints``, NaN, lower > upper, or a
            velocity limit <= 0.
        """
        for name in ('lower', 'upper', 'velocity'):
            values = getattr(self, name)
            if values is None:
                continue
            if len(values) != num_joints or any(math.isnan(v) for v in values):
                raise ValueError(f'{name} limits must be {num_joints} numbers, got {values}')
        if self.lower is not None and self.upper is not None:
            bad = [i for i, (lo, hi) in enumerate(zip(self.lower, self.upper)) if lo > hi]
            if bad:
                raise ValueError(f'lower > upper limit at joints {bad}')
        if self.velocity is not None and min(self.velocity) <= 0:
            raise ValueError(f'velocity limits must be > 0, got {self.velocity}')


@dataclass(frozen=True, slots=True)
class Chunk:
    """
    One action chunk as the executor reads it.

    :ivar joint_names: ``[J]`` names, a subset of the executor's, any order.
    :ivar stamp_ns: ``header.stamp`` in integer ns on the executor's clock.
    :ivar times_from_start_ns: ``[H]`` ``time_from_start`` of each point, integer ns.
    :ivar positions: ``float64 [H, J]``.
    :ivar velocities: ``float64 [H, J]`` or None (then interpolation is linear).
    """

    joint_names: tuple[str, ...]
    stamp_ns: int
    times_from_start_ns: tuple[int, ...]
    positions: np.ndarray
    velocities: np.ndarray | None = None

    @property
    def times_ns(self) -> np.ndarray:
        """Return the absolute due time of each point, ``int64 [H]`` ns."""
        return self.stamp_ns + np.asarray(self.times_from_start_ns, dtype=np.int64)


__all__ = ['Chunk', 'ChunkRefused', 'JointLimits']
