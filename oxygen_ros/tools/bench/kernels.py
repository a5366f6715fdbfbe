"""
``oxygen_bench kernels``: the model's Triton kernels built as Inductor builds them, per GPU target.

Every kernel launch of every preset's callers (a decode step, a causal suffix, the fused denoise),
in each dtype, typed as the installed torch types a ``wrap_triton`` kernel's arguments, analysed by
torch's mutation analysis and compiled with ``triton.compile`` for each target, on this machine,
with or without that GPU (``backends/fast_path/kernels/builds.py``). Prints one line per kernel x
variant x dtype x target (registers, bytes spilled, what it writes) and exits 1 when any failed.
Run it without ``TRITON_INTERPRET`` (the interpreter's kernels are not the compiler's).

Usage::

    oxygen_bench kernels [--target 90 110] [--preset NAME ...] [--dtype float32 bfloat16]
                         [--no-analysis] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import sys
from typing import Sequence

from oxygen_ros.config import get_preset, preset_names

DTYPES = ('float32', 'bfloat16')
"""The engine's dtypes (``EngineConfig.dtype``)."""
TARGETS = (90, 110)
"""Hopper (H100, H200) and Jetson AGX Thor."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='oxygen_bench kernels', description=__doc__.split(
        '\n\n')[0].split(': ', 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--target', type=int, nargs='+', default=list(TARGETS),
                        help='CUDA compute capabilities x 10 (default: 90 110)')
    parser.add_argument('--preset', nargs='+', default=list(preset_names()),
                        choices=preset_names(), help='presets (default: all)')
    parser.add_argument('--dtype', nargs='+', default=list(DTYPES), choices=DTYPES)
    parser.add_argument('--no-analysis', action='store_true',
                        help="skip torch's mutation analysis (faster)")
    parser.add_argument('--json', type=Path, help='write every build as JSON here')
    return parser


def run(targets: Sequence[int], presets: Sequence[str], dtypes: Sequence[str], *,
        analyse: bool = True) -> list[dict]:
    """Build one launch of each kind for every target; return each build as a dict."""
    import torch

    from oxygen_ros.backends.fast_path.kernels.builds import build, launch_kinds, model_launches

    launches = launch_kinds(launch for p in presets for d in dtypes
                            for launch in model_launches(get_preset(p).model, getattr(torch, d)))
    out = []
    for arch in targets:
        for launch in launches:
            b = build(launch, ('cuda', arch, 32), analyse=analyse)
            print(b.line(), flush=True)
            out.append({'kernel': b.kernel, 'variant': b.variant, 'signature': b.signature,
                        'target': b.target, 'ok': b.ok, 'error': b.error,
                        'registers': b.registers, 'spills': b.spills,
                        'mutated': list(b.mutated) if b.mutated is not None else None,
                        'seconds': round(b.seconds, 2)})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Build the table; return 0 when every kernel built, else 1."""
    args = _parser().parse_args(argv)
    if os.environ.get('TRITON_INTERPRET', '0') not in ('', '0'):
        print('oxygen_bench kernels: unset TRITON_INTERPRET (the interpreter builds nothing)',
              file=sys.stderr)
        return 2
    import torch
    import triton
    builds = run(args.target, args.preset, args.dtype, analyse=not args.no_analysis)
    failed = sum(not b['ok'] for b in builds)
    print(f'{len(builds) - failed} of {len(builds)} built (Triton {triton.__version__}, '
          f'torch {torch.__version__})')
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({'triton': triton.__version__,
                                         'torch': torch.__version__, 'builds': builds},
                                        indent=1))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
