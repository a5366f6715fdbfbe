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
