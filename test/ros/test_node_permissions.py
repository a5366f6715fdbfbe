"""
The permissions oxygen_keystore writes against the live graph over real DDS.

The node runs with remappings, a compressed camera and ``use_sim_time``, in the root namespace
and in ``/arm``; ``oxygen_keystore permissions`` is given the same ROS arguments. Every DDS
topic the live node reads or writes, named by the middleware itself (rmw_fastrtps' graph,
``no_demangle=True``: ``rt/...``, ``rq/...Request``, ``rr/...Reply``, its action's too), must be
granted to the node enclave, and nothing else may be. The demo's clients (its operator node,
the recorder, the bag replay), an rclcpp-style lifecycle controller and the simulator must find
everything they create granted to their role.
"""

from fnmatch import fnmatchcase
import json
import os
import subprocess
import sys
import time

from diagnostic_msgs.msg import DiagnosticArray
from oxygen_ros.resources import config_file
from oxygen_ros.ros.security import NODE_ENCLAVE, OBSERVER_ENCLAVE, OPERATOR_ENCLAVE
from oxygen_ros.ros.security import ROBOT_ENCLAVE
from oxygen_ros.tools.bag.topics import CAMERA_TOPICS, JOINT_STATES_TOPIC
from oxygen_ros.tools.common.observer import Observer, OUTPUTS, STREAMS
from oxygen_ros.tools.keystore.policy import DISCOVERY_TOPIC
from oxygen_ros_interfaces.msg import DecodedText
import pytest
from rcl_interfaces.msg import ParameterEvent
import rclpy
from rclpy.action import get_action_server_names_and_types_by_node
from rclpy.context import Context
from rclpy.lifecycle import LifecycleNode
from rclpy.parameter import Parameter
from rosgraph_msgs.msg import Clock
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

pytestmark = pytest.mark.ros

NODE_ARGS = ['--ros-args', '--params-file', str(config_file('test')),
             '-r', '/joint_states:=/arm/joints', '-r', '~/memory:=/notes',
             '-r', '/camera/left_wrist/image_raw:=/wrist/image',
             '-p', 'image_transport.left_wrist_0_rgb:=compressed', '-p', 'use_sim_time:=true']
CLIENT_ENCLAVES = (OPERATOR_ENCLAVE, OBSERVER_ENCLAVE, ROBOT_ENCLAVE)


