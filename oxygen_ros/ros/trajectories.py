"""
Action chunks as ``trajectory_msgs`` messages: joint trajectories, end-effector deltas.

Pure functions: no node, no DDS, no I/O. Times are integer nanoseconds (``oxygen_ros.units``):
``time_from_start`` of point ``i`` is exactly ``i * round(action_dt * 1e9)`` ns, whatever the
horizon.
"""

from __future__ import annotations

import math
import numbers
from typing import Sequence

from builtin_interfaces.msg import Time
from geometry_msgs.msg import Quaternion, Transform, Vector3
import numpy as np
from oxygen_ros.ros.stamps import as_stamp, ns_to_duration
from oxygen_ros.units import NS_PER_S
from std_msgs.msg import Header
from trajectory_msgs.msg import (
    JointTrajectory, JointTrajectoryPoint, MultiDOFJointTrajectory, MultiDOFJointTrajectoryPoint)


def _real_matrix(values: np.ndarray, what: str, names: Sequence[str]) -> np.ndarray:
    """Return ``values`` as a finite ``float64 [H >= 1, len(names)]`` array."""
    arr = np.asarray(values)
    if arr.ndim != 2 or arr.shape[0] < 1:
        raise ValueError(f'{what} must be [H, A] with H >= 1, got shape {arr.shape}')
    if arr.shape[1] != len(names):
        raise ValueError(
            f'{what} have {arr.shape[1]} dims but {len(names)} joint names were given')
    if not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
        raise ValueError(f'{what} must be real numbers, got dtype {arr.dtype}')
    arr = arr.astype(np.float64)
    finite = np.isfinite(arr)
    if not finite.all():
        step, dim = np.argwhere(~finite)[0]
        raise ValueError(f'{what} hold NaN/Inf, first at step {step} joint {names[dim]!r}')
    return arr


def _dt_ns(action_dt: float) -> int:
    if (isinstance(action_dt, bool) or not isinstance(action_dt, numbers.Real)
            or not math.isfinite(action_dt) or action_dt <= 0):
        raise ValueError(f'action_dt must be a positive number of seconds, got {action_dt!r}')
    dt_ns = round(action_dt * NS_PER_S)
    if dt_ns < 1:
        raise ValueError(f'action_dt {action_dt!r} s is below 1 ns')
    return dt_ns


def actions_to_trajectory(positions: np.ndarray, joint_names: Sequence[str],
                          stamp: Time | int, action_dt: float, frame_id: str = '', *,
                          velocities: np.ndarray | None = None) -> JointTrajectory:
    """
    Return a chunk of joint positions as a ``trajectory_msgs/JointTrajectory``.

    Point ``i`` holds ``positions[i]`` (and ``velocities[i]``) with ``time_from_start = i *
    action_dt``, computed in integer nanoseconds (``round(action_dt * 1e9) * i``) so no float
    error adds up over the horizon (``docs/topics.md#topics``). ``~/action_chunk`` carries joint
    positions only in ``positions``, never velocities (``control.action_space``).

    :param positions: ``float [H, A]`` joint positions in robot units (rad, m),
        ``A = len(joint_names)``.
    :param joint_names: names of the ``A`` joints, unique.
    :param stamp: ``header.stamp``, the stamp of the observation used (``Time`` or int ns).
    :param action_dt: seconds between consecutive points, ``> 0``.
    :param frame_id: ``header.frame_id``.
    :param velocities: ``float [H, A]`` joint velocities (rad/s, m/s) or None (left empty).
    :returns: the trajectory with ``H`` points.
    :raises ValueError: if an array is not 2-D with ``H >= 1`` and ``A = len(joint_names)``,
        the two differ in shape, hold NaN/Inf (first bad index given), names repeat, or
        ``action_dt`` is not a positive finite number.
    """
    names = list(joint_names)
    if len(set(names)) != len(names):
        raise ValueError(f'joint names repeat: {names}')
    arr = _real_matrix(positions, 'positions', names)
    vel = None if velocities is None else _real_matrix(velocities, 'velocities', names)
    if vel is not None and vel.shape != arr.shape:
        raise ValueError(f'velocities {vel.shape} and positions {arr.shape} differ in shape')
    dt_ns = _dt_ns(action_dt)
    msg = JointTrajectory()
    msg.header = Header(stamp=as_stamp(stamp), frame_id=frame_id)
    msg.joint_names = names
    points = []
    for i, row in enumerate(arr):
        point = JointTrajectoryPoint()
        point.positions = row
        if vel is not None:
            point.velocities = vel[i]
        point.time_from_start = ns_to_duration(i * dt_ns)
        points.append(point)
    msg.points = points
    return msg


