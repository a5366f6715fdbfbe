"""
``oxygen_keystore permissions``: the node's endpoints and what each enclave is granted.

Usage::

    oxygen_keystore permissions [--preset P] [--json] [--ros-args -r __ns:=/arm ...]

Prints every topic, service and action the node described by ``--preset`` and its
``--ros-args`` creates, under its resolved name, and then the DDS topics each enclave may
publish and subscribe: what ``oxygen_keystore create`` signs. No keys are touched. ``--json``
prints the same as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from oxygen_ros.tools.keystore.node_policy import (
    add_node_arguments, NODE_ARGS_HELP, node_policy, PolicyError, split_ros_args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='oxygen_keystore permissions',
        description=__doc__.split('\n\n')[0].split(': ', 1)[1], epilog=NODE_ARGS_HELP)
    parser.add_argument('--json', action='store_true', help='one JSON object on stdout')
    add_node_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_keystore permissions``; return the exit status."""
    own, ros_args = split_ros_args(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(own)
    try:
        policy = node_policy(args, ros_args)
    except PolicyError as exc:
        print(f'oxygen_keystore permissions: {exc}', file=sys.stderr)
        return 1
    node = policy.node_args.names.fully_qualified_name
    endpoints = [{'kind': ep.kind.value, 'name': ep.name, 'type': ep.type_name,
                  'peers': sorted(p.value for p in ep.peers)} for ep in policy.endpoints]
    grants = {g.enclave: {'publish': list(g.publish), 'subscribe': list(g.subscribe),
                          'deny_publish': list(g.deny_publish),
                          'deny_subscribe': list(g.deny_subscribe)}
              for g in policy.grants.values()}
    if args.json:
        print(json.dumps({'node': node, 'endpoints': endpoints, 'grants': grants}, indent=1))
        return 0
    print(f'node {node}: {len(endpoints)} endpoints')
    width = max(len(e['kind']) for e in endpoints)
    for e in endpoints:
        peers = ', '.join(e['peers']) or '-'
        print(f'  {e["kind"]:<{width}}  {e["name"]}  [{e["type"]}]  peers: {peers}')
    for enclave, grant in grants.items():
        print(f'\nenclave {enclave}')
        for side, topics in grant.items():
            if topics:
                print(f'  {side}:')
                print('\n'.join(f'    {t}' for t in topics))
    return 0


if __name__ == '__main__':
    sys.exit(main())
