"""
The topics our bags hold: default names, message classes, QoS and the rosbags typestore.

Shared by ``oxygen_make_demo_bag``, ``oxygen_replay`` and ``oxygen_record``. Topic names are
the node's defaults (architecture.md §4). QoS follows the node's subscriptions: sensor-data
(best effort, keep last 5) for camera streams, reliable for joint states and other state,
reliable + transient local (latched) for the instruction.

Bags are rosbag2 (version 9) written and read with ``rosbags``; message definitions and type
hashes come from rosbags' ``ROS2_JAZZY`` typestore, which agrees with the installed Jazzy
message packages (test_bags checks the hashes against ``share/<pkg>/msg/<Type>.json``).
"""

from __future__ import annotations

import enum
import functools
import importlib

from rclpy.qos import (
    DurabilityPolicy, HistoryPolicy, qos_profile_sensor_data, QoSProfile, ReliabilityPolicy)
from rosbags.interfaces import (
    Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime)
from rosbags.rosbag2 import StoragePlugin
from rosbags.typesys import get_typestore, Stores
from rosbags.typesys.store import Typestore

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
JOINT_STATE_TYPE = 'sensor_msgs/msg/JointState'
STRING_TYPE = 'std_msgs/msg/String'

_SENSOR_TYPES = frozenset({
    IMAGE_TYPE, 'sensor_msgs/msg/CompressedImage', 'sensor_msgs/msg/CameraInfo',
    'sensor_msgs/msg/PointCloud2', 'sensor_msgs/msg/LaserScan',
})
_LATCHED_TOPIC_SUFFIXES = ('/instruction', '/tf_static', '/robot_description')
_INFINITE = QosTime(sec=9_223_372_036, nsec=854_775_807)
"""``RMW_DURATION_INFINITE`` as real rosbag2 metadata writes it."""


class QosRole(enum.Enum):
    """What a topic carries, which fixes its QoS."""

    SENSOR_DATA = 'sensor_data'
    """Camera-like streams: best effort, keep last 5, volatile (``qos_profile_sensor_data``)."""
    RELIABLE = 'reliable'
    """State streams (joint states): reliable, keep last 10, volatile."""
    LATCHED = 'latched'
    """Set-once topics (instruction): reliable, keep last 1, transient local."""


class Storage(str, enum.Enum):
    """rosbag2 storage plugin."""

    MCAP = 'mcap'
    SQLITE3 = 'sqlite3'

    @property
    def plugin(self) -> StoragePlugin:
        """Return the rosbags storage plugin."""
        return StoragePlugin.MCAP if self is Storage.MCAP else StoragePlugin.SQLITE3


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


def qos_profile(role: QosRole) -> QoSProfile:
    """Return the rclpy QoS profile of a role (a new object each call)."""
    if role is QosRole.SENSOR_DATA:
        base = qos_profile_sensor_data
        return QoSProfile(history=base.history, depth=base.depth,
                          reliability=base.reliability, durability=base.durability)
    if role is QosRole.LATCHED:
        return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                          reliability=ReliabilityPolicy.RELIABLE,
                          durability=DurabilityPolicy.TRANSIENT_LOCAL)
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10,
                      reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)


def bag_qos(profile: QoSProfile) -> Qos:
    """
    Return an rclpy QoS profile as a rosbags ``Qos`` for ``offered_qos_profiles``.

    Zero (unset) deadline, lifespan and lease durations are written as infinite, as rosbag2
    records them. The enum values of rclpy and rosbags are the rmw values, so they map 1:1.
    """
    def as_time(duration: object) -> QosTime:
        ns = duration.nanoseconds
        return _INFINITE if ns <= 0 else QosTime(sec=ns // 10**9, nsec=ns % 10**9)

    return Qos(
        history=QosHistory(int(profile.history)),
        depth=int(profile.depth),
        reliability=QosReliability(int(profile.reliability)),
        durability=QosDurability(int(profile.durability)),
        deadline=as_time(profile.deadline),
        lifespan=as_time(profile.lifespan),
        liveliness=QosLiveliness(int(profile.liveliness)),
        liveliness_lease_duration=as_time(profile.liveliness_lease_duration),
        avoid_ros_namespace_conventions=bool(profile.avoid_ros_namespace_conventions),
    )


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


@functools.cache
def typestore() -> Typestore:
    """Return the rosbags typestore for bag connections (ROS 2 Jazzy definitions)."""
    return get_typestore(Stores.ROS2_JAZZY)


def check_known_type(msgtype: str) -> None:
    """
    Check that rosbags can describe ``msgtype`` in a bag (definition and type hash).

    :raises ValueError: if the type is not in the typestore.
    """
    if msgtype not in typestore().fielddefs:
        raise ValueError(f'message type {msgtype!r} is not in the rosbags ROS2_JAZZY '
                         f'typestore; cannot write it to a bag')
