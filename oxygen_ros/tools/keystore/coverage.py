"""
Does a keystore grant what a node about to start will create? Checked before it starts.

A keystore's permissions are written for one configuration of the node (``oxygen_keystore
create --preset P --ros-args ...``). Started with another (other cameras, a remapping, a
namespace), the node or its peers would meet the middleware's refusals one endpoint at a time,
as raw rmw errors. ``keystore_problem`` compares what each enclave's signed permissions allow
(``permissions.p7s``, the document the middleware reads) with the grant ``oxygen_keystore
create`` writes for the configuration being started, deciding as DDS Security does (OMG DDS
Security 1.1, §9.4: the rules in order, a deny rule before the allow rule here, topics
matched with fnmatch; anything else is denied), and names every missing grant in one message.
``oxygen_demo --keystore`` and the launch file's ``enclave:=`` run it (docs/security.md).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path
import shlex
from typing import Mapping, Sequence

from oxygen_ros.tools.keystore.documents import granted_topics
from oxygen_ros.tools.keystore.keystore import enclave_dir, keystore_domain_id
from oxygen_ros.tools.keystore.node_policy import policy_for
from oxygen_ros.tools.keystore.pki import PkiError, signed_content
from oxygen_ros.tools.keystore.policy import Grant, Role

SIDES = ('publish', 'subscribe')


def missing_grants(document: bytes, needed: Grant) -> dict[str, list[str]]:
    """
    Return the DDS topics of ``needed`` a permissions document does not allow, per side.

    :param document: a permissions document (XML, deny rules before allow rules).
    :returns: ``{'publish': [...], 'subscribe': [...]}`` without empty sides; a wildcard of
        ``needed`` (``rq/*/get_parametersRequest``) counts as allowed when the document has
        the same wildcard.
    """
    rules = granted_topics(document)
    out = {}
    for side in SIDES:
        deny = rules.get('deny_rule', {}).get(side, set())
        allow = rules.get('allow_rule', {}).get(side, set())
        lacking = [t for t in getattr(needed, side)
                   if any(fnmatchcase(t, p) for p in deny)
                   or not any(fnmatchcase(t, p) for p in allow)]
        if lacking:
            out[side] = lacking
    return out


def keystore_problem(keystore: Path, preset: str | None, ros_args: Sequence[str],
                     enclaves: Mapping[Role, str]) -> str | None:
    """
    Return why ``keystore`` would refuse the node (or its peers) as configured, or None.

    :param preset: the node's params file ``config/<preset>.yaml`` (``policy_for``).
    :param ros_args: the node's ``--ros-args ...`` (remappings, ``-p``, params files).
    :param enclaves: the enclave each role's process runs in (``{Role.NODE:
        '/oxygen_ros/oxygen'}``).
    :returns: one message naming every missing grant and the command that makes the keystore
        for this configuration.
    :raises PolicyError: a configuration the node itself would refuse.
    """
    policy = policy_for(preset, ros_args)
    lacks = []
    for role, enclave in enclaves.items():
        path = enclave_dir(keystore, enclave) / 'permissions.p7s'
        try:
            document = signed_content(path)
        except (OSError, PkiError) as exc:
            lacks.append(f'enclave {enclave} has no readable permissions ({exc})')
            continue
        missing = missing_grants(document, policy.grants[role])
        if missing:
            lacks.append(f'enclave {enclave} lacks ' + '; '.join(
                f'{side} {", ".join(topics)}' for side, topics in missing.items()))
    if not lacks:
        return None
    domain = keystore_domain_id(keystore)
    command = shlex.join(['oxygen_keystore', 'create', str(keystore),
                          *(['--domain-id', str(domain)] if domain is not None else []),
                          *(['--preset', preset] if preset else []), *ros_args])
    return (f'the keystore {keystore} was made for another configuration of the node: '
            f'{"; ".join(lacks)}. Make it for this one: {command}')


__all__ = ['keystore_problem', 'missing_grants']
