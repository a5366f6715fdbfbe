"""
Every topic, service and action the ``oxygen`` node creates, declared once.

The node creates its subscriptions, publishers and its action server from the names here, and
``oxygen_keystore`` writes the SROS2 permissions of the node and of its peers from
``node_endpoints`` (docs/security.md), so a renamed topic cannot leave the permissions stale.
Names are as the code passes them to rclpy (``~/x`` is private to the node, ``/x`` absolute);
namespace and remappings are applied later, as rcl applies them.

Besides its own endpoints the node has those rclpy and rcl create for every lifecycle node:
``/rosout``, ``/parameter_events``, the parameter services, ``~/get_type_description``, the
lifecycle services and ``~/transition_event``, and ``/clock`` under ``use_sim_time``.

With several robots (the ``robots`` parameter) each robot has the node's endpoints but
``/diagnostics`` under its own namespace (``robot_endpoint``): ``/<name>/camera/...``,
``/<name>/joint_states``, ``/<name>/oxygen/action_chunk``, ``/<name>/oxygen/ask``, ...

Each endpoint names its **peers**, who is expected at the other end: the robot (its camera and
joint-state drivers, the controller that executes the chunks, a sim), an operator (sends the
instruction and questions, drives the lifecycle and parameters) and an observer (reads chunks,
texts and diagnostics).
"""

from __future__ import annotations

from dataclasses import replace

from oxygen_ros.engine import TextTask
from oxygen_ros.ros.action_output import ACTION_CHUNK as ACTION_CHUNK_KEY, ChunkOutput
from oxygen_ros.ros.action_output import EE_DELTA_CHUNK as EE_DELTA_CHUNK_KEY
from oxygen_ros.ros.endpoint_types import Endpoint, EndpointKind, Peer
from oxygen_ros.ros.images.transport import COMPRESSED_SUFFIX
from oxygen_ros.ros.node_config import NodeConfig
from oxygen_ros.ros.topics import (
    CAMERA_TOPICS, COMPRESSED_IMAGE_TYPE, IMAGE_TYPE, JOINT_STATE_TYPE, JOINT_STATES_TOPIC,
    STRING_TYPE)

NODE_NAME = 'oxygen'
"""The node's name in the code (``-r __node:=`` renames it)."""
_READERS = frozenset({Peer.OPERATOR, Peer.OBSERVER})
_CHUNK_READERS = frozenset({Peer.ROBOT, Peer.OPERATOR, Peer.OBSERVER})
_OPERATOR = frozenset({Peer.OPERATOR})
_ROBOT = frozenset({Peer.ROBOT})
INSTRUCTION = Endpoint(EndpointKind.SUBSCRIPTION, '~/instruction', STRING_TYPE, _OPERATOR)
ASK_TOPIC = Endpoint(EndpointKind.SUBSCRIPTION, '~/ask', STRING_TYPE, _OPERATOR)
JOINT_STATES = Endpoint(EndpointKind.SUBSCRIPTION, JOINT_STATES_TOPIC, JOINT_STATE_TYPE, _ROBOT)
ASK_ACTION = Endpoint(EndpointKind.ACTION_SERVER, '~/ask', 'oxygen_ros_interfaces/action/Ask',
                      _OPERATOR)
ACTION_CHUNK = Endpoint(EndpointKind.PUBLISHER, '~/action_chunk',
                        'trajectory_msgs/msg/JointTrajectory', _CHUNK_READERS)
EE_DELTA_CHUNK = Endpoint(EndpointKind.PUBLISHER, '~/ee_delta_chunk',
                          'trajectory_msgs/msg/MultiDOFJointTrajectory', _CHUNK_READERS)
DIAGNOSTICS = Endpoint(EndpointKind.PUBLISHER, '/diagnostics',
                       'diagnostic_msgs/msg/DiagnosticArray', _READERS)
CHUNK_ENDPOINTS = {ACTION_CHUNK_KEY: ACTION_CHUNK, EE_DELTA_CHUNK_KEY: EE_DELTA_CHUNK}
"""``ChunkOutput.publisher_keys`` → the publisher each key stands for."""
DECODED_TEXT_TYPE = 'oxygen_ros_interfaces/msg/DecodedText'


