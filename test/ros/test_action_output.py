"""Each action space lands in the message fields that mean it; limits clip; params check it."""

import math

import numpy as np
from oxygen_ros.config import ActionSpace
from oxygen_ros.control.action_space import ClipCount
from oxygen_ros.control.trajectory_msg import trajectory_from_msg
from oxygen_ros.engine.outputs import ActionChunk
from oxygen_ros.resources import config_file
from oxygen_ros.ros.action_output import ACTION_CHUNK, ChunkOutput, EE_DELTA_CHUNK
from oxygen_ros.ros.node_config import build_configs
from oxygen_ros.ros.param_spec import ParameterError
from oxygen_ros.ros.trajectories import axis_angle_to_quaternion
import pytest
from trajectory_msgs.msg import JointTrajectory, MultiDOFJointTrajectory
import yaml

STAMP = 1_700_000_000_123_456_789


def params(name, **overrides):
    values = yaml.safe_load(config_file(name).read_text())['/**']['ros__parameters']
    values.update(overrides)
    return build_configs(values)[1]


def test_droid_chunks_carry_positions_in_positions_and_velocities_in_velocities():
    cfg = params('pi05_droid')
    assert cfg.action_space is ActionSpace.JOINT_VELOCITY and cfg.gripper_dims == (7,)
    out = ChunkOutput(cfg)
    assert out.publisher_keys == (ACTION_CHUNK,)
    state = np.array([0.1, -0.3, 0.2, -2.0, 0.0, 1.5, 0.4, 0.25])
    row = np.array([0.1, 0.2, -0.1, 0.0, 0.3, -0.2, 0.1, 0.7], np.float32)
    actions = np.tile(row, (15, 1))
    [(key, msg)] = out.messages(ActionChunk(actions, STAMP, 3, state)).messages
    assert key == ACTION_CHUNK and isinstance(msg, JointTrajectory)
    positions = trajectory_from_msg(msg).positions
    velocities = trajectory_from_msg(msg).velocities
    dt = 0.0666666667
    np.testing.assert_allclose(velocities[:, :7], 3.0 * actions[:, :7], rtol=1e-6)
    np.testing.assert_allclose(positions[:, :7], state[:7] + 3.0 * actions[0, :7] * dt *
                               np.arange(15)[:, None], rtol=1e-6, atol=1e-7)
    assert not np.allclose(positions[:, :7], actions[:, :7])  # the old bug: velocities as angle
    np.testing.assert_allclose(positions[:, 7], 0.7, rtol=1e-6)  # the gripper is a position
    assert msg.header.stamp.sec == STAMP // 10**9 and msg.header.stamp.nanosec == 123_456_789
    assert [p.time_from_start.nanosec for p in msg.points[:3]] == [0, 66_666_667, 133_333_334]


def test_droid_limits_clip_and_count():
    cfg = params('pi05_droid')
    state = np.array([2.85, 0.0, 0.0, -1.0, 0.0, 1.0, 0.0, 0.5])
    actions = np.zeros((15, 8), np.float32)
    actions[:, 0] = 1.0  # 3 rad/s: above joint_1's 2.175 rad/s, and into its 2.8973 limit
    actions[:, 7] = 1.5  # gripper beyond 1.0
    messages = ChunkOutput(cfg).messages(ActionChunk(actions, STAMP, 0, state))
    positions = trajectory_from_msg(messages.messages[0][1]).positions
    velocities = trajectory_from_msg(messages.messages[0][1]).velocities
    assert positions[:, 0].max() == pytest.approx(2.8973)
    assert np.abs(velocities[:, 0]).max() <= 2.175 + 1e-9
    np.testing.assert_allclose(positions[:, 7], 1.0)
    assert messages.clips.velocity == 15 and messages.clips.position >= 1 + 15
    assert messages.clips.dims == (0, 7)