def axis_angle_to_quaternion(rotvec: np.ndarray) -> np.ndarray:
    """
    Return unit quaternions ``(x, y, z, w)`` of axis-angle rotation vectors.

    ``q = (sin(θ/2) r/θ, cos(θ/2))`` with ``θ = |r|``; ``sin(θ/2)/θ`` by its Taylor series
    near 0, so a zero rotation is the identity.

    :param rotvec: ``float [..., 3]`` axis × angle (rad).
    :returns: ``float64 [..., 4]``, ``geometry_msgs/Quaternion`` order.
    """
    r = np.asarray(rotvec, dtype=np.float64)
    theta = np.linalg.norm(r, axis=-1, keepdims=True)
    small = theta < 1e-6
    safe = np.where(small, 1.0, theta)
    k = np.where(small, 0.5 - theta**2 / 48.0, np.sin(theta / 2) / safe)
    return np.concatenate([r * k, np.cos(theta / 2)], axis=-1)


def ee_deltas_to_multidof(translations: np.ndarray, rotations: np.ndarray, joint_name: str,
                          stamp: Time | int, action_dt: float,
                          frame_id: str = '') -> MultiDOFJointTrajectory:
    """
    Return per-step end-effector deltas as a ``trajectory_msgs/MultiDOFJointTrajectory``.

    One multi-DOF joint (the end effector); point ``i`` at ``time_from_start = i * action_dt``
    holds the delta of step ``i`` as a ``geometry_msgs/Transform``: translation (m) and the
    axis-angle rotation as a unit quaternion, both in ``frame_id``. Deltas are per step, each
    relative to the pose reached before it (``ActionSpace.EE_DELTA``), not poses.

    :param translations: ``float [H, 3]`` m.
    :param rotations: ``float [H, 3]`` axis-angle, rad.
    :param joint_name: the end effector's name (``end_effector_name``).
    :raises ValueError: shapes other than ``[H, 3]``, NaN/Inf, an empty name, a bad dt.
    """
    if not joint_name:
        raise ValueError('the end effector needs a name')
    axes = ('x', 'y', 'z')
    t = _real_matrix(translations, 'translations', axes)
    r = _real_matrix(rotations, 'rotations', axes)
    if t.shape != r.shape:
        raise ValueError(f'translations {t.shape} and rotations {r.shape} differ in shape')
    dt_ns = _dt_ns(action_dt)
    quats = axis_angle_to_quaternion(r)
    msg = MultiDOFJointTrajectory()
    msg.header = Header(stamp=as_stamp(stamp), frame_id=frame_id)
    msg.joint_names = [joint_name]
    points = []
    for i in range(t.shape[0]):
        x, y, z = t[i]
        qx, qy, qz, qw = quats[i]
        point = MultiDOFJointTrajectoryPoint()
        point.transforms = [Transform(translation=Vector3(x=x, y=y, z=z),
                                      rotation=Quaternion(x=qx, y=qy, z=qz, w=qw))]
        point.time_from_start = ns_to_duration(i * dt_ns)
        points.append(point)
    msg.points = points
    return msg


__all__ = ['actions_to_trajectory', 'axis_angle_to_quaternion', 'ee_deltas_to_multidof']
