"""
Who may do what: the enclaves of ``oxygen_keystore`` and the DDS topics each is granted.

One enclave per role (docs/security.md):

- **node** (``<root>/oxygen``): exactly the endpoints the node creates (``ros.endpoints``);
- **operator**: the other end of every endpoint whose peers include the operator: publishes
  ``~/instruction`` and ``~/ask``, calls the ``~/ask`` action, the lifecycle and parameter
  services, reads every output;
- **observer**: reads the action chunks, the texts, ``/diagnostics`` and
  ``~/transition_event``, nothing else;
- **robot**: publishes the cameras, the joint states, reads the action chunks; and what a
  simulator or robot driver publishes besides (``sim.endpoints.DRIVER_OUTPUTS``: ``/clock``,
  ``/diagnostics``, the sim's ``~/joint_command`` and ``~/chunk_events``).

A client role's participants are ROS nodes too: each is also granted what any node creates for
itself at start, rclpy's or rclcpp's, lifecycle or not (``endpoints.CLIENT_NODE_INFRASTRUCTURE``:
``/rosout`` and ``/parameter_events``, the server side of its own parameter, type-description,
lifecycle and logger services, its ``~/transition_event``), for any node name: a private name
``~/x`` becomes ``/*/x`` (``rq/*/get_parametersRequest``: DDS Security matches ``*`` with
fnmatch, across ``/``), so ``oxygen_ask``, the demo's clients, ``ros2 topic echo`` or a
ros2_control controller run in them. A deny rule before that keeps every DDS topic of the node
that such a wildcard would match out of the client's reach: no client can read the node's
requests, answer in its place or publish its ``~/transition_event``.

Grants are sets of DDS topic names (``names.topic_dds``...); ``ros_discovery_info`` (rmw_fastrtps'
graph topic) is granted to every enclave as sros2 does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import enum
from fnmatch import fnmatchcase
from typing import Iterable, Sequence

from oxygen_ros.ros.endpoints import CLIENT_NODE_INFRASTRUCTURE, Endpoint, EndpointKind, Peer
from oxygen_ros.ros.security import ENCLAVE_ROOT
from oxygen_ros.sim.endpoints import DRIVER_OUTPUTS
from oxygen_ros.tools.keystore.names import (
    action_services, action_topics, NodeNames, reply_dds, request_dds, topic_dds)

DEFAULT_ENCLAVE_ROOT = ENCLAVE_ROOT
DISCOVERY_TOPIC = 'ros_discovery_info'
"""rmw_fastrtps' ROS graph topic (a plain DDS name)."""


class Role(enum.Enum):
    """An enclave of the keystore; the value is its last path token."""

    NODE = 'oxygen'
    OPERATOR = 'operator'
    OBSERVER = 'observer'
    ROBOT = 'robot'

    @property
    def peer(self) -> Peer | None:
        """Return the ``Peer`` this role stands for (None for the node itself)."""
        return None if self is Role.NODE else Peer(self.value)

    def enclave(self, root: str = DEFAULT_ENCLAVE_ROOT) -> str:
        """Return the enclave path, ``<root>/<role>``."""
        return f'{root.rstrip("/")}/{self.value}'


@dataclass(frozen=True, slots=True)
class ResolvedEndpoint:
    """An endpoint under its fully qualified, remapped name."""

    kind: EndpointKind
    name: str
    type_name: str
    peers: frozenset[Peer]


@dataclass(frozen=True, slots=True)
class Grant:
    """
    The DDS topics one enclave may write and read (sorted, no duplicates).

    :ivar deny_publish: refused before ``publish`` is looked at (a deny rule comes first).
    """

    enclave: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    deny_publish: tuple[str, ...] = ()
    deny_subscribe: tuple[str, ...] = ()


@dataclass(slots=True)
class _Topics:
    publish: set[str] = field(default_factory=set)
    subscribe: set[str] = field(default_factory=set)

    def add(self, other: _Topics) -> None:
        self.publish |= other.publish
        self.subscribe |= other.subscribe


