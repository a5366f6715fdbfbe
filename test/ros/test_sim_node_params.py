"""The simulator node's ``panda_dir`` parameter (a folder of one's own) builds the scene."""

import os

import pytest
import rclpy
from rclpy.context import Context
from rclpy.parameter import Parameter

pytestmark = pytest.mark.ros


@pytest.fixture
def sim_node_class():
    os.environ.setdefault('MUJOCO_GL', 'egl')  # before mujoco's first import (sim/render.py)
    from oxygen_ros.sim.node import SimNode
    return SimNode


@pytest.fixture
def context(ros_domain_id):
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    yield ctx
    ctx.try_shutdown()


def test_panda_dir_parameter_builds_the_scene_from_that_folder(sim_node_class, context):
    from oxygen_ros.sim.assets import default_panda_dir
    folder = default_panda_dir()
    node = sim_node_class(context=context, parameter_overrides=[
        Parameter('panda_dir', value=str(folder)), Parameter('image_size', value=64)])
    try:
        assert node.cfg.panda_dir == str(folder)
        assert node.physics.model.ncam == 2
    finally:
        node.destroy_node()


def test_a_missing_panda_dir_says_how_to_get_the_assets(sim_node_class, context, tmp_path):
    with pytest.raises(FileNotFoundError, match='oxygen_fetch sim_assets'):
        sim_node_class(context=context, parameter_overrides=[
            Parameter('panda_dir', value=str(tmp_path / 'nowhere'))])


def test_robots_parameter_builds_one_arm_per_name_on_its_topics(sim_node_class, context):
    node = sim_node_class(context=context, parameter_overrides=[
        Parameter('robots', value=['left', 'right']), Parameter('image_size', value=32)])
    try:
        assert [arm.name for arm in node.arms] == ['left', 'right']
        assert node.arms[0].physics.data is not node.arms[1].physics.data
        assert node.arms[1].chunk_topic == '/right/oxygen/action_chunk'
        assert node.arms[1].command_joints[0] == 'right_joint1'
        topics = dict(node.get_topic_names_and_types())
        assert {'/clock', '/diagnostics', '/left/joint_states', '/right/oxygen_sim/chunk_events',
                '/left/camera/base/image_raw', '/right/camera/left_wrist/image_raw'} <= set(topics)
        assert '/joint_states' not in topics
    finally:
        node.close()
        node.destroy_node()


def test_bad_arm_names_are_refused(sim_node_class, context):
    with pytest.raises(ValueError, match='robots must be'):
        sim_node_class(context=context, parameter_overrides=[
            Parameter('robots', value=['left', 'left'])])
