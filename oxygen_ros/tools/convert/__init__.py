"""
``oxygen_convert``: an openpi JAX π0.5 checkpoint folder → an oxygen_ros checkpoint folder.

The conversion lives here, beside its command line, outside the runtime package (which only
reads the converted folder: ``checkpoint/weights.py``): ``orbax_reader`` (the JAX arrays),
``jax_layout`` (openpi's parameter tree), ``jax_to_pytorch`` (the conversion and what is
written), ``safetensors_stream`` (one tensor at a time). Needs the ``convert`` extra (``pip
install .[convert]``: tensorstore); not openpi, JAX, flax or transformers. Use:
docs/checkpoints.md.
"""

from __future__ import annotations

import argparse
import logging
import sys

from oxygen_ros.config import preset_names
from oxygen_ros.tools.convert.jax_to_pytorch import convert_checkpoint, MANIFEST_FILE, PRECISIONS
from oxygen_ros.tools.convert.orbax_reader import ConvertError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command line of ``oxygen_convert``."""
    parser = argparse.ArgumentParser(
        prog='oxygen_convert',
        description='Convert an openpi JAX pi0.5 checkpoint (orbax params/ + assets/, e.g. '
                    'gs://openpi-assets/checkpoints/pi05_droid) into an oxygen_ros checkpoint '
                    'folder: model.safetensors in the openpi-PyTorch layout, assets/ with the '
                    f'norm stats, config.json and {MANIFEST_FILE}. Reads with tensorstore '
                    "(pip install '.[convert]'); JAX, flax, openpi are not needed. Streams "
                    'tensor by tensor: a full pi0.5 converts in well under 16 GiB of RAM.')
    parser.add_argument('checkpoint', help='openpi checkpoint folder (with params/ and assets/)')
    parser.add_argument('out', help='output folder (created)')
    parser.add_argument('--preset', choices=preset_names(), default=None,
                        help='preset the weights must fit (default: the one whose dims fit '
                             "and whose asset id the checkpoint's assets/ holds)")
    parser.add_argument('--precision', choices=sorted(PRECISIONS), default='bfloat16',
                        help="on-disk dtype (default bfloat16 as openpi's converter; norms, "
                             'embeddings and the action/time heads stay float32)')
    parser.add_argument('--overwrite', action='store_true',
                        help='replace an existing model.safetensors and assets/')
    parser.add_argument('--no-progress', action='store_true', help='no progress bar')
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run ``oxygen_convert``; exit status 0, or 2 with the reason on stderr."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')
    try:
        result = convert_checkpoint(args.checkpoint, args.out, preset=args.preset,
                                    precision=args.precision, overwrite=args.overwrite,
                                    progress=not args.no_progress)
    except ConvertError as exc:
        print(f'oxygen_convert: error: {exc}', file=sys.stderr)
        return 2
    print(f'oxygen_convert: wrote {result.out_dir} (preset {result.preset}, '
          f'{result.precision}, {result.num_tensors} tensors, {result.nbytes / 2**30:.2f} GiB; '
          f'assets: {", ".join(result.asset_ids) or "none"})')
    print(f'run it: ros2 launch oxygen_ros oxygen.launch.py preset:={result.preset} '
          f'checkpoint:={result.out_dir.resolve()}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
