"""Message <-> numpy conversions (oxygen_ros.ros.convert); pure, no DDS."""

from builtin_interfaces.msg import Duration, Time
import numpy as np
from oxygen_ros.ros.convert import (
    actions_to_trajectory, duration_to_ns, Encoding, image_to_rgb, ImageConversionError,
    joint_state_to_vector, JointStateError, MAX_IMAGE_SIDE, ns_to_duration, ns_to_stamp,
    rgb_to_image, stamp_to_ns, SUPPORTED_ENCODINGS, trajectory_to_actions)
from oxygen_ros.ros.input_limits import MAX_JOINT_STATE_LENGTH
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import Image, JointState
from trajectory_msgs.msg import JointTrajectory

RNG = np.random.default_rng(0)
RGB = RNG.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
STAMP_NS = 1_700_000_123_456_789_012


def _raw_image(encoding, height, width, step, data):
    msg = Image()
    msg.encoding, msg.height, msg.width, msg.step = encoding, height, width, step
    msg.data = bytes(data)
    return msg


# ------------------------------------------------------------------------------------ stamps

def test_stamp_round_trip_is_exact():
    stamp = ns_to_stamp(STAMP_NS)
    assert (stamp.sec, stamp.nanosec) == (1_700_000_123, 456_789_012)
    assert stamp_to_ns(stamp) == STAMP_NS
    assert stamp_to_ns(ns_to_stamp(0)) == 0
    assert stamp_to_ns(ns_to_stamp(np.int64(5))) == 5


@pytest.mark.parametrize('bad', [-1, 2**31 * 10**9, 1.5, True, '3'])
def test_ns_to_stamp_rejects(bad):
    with pytest.raises(ValueError, match='stamp'):
        ns_to_stamp(bad)


def test_stamp_to_ns_rejects_bad_nanosec():
    with pytest.raises(ValueError, match='nanosec 1000000000 not in'):
        stamp_to_ns(Time(sec=1, nanosec=10**9))


def test_duration_round_trip():
    assert duration_to_ns(ns_to_duration(2_500_000_001)) == 2_500_000_001
    assert (ns_to_duration(2_500_000_001).sec, ns_to_duration(2_500_000_001).nanosec) == (
        2, 500_000_001)
    with pytest.raises(ValueError, match='duration -1 ns out of range'):
        ns_to_duration(-1)


# ------------------------------------------------------------------------------------ images

@pytest.mark.parametrize('encoding', SUPPORTED_ENCODINGS)
@pytest.mark.parametrize('padding', [0, 3])
def test_image_round_trip_each_encoding(encoding, padding):
    src = RGB[:, :, 0] if encoding == 'mono8' else RGB
    msg = rgb_to_image(src, STAMP_NS, 'cam', encoding, row_padding=padding)
    channels = Encoding(encoding).channels
    assert (msg.height, msg.width, msg.encoding) == (5, 7, encoding)
    assert msg.step == 7 * channels + padding
    assert len(msg.data) == msg.step * 5
    assert stamp_to_ns(msg.header.stamp) == STAMP_NS and msg.header.frame_id == 'cam'
    # Survives CDR serialization (what goes over DDS and into bags).
    msg = deserialize_message(serialize_message(msg), Image)
    out = image_to_rgb(msg)
    assert out.dtype == np.uint8 and out.shape == (5, 7, 3)
    expected = np.repeat(src[:, :, None], 3, axis=2) if encoding == 'mono8' else RGB
    np.testing.assert_array_equal(out, expected)
    assert not out.flags.writeable


def test_bytes_layout_per_encoding():
    pixel = np.array([[[10, 20, 30]]], dtype=np.uint8)
    layouts = {'rgb8': [10, 20, 30], 'bgr8': [30, 20, 10], 'rgba8': [10, 20, 30, 255],
               'bgra8': [30, 20, 10, 255]}
    for encoding, expected in layouts.items():
        assert list(rgb_to_image(pixel, 0, '', encoding).data) == expected, encoding
    assert list(rgb_to_image(np.array([[7]], np.uint8), 0, '', 'mono8').data) == [7]


def test_decode_handwritten_padded_bgra():
    # 2x2 bgra8, step 10 (2 bytes of padding per row filled with junk).
    data = [1, 2, 3, 4, 5, 6, 7, 8, 99, 99,
            9, 10, 11, 12, 13, 14, 15, 16, 99, 99]
    out = image_to_rgb(_raw_image('bgra8', 2, 2, 10, data))
    np.testing.assert_array_equal(
        out, [[[3, 2, 1], [7, 6, 5]], [[11, 10, 9], [15, 14, 13]]])


