"""
The node's topics: default names, message types and the QoS of each kind of stream.

Topic names are the node's defaults (``docs/topics.md#topics``); users remap them. QoS follows what
each stream is: sensor data (best effort, keep last 5) for camera streams, reliable for joint
states and other state, reliable + transient local (latched) for the instruction. The bag
tools (``tools/bag_topics.py``) use the same definitions so that replayed topics match the
node's subscriptions.
"""

from __future__ import annotations

import enum
import importlib

from rclpy.qos import (
    DurabilityPolicy, HistoryPolicy, qos_profile_sensor_data, QoSProfile, ReliabilityPolicy)

CAMERA_TOPICS: dict[str, str] = {
    'base_0_rgb': '/camera/base/image_raw',
    'left_wrist_0_rgb': '/camera/left_wrist/image_raw',
    'right_wrist_0_rgb': '/camera/right_wrist/image_raw',
}
"""Camera slot (``config.CAMERA_SLOTS``) -> default image topic of the node."""
JOINT_STATES_TOPIC = '/joint_states'
INSTRUCTION_TOPIC = '/oxygen/instruction'
"""The node's ``~/instruction`` with its default name ``oxygen``."""

IMAGE_TYPE = 'sensor_msgs/msg/Image'
COMPRESSED_IMAGE_TYPE = 'sensor_msgs/msg/CompressedImage'
JOINT_STATE_TYPE = 'sensor_msgs/msg/JointState'
STRING_TYPE = 'std_msgs/msg/String'

_SENSOR_TYPES = frozenset({
    IMAGE_TYPE, COMPRESSED_IMAGE_TYPE, 'sensor_msgs/msg/CameraInfo',
    'sensor_msgs/msg/PointCloud2', 'sensor_msgs/msg/LaserScan',
})
_LATCHED_TOPIC_SUFFIXES = ('/instruction', '/tf_static', '/robot_description')


class QosRole(enum.Enum):
    """What a topic carries, which fixes its QoS."""

    SENSOR_DATA = 'sensor_data'
    """Camera-like streams: best effort, keep last 5, volatile (``qos_profile_sensor_data``)."""
    RELIABLE = 'reliable'
    """State streams (joint states): reliable, keep last 10, volatile."""
    LATCHED = 'latched'
    """Set-once topics (instruction): reliable, keep last 1, transient local."""


def qos_role(topic: str, msgtype: str) -> QosRole:
    """
    Return the QoS role of a topic from its name and type.

    :param topic: fully qualified topic name, e.g. ``/camera/base/image_raw``.
    :param msgtype: ROS 2 type name, e.g. ``sensor_msgs/msg/Image``.
    """
    if msgtype in _SENSOR_TYPES:
        return QosRole.SENSOR_DATA
    if topic.endswith(_LATCHED_TOPIC_SUFFIXES):
        return QosRole.LATCHED
    return QosRole.RELIABLE


def qos_profile(role: QosRole, depth: int | None = None) -> QoSProfile:
    """
    Return the rclpy QoS profile of a role (a new object each call).

    :param depth: keep the last ``depth`` samples instead of the role's depth (sensor data
        only: the node's camera readers keep 1, the newest, all it uses; each sample kept
        holds a buffer of the largest image for good: ``docs/robustness.md#soak``).
    """
    if role is QosRole.SENSOR_DATA:
        base = qos_profile_sensor_data
        return QoSProfile(history=base.history, depth=depth or base.depth,
                          reliability=base.reliability, durability=base.durability)
    if role is QosRole.LATCHED:
        return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                          reliability=ReliabilityPolicy.RELIABLE,
                          durability=DurabilityPolicy.TRANSIENT_LOCAL)
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10,
                      reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)


def message_class(msgtype: str) -> type:
    """
    Return the rclpy message class of a ROS 2 type name.

    :param msgtype: ``pkg/msg/Name`` (``pkg/Name`` is accepted too).
    :raises ValueError: if the name is malformed or the package is not installed.
    """
    parts = msgtype.split('/')
    if len(parts) == 2:
        parts = [parts[0], 'msg', parts[1]]
    if len(parts) != 3 or not all(parts):
        raise ValueError(f'malformed message type {msgtype!r}; expected pkg/msg/Name')
    pkg, kind, name = parts
    try:
        return getattr(importlib.import_module(f'{pkg}.{kind}'), name)
    except (ImportError, AttributeError):
        raise ValueError(f'message type {msgtype!r} is not installed (no {pkg}.{kind}.{name} '
                         f'Python module)') from None


def has_header(msg_class: type) -> bool:
    """Return whether a message class has a ``std_msgs/Header header`` field."""
    return msg_class.get_fields_and_field_types().get('header') == 'std_msgs/Header'
