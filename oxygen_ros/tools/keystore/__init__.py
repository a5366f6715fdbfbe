"""``oxygen_keystore``: an SROS2 keystore for the node, from its own endpoints."""

from __future__ import annotations

from typing import Sequence

from oxygen_ros.tools.cli import run_group, Subcommand

COMMANDS = {
    'create': Subcommand('oxygen_ros.tools.keystore.create',
                         'create or refresh a keystore: CAs, governance, one enclave per role'),
    'permissions': Subcommand('oxygen_ros.tools.keystore.show',
                              "print the node's endpoints and what each enclave is granted"),
    'deploy': Subcommand('oxygen_ros.tools.keystore.deploy',
                         'copy enclaves (never the CA keys) into a keystore for a robot'),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_keystore SUBCOMMAND ...``; return the exit status."""
    return run_group('oxygen_keystore', __doc__.split(': ', 1)[1], COMMANDS, argv)