def test_decode_mono_replicates_and_skips_padding():
    out = image_to_rgb(_raw_image('mono8', 2, 3, 4, [1, 2, 3, 0, 4, 5, 6, 0]))
    np.testing.assert_array_equal(out[:, :, 0], [[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(out[:, :, 0], out[:, :, 2])


def test_rgb8_is_zero_copy_view():
    msg = rgb_to_image(RGB, 0, '')
    out = image_to_rgb(msg)
    assert np.shares_memory(out, np.frombuffer(msg.data, np.uint8))


def test_extra_trailing_data_is_ignored():
    msg = _raw_image('mono8', 1, 2, 2, [5, 6, 7, 8])
    np.testing.assert_array_equal(image_to_rgb(msg)[:, :, 1], [[5, 6]])


@pytest.mark.parametrize(('msg', 'pattern'), [
    (_raw_image('16UC1', 1, 1, 2, [0, 0]),
     r"unsupported image encoding '16UC1'; supported: rgb8, bgr8, mono8, rgba8, bgra8"),
    (_raw_image('RGB8', 1, 1, 3, [0, 0, 0]), "unsupported image encoding 'RGB8'"),
    (_raw_image('rgb8', 2, 2, 6, [0] * 11),
     r'rgb8 image 2x2 with step 6 needs 12 bytes, data has 11'),
    (_raw_image('rgb8', 2, 2, 5, [0] * 12), r'step 5 < width 2 \* 3 channels \(rgb8\) = 6'),
    (_raw_image('rgb8', 0, 2, 6, []), r'empty rgb8 image: 2x0'),
    (_raw_image('mono8', 3, 0, 0, []), r'empty mono8 image: 0x3'),
    (_raw_image('mono8', 1, MAX_IMAGE_SIDE + 1, MAX_IMAGE_SIDE + 1, []),
     r'image 8193x1 \(width x height\) exceeds the 8192 px limit'),
])
def test_image_to_rgb_rejects(msg, pattern):
    with pytest.raises(ImageConversionError, match=pattern):
        image_to_rgb(msg)


def test_image_errors_are_value_errors():
    assert issubclass(ImageConversionError, ValueError)
    assert issubclass(JointStateError, ValueError)


@pytest.mark.parametrize(('arr', 'encoding', 'pattern'), [
    (RGB.astype(np.float32), 'rgb8', 'must be uint8, got float32'),
    (RGB[:, :, :2], 'rgb8', r'rgb8 needs an RGB \[h, w, 3\] array, got shape \(5, 7, 2\)'),
    (RGB, 'mono8', r'mono8 needs a \[h, w\] array, got shape \(5, 7, 3\)'),
    (RGB, 'yuv422', "unsupported image encoding 'yuv422'"),
    (np.zeros((0, 4, 3), np.uint8), 'rgb8', r'image 4x0 \(width x height\) not within'),
])
def test_rgb_to_image_rejects(arr, encoding, pattern):
    with pytest.raises(ImageConversionError, match=pattern):
        rgb_to_image(arr, 0, '', encoding)


def test_rgb_to_image_accepts_time_message_and_enum():
    msg = rgb_to_image(RGB, Time(sec=3, nanosec=4), 'f', Encoding.BGR8)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec, msg.encoding) == (3, 4, 'bgr8')


# ------------------------------------------------------------------------------ joint states

NAMES = ['joint_1', 'joint_2', 'gripper']


def test_joint_state_maps_by_name_not_order():
    msg = JointState(name=['gripper', 'extra', 'joint_2', 'joint_1'],
                     position=[0.5, float('nan'), -2.0, 1.25])
    out = joint_state_to_vector(msg, NAMES)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.array([1.25, -2.0, 0.5], np.float32))


def test_joint_state_missing_names_listed():
    msg = JointState(name=['joint_2'], position=[0.0])
    with pytest.raises(JointStateError, match=r"lacks joints \['joint_1', 'gripper'\]"):
        joint_state_to_vector(msg, NAMES)


def test_joint_state_non_finite_listed():
    msg = JointState(name=NAMES, position=[float('inf'), 0.0, float('nan')])
    with pytest.raises(JointStateError,
                       match=r"non-finite positions for joints \['joint_1', 'gripper'\]"):
        joint_state_to_vector(msg, NAMES)


def test_joint_state_length_mismatch():
    msg = JointState(name=NAMES, position=[0.0, 1.0])
    with pytest.raises(JointStateError, match='has 3 names but 2 positions'):
        joint_state_to_vector(msg, NAMES)


def test_joint_state_duplicate_name():
    msg = JointState(name=['joint_1', 'joint_1'], position=[0.0, 1.0])
    with pytest.raises(JointStateError, match="lists joint 'joint_1' twice"):
        joint_state_to_vector(msg, ['joint_1'])


@pytest.mark.parametrize('field', ['name', 'position', 'velocity', 'effort'])
def test_joint_state_arrays_are_bounded(field):
    n = MAX_JOINT_STATE_LENGTH
    names = [f'j{i}' for i in range(n)]
    ok = JointState(name=names, position=[0.0] * n, velocity=[0.0] * n, effort=[0.0] * n)
    assert joint_state_to_vector(ok, ['j0', f'j{n - 1}']).shape == (2,)   # at the bound
    setattr(ok, field, [*getattr(ok, field), 'x' if field == 'name' else 0.0])
    with pytest.raises(JointStateError) as err:
        joint_state_to_vector(ok, ['j0'])
    assert str(err.value) == f'JointState {field} has {n + 1} entries, more than {n}'


# ------------------------------------------------------------------------------ trajectories

def test_actions_to_trajectory_exact_times_and_values():
    actions = RNG.standard_normal((50, 3)).astype(np.float32)
    msg = actions_to_trajectory(actions, NAMES, STAMP_NS, 0.02, frame_id='base')
    assert stamp_to_ns(msg.header.stamp) == STAMP_NS and msg.header.frame_id == 'base'
    assert msg.joint_names == NAMES
    assert len(msg.points) == 50
    # Integer-ns arithmetic: 49 * 0.02 s is exactly 980 ms (float sums would drift).
    assert [duration_to_ns(p.time_from_start) for p in msg.points] == [
        i * 20_000_000 for i in range(50)]
    assert msg.points[49].time_from_start == Duration(sec=0, nanosec=980_000_000)
    msg = deserialize_message(serialize_message(msg), JointTrajectory)
    np.testing.assert_array_equal(trajectory_to_actions(msg), actions.astype(np.float64))


def test_actions_to_trajectory_long_horizon_crosses_seconds():
    msg = actions_to_trajectory(np.zeros((4, 1)), ['a'], Time(sec=1, nanosec=2), 0.7)
    assert [(p.time_from_start.sec, p.time_from_start.nanosec) for p in msg.points] == [
        (0, 0), (0, 700_000_000), (1, 400_000_000), (2, 100_000_000)]
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec) == (1, 2)


