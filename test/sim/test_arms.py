"""The simulator's arms by name: joint names, topics, the node's parameters, the sim's own."""

from oxygen_ros.sim.arms import (
    arm_joints, arm_names, COMMAND_JOINTS, joint_name, node_parameters, ros_args)
from oxygen_ros.sim.endpoints import arm_endpoints, arm_topic, SIM_ENDPOINTS
from oxygen_ros.sim.params import SimConfig
import pytest
import yaml


def test_arm_names_of_a_count():
    assert arm_names(1) == ('',)
    assert arm_names(2) == ('left', 'right')
    assert arm_names(3) == ('arm1', 'arm2', 'arm3')
    with pytest.raises(ValueError, match='at least 1, got 0'):
        arm_names(0)


def test_a_named_arm_prefixes_its_joints_and_the_one_arm_keeps_them():
    assert joint_name('joint1', 'left') == 'left_joint1' and joint_name('joint1', '') == 'joint1'
    assert arm_joints(COMMAND_JOINTS, '') == COMMAND_JOINTS
    assert arm_joints(COMMAND_JOINTS, 'right')[-1] == 'right_gripper'


def test_topics_of_a_named_arm_are_under_its_namespace():
    assert arm_topic('/joint_states', 'left') == '/left/joint_states'
    assert arm_topic('/oxygen/action_chunk', 'left') == '/left/oxygen/action_chunk'
    assert arm_topic('~/chunk_events', 'left') == 'left/oxygen_sim/chunk_events'
    assert arm_topic('~/chunk_events', '') == '~/chunk_events'
    one = {ep.name for ep in arm_endpoints('')}
    assert one <= {ep.name for ep in SIM_ENDPOINTS} and '/clock' not in one
    left = {ep.name for ep in arm_endpoints('left')}
    assert left == {'left/oxygen_sim/joint_command', 'left/oxygen_sim/chunk_events',
                    '/left/camera/base/image_raw', '/left/camera/left_wrist/image_raw',
                    '/left/joint_states', '/left/oxygen/action_chunk'}


def test_node_parameters_serve_every_arm_and_nothing_more_for_one():
    assert node_parameters(('',)) == {}
    params = node_parameters(('left', 'right'))
    assert params['robots'] == ['left', 'right']
    assert params['left.joint_names'] == params['left.action_joint_names'] == \
        [f'left_{j}' for j in COMMAND_JOINTS]
    assert set(params) == {'robots', 'left.joint_names', 'left.action_joint_names',
                           'right.joint_names', 'right.action_joint_names'}


def test_ros_args_write_lists_as_yaml():
    args = ros_args({'robots': ['left', 'right'], 'real_time_factor': 0.5})
    assert args == ['-p', 'robots:=[left,right]', '-p', 'real_time_factor:=0.5']
    assert yaml.safe_load(args[1].split(':=')[1]) == ['left', 'right']


def test_the_sims_robots_parameter_checks_names_as_the_nodes():
    assert SimConfig().robots == ('',)
    assert SimConfig(robots=('left', 'right')).robots == ('left', 'right')
    for bad in (('left', 'left'), ('1arm',), ('left', ''), ()):
        with pytest.raises(ValueError, match='robots must be'):
            SimConfig(robots=bad)
