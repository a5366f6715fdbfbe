"""``oxygen_demo``: see the node work: on a replayed bag of photographs, or driving a sim arm."""

from __future__ import annotations

from typing import Sequence

from oxygen_ros.tools.cli import run_group, Subcommand

COMMANDS = {
    'bag': Subcommand('oxygen_ros.tools.demo.node_demo',
                      'the node on a looping bag of real photographs; asks two questions '
                      '(make demo)'),
    'sim': Subcommand('oxygen_ros.tools.demo.sim',
                      'the node drives the simulated Panda in closed loop (make sim)'),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_demo [SUBCOMMAND] ...`` (``bag`` by default); return the exit status."""
    return run_group('oxygen_demo', __doc__.split(': ', 1)[1], COMMANDS, argv, default='bag')
