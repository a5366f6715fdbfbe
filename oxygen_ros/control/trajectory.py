"""
An action chunk as a controller executes it: a timed joint trajectory.

``Trajectory`` is the ROS-free form of a ``trajectory_msgs/JointTrajectory``
(``trajectory_msg.trajectory_from_msg`` builds one), as ros2_control's
``joint_trajectory_controller`` holds a received message in its ``Trajectory`` class: joint
names, the stamp and each point's time from it, positions and optional velocities. The
engine's ``ActionChunk`` (``engine/outputs.py``) is what the model made, in robot units; the
node turns it into the message this is read from. ``ChunkRefused`` says why a chunk is not
executed. Limits: ``control.limits.JointLimits``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class ChunkRefused(ValueError):
    """A chunk the executor will not execute; the message says why."""


@dataclass(frozen=True, slots=True)
class Trajectory:
    """
    One action chunk as the executor reads it: points due at absolute times.

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


__all__ = ['ChunkRefused', 'Trajectory']
