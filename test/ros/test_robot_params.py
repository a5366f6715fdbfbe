"""Several robots' parameters without DDS traffic: robots, their <robots>.* entries, topics."""

from oxygen_ros.resources import config_file
from oxygen_ros.ros.endpoints import node_endpoints, robot_topic
from oxygen_ros.ros.node_config import build_configs, check_update
from oxygen_ros.ros.param_handler import ParameterHandler
from oxygen_ros.ros.param_spec import OnChange, ParameterError
from oxygen_ros.ros.params import declare_parameters, parameter_values, ROBOT_PARAMETERS
import pytest
from rclpy.exceptions import InvalidParameterValueException
from rclpy.node import Node
from rclpy.parameter import Parameter

JOINTS = [f'joint_{i}' for i in range(1, 8)] + ['gripper']
RIGHT = [f'r_{i}' for i in range(1, 9)]


def test_one_robot_by_default_with_the_nodes_topics():
    engine, node = build_configs({'preset': 'tiny'})
    assert node.robots == ('',) and node.robot_names == ('',) and node.robot('') is node
    assert engine.scheduler.max_robots == 1
    assert robot_topic('~/action_chunk', '') == '~/action_chunk'
    assert robot_topic('/camera/base/image_raw', '') == '/camera/base/image_raw'
    with pytest.raises(KeyError, match="no robot 'left'"):
        node.robot('left')


def test_each_robot_has_the_nodes_values_but_those_of_its_own():
    engine, node = build_configs({
        'preset': 'tiny', 'joint_names': JOINTS, 'instruction': 'tidy up',
        'velocity_limits': [2.0] * 7, 'robots': ['left', 'right'],
        'right.joint_names': RIGHT, 'right.velocity_limits': [1.0] * 7,
        'left.instruction': 'pick up the cup'})
    assert node.robot_names == ('left', 'right') and engine.scheduler.max_robots == 2
    left, right = node.robot('left'), node.robot('right')
    assert left.joint_names == tuple(JOINTS) and left.action_joint_names == tuple(JOINTS[:7])
    assert left.instruction == 'pick up the cup' and right.instruction == 'tidy up'
    # its own joints: its actions are their first robot_action_dim, not the node's
    assert right.joint_names == tuple(RIGHT) and right.action_joint_names == tuple(RIGHT[:7])
    assert list(left.limits.velocity) == [2.0] * 7 and list(right.limits.velocity) == [1.0] * 7
    assert left.frame_id == node.frame_id and right.control_rate_hz == node.control_rate_hz
    # a robot's instruction changes while running; its joints do not
    changed = node.updated('left.instruction', 'open the drawer')
    assert changed.robot('left').instruction == 'open the drawer'
    assert changed.robot('right').instruction == 'tidy up'
    assert 'cannot change' in check_update(node, 'right.joint_names', RIGHT)
    assert 'instruction' in check_update(node, 'left.instruction', 'x' * 5000)


@pytest.mark.parametrize('values, match', [
    ({'robots': ['left', 'left']}, r"robots must be \[''\] \(one robot\) or distinct names"),
    ({'robots': ['1st']}, r"got \['1st'\]"),
    ({'robots': ['a/b']}, 'distinct names'),
    ({'robots': ['left'], 'left.joint_names': ['a', 'b']},
     'left.joint_names: preset tiny has a 8-dim state, got 2 names'),
    ({'robots': ['left'], 'left.joint_names': ['a'] * 8}, 'left.joint_names must be distinct'),
    ({'robots': ['left'], 'left.velocity_limits': [1.0]},
     'left.velocity_limits needs one value per action joint'),
])
def test_bad_robots_are_refused_naming_the_robots_parameter(values, match):
    with pytest.raises(ParameterError, match=match):
        build_configs({'preset': 'tiny', **values})


def test_each_robots_endpoints_are_under_its_namespace():
    _, node = build_configs({'preset': 'tiny', 'robots': ['left', 'right']})
    names = {e.name for e in node_endpoints(node)}
    for robot in ('left', 'right'):
        assert {f'/{robot}/camera/base/image_raw', f'/{robot}/joint_states',
                f'{robot}/oxygen/action_chunk', f'{robot}/oxygen/ask',
                f'{robot}/oxygen/instruction', f'{robot}/oxygen/answer/stream'} <= names
    assert '/diagnostics' in names and '~/action_chunk' not in names
    assert '/joint_states' not in names


def test_each_robots_parameters_are_declared_with_the_nodes_as_defaults(rclpy_context):
    node = Node('oxygen', context=rclpy_context, cli_args=[
        '--ros-args', '--params-file', str(config_file('test')),
        '-p', 'robots:=[left, right]', '-p', f'right.joint_names:={RIGHT}'.replace("'", ''),
        '-p', 'left.instruction:=pick up the cup'])
    applied = []
    try:
        handler = ParameterHandler(node, {change: lambda value, **kw: applied.append(
            (value, kw)) for change in OnChange if change is not OnChange.NEXT_CYCLE})
        for spec in ROBOT_PARAMETERS:
            for robot in ('left', 'right'):
                desc = node.describe_parameter(spec.for_item(robot).name)
                assert desc.read_only == spec.read_only and desc.description == spec.description
        assert list(node.get_parameter('left.joint_names').value) == JOINTS
        assert list(node.get_parameter('right.action_joint_names').value) == RIGHT[:7]
        engine, cfg = build_configs(parameter_values(node))
        assert cfg.robot('left').instruction == 'pick up the cup'
        assert cfg.robot('right').joint_names == tuple(RIGHT)
        handler.config = cfg
        result = node.set_parameters([Parameter('right.instruction', value='stack')])[0]
        assert result.successful, result.reason
        assert applied == [('stack', {'robot': 'right'})]
        assert handler.config.robot('right').instruction == 'stack'
        result = node.set_parameters([Parameter('right.joint_names', value=JOINTS)])[0]
        assert not result.successful and 'read-only' in result.reason
    finally:
        node.destroy_node()


def test_bad_robot_names_fail_at_declaration(rclpy_context):
    node = Node('oxygen', context=rclpy_context, cli_args=[
        '--ros-args', '--params-file', str(config_file('test')), '-p', 'robots:=[a, a]'])
    try:
        with pytest.raises(InvalidParameterValueException, match='distinct names'):
            declare_parameters(node)
    finally:
        node.destroy_node()
