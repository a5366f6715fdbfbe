"""``oxygen_bag``: make, replay and record rosbag2 bags without rosbag2 (``rosbags`` + rclpy)."""

from __future__ import annotations

from typing import Sequence

from oxygen_ros.tools.cli import run_group, Subcommand

COMMANDS = {
    'replay': Subcommand('oxygen_ros.tools.bag.replay',
                         'publish a bag over DDS with its recorded timing (--loop)'),
    'record': Subcommand('oxygen_ros.tools.bag.record', 'record live topics into a bag'),
    'make_demo': Subcommand('oxygen_ros.tools.bag.make_demo',
                            'write a bag of real photographs and a smooth arm motion'),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_bag SUBCOMMAND ...``; return the exit status."""
    return run_group('oxygen_bag', __doc__.split(': ', 1)[1], COMMANDS, argv)
