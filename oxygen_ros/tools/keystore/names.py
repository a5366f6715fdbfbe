"""
ROS 2 names as rcl resolves them, and the DDS topic names they become.

rcl resolves a topic or service name in two steps (rcl ``expand_topic_name.c``, ``remap.c``;
design article "Topic and Service name mapping to DDS"): **expand** it against the node's name
and namespace (``~/x`` → ``<ns>/<node>/x``, ``x`` → ``<ns>/x``, ``/x`` stays), then **remap**
it with the first rule whose expanded match equals it (``-r from:=to`` on the command line; a
rule ``node:from:=to`` only for the node named ``node``); the replacement is expanded too.
``-r __ns:=/ns`` and ``-r __node:=name`` rename the node itself, before its names are
resolved. test/tools/test_keystore_names.py checks this module against rcl on real nodes.

``rmw_fastrtps`` (and every DDS rmw) prefixes the fully qualified name: ``rt`` for a topic,
``rq``/``rr`` plus ``Request``/``Reply`` for a service's two DDS topics; an action is three
services and two topics under ``<name>/_action/``. DDS Security permissions name these.
"""

from __future__ import annotations

from dataclasses import dataclass
import re

_TOKEN = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')
_NODE_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')
ACTION_SERVICES = ('send_goal', 'cancel_goal', 'get_result')
"""The services of an action (``<action>/_action/<service>``)."""
ACTION_TOPICS = ('feedback', 'status')
"""The topics of an action (``<action>/_action/<topic>``)."""


class RosNameError(ValueError):
    """A name, namespace or remapping rule that rcl would refuse (the message says why)."""


def validate_namespace(namespace: str) -> str:
    """
    Return ``namespace`` if it is a valid fully qualified namespace (``/`` or ``/a/b``).

    :raises RosNameError: otherwise.
    """
    if namespace == '/':
        return namespace
    if not namespace.startswith('/') or namespace.endswith('/') or \
            not all(_TOKEN.fullmatch(t) for t in namespace[1:].split('/')):
        raise RosNameError(f'invalid namespace {namespace!r}: it must be / or '
                           '/token[/token...] with tokens of letters, digits and _, not '
                           'starting with a digit')
    return namespace


def validate_node_name(name: str) -> str:
    """Return ``name`` if it is a valid node name; raise ``RosNameError`` otherwise."""
    if not _NODE_NAME.fullmatch(name):
        raise RosNameError(f'invalid node name {name!r}: letters, digits and _, not '
                           'starting with a digit')
    return name


def expand(name: str, node_name: str, namespace: str) -> str:
    """
    Return the fully qualified form of a topic or service name (rcl ``rcl_expand_topic_name``).

    :param name: ``/abs/name``, ``relative/name`` or ``~/private/name`` (``~`` alone too).
    :param node_name: the node's (remapped) name.
    :param namespace: the node's (remapped) namespace.
    :raises RosNameError: a name rcl would refuse (empty, ``//``, a trailing ``/``, a token
        starting with a digit, characters other than letters, digits, ``_``, ``/``, ``~``)
        or a substitution (``{node}``), which this module does not implement.
    """
    if '{' in name or '}' in name:
        raise RosNameError(f'{name!r}: substitutions ({{node}}, {{ns}}) are not supported here')
    ns = validate_namespace(namespace).rstrip('/')
    if name == '~' or name.startswith('~/'):
        full = f'{ns}/{node_name}{name[1:]}'
    elif name.startswith('/'):
        full = name
    else:
        full = f'{ns}/{name}'
    tokens = full[1:].split('/')
    if not name or not all(_TOKEN.fullmatch(t) for t in tokens):
        raise RosNameError(f'invalid topic or service name {name!r} (expands to {full!r})')
    return full