def keystore_permissions(ros_args):
    proc = subprocess.run([sys.executable, '-m', 'oxygen_ros.tools.keystore', 'permissions',
                           '--json', *ros_args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def graph_topics(node, name, namespace='/'):
    """
    Return the DDS topics a node writes and reads as the middleware names them (none: empty).

    ``no_demangle=True`` lists every DDS writer and reader of the node under its DDS topic,
    services and actions included (a server reads ``rq/<name>Request``, writes
    ``rr/<name>Reply``), without this project's name formulas.
    """
    if (name, namespace) not in node.get_node_names_and_namespaces():
        return set(), set()
    write = node.get_publisher_names_and_types_by_node(name, namespace, no_demangle=True)
    read = node.get_subscriber_names_and_types_by_node(name, namespace, no_demangle=True)
    return {topic for topic, _ in write}, {topic for topic, _ in read}


def graph_endpoints(node, name, namespace='/'):
    """Return ``{(kind, name, type)}`` of a node from the ROS graph (actions as one)."""
    actions = get_action_server_names_and_types_by_node(node, name, namespace)
    hidden = tuple(f'{a}/_action/' for a, _ in actions)
    out = {('action server', a, t) for a, [t] in actions}
    for kind, entries in (
            ('publisher', node.get_publisher_names_and_types_by_node(name, namespace)),
            ('subscription', node.get_subscriber_names_and_types_by_node(name, namespace)),
            ('service', node.get_service_names_and_types_by_node(name, namespace))):
        out |= {(kind, n, t) for n, [t] in entries if not n.startswith(hidden)}
    return out


def allowed(grant, side, topic):
    """DDS Security's decision: the deny rule first, then the allow rule (fnmatch), else DENY."""
    if any(fnmatchcase(topic, p) for p in grant[f'deny_{side}']):
        return False
    return any(fnmatchcase(topic, p) for p in grant[side])


def wait_until(ros_node, predicate, timeout_s=60.0, proc=None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None:
            assert proc.popen.poll() is None, proc.output()
        if predicate():
            return True
        ros_node.spin_for(0.2)
    return False


def live_node_as_granted(ros_node, ros_processes, args, namespace):
    """
    Start the node with ``args``; return it and the endpoints the tool lists for them.

    Asserts that the DDS topics of the live node are exactly those granted to the node enclave
    and its endpoints exactly those listed (with their types).
    """
    expected = keystore_permissions(args)
    grant = expected['grants'][NODE_ENCLAVE]
    want = ({t for t in grant['publish'] if t != DISCOVERY_TOPIC},
            {t for t in grant['subscribe'] if t != DISCOVERY_TOPIC})
    assert not grant['deny_publish'] and not grant['deny_subscribe']
    proc = ros_processes.start('oxygen_ros.ros.node', *args)
    node = ros_node.node
    got = [set(), set()]

    def same():
        got[:] = graph_topics(node, 'oxygen', namespace)
        return tuple(got) == want
    assert wait_until(ros_node, same, proc=proc), (
        f'granted, not in the graph: {sorted((want[0] - got[0]) | (want[1] - got[1]))}; '
        f'in the graph, not granted: {sorted((got[0] - want[0]) | (got[1] - want[1]))}\n'
        f'{proc.output()}')
    # the same endpoints with their types, as the tool lists them
    listed = {(e['kind'], e['name'], e['type']) for e in expected['endpoints']}
    assert graph_endpoints(node, 'oxygen', namespace) == listed
    return proc, listed


@pytest.mark.parametrize('namespace', ['/', '/arm'])
def test_node_permissions_name_exactly_the_live_graph(ros_node, ros_processes, namespace):
    args = [*NODE_ARGS, *(['-r', f'__ns:={namespace}'] if namespace != '/' else [])]
    clock = ros_node.node.create_publisher(Clock, '/clock', 10)   # for use_sim_time
    ros_node.node.create_timer(0.05, lambda: clock.publish(
        Clock(clock=ros_node.node.get_clock().now().to_msg())))
    proc, listed = live_node_as_granted(ros_node, ros_processes, args, namespace)
    assert ('subscription', '/wrist/image/compressed', 'sensor_msgs/msg/CompressedImage') \
        in listed and ('publisher', '/notes', 'std_msgs/msg/String') in listed
    assert ('subscription', '/clock', 'rosgraph_msgs/msg/Clock') in listed
    private = f'{namespace.rstrip("/")}/oxygen'
    assert ('publisher', f'{private}/action_chunk', 'trajectory_msgs/msg/JointTrajectory') \
        in listed and ('service', f'{private}/get_state', 'lifecycle_msgs/srv/GetState') in listed
    assert proc.stop() == 0, proc.output()


ROBOTS_ARGS = ['--ros-args', '--params-file', str(config_file('test')),
               '-p', 'robots:=[left, right]', '-r', '/right/joint_states:=/arm_r/joints',
               '-r', 'right/oxygen/memory:=/notes',
               '-p', 'image_transport.left_wrist_0_rgb:=compressed']


@pytest.mark.parametrize('namespace', ['/', '/cell'])
def test_node_permissions_with_robots_name_exactly_the_live_graph(
        ros_node, ros_processes, namespace):
    # each robot's endpoints under its namespace, remapped as any topic: granted exactly
    args = [*ROBOTS_ARGS, *(['-r', f'__ns:={namespace}'] if namespace != '/' else [])]
    proc, listed = live_node_as_granted(ros_node, ros_processes, args, namespace)
    ns = namespace.rstrip('/')
    for robot in ('left', 'right'):
        assert ('publisher', f'{ns}/{robot}/oxygen/action_chunk',
                'trajectory_msgs/msg/JointTrajectory') in listed
        assert ('action server', f'{ns}/{robot}/oxygen/ask',
                'oxygen_ros_interfaces/action/Ask') in listed
        assert ('subscription', f'/{robot}/camera/base/image_raw', 'sensor_msgs/msg/Image') \
            in listed
    assert ('subscription', '/left/camera/left_wrist/image_raw/compressed',
            'sensor_msgs/msg/CompressedImage') in listed
    assert ('subscription', '/left/joint_states', 'sensor_msgs/msg/JointState') in listed
    assert ('subscription', '/arm_r/joints', 'sensor_msgs/msg/JointState') in listed
    assert ('publisher', '/notes', 'std_msgs/msg/String') in listed
    assert ('publisher', f'{ns}/left/oxygen/memory', 'std_msgs/msg/String') in listed
    # nothing of a robot on the node's own names
    own_names = {f'{ns}/oxygen/action_chunk', '/joint_states', f'{ns}/oxygen/ask',
                 f'{ns}/oxygen/memory'}
    assert not {e for e in listed if e[1] in own_names}
    assert ('service', f'{ns}/oxygen/get_state', 'lifecycle_msgs/srv/GetState') in listed
    assert proc.stop() == 0, proc.output()


def test_the_demo_clients_are_granted_everything_they_create(ros_domain_id, ros_node,
                                                             ros_processes, demo_bag, tmp_path):
    grants = keystore_permissions(['--ros-args', '--params-file',
                                   str(config_file('test'))])['grants']
    # the node's outputs, as its publishers would offer them (the recorder waits for them)
    types = (JointTrajectory, String, String, String, DiagnosticArray, *[DecodedText] * 3)
    for topic, msg_type in zip((*OUTPUTS, *STREAMS), types):
        ros_node.node.create_publisher(msg_type, topic, 10)
    record = ros_processes.start('oxygen_ros.tools.bag.record', str(tmp_path / 'bag'),
                                 *OUTPUTS, *STREAMS)
    replay = ros_processes.start(
        'oxygen_ros.tools.bag.replay', str(demo_bag.path), '--loop', '--topics',
        CAMERA_TOPICS['base_0_rgb'], CAMERA_TOPICS['left_wrist_0_rgb'], JOINT_STATES_TOPIC)
    rclpy.init(domain_id=ros_domain_id)
    try:
        operator = Observer('oxygen_demo')       # the demo's own node: questions, outputs
        node = ros_node.node
        for name, enclave, proc, marker in (
                ('oxygen_record', OBSERVER_ENCLAVE, record, f'rt{STREAMS[-1]}'),
                ('oxygen_replay', ROBOT_ENCLAVE, replay, f'rt{JOINT_STATES_TOPIC}'),
                ('oxygen_demo', OPERATOR_ENCLAVE, None, 'rq/oxygen/get_stateRequest')):
            topics = [set(), set()]

            def seen():
                operator.executor.spin_once(timeout_sec=0.0)
                topics[:] = graph_topics(node, name)
                return marker in topics[0] | topics[1]
            assert wait_until(ros_node, seen, proc=proc), (name, topics)
            write, read = topics
            assert [t for t in sorted(write) if not allowed(grants[enclave], 'publish', t)] \
                == [], name
            assert [t for t in sorted(read) if not allowed(grants[enclave], 'subscribe', t)] \
                == [], name
        # and the node's own side stays the node's: a client cannot serve its services
        for enclave in (OPERATOR_ENCLAVE, OBSERVER_ENCLAVE, ROBOT_ENCLAVE):
            assert not allowed(grants[enclave], 'subscribe', 'rq/oxygen/get_stateRequest')
        operator.close()
    finally:
        rclpy.try_shutdown()
    assert record.stop() == 0, record.output()
    assert replay.stop() == 0, replay.output()


def violations(grant, write, read):
    """Return the DDS topics a node writes or reads that ``grant`` does not allow."""
    return ([f'publish {t}' for t in sorted(write) if not allowed(grant, 'publish', t)]
            + [f'subscribe {t}' for t in sorted(read) if not allowed(grant, 'subscribe', t)])


def test_an_rclcpp_lifecycle_controller_may_start_in_every_client_enclave(ros_domain_id,
                                                                          ros_node):
    """
    What an rclcpp lifecycle node creates at start, as ros2_control's controllers are.

    rcl_lifecycle's services and ``~/transition_event`` (rclpy's LifecycleNode takes them from
    rcl_lifecycle too), the logger services (controllers turn them on), ``/clock`` under
    ``use_sim_time``, and the ``/parameter_events`` subscription of rclcpp's time source
    (rclcpp ``time_source.cpp``; rclpy makes none, so it is made here).
    """
    grants = keystore_permissions(['--ros-args', '--params-file',
                                   str(config_file('test'))])['grants']
    context = Context()
    rclpy.init(context=context, domain_id=ros_domain_id)
    try:
        controller = LifecycleNode(
            'joint_trajectory_controller', namespace='/arm', context=context,
            enable_logger_service=True,
            parameter_overrides=[Parameter('use_sim_time', value=True)])
        controller.create_subscription(ParameterEvent, '/parameter_events', lambda _: None, 10)
        topics = [set(), set()]

        def seen():
            topics[:] = graph_topics(ros_node.node, 'joint_trajectory_controller', '/arm')
            return {'rt/parameter_events', 'rt/clock',
                    'rq/arm/joint_trajectory_controller/set_logger_levelsRequest',
                    'rq/arm/joint_trajectory_controller/change_stateRequest'} <= topics[1]
        assert wait_until(ros_node, seen), topics
        assert 'rt/arm/joint_trajectory_controller/transition_event' in topics[0]
        for enclave in CLIENT_ENCLAVES:
            assert violations(grants[enclave], *topics) == [], enclave
        controller.destroy_node()
    finally:
        context.try_shutdown()


@pytest.mark.parametrize('arms', [('',), ('left', 'right')], ids=['one arm', 'two arms'])
def test_the_simulator_may_start_in_the_robot_enclave(ros_domain_id, ros_node, arms):
    """The sim's live graph against the robot's grant for the node of ``config/sim.yaml``."""
    os.environ.setdefault('MUJOCO_GL', 'egl')  # before mujoco's first import (sim/render.py)
    from oxygen_ros.sim.arms import node_parameters, ros_args
    from oxygen_ros.sim.endpoints import ACTION_CHUNK, arm_topic, CHUNK_EVENTS, sim_endpoints
    from oxygen_ros.sim.node import NODE_NAME, SimNode
    from oxygen_ros.tools.keystore.names import NodeNames
    grant = keystore_permissions(['--ros-args', '--params-file', str(config_file('sim')),
                                  *ros_args(node_parameters(arms))])['grants'][ROBOT_ENCLAVE]
    robots = [] if arms == ('',) else [Parameter('robots', value=list(arms))]
    names = NodeNames(NODE_NAME)
    chunks, events = (names.resolve(arm_topic(ep.name, arms[-1]))
                      for ep in (ACTION_CHUNK, CHUNK_EVENTS))
    context = Context()
    rclpy.init(context=context, domain_id=ros_domain_id)
    try:
        sim = SimNode(context=context,
                      parameter_overrides=[Parameter('image_size', value=32), *robots])
        topics = [set(), set()]

        def seen():
            topics[:] = graph_topics(ros_node.node, NODE_NAME)
            return f'rt{chunks}' in topics[1] and f'rt{events}' in topics[0]
        assert wait_until(ros_node, seen), topics
        assert violations(grant, *topics) == []
        # what the sim declares (and the keystore reads) is what it creates
        declared = {(ep.kind.value, names.resolve(ep.name), ep.type_name)
                    for ep in sim_endpoints(arms)}
        own = {e for e in graph_endpoints(ros_node.node, NODE_NAME)
               if e[0] != 'service' and e[1] not in ('/rosout', '/parameter_events')}
        assert own == declared
        sim.close()
        sim.destroy_node()
    finally:
        context.try_shutdown()
