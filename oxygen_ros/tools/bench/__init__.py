"""``oxygen_bench``: measure speed: the engine, the model, the node's timing, a GPU session."""

from __future__ import annotations

from typing import Sequence

from oxygen_ros.tools.cli import run_group, Subcommand

COMMANDS = {
    'engine': Subcommand('oxygen_ros.tools.bench.engine',
                         'OxyGen vs isolated execution on one workload, side by side'),
    'model': Subcommand('oxygen_ros.tools.bench.model',
                        'time the model entry points (vision, prefill, denoise, decode)'),
    'jitter': Subcommand('oxygen_ros.tools.bench.jitter',
                         "the node's action-chunk timing while texts decode (over DDS)"),
    'image_decode': Subcommand('oxygen_ros.tools.bench.image_decode',
                               'what a compressed (JPEG/PNG) camera costs per frame'),
    'kernels': Subcommand('oxygen_ros.tools.bench.kernels',
                          'the Triton kernels built as Inductor builds them, per GPU target'),
    'serve': Subcommand('oxygen_ros.tools.bench.serve',
                        "openpi's wire: a client round trip beside the engine's own step"),
    'gpu': Subcommand('oxygen_ros.tools.bench.gpu_session',
                      'the GPU session: --session 1, then 2 (one lease), 3-6 optional'),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_bench SUBCOMMAND ...``; return the exit status."""
    return run_group('oxygen_bench', __doc__.split(': ', 1)[1], COMMANDS, argv)
