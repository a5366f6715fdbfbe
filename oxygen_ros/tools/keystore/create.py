"""
``oxygen_keystore create KEYSTORE``: an SROS2 keystore for the node, from its own endpoints.

Usage::

    oxygen_keystore create ~/oxygen_keystore --domain-id 7 [--days 365] [--preset pi05_droid]
        [--ros-args -r __ns:=/arm -r /camera/base/image_raw:=/zed/left/image_rect_color ...]

Creates (or refreshes) the CAs, the governance and one enclave per role, ``<root>/oxygen``,
``<root>/operator``, ``<root>/observer`` and ``<root>/robot`` (``--enclave-root``, default
``/oxygen_ros``), each with permissions for exactly the endpoints of the node described by
``--preset`` and its ``--ros-args``, signed with the permissions CA. Run it again after a
remapping, a new namespace or domain: keys and certificates are kept, grants rewritten.
Prints what it did; exits 1 on an error (message on stderr), 0 otherwise. What to copy to the
robot: ``oxygen_keystore deploy`` (docs/security.md).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import sys
from typing import Sequence

from oxygen_ros.tools.keystore.documents import check_domain_id, MAX_DOMAIN_ID
from oxygen_ros.tools.keystore.keystore import create_keystore, git_work_tree, KeystoreError
from oxygen_ros.tools.keystore.node_policy import (
    add_node_arguments, NODE_ARGS_HELP, node_policy, PolicyError, split_ros_args)
from oxygen_ros.tools.keystore.pki import PkiError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='oxygen_keystore create', description=__doc__.split('\n\n')[0].split(': ', 1)[1],
        epilog=NODE_ARGS_HELP)
    parser.add_argument('keystore', type=Path, help='keystore folder (created if missing)')
    parser.add_argument('--domain-id', type=int, default=None,
                        help=f'ROS domain of governance and permissions, 0-{MAX_DOMAIN_ID} '
                             '(default $ROS_DOMAIN_ID, else 0)')
    parser.add_argument('--days', type=int, default=365,
                        help='validity of new enclave certificates and of the permissions '
                             '(default 365)')
    parser.add_argument('--ca-days', type=int, default=3650,
                        help='validity of new CA certificates (default 3650)')
    parser.add_argument('--renew', action='store_true',
                        help='new keys and certificates for the enclaves even if still good')
    add_node_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_keystore create``; return the exit status."""
    own, ros_args = split_ros_args(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(own)
    try:
        domain_id = check_domain_id(args.domain_id if args.domain_id is not None
                                    else int(os.environ.get('ROS_DOMAIN_ID') or 0))
        policy = node_policy(args, ros_args)
        steps = create_keystore(args.keystore, list(policy.grants.values()), domain_id,
                                days=args.days, ca_days=args.ca_days, renew=args.renew)
    except (KeystoreError, PkiError, PolicyError, ValueError) as exc:
        print(f'oxygen_keystore create: {exc}', file=sys.stderr)
        return 1
    for step in steps:
        print(f'{step.action:>8}  {step.path}')
    names = policy.node_args.names
    print(f'\nkeystore {args.keystore.resolve()} for node {names.fully_qualified_name} on '
          f'domain {domain_id}: {len(policy.endpoints)} endpoints; enclaves '
          f'{", ".join(g.enclave for g in policy.grants.values())}')
    print(f'the CA keys are in {(args.keystore / "private").resolve()}: keep them off the robot '
          'and out of git (oxygen_keystore deploy copies enclaves without them)')
    tree = git_work_tree(args.keystore)
    if tree is not None:
        print(f'WARNING: {args.keystore} is inside the git work tree {tree}: never commit its '
              'private/ folder or any key.pem', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
