"""
Conversions between ROS 2 messages and the numpy arrays the engine works with.

Pure functions: no node, no DDS, no I/O. There is no ROS 2 ``cv_bridge`` on PyPI
(ros2-from-pypi.md), so images are decoded here with numpy, honouring the ``step`` row
padding of ``sensor_msgs/Image`` (REP-118 layout: ``height`` rows of ``step`` bytes each, the
first ``width * channels`` bytes of a row are pixels).

Stamps are handled as integer nanoseconds everywhere (no float seconds), so that
``time_from_start`` of an action chunk is exactly ``i * action_dt`` and header stamps survive a
round trip bit for bit.
"""

from __future__ import annotations

import enum
import math
import numbers
from typing import Sequence

from builtin_interfaces.msg import Duration, Time
from geometry_msgs.msg import Quaternion, Transform, Vector3
import numpy as np
from oxygen_ros.ros.input_limits import MAX_JOINT_STATE_LENGTH
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Header
from trajectory_msgs.msg import (
    JointTrajectory, JointTrajectoryPoint, MultiDOFJointTrajectory, MultiDOFJointTrajectoryPoint)

NS_PER_S = 1_000_000_000
MAX_IMAGE_SIDE = 8192
"""Largest accepted image width or height in pixels; larger ones are rejected as corrupt."""
_INT32_MAX = 2**31 - 1


class ImageConversionError(ValueError):
    """A ``sensor_msgs/Image`` that cannot be turned into an RGB array (the message says why)."""


class JointStateError(ValueError):
    """A ``sensor_msgs/JointState`` that cannot be mapped to the configured joint order."""


class Encoding(str, enum.Enum):
    """The 8-bit ``sensor_msgs/Image`` encodings we read and write (``image_encodings.hpp``)."""

    RGB8 = 'rgb8'
    BGR8 = 'bgr8'
    MONO8 = 'mono8'
    RGBA8 = 'rgba8'
    BGRA8 = 'bgra8'

    @property
    def channels(self) -> int:
        """Bytes per pixel."""
        return _CHANNELS[self]


_CHANNELS = {Encoding.RGB8: 3, Encoding.BGR8: 3, Encoding.MONO8: 1, Encoding.RGBA8: 4,
             Encoding.BGRA8: 4}
SUPPORTED_ENCODINGS: tuple[str, ...] = tuple(e.value for e in Encoding)


def _encoding(name: str) -> Encoding:
    try:
        return Encoding(name)
    except ValueError:
        raise ImageConversionError(
            f'unsupported image encoding {name!r}; supported: '
            f'{", ".join(SUPPORTED_ENCODINGS)}') from None


# --------------------------------------------------------------------------------------------
# Stamps


def stamp_to_ns(stamp: Time) -> int:
    """
    Return a ``builtin_interfaces/Time`` as integer nanoseconds.

    :param stamp: the message stamp (``sec`` int32, ``nanosec`` uint32).
    :returns: ``sec * 1e9 + nanosec``, exact.
    :raises ValueError: if ``nanosec`` is not in ``[0, 1e9)``.
    """
    if not 0 <= stamp.nanosec < NS_PER_S:
        raise ValueError(f'stamp nanosec {stamp.nanosec} not in [0, {NS_PER_S})')
    return stamp.sec * NS_PER_S + stamp.nanosec


def ns_to_stamp(ns: int) -> Time:
    """
    Return integer nanoseconds as a ``builtin_interfaces/Time``.

    :param ns: nanoseconds since the epoch of the clock (ROS time), ``>= 0``.
    :returns: the stamp, ``nanosec`` in ``[0, 1e9)``.
    :raises ValueError: if ``ns`` is negative, not an integer, or beyond int32 seconds.
    """
    sec, nanosec = _split_ns(ns, 'stamp')
    return Time(sec=sec, nanosec=nanosec)


def duration_to_ns(duration: Duration) -> int:
    """Return a ``builtin_interfaces/Duration`` as integer nanoseconds."""
    return duration.sec * NS_PER_S + duration.nanosec


def ns_to_duration(ns: int) -> Duration:
    """
    Return non-negative integer nanoseconds as a ``builtin_interfaces/Duration``.

    :raises ValueError: if ``ns`` is negative, not an integer, or beyond int32 seconds.
    """
    sec, nanosec = _split_ns(ns, 'duration')
    return Duration(sec=sec, nanosec=nanosec)


def _split_ns(ns: int, what: str) -> tuple[int, int]:
    if isinstance(ns, bool) or not isinstance(ns, (int, np.integer)):
        raise ValueError(f'{what} must be integer nanoseconds, got {ns!r}')
    ns = int(ns)
    if ns < 0 or ns // NS_PER_S > _INT32_MAX:
        raise ValueError(f'{what} {ns} ns out of range [0, {_INT32_MAX}] s')
    return ns // NS_PER_S, ns % NS_PER_S


