"""Action semantics: integration of velocities, limits and their counts, end-effector deltas."""

import math

import numpy as np
from oxygen_ros.config import ActionSpace
from oxygen_ros.control.action_space import (
    ActionSemantics, ClipCount, EeDeltaCommand, JointCommand, JointLimits)
import pytest

INF = math.inf


def test_joint_velocity_integrates_from_the_observed_state():
    # DROID layout: 2 arm joints (velocities) + a gripper position; state = [q1, q2, g].
    sem = ActionSemantics(ActionSpace.JOINT_VELOCITY, 3, gripper_dims=(2,), action_dt=0.5,
                          velocity_scale=2.0)
    actions = np.array([[0.1, -0.2, 0.3], [0.2, 0.0, 0.5], [-0.1, 0.1, 0.5]])
    cmd = sem.command(actions, state=np.array([1.0, -1.0, 0.0]))
    assert isinstance(cmd, JointCommand)
    v = actions[:, :2] * 2.0  # rad/s
    np.testing.assert_allclose(cmd.velocities[:, :2], v)
    # p_0 = q, p_{i+1} = p_i + v_i dt: the positions are positions, never the velocities
    np.testing.assert_allclose(cmd.positions[:, :2], [[1.0, -1.0], [1.1, -1.2], [1.3, -1.2]])
    np.testing.assert_allclose(cmd.positions[:, 2], [0.3, 0.5, 0.5])  # gripper: as commanded
    np.testing.assert_allclose(cmd.velocities[:, 2], [0.4, 0.0, 0.0])  # its finite differences
    assert cmd.clips == ClipCount()


def test_joint_velocity_limits_scale_the_arm_velocity_and_stop_at_position_limits():
    limits = JointLimits(lower=[-INF, -0.04, 0.0], upper=[INF, INF, 1.0],
                         velocity=[1.0, 0.5, INF])
    sem = ActionSemantics(ActionSpace.JOINT_VELOCITY, 3, gripper_dims=(2,), limits=limits,
                          action_dt=0.1)
    actions = np.array([[2.0, 0.5, 1.5],     # joint 0 at twice its limit: the step is halved
                        [0.5, -0.25, 0.2],   # within limits
                        [0.0, -0.5, 0.2]])   # joint 1 would pass its lower limit -0.04
    cmd = sem.command(actions, state=np.zeros(3))
    np.testing.assert_allclose(cmd.velocities[0, :2], [1.0, 0.25])  # direction kept
    np.testing.assert_allclose(cmd.positions[:, 0], [0.0, 0.1, 0.15])
    np.testing.assert_allclose(cmd.positions[:, 1], [0.0, 0.025, 0.0])
    # the last step can only reach the limit: velocity -0.04 / 0.1 s, not -0.5
    np.testing.assert_allclose(cmd.velocities[2, 1], -0.4)
    np.testing.assert_allclose(cmd.positions[:, 2], [1.0, 0.2, 0.2])  # gripper clipped to 1
    assert cmd.clips == ClipCount(position=2, velocity=1, dims=(0, 1, 2))


def test_joint_velocity_never_leaves_a_limit_it_started_beyond_further():
    limits = JointLimits(lower=[-1.0], upper=[1.0], velocity=[INF])
    sem = ActionSemantics(ActionSpace.JOINT_VELOCITY, 1, limits=limits, action_dt=0.1)
    cmd = sem.command(np.array([[1.0], [-1.0]]), state=np.array([1.5]))  # observed beyond
    np.testing.assert_allclose(cmd.positions[:, 0], [1.5, 1.5])  # no further out, no jump
    np.testing.assert_allclose(cmd.velocities[:, 0], [0.0, -1.0])


def test_joint_positions_are_clipped_and_rate_limited_from_the_observed_state():
    limits = JointLimits(lower=[-1.0, -INF], upper=[1.0, INF], velocity=[1.0, INF])
    sem = ActionSemantics(ActionSpace.JOINT_POSITION, 2, limits=limits, action_dt=0.1)
    cmd = sem.command(np.array([[0.5, 3.0], [2.0, -3.0]]), state=np.array([0.0, 0.0]))
    assert cmd.velocities is None
    # joint 0: 0.0 -> 0.5 limited to a 0.1 step; 2.0 -> clipped to 1.0, then a 0.1 step
    np.testing.assert_allclose(cmd.positions[:, 0], [0.1, 0.2])
    np.testing.assert_allclose(cmd.positions[:, 1], [3.0, -3.0])  # unlimited joint
    assert cmd.clips == ClipCount(position=1, velocity=2, dims=(0,))


def test_joint_positions_without_a_state_entry_start_unconstrained():
    limits = JointLimits(lower=[-INF], upper=[INF], velocity=[1.0])
    sem = ActionSemantics(ActionSpace.JOINT_POSITION, 1, limits=limits, action_dt=0.1,
                          state_index=[-1])
    cmd = sem.command(np.array([[5.0], [6.0]]), state=np.array([0.0]))
    np.testing.assert_allclose(cmd.positions[:, 0], [5.0, 5.1])
    assert cmd.clips == ClipCount(velocity=1, dims=(0,))