def test_libero_chunks_go_to_a_multidof_trajectory_and_the_gripper_to_the_joint_one():
    cfg = params('pi05_libero')
    out = ChunkOutput(cfg)
    assert out.publisher_keys == (ACTION_CHUNK, EE_DELTA_CHUNK)
    actions = np.zeros((10, 7), np.float32)
    actions[:, 0] = 0.5
    actions[:, 5] = -2.0  # outside OSC's input range: clipped to -1
    actions[:, 6] = 1.0
    messages = out.messages(ActionChunk(actions, STAMP, 0, np.zeros(8)))
    (k1, grip), (k2, ee) = messages.messages
    assert (k1, k2) == (ACTION_CHUNK, EE_DELTA_CHUNK)
    assert list(grip.joint_names) == ['gripper']
    np.testing.assert_allclose(trajectory_from_msg(grip).positions, 1.0)
    assert isinstance(ee, MultiDOFJointTrajectory) and list(ee.joint_names) == ['end_effector']
    assert ee.header.frame_id == 'world' and len(ee.points) == 10
    tf = ee.points[1].transforms[0]
    assert (tf.translation.x, tf.translation.y, tf.translation.z) == pytest.approx((0.025, 0, 0))
    want = axis_angle_to_quaternion(np.array([0.0, 0.0, -0.5]))
    assert (tf.rotation.x, tf.rotation.y, tf.rotation.z, tf.rotation.w) == pytest.approx(
        tuple(want))
    assert ee.points[1].time_from_start.nanosec == 50_000_000
    assert messages.clips == ClipCount(position=10, dims=(5,))


def test_aloha_and_demo_chunks_are_positions_only():
    for name in ('pi05_base', 'demo'):
        cfg = params(name)
        assert cfg.action_space is ActionSpace.JOINT_POSITION
        n = len(cfg.action_joint_names)
        actions = np.full((4, n), 0.3, np.float32)
        [(key, msg)] = ChunkOutput(cfg).messages(
            ActionChunk(actions, STAMP, 0, np.zeros(len(cfg.joint_names)))).messages
        np.testing.assert_allclose(trajectory_from_msg(msg).positions, 0.3, rtol=1e-6)
        assert all(len(p.velocities) == 0 for p in msg.points)


def test_quaternions_of_axis_angle_rotations():
    q = axis_angle_to_quaternion(np.array([[0.0, 0.0, 0.0], [math.pi, 0.0, 0.0],
                                           [0.0, math.pi / 2, 0.0], [1e-9, 0.0, 0.0]]))
    np.testing.assert_allclose(q[0], [0, 0, 0, 1])
    np.testing.assert_allclose(q[1], [1, 0, 0, 0], atol=1e-12)
    np.testing.assert_allclose(q[2], [0, math.sin(math.pi / 4), 0, math.cos(math.pi / 4)])
    np.testing.assert_allclose(q[3], [5e-10, 0, 0, 1])
    np.testing.assert_allclose(np.linalg.norm(q, axis=-1), 1.0)


@pytest.mark.parametrize(('overrides', 'pattern'), [
    ({'action_space': 'torque'}, "action_space must be '' or one of"),
    ({'velocity_limits': [1.0] * 3}, r'velocity_limits needs one value per action joint \(8\)'),
    ({'position_limits_lower': [0.0] * 8, 'position_limits_upper': [-1.0] * 8},
     'limits: lower > upper'),
    ({'action_joint_names': ['joint_1', 'joint_2', 'joint_3', 'joint_4', 'joint_5',
                             'joint_6', 'other', 'gripper']},
     r'joint-velocity action dims \[6\] have no joint in the observed state'),
    ({'action_space': 'ee_delta'}, 'ee_delta actions are 6 delta dims followed by'),
    ({'end_effector_name': ''}, 'end_effector_name must not be empty'),
])
def test_parameters_that_cannot_carry_the_action_space_are_refused(overrides, pattern):
    with pytest.raises(ParameterError, match=pattern):
        params('pi05_droid', **overrides)
