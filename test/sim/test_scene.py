"""The simulated scene: model composition, servos and gripper mapping, cameras, limits."""

from pathlib import Path

import mujoco
import numpy as np
from oxygen_ros.sim.assets import panda_dir
from oxygen_ros.sim.params import FRANKA_VELOCITY_LIMITS, GRIPPER_VELOCITY_LIMIT, SimConfig
from oxygen_ros.sim.physics import gripper_to_ctrl, PandaPhysics
from oxygen_ros.sim.render import CameraRenderer
from oxygen_ros.sim.scene import (
    ARM_JOINTS, BASE_CAMERA, build_model, look_at, PANDA_PREFIX, SceneConfig, WRIST_CAMERA)
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope='module')
def model():
    return build_model(panda_dir())


def test_scene_holds_the_panda_table_cup_and_two_cameras(model):
    joints = {model.joint(i).name for i in range(model.njnt)}
    assert {PANDA_PREFIX + j for j in ARM_JOINTS} <= joints and 'cup_free' in joints
    assert model.nu == 8 and model.opt.timestep == pytest.approx(0.002)
    assert [model.camera(i).name for i in range(model.ncam)] == [BASE_CAMERA, WRIST_CAMERA]
    assert model.body(model.camera(WRIST_CAMERA).bodyid[0]).name == PANDA_PREFIX + 'hand'
    assert model.vis.quality.shadowsize == 0 and model.vis.quality.offsamples == 0
    assert (model.vis.global_.offwidth, model.vis.global_.offheight) == (224, 224)


def test_home_pose_servos_hold_and_track(model):
    physics = PandaPhysics(model)
    home = physics.arm_positions()
    assert home == pytest.approx([0, 0, 0, -1.57079, 0, 1.57079, -0.7853])
    physics.set_command(home, 0.0)
    physics.step(500)  # 1 s
    assert physics.time_ns == 1_000_000_000
    assert np.abs(physics.arm_positions() - home).max() < 0.02  # servos hold under gravity
    target = home + np.array([0.3, 0.2, 0.0, 0.3, 0.0, 0.0, 0.0])
    physics.set_command(target, 0.0)
    physics.step(1000)
    assert np.abs(physics.arm_positions() - target).max() < 0.02


def test_gripper_zero_is_open_and_one_is_closed(model):
    assert gripper_to_ctrl(0.0) == 255.0 and gripper_to_ctrl(1.0) == 0.0
    assert gripper_to_ctrl(1.7) == 0.0 and gripper_to_ctrl(-1.0) == 255.0  # clipped
    physics = PandaPhysics(model)
    arm = physics.arm_positions()
    physics.set_command(arm, 1.0)
    physics.step(500)
    assert physics.finger_positions().max() < 0.002 and physics.gripper_position() > 0.95
    physics.set_command(arm, 0.0)
    physics.step(500)
    assert physics.finger_positions().min() > 0.038 and physics.gripper_position() < 0.05


def test_cameras_render_224_rgb(model):
    physics = PandaPhysics(model)
    renderer = CameraRenderer(model, 224)
    try:
        base = renderer.render(physics.data, BASE_CAMERA)
        wrist = renderer.render(physics.data, WRIST_CAMERA)
    finally:
        renderer.close()
    for image in (base, wrist):
        assert image.shape == (224, 224, 3) and image.dtype == np.uint8
        assert image.std() > 10  # a scene, not a blank buffer
    cup = (base[..., 0] > 150) & (base[..., 1] < 60) & (base[..., 2] < 60)
    assert cup.sum() > 20  # the red cup is in the base camera's view


def test_look_at_points_the_camera_at_the_target():
    xyaxes = np.array(look_at(np.array([1.0, 0.0, 0.0]), np.array([0.0, 0.0, 0.0])))
    x, y = xyaxes[:3], xyaxes[3:]
    assert np.cross(x, y) == pytest.approx([1.0, 0.0, 0.0])  # camera z points back, -z looks
    assert y == pytest.approx([0.0, 0.0, 1.0])


def test_node_params_file_limits_are_the_models_and_the_sims(model):
    params = yaml.safe_load((ROOT / 'config' / 'sim.yaml').read_text())['/**']['ros__parameters']
    ranges = np.array([model.joint(PANDA_PREFIX + j).range for j in ARM_JOINTS])
    assert params['position_limits_lower'] == [*ranges[:, 0].tolist(), 0.0]
    assert params['position_limits_upper'] == [*ranges[:, 1].tolist(), 1.0]
    assert params['velocity_limits'] == [*FRANKA_VELOCITY_LIMITS, GRIPPER_VELOCITY_LIMIT]
    assert tuple(params['velocity_limits']) == SimConfig().velocity_limits
    assert params['joint_names'] == params['action_joint_names'] == [*ARM_JOINTS, 'gripper']
    assert params['use_sim_time'] is True and params['action_space'] == 'joint_velocity'


def test_scene_config_is_checked():
    with pytest.raises(ValueError, match='image_size must be in'):
        SceneConfig(image_size=8)
    with pytest.raises(ValueError, match='velocity_limits must be 8 positive numbers'):
        SimConfig(velocity_limits=(1.0,) * 7)


def test_mujoco_is_the_pinned_major():
    assert mujoco.__version__.split('.')[0] == '4'
