"""
What the bag tools add to the node's topics (``ros/topics.py``): storage, bag QoS, typestore.

Shared by ``oxygen_bag make_demo``, ``oxygen_bag replay`` and ``oxygen_bag record``. Topic names,
types and QoS roles come from ``oxygen_ros.ros.topics`` (the node's own definitions, re-exported
here for the tools) so that replayed topics match the node's subscriptions.

Bags are rosbag2 (version 9) written and read with ``rosbags``; message definitions and type
hashes come from rosbags' ``ROS2_JAZZY`` typestore, which agrees with the installed Jazzy
message packages (test_bags checks the hashes against ``share/<pkg>/msg/<Type>.json``), plus
the project's own messages (``oxygen_ros_interfaces``), registered from their installed
``.msg`` files.
"""

from __future__ import annotations

import enum
import functools
import logging
from pathlib import Path

from oxygen_ros.ros.topics import (  # noqa: F401 (re-exported for the bag tools)
    CAMERA_TOPICS, COMPRESSED_IMAGE_TYPE, has_header, IMAGE_TYPE, INSTRUCTION_TOPIC,
    JOINT_STATE_TYPE, JOINT_STATES_TOPIC, message_class, qos_profile, qos_role, QosRole,
    STRING_TYPE)
from oxygen_ros.units import NS_PER_S
from rclpy.qos import QoSProfile
from rosbags.interfaces import (
    Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime)
from rosbags.rosbag2 import StoragePlugin
from rosbags.typesys import get_types_from_msg, get_typestore, Stores
from rosbags.typesys.store import Typestore

OWN_INTERFACES = 'oxygen_ros_interfaces'
"""The project's interface package (its messages are registered in ``typestore()``)."""
_LOG = logging.getLogger(__name__)
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
        return _INFINITE if ns <= 0 else QosTime(sec=ns // NS_PER_S, nsec=ns % NS_PER_S)

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


def own_message_definitions(package: str = OWN_INTERFACES) -> dict[str, str]:
    """
    Return ``{'pkg/msg/Name': definition}`` of the installed ``.msg`` files of ``package``.

    :raises ament_index_python.packages.PackageNotFoundError: the package is not installed
        (``make setup``, or ``colcon build`` and sourcing the workspace).
    """
    from ament_index_python.packages import get_package_share_directory
    msg_dir = Path(get_package_share_directory(package)) / 'msg'
    return {f'{package}/msg/{path.stem}': path.read_text()
            for path in sorted(msg_dir.glob('*.msg'))}


@functools.cache
def typestore() -> Typestore:
    """
    Return the rosbags typestore for bag connections.

    ROS 2 Jazzy definitions, plus the ``oxygen_ros_interfaces`` messages when that package is
    installed (logged once when it is not: its topics then cannot be recorded).
    """
    from ament_index_python.packages import PackageNotFoundError
    store = get_typestore(Stores.ROS2_JAZZY)
    try:
        definitions = own_message_definitions()
    except PackageNotFoundError:
        _LOG.warning('%s is not installed: its messages cannot be written to bags',
                     OWN_INTERFACES)
        return store
    types = {}
    for name, text in definitions.items():
        types.update(get_types_from_msg(text, name))
    store.register(types)
    return store


def check_known_type(msgtype: str) -> None:
    """
    Check that rosbags can describe ``msgtype`` in a bag (definition and type hash).

    :raises ValueError: if the type is not in the typestore.
    """
    if msgtype not in typestore().fielddefs:
        raise ValueError(f'message type {msgtype!r} is not in the rosbags ROS2_JAZZY '
                         f'typestore nor in {OWN_INTERFACES}; cannot write it to a bag')


def bag_instruction(bag: Path) -> str:
    """
    Return the first ``/oxygen/instruction`` of a bag ('' if it has none).

    A secured replay runs in the robot's enclave, which may not publish the instruction: the
    node takes it as its ``instruction`` parameter instead (``oxygen_demo --keystore``, the
    launch file with ``enclave:=``).

    :raises Exception: what ``rosbags`` raises for a bag it cannot open.
    """
    from rosbags.rosbag2 import Reader
    store = typestore()
    with Reader(bag) as reader:
        connections = [c for c in reader.connections if c.topic == INSTRUCTION_TOPIC]
        for connection, _, raw in reader.messages(connections=connections):
            return store.deserialize_cdr(raw, connection.msgtype).data
    return ''
