"""
What a ROS node creates on a name, and who is expected at the other end: ``Endpoint``.

Light on purpose (no rclpy, no model): the ``oxygen`` node (``endpoints``) and the simulator
(``sim.endpoints``) declare their topics, services and actions with these types, and
``oxygen_keystore`` writes the SROS2 permissions from those declarations (docs/security.md).
"""

from __future__ import annotations

from dataclasses import dataclass
import enum


class EndpointKind(enum.Enum):
    """What a node creates on a name."""

    PUBLISHER = 'publisher'
    SUBSCRIPTION = 'subscription'
    SERVICE = 'service'
    """A service server."""
    ACTION_SERVER = 'action server'


class Peer(enum.Enum):
    """Who is expected at the other end of one of the ``oxygen`` node's endpoints."""

    ROBOT = 'robot'
    """The robot's drivers: cameras, joint states and clock in; executes the action chunks."""
    OPERATOR = 'operator'
    """Sends instructions and questions, drives the lifecycle and the parameters, reads all."""
    OBSERVER = 'observer'
    """Reads the action chunks, the texts and the diagnostics, and nothing else."""


NOBODY: frozenset[Peer] = frozenset()


@dataclass(frozen=True, slots=True)
class Endpoint:
    """
    One endpoint of a node.

    :ivar name: as passed to rclpy: ``~/action_chunk``, ``/diagnostics``.
    :ivar type_name: ``pkg/msg/Name``, ``pkg/srv/Name`` or ``pkg/action/Name``.
    :ivar peers: who may use it from the other end (none: only the node's own bookkeeping).
    :ivar suffix: appended after ``name`` is resolved (a compressed camera: its image topic
        is remapped, then ``/compressed`` appended, as image_transport does;
        ``images.transport.camera_input``).
    """

    kind: EndpointKind
    name: str
    type_name: str
    peers: frozenset[Peer] = NOBODY
    suffix: str = ''


__all__ = ['Endpoint', 'EndpointKind', 'NOBODY', 'Peer']
