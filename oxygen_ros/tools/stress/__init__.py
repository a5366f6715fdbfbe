"""``oxygen_stress``: load the running node and check it holds: a question flood, a soak."""

from __future__ import annotations

from typing import Sequence

from oxygen_ros.tools.cli import run_group, Subcommand

COMMANDS = {
    'flood': Subcommand('oxygen_ros.tools.stress.flood',
                        'flood ~/ask with questions; exact counts and the action chunk rate'),
    'soak': Subcommand('oxygen_ros.tools.stress.soak',
                       'the node for N minutes under steady load, watched for leaks and rate'),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_stress SUBCOMMAND ...``; return the exit status."""
    return run_group('oxygen_stress', __doc__.split(': ', 1)[1], COMMANDS, argv)
