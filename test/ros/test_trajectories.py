"""Action chunks <-> JointTrajectory (oxygen_ros.ros.trajectories); pure, no DDS."""

from builtin_interfaces.msg import Duration, Time
import numpy as np
from oxygen_ros.control.trajectory_msg import trajectory_from_msg
from oxygen_ros.ros.stamps import duration_to_ns, stamp_to_ns
from oxygen_ros.ros.trajectories import actions_to_trajectory
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from trajectory_msgs.msg import JointTrajectory

RNG = np.random.default_rng(0)
STAMP_NS = 1_700_000_123_456_789_012
NAMES = ['joint_1', 'joint_2', 'gripper']


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
    np.testing.assert_array_equal(trajectory_from_msg(msg).positions, actions.astype(np.float64))


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