def text_endpoints(task: TextTask) -> tuple[Endpoint, Endpoint]:
    """Return the publishers of one text task: ``~/<task>`` (whole) and ``~/<task>/stream``."""
    return (Endpoint(EndpointKind.PUBLISHER, f'~/{task.value}', STRING_TYPE, _READERS),
            Endpoint(EndpointKind.PUBLISHER, f'~/{task.value}/stream', DECODED_TEXT_TYPE,
                     _READERS))


def camera_endpoint(slot: str, compressed: bool) -> Endpoint:
    """
    Return the subscription of camera ``slot`` (``CAMERA_SLOTS`` name).

    :param compressed: ``sensor_msgs/CompressedImage`` on ``<resolved topic>/compressed``
        instead of ``sensor_msgs/Image`` on the topic.
    """
    topic = CAMERA_TOPICS[slot]
    if compressed:
        return Endpoint(EndpointKind.SUBSCRIPTION, topic, COMPRESSED_IMAGE_TYPE, _ROBOT,
                        suffix=COMPRESSED_SUFFIX)
    return Endpoint(EndpointKind.SUBSCRIPTION, topic, IMAGE_TYPE, _ROBOT)


def robot_topic(name: str, robot: str) -> str:
    """
    Return the name of the node's endpoint ``name`` for robot ``robot`` (``''``: ``name``).

    An absolute ``/x`` becomes ``/<robot>/x``; the node's private ``~/x`` becomes
    ``<robot>/oxygen/x``, resolved in the node's namespace (``/<robot>/oxygen/x`` in the root
    namespace); remappings apply to these names as to any.
    """
    if not robot:
        return name
    if name.startswith('~/'):
        return f'{robot}/{NODE_NAME}/{name[2:]}'
    return f'/{robot}{name}' if name.startswith('/') else f'{robot}/{name}'


def robot_endpoint(endpoint: Endpoint, robot: str) -> Endpoint:
    """Return ``endpoint`` as robot ``robot`` has it (``robot_topic``)."""
    return replace(endpoint, name=robot_topic(endpoint.name, robot))


def robot_endpoints(cfg: NodeConfig, robot: str) -> tuple[Endpoint, ...]:
    """Return the endpoints of one robot of a node: its inputs, chunks, texts, ``~/ask``."""
    compressed = set(cfg.compressed_cameras)
    keys = ChunkOutput(cfg.robot(robot)).publisher_keys
    out = [camera_endpoint(slot, slot in compressed) for slot in cfg.cameras]
    out += [JOINT_STATES, INSTRUCTION, ASK_TOPIC, ASK_ACTION]
    out += [CHUNK_ENDPOINTS[key] for key in keys]
    for task in TextTask:
        out += text_endpoints(task)
    return tuple(robot_endpoint(ep, robot) for ep in out)


_PARAMETER_SERVICES = (
    ('describe_parameters', 'DescribeParameters'), ('get_parameter_types', 'GetParameterTypes'),
    ('get_parameters', 'GetParameters'), ('list_parameters', 'ListParameters'),
    ('set_parameters', 'SetParameters'), ('set_parameters_atomically', 'SetParametersAtomically'))
_LIFECYCLE_SERVICES = (
    ('change_state', 'ChangeState'), ('get_state', 'GetState'),
    ('get_available_states', 'GetAvailableStates'),
    ('get_available_transitions', 'GetAvailableTransitions'),
    ('get_transition_graph', 'GetAvailableTransitions'))
_LOGGER_SERVICES = (('get_logger_levels', 'GetLoggerLevels'),
                    ('set_logger_levels', 'SetLoggerLevels'))
PARAMETER_EVENTS = '/parameter_events'

