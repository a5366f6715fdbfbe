"""
What the bag tools add to the node's topics (``ros/topics.py``): storage, bag QoS, typestore.

Shared by ``oxygen_make_demo_bag``, ``oxygen_replay`` and ``oxygen_record``. Topic names, types
and QoS roles come from ``oxygen_ros.ros.topics`` (the node's own definitions, re-exported
here for the tools) so that replayed topics match the node's subscriptions.

Bags are rosbag2 (version 9) written and read with ``rosbags``; message definitions and type
hashes come from rosbags' ``ROS2_JAZZY`` typestore, which agrees with the installed Jazzy
message packages (test_bags checks the hashes against ``share/<pkg>/msg/<Type>.json``).
"""

from __future__ import annotations

import enum
import functools

from oxygen_ros.ros.topics import (  # noqa: F401 (re-exported for the bag tools)
    CAMERA_TOPICS, COMPRESSED_IMAGE_TYPE, has_header, IMAGE_TYPE, INSTRUCTION_TOPIC,
    JOINT_STATE_TYPE, JOINT_STATES_TOPIC, message_class, qos_profile, qos_role, QosRole,
    STRING_TYPE)
from rclpy.qos import QoSProfile
from rosbags.interfaces import (
    Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime)
from rosbags.rosbag2 import StoragePlugin
from rosbags.typesys import get_typestore, Stores
from rosbags.typesys.store import Typestore

_INFINITE = QosTime(sec=9_223_372_036, nsec=854_775_807)
"""``RMW_DURATION_INFINITE`` as real rosbag2 metadata writes it."""


class Storage(str, enum.Enum):
    """rosbag2 storage plugin."""

    MCAP = 'mcap'
    SQLITE3 = 'sqlite3'

    @property
    def plugin(self) -> StoragePlugin:
        """Return the rosbags storage plugin."""
        return StoragePlugin.MCAP if self is Storage.MCAP else StoragePlugin.SQLITE3


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