# --------------------------------------------------------------------------------------------
# Images


def image_to_rgb(msg: Image) -> np.ndarray:
    """
    Decode an 8-bit ``sensor_msgs/Image`` into an RGB array.

    ``mono8`` is replicated into three channels; the alpha of ``rgba8``/``bgra8`` is dropped.
    Rows may be padded (``step > width * channels``); the padding is skipped.

    The result is read-only. For ``rgb8`` it is a zero-copy view of ``msg.data`` (strided when
    rows are padded, so call ``np.ascontiguousarray`` if you need contiguous memory); for the
    other encodings it is a new contiguous array.

    :param msg: the image message.
    :returns: ``uint8 [height, width, 3]`` RGB.
    :raises ImageConversionError: unsupported encoding (the supported ones are listed), zero or
        more than ``MAX_IMAGE_SIDE`` width/height, ``step < width * channels``, or fewer than
        ``step * height`` bytes of data.
    """
    enc = _encoding(msg.encoding)
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if height == 0 or width == 0:
        raise ImageConversionError(f'empty {enc.value} image: {width}x{height} (width x height)')
    if height > MAX_IMAGE_SIDE or width > MAX_IMAGE_SIDE:
        raise ImageConversionError(
            f'image {width}x{height} (width x height) exceeds the {MAX_IMAGE_SIDE} px limit')
    row_bytes = width * enc.channels
    if step < row_bytes:
        raise ImageConversionError(
            f'step {step} < width {width} * {enc.channels} channels ({enc.value}) = {row_bytes}')
    data = np.frombuffer(msg.data, dtype=np.uint8)
    if data.size < step * height:
        raise ImageConversionError(
            f'{enc.value} image {width}x{height} with step {step} needs {step * height} bytes, '
            f'data has {data.size}')
    pixels = data[:step * height].reshape(height, step)[:, :row_bytes]
    pixels = pixels.reshape(height, width, enc.channels)
    if enc is Encoding.RGB8:
        rgb = pixels
    elif enc is Encoding.MONO8:
        rgb = np.repeat(pixels, 3, axis=2)
    elif enc is Encoding.RGBA8:
        rgb = np.ascontiguousarray(pixels[:, :, :3])
    else:  # BGR8, BGRA8
        rgb = np.ascontiguousarray(pixels[:, :, 2::-1])
    rgb.flags.writeable = False
    return rgb


def rgb_to_image(arr: np.ndarray, stamp: Time | int, frame_id: str,
                 encoding: Encoding | str = Encoding.RGB8, *, row_padding: int = 0) -> Image:
    """
    Encode an RGB (or, for ``mono8``, grayscale) array as a ``sensor_msgs/Image``.

    :param arr: ``uint8 [h, w, 3]`` RGB; for ``mono8`` ``uint8 [h, w]`` (or ``[h, w, 1]``).
        Alpha, when the encoding has one, is written as 255.
    :param stamp: ``header.stamp``, a ``Time`` message or integer nanoseconds.
    :param frame_id: ``header.frame_id``.
    :param encoding: one of ``SUPPORTED_ENCODINGS``.
    :param row_padding: extra zero bytes at the end of every row (``step = w * ch + padding``).
    :returns: the message, ``is_bigendian = 0``.
    :raises ImageConversionError: unsupported encoding, wrong dtype or shape, size out of range.
    """
    enc = _encoding(encoding.value if isinstance(encoding, Encoding) else encoding)
    arr = np.asarray(arr)
    if arr.dtype != np.uint8:
        raise ImageConversionError(f'image array must be uint8, got {arr.dtype}')
    if enc is Encoding.MONO8:
        if arr.ndim == 3 and arr.shape[2] == 1:
            arr = arr[:, :, 0]
        if arr.ndim != 2:
            raise ImageConversionError(f'mono8 needs a [h, w] array, got shape {arr.shape}')
        pixels = arr[:, :, None]
    else:
        if arr.ndim != 3 or arr.shape[2] != 3:
            raise ImageConversionError(
                f'{enc.value} needs an RGB [h, w, 3] array, got shape {arr.shape}')
        channels = arr[:, :, ::-1] if enc in (Encoding.BGR8, Encoding.BGRA8) else arr
        if enc in (Encoding.RGBA8, Encoding.BGRA8):
            alpha = np.full(arr.shape[:2] + (1,), 255, dtype=np.uint8)
            channels = np.concatenate([channels, alpha], axis=2)
        pixels = channels
    height, width = pixels.shape[:2]
    if not (0 < height <= MAX_IMAGE_SIDE and 0 < width <= MAX_IMAGE_SIDE):
        raise ImageConversionError(
            f'image {width}x{height} (width x height) not within 1..{MAX_IMAGE_SIDE} px')
    if row_padding < 0:
        raise ImageConversionError(f'row_padding must be >= 0, got {row_padding}')
    row_bytes = width * enc.channels
    rows = np.zeros((height, row_bytes + row_padding), dtype=np.uint8)
    rows[:, :row_bytes] = pixels.reshape(height, row_bytes)
    msg = Image()
    msg.header = Header(stamp=_as_stamp(stamp), frame_id=frame_id)
    msg.height, msg.width = height, width
    msg.encoding = enc.value
    msg.is_bigendian = 0
    msg.step = row_bytes + row_padding
    msg.data = rows.tobytes()
    return msg