NODE_INFRASTRUCTURE: tuple[Endpoint, ...] = (
    Endpoint(EndpointKind.PUBLISHER, '/rosout', 'rcl_interfaces/msg/Log', _OPERATOR),
    Endpoint(EndpointKind.PUBLISHER, PARAMETER_EVENTS, 'rcl_interfaces/msg/ParameterEvent',
             _OPERATOR),
    *(Endpoint(EndpointKind.SERVICE, f'~/{name}', f'rcl_interfaces/srv/{srv}', _OPERATOR)
      for name, srv in _PARAMETER_SERVICES),
    Endpoint(EndpointKind.SERVICE, '~/get_type_description',
             'type_description_interfaces/srv/GetTypeDescription'),
)
"""What rclpy's and rclcpp's ``Node`` create (``/rosout``, ``/parameter_events``, the parameter
services; rcl's type description service)."""
LIFECYCLE_INFRASTRUCTURE: tuple[Endpoint, ...] = (
    *(Endpoint(EndpointKind.SERVICE, f'~/{name}', f'lifecycle_msgs/srv/{srv}', _OPERATOR)
      for name, srv in _LIFECYCLE_SERVICES),
    Endpoint(EndpointKind.PUBLISHER, '~/transition_event', 'lifecycle_msgs/msg/TransitionEvent',
             _READERS),
)
"""What rcl_lifecycle creates for a lifecycle node (rclpy's ``LifecycleNode`` and
rclcpp_lifecycle's alike: both take the names from rcl_lifecycle)."""
GET_STATE = next(e for e in LIFECYCLE_INFRASTRUCTURE if e.name == '~/get_state')
"""The lifecycle state query the tools poll until the node is active."""
CLOCK = Endpoint(EndpointKind.SUBSCRIPTION, '/clock', 'rosgraph_msgs/msg/Clock', _ROBOT)
"""rclpy's time source subscribes to it when ``use_sim_time`` is true."""
CLIENT_NODE_INFRASTRUCTURE: tuple[Endpoint, ...] = (
    *NODE_INFRASTRUCTURE, *LIFECYCLE_INFRASTRUCTURE,
    Endpoint(EndpointKind.SUBSCRIPTION, PARAMETER_EVENTS, 'rcl_interfaces/msg/ParameterEvent'),
    *(Endpoint(EndpointKind.SERVICE, f'~/{name}', f'rcl_interfaces/srv/{srv}')
      for name, srv in _LOGGER_SERVICES),
    CLOCK,
)
"""
What any node of the node's peers may create for itself at start, under its own name.

The node's own infrastructure (rclpy and rclcpp alike), a lifecycle node's (ros2_control's
controllers, such as joint_trajectory_controller, are rclcpp_lifecycle nodes:
controller_interface ``controller_interface_base.hpp``), the ``/parameter_events``
subscription every rclcpp node makes (rclcpp ``time_source.cpp``, ``TimeSource::NodeState::
attachNode``; rclpy makes none) and the logger services a node makes with
``enable_logger_service`` (rclcpp ``node_logging.cpp``; ros2_control's controllers turn it on),
and ``/clock`` under ``use_sim_time``. ``oxygen_keystore`` grants them to every client enclave
under any node name.
"""


def node_endpoints(cfg: NodeConfig, *, use_sim_time: bool = False) -> tuple[Endpoint, ...]:
    """
    Return every endpoint of a configured ``oxygen`` node.

    :param cfg: its configuration (cameras and their transports, the action space, the
        robots).
    :param use_sim_time: the ``use_sim_time`` parameter (a ``/clock`` subscription).
    :raises ParameterError: a configuration the node would refuse at configure.
    """
    out = [ep for robot in cfg.robot_names for ep in robot_endpoints(cfg, robot)]
    out += [DIAGNOSTICS, *NODE_INFRASTRUCTURE, *LIFECYCLE_INFRASTRUCTURE]
    if use_sim_time:
        out.append(CLOCK)
    return tuple(out)


__all__ = ['ACTION_CHUNK', 'ASK_ACTION', 'ASK_TOPIC', 'CHUNK_ENDPOINTS',
           'CLIENT_NODE_INFRASTRUCTURE', 'CLOCK', 'DIAGNOSTICS', 'EE_DELTA_CHUNK', 'Endpoint',
           'EndpointKind', 'GET_STATE', 'INSTRUCTION', 'JOINT_STATES', 'LIFECYCLE_INFRASTRUCTURE',
           'NODE_INFRASTRUCTURE', 'NODE_NAME', 'PARAMETER_EVENTS', 'Peer',
           'camera_endpoint', 'node_endpoints', 'robot_endpoint', 'robot_endpoints',
           'robot_topic', 'text_endpoints']
