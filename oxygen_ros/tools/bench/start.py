"""
Start-up time to the first action chunk, as a node starts (``python -m ...tools.bench_start``).

Run it in a fresh process (``oxygen_bench gpu``'s second command runs it after the first
command's bench, whose warm-up filled the compile caches on disk). It does what the node's
configure and first cycle do: build the engine (weights, KV pool, the fast path's warm-up:
compile, capture, parity gate), the engine warm-up cycle, then one control cycle on a real
observation, and prints one JSON line: seconds per phase, ``first_chunk_unix_s`` (the wall
clock when the chunk was ready, for the parent to subtract its spawn time), the compile
cache hits / misses, per step the Dynamo graphs traced (``compiles``) and the functions
compiled ahead of time loaded instead (``loaded``), what the parity gate held the graphs to
(``gate``: eager in float32, or the tolerances recorded for these weights), the warm-up's
seconds per step (``phases``), graphs per step, any fallback and any feature the fast path
dropped (``dropped``). Random weights (no checkpoint loading time).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from oxygen_ros.config import CAMERA_SLOTS, preset_names
from oxygen_ros.tools.bench.options import (
    add_fast_path_arguments, add_quantization_argument, COMPILE_MODES)
from oxygen_ros.tools.bench.options import fast_path_options


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog='bench_start', description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--preset', default='pi05_droid', choices=preset_names())
    p.add_argument('--dtype', default='bfloat16', choices=('float32', 'bfloat16'))
    add_quantization_argument(p)
    p.add_argument('--device', default='cuda')
    p.add_argument('--cameras', type=int, default=3, choices=(1, 2, 3))
    p.add_argument('--compile-mode', default='auto', choices=COMPILE_MODES)
    p.add_argument('--max-running', type=int, default=32)
    p.add_argument('--decode-budget', type=int, default=30)
    add_fast_path_arguments(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Start an engine, run one cycle, print the timings as one JSON line."""
    t0 = time.perf_counter()
    args = _parse(argv)
    from dataclasses import replace
    import logging
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')
    from oxygen_ros.engine import AttentionBackend, CompileMode, Engine, EngineConfig, load_model
    from oxygen_ros.engine.loading import make_backend_for
    from oxygen_ros.tools.bench.warmup_summary import dropped_features
    from oxygen_ros.tools.common.workload import make_observation
    import torch
    t_import = time.perf_counter()
    cfg = EngineConfig.create(
        preset=args.preset, dtype=args.dtype, quantization=args.quantization,
        device=args.device, compile_mode=CompileMode(args.compile_mode),
        cameras=CAMERA_SLOTS[:args.cameras], decode_budget=args.decode_budget,
        max_running_requests=args.max_running,
        attention_backend=AttentionBackend.resolve(args.attention))
    loaded = load_model(cfg, cfg.model_config())   # what Engine(cfg) does, fast path narrowed
    backend = make_backend_for(cfg, loaded.model, cfg.pool_blocks(), reference=loaded.reference,
                               **fast_path_options(args, progress=False))
    engine = Engine(cfg, model=replace(loaded, reference=None), backend=backend)
    t_build = time.perf_counter()
    cameras, state_dim = engine.robot.cameras, engine.robot.state_dim
    engine.warmup(make_observation(0, cameras, state_dim))
    t_warm = time.perf_counter()
    out = engine.step(make_observation(1, cameras, state_dim))
    if out.action is None:
        raise RuntimeError('no action chunk from the first cycle')
    first = time.time()
    t_first = time.perf_counter()
    report = engine.backend.warmup_report
    cache = report.compile_cache
    print(json.dumps({
        'import_s': t_import - t0, 'engine_build_s': t_build - t_import,
        'fast_path_warmup_s': report.seconds,
        'engine_warmup_cycle_s': t_warm - t_build, 'first_cycle_s': t_first - t_warm,
        'main_to_first_chunk_s': t_first - t0, 'first_chunk_unix_s': first,
        'compile_cache_hits': cache.hits if cache else None,
        'compile_cache_misses': cache.misses if cache else None,
        'compile_cache_loaded': cache.loaded if cache else None,
        'compiles': dict(report.compiles), 'loaded': dict(report.loaded),
        'gate': report.gate, 'phases': {k: round(v, 3) for k, v in report.phases.items()},
        'graphs': dict(report.graphs), 'fallbacks': engine.fallbacks,
        'dropped': dropped_features(engine.backend),
        'quantization': engine.describe_quantization(),
        'compile_mode': args.compile_mode,
        'compile_backend': args.compile_backend, 'compile_cameras': args.compile_cameras,
        'attention_backend': backend.attention.value,
        'device_name': torch.cuda.get_device_name() if args.device.startswith('cuda')
        else 'cpu'}))
    return 0


if __name__ == '__main__':
    sys.exit(main())
