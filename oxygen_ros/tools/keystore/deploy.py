"""
``oxygen_keystore deploy KEYSTORE OUT --enclave E``: a keystore for one machine, no CA keys.

Usage::

    oxygen_keystore deploy ~/oxygen_keystore /tmp/robot_keystore --enclave /oxygen_ros/oxygen
    rsync -a /tmp/robot_keystore/ robot:/etc/oxygen_ros/keystore/

Writes ``OUT`` (a new folder) with the public CA certificates, the signed governance and the
named enclaves only: ``private/`` (the CA keys) and the other enclaves' private keys stay
behind. Point ``ROS_SECURITY_KEYSTORE`` at it on that machine. Exits 1 on an error.
"""

from __future__ import annotations

import argparse
from pathlib import Path
import sys
from typing import Sequence

from oxygen_ros.tools.keystore.keystore import deploy, KeystoreError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='oxygen_keystore deploy',
                                     description=__doc__.split('\n\n')[0].split(': ', 1)[1])
    parser.add_argument('keystore', type=Path, help='the keystore oxygen_keystore create made')
    parser.add_argument('out', type=Path, help='new folder for that machine')
    parser.add_argument('--enclave', action='append', required=True, metavar='ENCLAVE',
                        help='an enclave to copy (repeat for more), e.g. /oxygen_ros/oxygen')
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_keystore deploy``; return the exit status."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        written = deploy(args.keystore, args.out, args.enclave)
    except KeystoreError as exc:
        print(f'oxygen_keystore deploy: {exc}', file=sys.stderr)
        return 1
    print(f'{len(written)} files in {args.out.resolve()} for {", ".join(args.enclave)}; no CA '
          'key. On that machine: export ROS_SECURITY_KEYSTORE=<where you copy it>')
    return 0


if __name__ == '__main__':
    sys.exit(main())
