"""
π0.5 on a GPU: components beside their rooflines, OxyGen vs isolated, start-up time.

Run as ``python -m oxygen_ros.tools.bench.gpu_check`` (``oxygen_bench gpu``). Defaults are the
deployment case of issue 10: full-size ``pi05_droid``, bfloat16, random weights, CUDA, 3
cameras, 50 prompt tokens. Phases (``--phases``; results merge into ``--json``, so the phases
may run in separate calls):

- ``components``: per backend (eager, compiled = the fast path, tensorrt), warm-up time, any
  fallback, the gate's closest call per step, and the median time of each model call (vision,
  prefill of the whole prefix, 10-step denoise, decode step at several batch sizes over a long
  context, LM head), each beside its roofline bound on this GPU and a Jetson AGX Thor
  projection (``bench_roofline.py``); and the action path's parity: fast-path actions against
  eager in the model dtype, with eager float32 as the reference (``parity.py``'s rule).
- ``bench``: ``oxygen_bench engine`` OxyGen vs isolated per backend on the paper workload (3
  cameras, decode budget 30, k = 5, a text request every frame).
- ``start``: ``bench_start`` twice in fresh processes: the second finds the compile caches.

The JSON holds the GPU, driver, torch, CUDA and date, and ``show``: issue 10's targets with
the measured figures. Exit 1 when a requested backend was unavailable or failed, or a compiled
step fell back to eager. Runs on any device and preset (``--preset tiny --device cpu`` in CI).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
from pathlib import Path
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable

from oxygen_ros.config import CAMERA_SLOTS, preset_names

BACKENDS = ('eager', 'compiled', 'tensorrt')
PHASES = ('components', 'bench', 'start')


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog='oxygen_bench gpu', description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--phases', nargs='+', default=['components'], choices=PHASES)
    p.add_argument('--bench', action='store_true', help='same as adding the bench phase')
    p.add_argument('--preset', default='pi05_droid', choices=preset_names())
    p.add_argument('--dtype', default='bfloat16', choices=('float32', 'bfloat16'))
    p.add_argument('--device', default='cuda')
    p.add_argument('--cameras', type=int, default=3, choices=(1, 2, 3))
    p.add_argument('--prompt-tokens', type=int, default=50)
    p.add_argument('--decode-batches', type=int, nargs='+', default=[1, 8, 32])
    p.add_argument('--decode-ctx', type=int, default=900,
                   help='context slots per decode row (within a 30-token decode budget of the '
                        'longest prefix: the compiled context buckets)')
    p.add_argument('--backends', nargs='+', default=['eager', 'compiled'], choices=BACKENDS)
    p.add_argument('--compile-mode', default='reduce-overhead',
                   choices=('default', 'reduce-overhead', 'cuda-graphs'))
    p.add_argument('--compile-backend', default='inductor')
    p.add_argument('--repeats', type=int, default=20)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--json', type=Path, default=None, help='write (merge) the results here')
    p.add_argument('--out-dir', type=Path, default=None,
                   help='write (merge) into OUT_DIR/<date>-<gpu>.json (docs/gpu)')
    p.add_argument('--bench-frames', type=int, default=40)
    p.add_argument('--max-running', type=int, default=32, help='largest decode batch')
    p.add_argument('--gpu', default=None, help='GPU name for the roofline (default: detected)')
    args = p.parse_args(argv)
    if args.bench and 'bench' not in args.phases:
        args.phases.append('bench')
    return args


def _timed(fn: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    """Return the median wall time of ``fn`` in ms (one untimed call first)."""
    fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def _engine_config(args: argparse.Namespace, compiled: bool):
    from oxygen_ros.engine.config import BackendKind, CompileMode, EngineConfig

    return EngineConfig(preset=args.preset, dtype=args.dtype, device=args.device,
                        block_size=16, max_running_requests=max(args.decode_batches),
                        decode_budget=30, backend=BackendKind.TORCH,
                        compile_mode=CompileMode(args.compile_mode if compiled else 'none'))


def _backend(name: str, args: argparse.Namespace, model, num_blocks: int):
    """Return (backend, warm-up seconds) for ``name``."""
    from oxygen_ros.backends import fast_backend
    from oxygen_ros.backends.tensorrt_backend import TensorRTBackend
    from oxygen_ros.backends.torch_backend import TorchBackend

    cfg = _engine_config(args, name == 'compiled').backend_config()
    if name == 'eager':
        return TorchBackend(model, num_blocks, 16), 0.0
    if name == 'compiled':
        b = fast_backend.CompiledTorchBackend.create(cfg, model, num_blocks,
                                                     backend=args.compile_backend)
        return b, b.compile_seconds
    b = TensorRTBackend.create(cfg, model, num_blocks)
    return b, b.compile_seconds


def _components(backend, args: argparse.Namespace, sync: Callable[[], None], *,
                timed: bool = True) -> dict:
    """Time the model calls the engine makes, on ``backend.model`` over ``backend.cache``."""
    from oxygen_ros.backends.torch_backend import greedy_calls
    import torch

    m, cache, dev = backend.model, backend.cache, backend.device
    greedy, seed = greedy_calls(m)
    cfg = m.cfg
    gen = torch.Generator().manual_seed(args.seed)
    size = cfg.vision.image_size
    images = (torch.rand(1, args.cameras, 3, size, size, generator=gen) * 2 - 1).to(
        dev, m.dtype)
    tokens = torch.randint(3, 1000, (1, args.prompt_tokens), generator=gen).to(dev)
    p = args.cameras * cfg.image_tokens_per_camera + args.prompt_tokens
    slots = torch.arange(16, 16 + p, device=dev)[None]     # block 0 is the null block
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=gen).to(dev)
    out, ms = {}, {}

    def time_it(name: str, fn: Callable[[], object]) -> None:
        if timed:
            ms[name] = _timed(fn, args.repeats, sync)
    with torch.inference_mode():   # token masks None: all valid, as the backend calls it
        embeds = m.encode_images(images)
        out['image_embeds'] = embeds
        time_it('vision', lambda: m.encode_images(images))
        prefix = m.prefill(tokens, None, image_embeds=embeds, cache=cache, slots=slots)
        out['prefix_hidden'] = prefix.last_hidden
        time_it('prefill', lambda: m.prefill(tokens, None, image_embeds=embeds, cache=cache,
                                             slots=slots))
        out['actions'] = m.denoise(prefix, noise)
        time_it('denoise_10_steps', lambda: m.denoise(prefix, noise))
        ctx_len = max(args.decode_ctx, p)
        for b in args.decode_batches:
            ctx = torch.cat([slots[0], 16 + p + torch.arange(ctx_len - p, device=dev)])
            ctx = ctx[None].expand(b, ctx_len).contiguous()
            mask = torch.ones(b, ctx_len, dtype=torch.bool, device=dev)
            write = 16 + ctx_len + torch.arange(b, device=dev)
            toks = torch.randint(3, 1000, (b,), generator=gen).to(dev)
            pos = torch.full((b,), ctx_len, dtype=torch.int64, device=dev)

            def step(toks=toks, pos=pos, write=write, ctx=ctx, mask=mask):
                return greedy(toks, pos, cache, write, ctx, mask)  # what the engine calls
            out[f'decode_logits_b{b}'] = m.decode_step(toks, pos, cache, write, ctx, mask)
            time_it(f'decode_step_b{b}', step)
        hidden = prefix.last_hidden.expand(max(args.decode_batches), -1).contiguous()
        time_it('lm_head', lambda: seed(hidden))
    return {'ms': ms, 'outputs': out}


def _pipeline_parity(args: argparse.Namespace, model, num_blocks: int, outputs: dict) -> dict:
    """Hold the fast path's outputs against eager with eager float32 as the reference."""
    from oxygen_ros.backends.parity import check_parity
    from oxygen_ros.backends.parity_probe import float32_copy
    from oxygen_ros.backends.torch_backend import TorchBackend

    if 'compiled' not in outputs:
        return {}
    if 'eager' not in outputs:
        outputs['eager'] = _components(TorchBackend(model, num_blocks, 16), args, lambda: None,
                                       timed=False)['outputs']
    ref = None
    reference = float32_copy(model)
    if reference is not None:
        ref = _components(TorchBackend(reference, num_blocks, 16), args, lambda: None,
                          timed=False)['outputs']
        del reference
    result = {}
    for key in ('actions', 'prefix_hidden') + tuple(f'decode_logits_b{b}'
                                                    for b in args.decode_batches):
        r = check_parity(key, [outputs['compiled'][key]], [outputs['eager'][key]],
                         None if ref is None else [ref[key]])
        result[key] = {'error': r.error, 'tolerance': r.tolerance,
                       'eager_vs_float32': r.reference_error, 'passed': r.passed}
    return {'passed': all(r['passed'] for r in result.values()), 'outputs': result,
            'rule': 'max|fast - eager| <= max(1e-4 * scale, 3 * max|eager - eager_fp32|)'}


