"""
The DDS Security governance and permissions documents (OMG DDS Security 1.1, §9.4).

Written as sros2 writes them (``sros2/policy/defaults/dds/governance.xml``,
``templates/dds/permissions.xsl``) so the keystore works with the ``ros2 security`` verbs too:

- **governance** (one per keystore): no unauthenticated participants, join access control,
  discovery and liveliness encrypted, RTPS messages signed, and for every topic discovery and
  liveliness protection, read and write access control, metadata and data encrypted;
- **permissions** (one per enclave): a grant whose subject is the enclave's certificate
  (``CN=<enclave>``), valid as long as that certificate, a deny rule (when there is one) before
  the allow rule, both on the keystore's domain, and ``DENY`` for everything else.
"""

from __future__ import annotations

import datetime
from xml.etree import ElementTree as ET

from oxygen_ros.tools.keystore.policy import Grant

_SCHEMA_NS = 'http://www.w3.org/2001/XMLSchema-instance'
_OMG_XSD = 'http://www.omg.org/spec/DDS-SECURITY/20170901/omg_shared_ca_{}.xsd'
MAX_DOMAIN_ID = 232
"""The largest ROS_DOMAIN_ID (ROS 2 docs "The ROS_DOMAIN_ID"; 0-232 on Linux)."""


def _root() -> ET.Element:
    return ET.Element('dds')


def _text(parent: ET.Element, tag: str, text: str) -> ET.Element:
    element = ET.SubElement(parent, tag)
    element.text = text
    return element


def _serialize(root: ET.Element, kind: str) -> bytes:
    root.set('xmlns:xsi', _SCHEMA_NS)
    root.set('xsi:noNamespaceSchemaLocation', _OMG_XSD.format(kind))
    ET.indent(root, '  ')
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, 'utf-8') + b'\n'


def check_domain_id(domain_id: int) -> int:
    """Return ``domain_id`` if it is a ROS domain id; raise ``ValueError`` naming it if not."""
    if isinstance(domain_id, bool) or not isinstance(domain_id, int) or \
            not 0 <= domain_id <= MAX_DOMAIN_ID:
        raise ValueError(f'domain id must be an integer in [0, {MAX_DOMAIN_ID}], got '
                         f'{domain_id!r}')
    return domain_id


def governance_xml(domain_id: int) -> bytes:
    """Return the governance document for one ROS domain (UTF-8 XML)."""
    root = _root()
    rule = ET.SubElement(ET.SubElement(root, 'domain_access_rules'), 'domain_rule')
    _text(ET.SubElement(rule, 'domains'), 'id', str(check_domain_id(domain_id)))
    for tag, value in (('allow_unauthenticated_participants', 'false'),
                       ('enable_join_access_control', 'true'),
                       ('discovery_protection_kind', 'ENCRYPT'),
                       ('liveliness_protection_kind', 'ENCRYPT'),
                       ('rtps_protection_kind', 'SIGN')):
        _text(rule, tag, value)
    topic = ET.SubElement(ET.SubElement(rule, 'topic_access_rules'), 'topic_rule')
    for tag, value in (('topic_expression', '*'),
                       ('enable_discovery_protection', 'true'),
                       ('enable_liveliness_protection', 'true'),
                       ('enable_read_access_control', 'true'),
                       ('enable_write_access_control', 'true'),
                       ('metadata_protection_kind', 'ENCRYPT'),
                       ('data_protection_kind', 'ENCRYPT')):
        _text(topic, tag, value)
    return _serialize(root, 'governance')


def _time(moment: datetime.datetime) -> str:
    """Return an XML Schema dateTime in UTC, seconds resolution (``2026-11-25T10:00:00``)."""
    return moment.astimezone(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%S')


def _rule(grant_element: ET.Element, tag: str, domain_id: int, publish: tuple[str, ...],
          subscribe: tuple[str, ...]) -> None:
    rule = ET.SubElement(grant_element, tag)
    _text(ET.SubElement(rule, 'domains'), 'id', str(domain_id))
    for side, topics in (('publish', publish), ('subscribe', subscribe)):
        if topics:
            parent = ET.SubElement(ET.SubElement(rule, side), 'topics')
            for topic in topics:
                _text(parent, 'topic', topic)


def permissions_xml(grant: Grant, domain_id: int, not_before: datetime.datetime,
                    not_after: datetime.datetime) -> bytes:
    """
    Return the permissions document of one enclave (UTF-8 XML).

    :param not_before: start of validity (the enclave certificate's; aware datetimes).
    :param not_after: end of validity.
    :raises ValueError: a domain id out of range, or ``not_after`` before ``not_before``.
    """
    check_domain_id(domain_id)
    if not_after <= not_before:
        raise ValueError(f'validity ends ({not_after}) before it starts ({not_before})')
    root = _root()
    element = ET.SubElement(ET.SubElement(root, 'permissions'), 'grant', name=grant.enclave)
    _text(element, 'subject_name', f'CN={grant.enclave}')
    validity = ET.SubElement(element, 'validity')
    _text(validity, 'not_before', _time(not_before))
    _text(validity, 'not_after', _time(not_after))
    if grant.deny_publish or grant.deny_subscribe:
        _rule(element, 'deny_rule', domain_id, grant.deny_publish, grant.deny_subscribe)
    _rule(element, 'allow_rule', domain_id, grant.publish, grant.subscribe)
    _text(element, 'default', 'DENY')
    return _serialize(root, 'permissions')


def granted_topics(document: bytes) -> dict[str, dict[str, set[str]]]:
    """
    Return ``{rule: {'publish': topics, 'subscribe': topics}}`` of a permissions document.

    ``rule`` is ``allow_rule`` or ``deny_rule`` (the topics of all grants together).
    """
    out: dict[str, dict[str, set[str]]] = {}
    for rule in ('allow_rule', 'deny_rule'):
        for element in ET.fromstring(document).iter(rule):
            sides = out.setdefault(rule, {'publish': set(), 'subscribe': set()})
            for side in ('publish', 'subscribe'):
                sides[side] |= {t.text for t in element.iterfind(f'{side}/topics/topic')}
    return out


__all__ = ['MAX_DOMAIN_ID', 'check_domain_id', 'governance_xml', 'granted_topics',
           'permissions_xml']
