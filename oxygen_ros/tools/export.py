"""
``oxygen_export``: the π0.5 graphs as ONNX (vision, prefill, decode, denoise, LM head).

Writes ``<graph>.onnx``, the shared ``weights.bin`` and ``manifest.json`` (every input and
output with shape and dtype, preset, opset, weights SHA-256) into ``--out``. The experimental
TensorRT backend (``tools/tensorrt/``, never run on TensorRT) builds its engines from such a
directory (it exports one itself when it has none).
A checkpoint that does not fit the preset fails with the checkpoint loader's message (which
names the disagreeing dimensions and the preset that would fit).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
import sys

from oxygen_ros.config import PrefixAttention, preset_names

_DTYPES = ('float32', 'float16', 'bfloat16')


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog='oxygen_export', description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--preset', required=True, choices=preset_names())
    p.add_argument('--checkpoint', type=Path, default=None,
                   help='model.safetensors or its directory (default: seeded random weights)')
    p.add_argument('--dtype', default='float32', choices=_DTYPES,
                   help='weights and activations of the graphs (float32 islands kept)')
    p.add_argument('--out', type=Path, required=True, help='output directory')
    p.add_argument('--prefix-attention', default=None,
                   choices=[m.value for m in PrefixAttention], help="default: the preset's")
    p.add_argument('--graphs', nargs='+', default=None,
                   help='graphs to export (default: all): vision prefill decode denoise lm_head')
    p.add_argument('--embed-weights', action='store_true',
                   help='self-contained .onnx files instead of one shared weights.bin (< 2 GB)')
    p.add_argument('--seed', type=int, default=0, help='seed of the random weights')
    p.add_argument('--no-check', action='store_true', help='skip onnx.checker')
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Export; return the process exit code (2 on a bad checkpoint or argument)."""
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')
    import torch

    from oxygen_ros.checkpoint.weights import CheckpointError, load_checkpoint
    from oxygen_ros.config import get_preset
    from oxygen_ros.model.pi05 import build_model
    from oxygen_ros.tools.tensorrt.onnx_export import export_graphs, WeightStorage
    from oxygen_ros.tools.tensorrt.onnx_graphs import GraphName

    cfg = get_preset(args.preset).model
    if args.prefix_attention:
        cfg = cfg.with_overrides(prefix_attention=PrefixAttention(args.prefix_attention))
    dtype = getattr(torch, args.dtype)
    try:
        graphs = tuple(GraphName(g) for g in args.graphs) if args.graphs else tuple(GraphName)
    except ValueError as exc:
        print(f'oxygen_export: {exc}; known: {[g.value for g in GraphName]}', file=sys.stderr)
        return 2
    if args.checkpoint is not None:
        try:
            model = load_checkpoint(args.checkpoint, cfg, dtype=dtype)
        except CheckpointError as exc:
            print(f'oxygen_export: {exc}', file=sys.stderr)
            return 2
    else:
        torch.manual_seed(args.seed)
        model = build_model(cfg, dtype=dtype)
        logging.getLogger('oxygen_export').warning(
            'no --checkpoint: exporting RANDOM weights (seed %d)', args.seed)
    storage = WeightStorage.EMBEDDED if args.embed_weights else WeightStorage.SHARED
    try:
        manifest = export_graphs(model, args.out, graphs=graphs, storage=storage,
                                 check=not args.no_check)
    except ValueError as exc:
        print(f'oxygen_export: {exc}', file=sys.stderr)
        return 2
    print(f'{args.out}: {", ".join(g.value for g in manifest.graphs)} ({manifest.dtype}, '
          f'opset {manifest.opset}, IR {manifest.ir_version}), weights sha256 '
          f'{manifest.weights_sha256[:16]}...')
    return 0


if __name__ == '__main__':
    sys.exit(main())
