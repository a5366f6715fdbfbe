"""oxygen_keystore's name resolution equals rcl's on real nodes; ROS args and params files."""

from pathlib import Path

from oxygen_ros.tools.keystore.names import (
    action_services, action_topics, expand, NodeNames, RemapRule, reply_dds, request_dds,
    RosNameError, topic_dds)
from oxygen_ros.tools.keystore.node_args import NodeArgsError, parse_ros_args
import pytest
import rclpy
from rclpy.context import Context

NAMES = ('~/action_chunk', '~/instruction', '/diagnostics', '/joint_states', 'relative/topic',
         '~', '/camera/base/image_raw', 'instruction', '~/ask/_action/send_goal')
RULES = [
    (),
    ('__ns:=/arm',),
    ('/joint_states:=/arm/joint_states', '~/instruction:=/task'),
    ('instruction:=cmd', 'relative/topic:=~/moved'),               # relative matches
    ('oxygen:/joint_states:=/mine', 'other:/diagnostics:=/theirs'),  # node-specific rules
    ('__node:=arm_vla', '/diagnostics:=diag', '/diagnostics:=/second'),  # first match wins
    ('__ns:=/a/b', '__node:=vla', '~/action_chunk:=/cmd/chunk', 'vla:__ns:=/c'),
    ('oxygen:__node:=renamed', 'renamed:__ns:=/by_new_name'),      # __ns matches new name
]


@pytest.mark.ros
@pytest.mark.parametrize('rules', RULES, ids=[' '.join(r) or 'none' for r in RULES])
@pytest.mark.parametrize('namespace', ['/', '/robot'])
def test_resolve_equals_rcl(ros_domain_id, rules, namespace):
    context = Context()
    args = ['probe', '--ros-args', *(a for rule in rules for a in ('-r', rule))]
    rclpy.init(context=context, args=args, domain_id=ros_domain_id)
    try:
        node = rclpy.create_node('oxygen', namespace=namespace, context=context,
                                 start_parameter_services=False, enable_rosout=False)
        ours = NodeNames('oxygen', namespace, tuple(RemapRule.parse(r) for r in rules))
        assert ours.fully_qualified_name == node.get_fully_qualified_name()
        for name in NAMES:
            assert ours.resolve(name) == node.resolve_topic_name(name), name
            assert ours.resolve(name) == node.resolve_service_name(name), name
        node.destroy_node()
    finally:
        context.try_shutdown()


def test_expand():
    assert expand('~/x', 'n', '/') == '/n/x'
    assert expand('~', 'n', '/a') == '/a/n'
    assert expand('x/y', 'n', '/a/b') == '/a/b/x/y'
    assert expand('/x', 'n', '/a') == '/x'
    for bad in ('', 'a//b', 'a/', '1a', 'a b', '{node}/x', '~x'):
        with pytest.raises(RosNameError):
            expand(bad, 'n', '/')
    with pytest.raises(RosNameError, match="invalid namespace 'a'"):
        expand('x', 'n', 'a')


def test_remap_rule_parse():
    assert RemapRule.parse('a:=b') == RemapRule(None, 'a', 'b')
    assert RemapRule.parse('oxygen:/a:=/b') == RemapRule('oxygen', '/a', '/b')
    assert RemapRule.parse('__name:=x') == RemapRule(None, '__node', 'x')
    for bad in ('a', 'a:=', ':=b', ':a:=b'):
        with pytest.raises(RosNameError, match='remapping rule'):
            RemapRule.parse(bad)
    with pytest.raises(RosNameError, match='invalid namespace'):
        RemapRule.parse('__ns:=relative')
    with pytest.raises(RosNameError, match='invalid node name'):
        RemapRule.parse('__node:=9lives')


def test_dds_names_as_rmw_fastrtps_and_sros2_write_them():
    assert topic_dds('/oxygen/action_chunk') == 'rt/oxygen/action_chunk'
    assert request_dds('/oxygen/get_state') == 'rq/oxygen/get_stateRequest'
    assert reply_dds('/oxygen/get_state') == 'rr/oxygen/get_stateReply'
    assert action_services('/oxygen/ask') == ('/oxygen/ask/_action/send_goal',
                                              '/oxygen/ask/_action/cancel_goal',
                                              '/oxygen/ask/_action/get_result')
    assert action_topics('/oxygen/ask') == ('/oxygen/ask/_action/feedback',
                                            '/oxygen/ask/_action/status')


# ------------------------------------------------------------------- ROS args, params files

def test_parse_ros_args_reads_remaps_files_and_params(tmp_path: Path):
    args = parse_ros_args(['--preset-ish', '--ros-args', '-r', '__ns:=/arm', '--remap',
                           '/a:=/b', '--params-file', 'f.yaml', '-p', 'use_sim_time:=true',
                           '--param', 'cameras:=[base_0_rgb]', '--enclave', '/e',
                           '--log-level', 'debug', '--disable-rosout-logs', '--', 'tail',
                           '-r', 'ignored:=x'], 'oxygen')
    assert args.names.fully_qualified_name == '/arm/oxygen'
    assert args.names.resolve('/a') == '/b' and args.names.resolve('ignored') == '/arm/ignored'
    assert args.params_files == (Path('f.yaml'),)
    assert args.overrides == (('use_sim_time', True), ('cameras', ['base_0_rgb']))
    with pytest.raises(NodeArgsError, match="unknown ROS argument '--bogus'"):
        parse_ros_args(['--ros-args', '--bogus'], 'oxygen')
    with pytest.raises(NodeArgsError, match='-r needs a value'):
        parse_ros_args(['--ros-args', '-r'], 'oxygen')
    with pytest.raises(NodeArgsError, match="-p 'x' is not name:=value"):
        parse_ros_args(['--ros-args', '-p', 'x'], 'oxygen')


def test_params_files_match_the_node_as_rcl_does(tmp_path: Path):
    first = tmp_path / 'first.yaml'
    first.write_text(
        '/**:\n  ros__parameters:\n    preset: tiny\n    instruction: all\n'
        'oxygen:\n  ros__parameters:\n    instruction: by name\n'
        '/other/oxygen:\n  ros__parameters:\n    instruction: not me\n'
        'arm:\n  oxygen:\n    ros__parameters:\n      image_transport:\n'
        '        base_0_rgb: compressed\n'
        '/**/oxygen:\n  ros__parameters:\n    seed: 3\n'
        '/arm/*:\n  ros__parameters:\n    memory_period: 2.0\n')
    second = tmp_path / 'second.yaml'
    second.write_text('/arm/oxygen:\n  ros__parameters:\n    instruction: second file\n')
    args = parse_ros_args(['--ros-args', '-r', '__ns:=/arm', '--params-file', str(first),
                           '--params-file', str(second), '-p', 'seed:=4'], 'oxygen')
    assert args.parameters() == {'preset': 'tiny', 'instruction': 'second file',
                                 'image_transport.base_0_rgb': 'compressed', 'seed': 4,
                                 'memory_period': 2.0}
    root = parse_ros_args(['--ros-args', '--params-file', str(first)], 'oxygen')
    assert root.parameters() == {'preset': 'tiny', 'instruction': 'by name', 'seed': 3}
    bad = tmp_path / 'bad.yaml'
    bad.write_text('- a list\n')
    with pytest.raises(NodeArgsError, match='is not a ROS parameter file'):
        parse_ros_args(['--ros-args', '--params-file', str(bad)], 'oxygen').parameters()
    with pytest.raises(NodeArgsError, match='cannot read the params file'):
        parse_ros_args(['--ros-args', '--params-file', str(tmp_path / 'none.yaml')],
                       'oxygen').parameters()
