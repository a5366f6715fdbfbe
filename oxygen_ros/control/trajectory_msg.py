"""
``trajectory_msgs/JointTrajectory`` to ``Trajectory``, without importing ROS.

The message is read by its fields (duck typing), so this module imports neither rclpy nor the
message packages: a robot driver passes the message it received, tests pass real messages.
"""

from __future__ import annotations

import numpy as np

from oxygen_ros.control.trajectory import ChunkRefused, Trajectory
from oxygen_ros.units import NS_PER_S


def trajectory_from_msg(msg: object) -> Trajectory:
    """
    Return the ``Trajectory`` of a ``trajectory_msgs/JointTrajectory``.

    ``header.stamp`` and every ``time_from_start`` become integer ns; ``positions`` of every
    point become ``float64 [H, J]``; ``velocities`` are used only when every point has them
    (all empty: linear interpolation). Limits and names are checked by the executor.

    :param msg: a ``JointTrajectory`` (or anything with its fields).
    :raises ChunkRefused: a point whose positions or velocities do not have one value per
        joint name, velocities on some points only, or a negative or malformed stamp.
    """
    names = tuple(msg.joint_names)
    stamp = msg.header.stamp
    if stamp.sec < 0 or not 0 <= stamp.nanosec < NS_PER_S:
        raise ChunkRefused(f'malformed header.stamp {stamp.sec} s {stamp.nanosec} ns')
    points = list(msg.points)
    width = len(names)
    rows, vels, tfs = [], [], []
    for i, point in enumerate(points):
        if len(point.positions) != width:
            raise ChunkRefused(f'point {i} has {len(point.positions)} positions for {width} '
                               f'joint names')
        if len(point.velocities) not in (0, width):
            raise ChunkRefused(f'point {i} has {len(point.velocities)} velocities for {width} '
                               f'joint names')
        rows.append(np.asarray(point.positions, dtype=np.float64))
        vels.append(np.asarray(point.velocities, dtype=np.float64))
        tfs.append(point.time_from_start.sec * NS_PER_S + point.time_from_start.nanosec)
    given = [v.size > 0 for v in vels]
    if any(given) and not all(given):
        raise ChunkRefused(f'velocities on {sum(given)} of {len(points)} points; give them on '
                           f'every point or none')
    positions = np.stack(rows) if rows else np.zeros((0, width))
    velocities = np.stack(vels) if rows and all(given) else None
    return Trajectory(names, stamp.sec * NS_PER_S + stamp.nanosec, tuple(tfs), positions,
                      velocities)


__all__ = ['trajectory_from_msg']