def _environment(args: argparse.Namespace) -> dict:
    import torch

    cuda = args.device.startswith('cuda')
    driver = None
    if cuda and shutil.which('nvidia-smi'):
        proc = subprocess.run(['nvidia-smi', '--query-gpu=driver_version',
                               '--format=csv,noheader'], capture_output=True, text=True)
        driver = proc.stdout.strip().splitlines()[0] if proc.returncode == 0 else None
    return {'preset': args.preset, 'dtype': args.dtype, 'device': args.device,
            'device_name': torch.cuda.get_device_name() if cuda else 'cpu',
            'driver': driver, 'torch': torch.__version__, 'cuda': torch.version.cuda,
            'platform': platform.platform(), 'python': sys.version.split()[0],
            'date': datetime.date.today().isoformat(), 'cameras': args.cameras,
            'prompt_tokens': args.prompt_tokens, 'decode_ctx': args.decode_ctx,
            'random_weights': True}


def _run_components(args: argparse.Namespace, report: dict) -> bool:
    import torch

    from oxygen_ros.backends.errors import BackendUnavailableError
    from oxygen_ros.backends.gpu_specs import lookup_gpu
    from oxygen_ros.config import get_preset
    from oxygen_ros.model.pi05 import build_model
    from oxygen_ros.tools.bench.roofline import component_costs, format_table, paper_cycle
    from oxygen_ros.tools.bench.roofline import roofline

    sync = torch.cuda.synchronize if args.device.startswith('cuda') else (lambda: None)
    torch.manual_seed(args.seed)
    cfg = get_preset(args.preset).with_overrides(cameras=CAMERA_SLOTS[:args.cameras])
    model = build_model(cfg, dtype=getattr(torch, args.dtype), device=args.device)
    prefix = args.cameras * cfg.image_tokens_per_camera + args.prompt_tokens
    num_slots = 16 + max(args.decode_ctx, prefix) + 2 * max(args.decode_batches) + 4096
    num_blocks = -(-num_slots // 16) + 1
    gpu = lookup_gpu(args.gpu or report['device_name'])
    costs = component_costs(cfg, cameras=args.cameras, prompt_tokens=args.prompt_tokens,
                            decode_batches=args.decode_batches, decode_ctx=args.decode_ctx,
                            dtype_bytes=torch.empty((), dtype=model.dtype).element_size())
    report['gpu_spec'] = None if gpu is None else {
        'name': gpu.name, 'bandwidth_GB_s': gpu.bandwidth / 1e9,
        'bf16_dense_TFLOP_s': gpu.bf16_flops / 1e12, 'source': gpu.source}
    backends, outputs, failed = report.setdefault('backends', {}), {}, False
    for name in args.backends:
        try:
            backend, warm = _backend(name, args, model, num_blocks)
            result = _components(backend, args, sync)
        except BackendUnavailableError as exc:
            print(f'{name}: unavailable: {exc}', file=sys.stderr)
            backends[name] = {'error': str(exc)}
            failed = True
            continue
        rows = roofline(result['ms'], costs, gpu)
        entry = {'warmup_s': warm, 'ms': result['ms'], 'fallbacks': backend.fallbacks,
                 'roofline': rows,
                 'paper_cycle': paper_cycle(rows, tokens_per_cycle=5,
                                            batch_name=f'decode_step_b{args.decode_batches[1]}'
                                            if len(args.decode_batches) > 1 else
                                            f'decode_step_b{args.decode_batches[0]}')}
        parity = getattr(backend.model, 'parity', {})
        entry['gate'] = {step: r.describe() for step, r in parity.items()}
        backends[name] = {**backends.get(name, {}), **entry}
        outputs[name] = {k: v.detach() for k, v in result['outputs'].items()}
        if backend.fallbacks:
            failed = True
            print(f'{name}: compiled steps FELL BACK to eager: {backend.fallbacks}',
                  file=sys.stderr)
        print(f'\n{name}: warm-up {warm:.1f} s\n{format_table(rows, gpu)}')
        del backend
    parity = _pipeline_parity(args, model, num_blocks, outputs)
    if parity:                     # a call without the compiled backend keeps an earlier one
        report['pipeline_parity'] = parity
    return failed


def _run_bench(args: argparse.Namespace, report: dict) -> bool:
    from oxygen_ros.tools.bench.engine import main as bench_main

    failed = False
    tmp = Path(tempfile.mkdtemp(prefix='oxygen-gpu-check-'))   # merged into the report
    for name in args.backends:
        out = tmp / f'bench_{name}.json'
        rc = bench_main(['--preset', args.preset, '--cameras', str(args.cameras),
                         '--decode-budget', '30', '--tokens-per-cycle', '5', '--text-every', '1',
                         '--dtype', args.dtype, '--device', args.device,
                         '--frames', str(args.bench_frames), '--max-running',
                         str(args.max_running),
                         '--backend', 'tensorrt' if name == 'tensorrt' else 'torch',
                         '--compile', args.compile_mode if name == 'compiled' else 'none',
                         '--no-progress', '--json', str(out)])
        bench = json.loads(out.read_text()) if rc == 0 else {'error': f'exit code {rc}'}
        report.setdefault('backends', {}).setdefault(name, {})['bench'] = bench
        failed |= rc != 0 or bool(bench.get('fallbacks'))
    return failed


def _run_start(args: argparse.Namespace, report: dict) -> bool:
    """Start twice in fresh processes; the second start reuses the compile caches."""
    runs = []
    for _ in range(2):
        cmd = [sys.executable, '-m', 'oxygen_ros.tools.bench.start', '--preset', args.preset,
               '--dtype', args.dtype, '--device', args.device, '--cameras', str(args.cameras),
               '--compile-mode', 'auto', '--max-running', str(args.max_running)]
        spawned = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            report['second_start'] = {'error': f'bench_start exit code {proc.returncode}'}
            return True
        run = json.loads(proc.stdout.strip().splitlines()[-1])
        run['first_chunk_s'] = run['first_chunk_unix_s'] - spawned
        runs.append(run)
        print(f"start: first action chunk {run['first_chunk_s']:.1f} s after spawn "
              f"(fast-path warm-up {run['fast_path_warmup_s']:.1f} s, compile cache "
              f"{run['compile_cache_hits']} hits / {run['compile_cache_misses']} misses)")
    report['first_start'], report['second_start'] = runs
    return bool(runs[0]['fallbacks'] or runs[1]['fallbacks'])


def main(argv: list[str] | None = None) -> int:
    """Run the phases; return 0, or 1 on an unavailable or failed backend or a fallback."""
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')
    from oxygen_ros.tools.bench.roofline import show

    env = _environment(args)
    if args.json is None and args.out_dir is not None:
        slug = re.sub(r'[^a-z0-9]+', '-', env['device_name'].lower()).strip('-')
        args.json = args.out_dir / f"{env['date']}-{slug}.json"
    report = json.loads(args.json.read_text()) if args.json and args.json.is_file() else {}
    report.update(env)
    failed = False
    if 'components' in args.phases:
        failed |= _run_components(args, report)
    if 'bench' in args.phases:
        failed |= _run_bench(args, report)
    if 'start' in args.phases:
        failed |= _run_start(args, report)
    report['show'] = show(report)
    for key, row in report['show'].items():
        mark = {True: 'ok', False: 'MISSED', None: 'not measured'}[row['ok']]
        print(f"{key:34} {mark:12} measured {row['measured']} (target {row['target']})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str))
        print(f'wrote {args.json}')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