def _as_stamp(stamp: Time | int) -> Time:
    return stamp if isinstance(stamp, Time) else ns_to_stamp(stamp)


# --------------------------------------------------------------------------------------------
# Joint states and trajectories


def joint_state_to_vector(msg: JointState, joint_names: Sequence[str]) -> np.ndarray:
    """
    Return the positions of ``joint_names`` from a ``sensor_msgs/JointState``, by name.

    The message may list more joints than asked for, in any order; only the requested ones
    are checked for finiteness.

    :param msg: the joint state.
    :param joint_names: the joint order of the robot state vector (parameter ``joint_names``).
    :returns: ``float32 [len(joint_names)]`` positions in message units (rad or m).
    :raises JointStateError: an array longer than ``MAX_JOINT_STATE_LENGTH``, ``name`` and
        ``position`` lengths differ, a name repeats in the message, requested joints are
        missing (all listed), or their positions are NaN/Inf (all listed).
    """
    lengths = {field: len(getattr(msg, field)) for field in ('name', 'position', 'velocity',
                                                             'effort')}
    longest = max(lengths, key=lengths.get)
    if lengths[longest] > MAX_JOINT_STATE_LENGTH:
        raise JointStateError(f'JointState {longest} has {lengths[longest]} entries, more than '
                              f'{MAX_JOINT_STATE_LENGTH}')
    names = list(msg.name)
    positions = np.asarray(msg.position, dtype=np.float64)
    if len(names) != positions.shape[0]:
        raise JointStateError(
            f'JointState has {len(names)} names but {positions.shape[0]} positions')
    index = {}
    for i, name in enumerate(names):
        if name in index:
            raise JointStateError(f'JointState lists joint {name!r} twice')
        index[name] = i
    missing = [name for name in joint_names if name not in index]
    if missing:
        raise JointStateError(
            f'JointState lacks joints {missing}; it has {names}')
    out = positions[[index[name] for name in joint_names]]
    bad = [name for name, value in zip(joint_names, out) if not math.isfinite(value)]
    if bad:
        raise JointStateError(f'JointState has non-finite positions for joints {bad}')
    return out.astype(np.float32)


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
    error adds up over the horizon (architecture.md §4). ``~/action_chunk`` carries joint
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
    msg.header = Header(stamp=_as_stamp(stamp), frame_id=frame_id)
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


def trajectory_to_actions(msg: JointTrajectory, field: str = 'positions') -> np.ndarray:
    """
    Return the positions (or another per-point field) of a ``JointTrajectory`` as an array.

    :param field: ``positions``, ``velocities``, ``accelerations`` or ``effort``.
    :returns: ``float64 [H, A]`` in the message's joint order.
    :raises ValueError: if a point's ``field`` does not match ``joint_names`` in length.
    """
    width = len(msg.joint_names)
    rows = []
    for i, point in enumerate(msg.points):
        values = getattr(point, field)
        if len(values) != width:
            raise ValueError(f'point {i} has {len(values)} {field} for {width} joint names')
        rows.append(np.asarray(values, dtype=np.float64))
    return np.stack(rows) if rows else np.zeros((0, width))


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
    msg.header = Header(stamp=_as_stamp(stamp), frame_id=frame_id)
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


__all__ = [
    'Encoding', 'ImageConversionError', 'JointStateError', 'MAX_IMAGE_SIDE', 'NS_PER_S',
    'SUPPORTED_ENCODINGS', 'actions_to_trajectory', 'axis_angle_to_quaternion',
    'duration_to_ns', 'ee_deltas_to_multidof', 'image_to_rgb',
    'joint_state_to_vector', 'ns_to_duration', 'ns_to_stamp', 'rgb_to_image', 'stamp_to_ns',
    'trajectory_to_actions',
]
