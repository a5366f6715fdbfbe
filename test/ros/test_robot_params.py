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


def test_a_robot_is_due_every_nth_cycle_at_a_rate_and_action_dt_of_its_own():
    _, node = build_configs({
        'preset': 'tiny', 'control_rate_hz': 10.0, 'action_dt': 0.05,
        'robots': ['left', 'mid', 'right'], 'mid.control_rate_hz': 3.333333,
        'right.control_rate_hz': 5.0, 'right.action_dt': 0.2})
    assert [node.due_every(r) for r in ('left', 'mid', 'right')] == [1, 3, 2]
    left, mid, right = (node.robot(r) for r in ('left', 'mid', 'right'))
    assert (left.control_rate_hz, left.action_dt) == (10.0, 0.05)
    assert mid.control_rate_hz == 10.0 / 3 and mid.action_dt == 0.05
    assert (right.control_rate_hz, right.action_dt) == (5.0, 0.2)
    assert right.action_semantics().action_dt == 0.2  # its velocity limits count in its steps
    assert node.describe_rates() == '10 Hz (mid 3.33333 Hz, right 5 Hz)'
    # 0 (the default) is the node's rate and follows it; a robot's own rate stays its own
    faster = node.updated('control_rate_hz', 20.0)
    assert [faster.due_every(r) for r in ('left', 'mid', 'right')] == [1, 6, 4]
    assert faster.robot('left').control_rate_hz == 20.0
    assert node.updated('right.control_rate_hz', 0.0).due_every('right') == 1
    assert node.updated('right.action_dt', 0.0).robot('right').action_dt == 0.05
    assert node.updated('action_dt', 0.1).robot('left').action_dt == 0.1
    with pytest.raises(KeyError, match="no robot 'nobody'"):
        node.due_every('nobody')


THREE_ON_TEN = ('right.control_rate_hz 3 Hz is not control_rate_hz 10 Hz / n for a whole n (a '
                'robot is due every n-th control cycle): the nearest are 3.33333333 Hz (n = 3) '
                'and 2.5 Hz (n = 4)')


@pytest.mark.parametrize('rate, message', [
    (3.0, THREE_ON_TEN),
    (3.33333, 'right.control_rate_hz 3.33333 Hz is not control_rate_hz 10 Hz / n for a whole n'),
    (20.0, 'right.control_rate_hz 20 Hz is above control_rate_hz 10 Hz: a robot is due at most '
           'once per control cycle (raise control_rate_hz, the cycle rate, or lower '
           'right.control_rate_hz)'),
    (0.05, "right.control_rate_hz must be 0.0 (the node's control_rate_hz) or in [0.1, 1000.0], "
           'got 0.05'),
])
def test_a_robots_rate_that_is_no_whole_fraction_of_the_nodes_is_refused(rate, message):
    with pytest.raises(ParameterError) as exc:
        build_configs({'preset': 'tiny', 'control_rate_hz': 10.0, 'robots': ['left', 'right'],
                       'right.control_rate_hz': rate})
    assert str(exc.value).startswith(message), str(exc.value)


def test_a_rate_change_that_breaks_a_robots_fraction_is_refused():
    _, node = build_configs({'preset': 'tiny', 'control_rate_hz': 10.0,
                             'robots': ['left', 'right'], 'right.control_rate_hz': 5.0})
    assert check_update(node, 'right.control_rate_hz', 3.0) == THREE_ON_TEN
    assert check_update(node, 'control_rate_hz', 12.0) == (
        'right.control_rate_hz 5 Hz is not control_rate_hz 12 Hz / n for a whole n (a robot is '
        'due every n-th control cycle): the nearest are 6 Hz (n = 2) and 4 Hz (n = 3)')
    assert 'is above control_rate_hz 4 Hz' in check_update(node, 'control_rate_hz', 4.0)
    assert check_update(node, 'control_rate_hz', 15.0) is None  # 5 Hz: every 3rd
    assert check_update(node, 'right.action_dt', 0.0001).startswith(
        "right.action_dt must be 0.0 (the node's action_dt) or in [0.001, 10.0]")


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
        # a robot's rate: dynamic, from the next cycle (nothing to apply); a bad one refused
        assert node.get_parameter('right.control_rate_hz').value == 0.0
        result = node.set_parameters([Parameter('right.control_rate_hz', value=5.0)])[0]
        assert result.successful, result.reason
        assert handler.config.due_every('right') == 2 and len(applied) == 1
        result = node.set_parameters([Parameter('right.control_rate_hz', value=3.0)])[0]
        assert not result.successful and result.reason == THREE_ON_TEN
        result = node.set_parameters([Parameter('control_rate_hz', value=12.0)])[0]
        assert not result.successful and result.reason.startswith(
            'right.control_rate_hz 5 Hz is not control_rate_hz 12 Hz / n')
        assert node.get_parameter('control_rate_hz').value == 10.0
        assert handler.config.control_rate_hz == 10.0 and handler.config.due_every('right') == 2
        # set together, the node's rate and right's are checked as one: 12 Hz and 6 Hz
        result = node.set_parameters_atomically([Parameter('control_rate_hz', value=12.0),
                                                 Parameter('right.control_rate_hz', value=6.0)])
        assert result.successful, result.reason
        assert handler.config.control_rate_hz == 12.0 and handler.config.due_every('right') == 2
        assert applied[-1] == (12.0, {})  # the control timer retimed
        result = node.set_parameters_atomically([Parameter('right.control_rate_hz', value=5.0),
                                                 Parameter('left.instruction', value='wipe')])
        assert not result.successful and result.reason.startswith(
            'right.control_rate_hz 5 Hz is not control_rate_hz 12 Hz / n')
        assert handler.config.robot('left').instruction == 'pick up the cup'  # none applied
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
