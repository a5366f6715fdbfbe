"""openpi's robot transforms: ALOHA's flips, gripper maps and absolute actions; pass-through."""

import numpy as np
from oxygen_ros.config import get_preset
from oxygen_ros.policies import aloha, preset_robot
from oxygen_ros.policies.aloha import ALOHA, AlohaPolicy
from oxygen_ros.transforms.norm_stats import NormStats
from oxygen_ros.transforms.normalize import Normalizer
import pytest

# Values worked out by hand from openpi's aloha_policy.py constants (see the module docstring):
# linear 0.5 -> x = 0.03822 m -> asin(0.385786) = 0.396059 rad -> (0.396059 - 0.5476) / 1.082
GRIPPER_TO_ANGULAR_HALF = -0.1400559217021429
# (0.0 + 0.5476 + 0.6213) / (1.4910 + 0.6213) and the same for 0.25
GRIPPER_FROM_ANGULAR = {0.0: 0.5533778345878898, 0.25: 0.6717322350044973}


def test_aloha_gripper_maps_match_openpi_constants():
    assert aloha.aloha_gripper_to_angular(np.array(0.5)) == \
        pytest.approx(GRIPPER_TO_ANGULAR_HALF, abs=1e-12)
    for value, want in GRIPPER_FROM_ANGULAR.items():
        assert aloha.aloha_gripper_from_angular(np.array(value)) == \
            pytest.approx(want, abs=1e-12)


def test_aloha_state_is_flipped_and_its_grippers_mapped():
    state = np.arange(1, 15, dtype=np.float64) / 10
    state[[6, 13]] = 0.5
    out = ALOHA.state_to_model(state)
    flip = [1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1]
    joints = [i for i in range(14) if i not in (6, 13)]
    np.testing.assert_allclose(out[joints], (np.array(flip) * state)[joints])
    np.testing.assert_allclose(out[[6, 13]], GRIPPER_TO_ANGULAR_HALF)
    assert state[1] == 0.2  # the input is not changed


def test_aloha_actions_add_the_state_to_arm_joints_then_flip_and_map_grippers():
    model_state = np.linspace(-0.7, 0.6, 14)
    actions = np.zeros((2, 14))
    actions[1] = 0.25
    out = ALOHA.actions_to_robot(actions, model_state)
    flip = np.array([1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1])
    arm = [i for i in range(14) if i not in (6, 13)]
    for row in range(2):
        np.testing.assert_allclose(out[row, arm], (flip * (actions[row] + model_state))[arm])
    np.testing.assert_allclose(out[0, [6, 13]], GRIPPER_FROM_ANGULAR[0.0])  # absolute: no state
    np.testing.assert_allclose(out[1, [6, 13]], GRIPPER_FROM_ANGULAR[0.25])
    with pytest.raises(ValueError, match='relative to the state'):
        ALOHA.actions_to_robot(actions, None)
    with pytest.raises(ValueError, match='ALOHA needs 14 state and action dims, got 8 and 8'):
        AlohaPolicy('aloha8', ALOHA.cameras, 8, 8, ALOHA.action_space, (6,), ALOHA.prompt_format)


@pytest.mark.parametrize('robot', ['droid', 'libero', 'panda', 'test_arm'])
def test_the_other_robots_pass_state_and_actions_through(robot):
    robot = preset_robot({'droid': 'pi05_droid', 'libero': 'pi05_libero', 'panda': 'demo',
                          'test_arm': 'tiny'}[robot])
    x = np.linspace(-0.3, 0.4, robot.state_dim)
    np.testing.assert_array_equal(robot.state_to_model(x), x)
    a = np.ones((2, robot.robot_action_dim))
    np.testing.assert_array_equal(robot.actions_to_robot(a, None), a)
    np.testing.assert_array_equal(robot.actions_to_model(a, None), a)
    assert not robot.relative_actions


def _stats(dim):
    return NormStats(mean=np.zeros(dim), std=np.ones(dim), q01=-np.ones(dim), q99=np.ones(dim))