@dataclass(frozen=True, slots=True)
class RemapRule:
    """
    One ``-r [node:]match:=replacement`` rule.

    :ivar node_name: applies to that node only; None = to every node.
    :ivar match: a name, or ``__ns`` / ``__node`` (``__name``) for the node's namespace / name.
    """

    node_name: str | None
    match: str
    replacement: str

    @classmethod
    def parse(cls, text: str) -> RemapRule:
        """
        Parse ``[node:]match:=replacement`` as rcl does.

        :raises RosNameError: no ``:=``, an empty side, or a namespace/node replacement rcl
            would refuse.
        """
        left, sep, replacement = text.partition(':=')
        if not sep or not left or not replacement:
            raise RosNameError(f'remapping rule {text!r} is not [node:]from:=to')
        node_name, colon, match = left.rpartition(':')
        if colon and not node_name:
            raise RosNameError(f'remapping rule {text!r}: empty node name before ":"')
        if match == '__ns':
            validate_namespace(replacement)
        elif match in ('__node', '__name'):
            validate_node_name(replacement)
            match = '__node'
        return cls(node_name or None, match, replacement)

    def applies_to(self, node_name: str) -> bool:
        return self.node_name is None or self.node_name == node_name


@dataclass(frozen=True, slots=True)
class NodeNames:
    """
    A node's name, namespace and remapping rules, resolving names as rcl does.

    :param node_name: the name in the code (``oxygen``), before ``__node`` rules.
    :param namespace: the namespace before ``__ns`` rules.
    :param rules: in command-line order (the first match wins).
    """

    node_name: str
    namespace: str = '/'
    rules: tuple[RemapRule, ...] = ()

    @property
    def name(self) -> str:
        """Return the node's name after ``__node`` rules."""
        for rule in self.rules:
            if rule.match == '__node' and rule.applies_to(self.node_name):
                return rule.replacement
        return self.node_name

    @property
    def ns(self) -> str:
        """Return the node's namespace after ``__ns`` rules (matched on the remapped name)."""
        name = self.name
        for rule in self.rules:
            if rule.match == '__ns' and rule.applies_to(name):
                return rule.replacement
        return validate_namespace(self.namespace)

    @property
    def fully_qualified_name(self) -> str:
        return f'{self.ns.rstrip("/")}/{self.name}'

    def resolve(self, name: str) -> str:
        """
        Return the fully qualified, remapped name of a topic, service or action.

        :raises RosNameError: an invalid name, or a rule that remaps it to one.
        """
        node, ns = self.name, self.ns
        full = expand(name, node, ns)
        for rule in self.rules:
            if rule.match in ('__ns', '__node') or not rule.applies_to(node):
                continue
            if expand(rule.match, node, ns) == full:
                return expand(rule.replacement, node, ns)
        return full


def topic_dds(name: str) -> str:
    """Return the DDS topic of a ROS topic (``/a/b`` → ``rt/a/b``)."""
    return f'rt{name}'


def request_dds(service: str) -> str:
    """Return the DDS topic a service's requests travel on (``rq/<name>Request``)."""
    return f'rq{service}Request'


def reply_dds(service: str) -> str:
    """Return the DDS topic a service's replies travel on (``rr/<name>Reply``)."""
    return f'rr{service}Reply'


def action_services(action: str) -> tuple[str, ...]:
    """Return the services of an action (``<action>/_action/send_goal`` ...)."""
    return tuple(f'{action}/_action/{s}' for s in ACTION_SERVICES)


def action_topics(action: str) -> tuple[str, ...]:
    """Return the topics of an action (``<action>/_action/feedback``, ``.../status``)."""
    return tuple(f'{action}/_action/{t}' for t in ACTION_TOPICS)


__all__ = ['ACTION_SERVICES', 'ACTION_TOPICS', 'RosNameError', 'NodeNames', 'RemapRule',
           'action_services', 'action_topics', 'expand', 'reply_dds', 'request_dds',
           'topic_dds', 'validate_namespace', 'validate_node_name']
