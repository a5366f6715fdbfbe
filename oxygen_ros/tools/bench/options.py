"""Command-line options of the fast path shared by ``oxygen_bench engine``, ``start``, ``gpu``."""

from __future__ import annotations

import argparse

from oxygen_ros.backends.config import AttentionBackend, Step

COMPILE_MODES = ('none', 'auto', 'default', 'reduce-overhead', 'cuda-graphs')


def add_fast_path_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``--only``, ``--compile-cameras``, ``--compile-backend``, ``--attention`` and kin."""
    p.add_argument('--only', nargs='+', default=None, choices=[s.value for s in Step],
                   help='put only these steps on the fast path (default: all)')
    p.add_argument('--compile-cameras', type=int, nargs='+', default=None,
                   help='valid-camera counts to compile (default: 1 to --cameras)')
    p.add_argument('--compile-backend', default='inductor',
                   help='torch.compile backend of the fast path')
    p.add_argument('--attention', default=None, choices=[b.value for b in AttentionBackend],
                   help='attention kernel (default: $OXYGEN_ROS_ATTENTION, else auto)')
    p.add_argument('--no-precompile', action='store_true',
                   help='compile the steps just in time only (default: ahead of time too, '
                        'kept on disk for the next start; inductor and aot_eager)')


def fast_path_options(args: argparse.Namespace, *, progress: bool = True) -> dict:
    """Return ``backends.factory.make_backend``'s fast-path options from those arguments."""
    return {'backend': args.compile_backend, 'progress': progress,
            'precompile': not args.no_precompile,
            'only': [Step(s) for s in args.only] if args.only else None,
            'camera_counts': tuple(args.compile_cameras) if args.compile_cameras else None}


__all__ = ['COMPILE_MODES', 'add_fast_path_arguments', 'fast_path_options']