def resolve_endpoints(endpoints: Iterable[Endpoint], names: NodeNames
                      ) -> tuple[ResolvedEndpoint, ...]:
    """
    Return the endpoints under the names the running node gives them.

    A ``suffix`` is appended to the resolved name, which is resolved again (as
    ``images.transport.camera_input`` passes ``<resolved>/compressed`` to rclpy).

    :raises RosNameError: a name or remapping rcl would refuse.
    """
    out = []
    for ep in endpoints:
        name = names.resolve(ep.name)
        if ep.suffix:
            name = names.resolve(name + ep.suffix)
        out.append(ResolvedEndpoint(ep.kind, name, ep.type_name, ep.peers))
    return tuple(out)


def _service(name: str, *, server: bool) -> _Topics:
    request, reply = {request_dds(name)}, {reply_dds(name)}
    return _Topics(reply, request) if server else _Topics(request, reply)


def dds_topics(ep: ResolvedEndpoint, *, owner: bool) -> _Topics:
    """
    Return the DDS topics of one endpoint, for its owner (the node) or for a peer.

    :param owner: True: what the node writes and reads; False: the mirror, what a peer at the
        other end writes and reads.
    """
    kind = ep.kind
    if kind is EndpointKind.SERVICE:
        return _service(ep.name, server=owner)
    if kind is EndpointKind.ACTION_SERVER:
        out = _Topics()
        for service in action_services(ep.name):
            out.add(_service(service, server=owner))
        for topic in action_topics(ep.name):
            out.add(_Topics({topic_dds(topic)}) if owner else _Topics(set(), {topic_dds(topic)}))
        return out
    writes = (kind is EndpointKind.PUBLISHER) == owner
    return _Topics({topic_dds(ep.name)}) if writes else _Topics(set(), {topic_dds(ep.name)})


def _any_node(endpoints: Iterable[Endpoint]) -> tuple[ResolvedEndpoint, ...]:
    """Return endpoints of a node of any name: ``~/x`` is ``/*/x`` (DDS Security's fnmatch)."""
    return tuple(ResolvedEndpoint(ep.kind, f'/*{ep.name[1:]}' if ep.name.startswith('~/')
                                  else ep.name, ep.type_name, ep.peers) for ep in endpoints)


_ROLE_OWN = {role: _any_node((*CLIENT_NODE_INFRASTRUCTURE,
                              *(DRIVER_OUTPUTS if role is Role.ROBOT else ())))
             for role in (Role.OPERATOR, Role.OBSERVER, Role.ROBOT)}
"""What each client role's nodes create for themselves, under any node name."""


def _deny(node: set[str], granted: set[str]) -> tuple[str, ...]:
    """Return the node's topics a client's wildcard matches though it is not granted them."""
    wildcards = [p for p in granted if '*' in p]
    return tuple(sorted(t for t in node - granted if any(fnmatchcase(t, p) for p in wildcards)))


def grants(endpoints: Sequence[ResolvedEndpoint], enclave_root: str = DEFAULT_ENCLAVE_ROOT
           ) -> dict[Role, Grant]:
    """
    Return the grant of every role for one node's endpoints.

    :param endpoints: the node's endpoints (``resolve_endpoints`` of ``node_endpoints``).
    """
    node = _Topics({DISCOVERY_TOPIC}, {DISCOVERY_TOPIC})
    for ep in endpoints:
        node.add(dds_topics(ep, owner=True))
    out = {Role.NODE: Grant(Role.NODE.enclave(enclave_root), tuple(sorted(node.publish)),
                            tuple(sorted(node.subscribe)))}
    for role, own in _ROLE_OWN.items():
        topics = _Topics({DISCOVERY_TOPIC}, {DISCOVERY_TOPIC})
        for ep in endpoints:
            if role.peer in ep.peers:
                topics.add(dds_topics(ep, owner=False))
        for ep in own:
            topics.add(dds_topics(ep, owner=True))
        out[role] = Grant(role.enclave(enclave_root), tuple(sorted(topics.publish)),
                          tuple(sorted(topics.subscribe)),
                          _deny(node.publish, topics.publish),
                          _deny(node.subscribe, topics.subscribe))
    return out


__all__ = ['DEFAULT_ENCLAVE_ROOT', 'DISCOVERY_TOPIC', 'Grant', 'ResolvedEndpoint', 'Role',
           'dds_topics', 'grants', 'resolve_endpoints']
