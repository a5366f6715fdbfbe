"""Command-line options shared by ``oxygen_bench engine``, ``start``, ``gpu`` and ``run_model``."""

from __future__ import annotations

import argparse

from oxygen_ros.engine import AttentionBackend, Quantization, Step

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


def add_quantization_argument(p: argparse.ArgumentParser) -> None:
    """Add ``--quantization`` (``EngineConfig.quantization``)."""
    p.add_argument('--quantization', default=Quantization.NONE.value,
                   choices=[q.value for q in Quantization],
                   help="weights quantized at load: 'fp8' = E4M3 weights with per-channel "
                        "scales, held to the FP8 action check (docs/gpu.md 'FP8 weights'); "
                        'on CUDA with --dtype bfloat16')


def fast_path_options(args: argparse.Namespace, *, progress: bool = True) -> dict:
    """Return ``backends.factory.make_backend``'s fast-path options from those arguments."""
    return {'backend': args.compile_backend, 'progress': progress,
            'precompile': not args.no_precompile,
            'only': [Step(s) for s in args.only] if args.only else None,
            'camera_counts': tuple(args.compile_cameras) if args.compile_cameras else None}


__all__ = ['COMPILE_MODES', 'add_fast_path_arguments', 'add_quantization_argument',
           'fast_path_options']