def test_pi05_base_normalizer_applies_the_aloha_transforms():
    cfg, robot = get_preset('pi05_base').model, preset_robot('pi05_base')
    assert robot is ALOHA
    norm = Normalizer.from_config(cfg, robot, {'state': _stats(14), 'actions': _stats(14)})
    state = np.full(14, 0.5)
    # identity-like stats: normalized = (x + 1) / (2 + 1e-6) * 2 - 1 of the adapted state
    adapted = ALOHA.state_to_model(state)
    np.testing.assert_allclose(norm.normalize_state(state),
                               (adapted + 1) / (2 + 1e-6) * 2 - 1)
    actions = np.zeros((3, 32))
    robot = norm.actions_to_robot(actions, state)
    unnorm = np.full((3, 14), (0 + 1) / 2 * (2 + 1e-6) - 1)
    np.testing.assert_allclose(robot, ALOHA.actions_to_robot(unnorm, adapted))
    with pytest.raises(ValueError, match=r'the aloha robot needs the frame state of shape'):
        norm.actions_to_robot(actions)


@pytest.mark.parametrize('preset', ['pi05_droid', 'pi05_libero', 'tiny'])
def test_other_presets_need_no_state_for_their_actions(preset):
    cfg, robot = get_preset(preset).model, preset_robot(preset)
    norm = Normalizer.identity(cfg, robot)
    actions = np.random.default_rng(0).normal(size=(cfg.action_horizon, 32))
    np.testing.assert_allclose(norm.actions_to_robot(actions),
                               actions[:, :robot.robot_action_dim], rtol=2e-6, atol=1e-6)


def _quantile_stats(dim, seed):
    rng = np.random.default_rng(seed)
    low = rng.uniform(-2.0, 0.0, dim)
    return NormStats(mean=np.zeros(dim), std=np.ones(dim), q01=low,
                     q99=low + rng.uniform(0.5, 3.0, dim))


def test_aloha_actions_to_model_inverts_actions_to_robot_for_the_same_state():
    norm = Normalizer.from_config(get_preset('pi05_base').model, ALOHA,
                                  {'state': _quantile_stats(14, 1),
                                   'actions': _quantile_stats(14, 2)})
    rng = np.random.default_rng(3)
    actions, state = rng.normal(size=(5, 32)), rng.uniform(0.1, 0.9, 14)
    robot = norm.actions_to_robot(actions, state)
    np.testing.assert_allclose(norm.actions_to_model(robot, state), actions[:, :14], atol=1e-12)
    assert norm.relative_actions
    # against another state: the arm joints become offsets from it (same absolute target)
    other = state + rng.normal(scale=0.2, size=14)
    rebased = np.concatenate([norm.actions_to_model(robot, other), actions[:, 14:]], 1)
    np.testing.assert_allclose(norm.actions_to_robot(rebased, other), robot, atol=1e-12)
    assert np.abs(rebased[:, :6] - actions[:, :6]).max() > 0.01   # the offsets did change
    np.testing.assert_allclose(rebased[:, [6, 13]], actions[:, [6, 13]], atol=1e-12)
    with pytest.raises(ValueError, match=r'needs the frame state of shape \(14,\)'):
        norm.actions_to_model(robot)
    with pytest.raises(ValueError, match=r'actions must have shape \[\.\.\., H, 14\]'):
        norm.actions_to_model(robot[:, :7], state)


@pytest.mark.parametrize('preset', ['pi05_droid', 'pi05_libero', 'tiny'])
def test_actions_to_model_of_absolute_velocity_and_delta_presets_is_the_plain_inverse(preset):
    cfg, arm = get_preset(preset).model, preset_robot(preset)
    norm = Normalizer.from_config(cfg, arm, {'state': _quantile_stats(arm.state_dim, 4),
                                             'actions': _quantile_stats(arm.robot_action_dim, 5)})
    assert not norm.relative_actions
    actions = np.random.default_rng(6).normal(size=(cfg.action_horizon, 32))
    robot = norm.actions_to_robot(actions)
    for state in (None, np.ones(arm.state_dim)):     # the state changes nothing
        np.testing.assert_allclose(norm.actions_to_model(robot, state),
                                   actions[:, :arm.robot_action_dim], atol=1e-12)