def test_actions_to_trajectory_rounds_dt_to_nearest_ns():
    msg = actions_to_trajectory(np.zeros((16, 1)), ['a'], 0, 1 / 15)
    assert duration_to_ns(msg.points[1].time_from_start) == 66_666_667
    assert duration_to_ns(msg.points[15].time_from_start) == 15 * 66_666_667


@pytest.mark.parametrize(('actions', 'names', 'dt', 'pattern'), [
    (np.zeros(3), NAMES, 0.1, r'must be \[H, A\] with H >= 1, got shape \(3,\)'),
    (np.zeros((0, 3)), NAMES, 0.1, r'got shape \(0, 3\)'),
    (np.zeros((2, 2)), NAMES, 0.1, 'positions have 2 dims but 3 joint names'),
    (np.zeros((2, 2)), ['a', 'a'], 0.1, r"joint names repeat: \['a', 'a'\]"),
    (np.array([[0.0, 1.0, 2.0], [0.0, np.nan, 0.0]]), NAMES, 0.1,
     "NaN/Inf, first at step 1 joint 'joint_2'"),
    (np.array([[np.inf, 0.0, 0.0]]), NAMES, 0.1, "first at step 0 joint 'joint_1'"),
    (np.zeros((1, 3)), NAMES, 0.0, 'action_dt must be a positive number of seconds, got 0.0'),
    (np.zeros((1, 3)), NAMES, float('nan'), 'action_dt must be a positive'),
    (np.zeros((1, 3)), NAMES, True, 'action_dt must be a positive'),
    (np.zeros((1, 3)), NAMES, 1e-12, 'below 1 ns'),
    (np.array([['a', 'b', 'c']]), NAMES, 0.1, 'must be real numbers'),
])
def test_actions_to_trajectory_rejects(actions, names, dt, pattern):
    with pytest.raises(ValueError, match=pattern):
        actions_to_trajectory(actions, names, 0, dt)