def test_ee_deltas_are_scaled_to_si_units_and_clipped_to_the_input_range():
    limits = JointLimits(lower=[-1.0] * 7, upper=[1.0] * 7, velocity=[INF] * 7)
    sem = ActionSemantics(ActionSpace.EE_DELTA, 7, gripper_dims=(6,), limits=limits,
                          action_dt=0.05, ee_scale=(0.05, 0.5))
    actions = np.array([[0.2, -0.4, 2.0, 0.1, 0.0, -1.0, -1.0],
                        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
    cmd = sem.command(actions)
    assert isinstance(cmd, EeDeltaCommand)
    np.testing.assert_allclose(cmd.translations, [[0.01, -0.02, 0.05], [0, 0, 0]])
    np.testing.assert_allclose(cmd.rotations, [[0.05, 0.0, -0.5], [0, 0, 0]])
    np.testing.assert_allclose(cmd.grippers, [[-1.0], [1.0]])
    assert cmd.clips == ClipCount(position=1, dims=(2,))


def test_ee_delta_speed_limits_apply_to_scaled_deltas():
    limits = JointLimits(lower=[-INF] * 6, upper=[INF] * 6, velocity=[0.5] * 3 + [INF] * 3)
    sem = ActionSemantics(ActionSpace.EE_DELTA, 6, limits=limits, action_dt=0.1,
                          ee_scale=(0.1, 1.0))
    cmd = sem.command(np.array([[1.0, 0.2, 0.0, 3.0, 0.0, 0.0]]))
    np.testing.assert_allclose(cmd.translations, [[0.05, 0.02, 0.0]])  # 0.5 m/s * 0.1 s
    np.testing.assert_allclose(cmd.rotations, [[3.0, 0.0, 0.0]])
    assert cmd.grippers.shape == (1, 0)
    assert cmd.clips == ClipCount(velocity=1, dims=(0,))


@pytest.mark.parametrize(('kwargs', 'pattern'), [
    ({'space': ActionSpace.JOINT_VELOCITY, 'num_dims': 2, 'state_index': [0, -1]},
     r'joint-velocity action dims \[1\] have no joint in the observed state'),
    ({'space': ActionSpace.EE_DELTA, 'num_dims': 7},
     'ee_delta actions are 6 delta dims followed by the grippers'),
    ({'space': ActionSpace.EE_DELTA, 'num_dims': 7, 'gripper_dims': (0,)},
     'ee_delta actions are 6 delta dims'),
    ({'space': ActionSpace.JOINT_POSITION, 'num_dims': 2, 'gripper_dims': (2,)},
     r'gripper dims \(2,\) not in 0..1'),
    ({'space': ActionSpace.JOINT_POSITION, 'num_dims': 2, 'action_dt': 0.0},
     'action_dt must be a positive number'),
    ({'space': ActionSpace.JOINT_POSITION, 'num_dims': 2,
      'limits': JointLimits.unlimited(3)}, 'limits have 3 dims, the actions 2'),
])
def test_semantics_refuse_what_they_cannot_carry(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        ActionSemantics(**kwargs)


@pytest.mark.parametrize(('lower', 'upper', 'velocity', 'pattern'), [
    ([0.0], [1.0, 2.0], [1.0], 'one value per action dim'),
    ([2.0], [1.0], [1.0], r'lower > upper position limit at dims \[0\]'),
    ([0.0], [1.0], [0.0], 'velocity limits must be > 0'),
    ([math.nan], [1.0], [1.0], 'lower limits hold NaN'),
])
def test_limits_are_checked(lower, upper, velocity, pattern):
    with pytest.raises(ValueError, match=pattern):
        JointLimits(lower, upper, velocity)


def test_commands_refuse_bad_chunks():
    sem = ActionSemantics(ActionSpace.JOINT_VELOCITY, 2, action_dt=0.1)
    with pytest.raises(ValueError, match='needs the observed state'):
        sem.command(np.zeros((3, 2)))
    with pytest.raises(ValueError, match='NaN/Inf'):
        sem.command(np.array([[math.nan, 0.0]]), state=np.zeros(2))
    with pytest.raises(ValueError, match=r'must be \[H, 2\]'):
        sem.command(np.zeros((3, 3)), state=np.zeros(2))
    with pytest.raises(ValueError, match='observed state holds NaN/Inf'):
        sem.command(np.zeros((3, 2)), state=np.array([0.0, math.inf]))


def test_limits_compare_by_value():
    assert JointLimits([0.0], [1.0], [2.0]) == JointLimits(np.zeros(1), [1], (2.0,))
    assert JointLimits.unlimited(2).num_dims == 2
