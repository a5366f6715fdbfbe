"""
π0.5 component times on torch eager, torch.compile and TensorRT (``tools/gpu_check.py``).

Run as ``python -m oxygen_ros.tools.gpu_check``.

Defaults are the deployment case: full-size ``pi05_droid``, bfloat16, random weights, CUDA,
3 cameras. For each backend it times the five model calls the engine makes (vision, prefill
of the whole prefix, 10-step denoise, decode step at several batch sizes over a long
context, LM head), checks their outputs against eager, and reports the warm-up (compile /
engine build) apart. ``--bench`` then runs ``oxygen-bench`` on the OxyGen paper workload
(3 cameras, decode budget 30, k = 5, a text request every frame) per backend.

Runs on any device and preset (``--preset tiny --device cpu`` is the smoke test in CI).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
import statistics
import sys
import time
from typing import Callable

from oxygen_ros.config import preset_names

BACKENDS = ('eager', 'compiled', 'tensorrt')


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog='gpu_check', description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--preset', default='pi05_droid', choices=preset_names())
    p.add_argument('--dtype', default='bfloat16', choices=('float32', 'bfloat16'))
    p.add_argument('--device', default='cuda')
    p.add_argument('--cameras', type=int, default=3, choices=(1, 2, 3))
    p.add_argument('--prompt-tokens', type=int, default=50)
    p.add_argument('--decode-batches', type=int, nargs='+', default=[1, 8, 32])
    p.add_argument('--decode-ctx', type=int, default=900, help='context slots per decode row')
    p.add_argument('--backends', nargs='+', default=list(BACKENDS), choices=BACKENDS)
    p.add_argument('--compile-mode', default='reduce-overhead',
                   choices=('default', 'reduce-overhead'))
    p.add_argument('--compile-backend', default='inductor')
    p.add_argument('--repeats', type=int, default=20)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--json', type=Path, default=None)
    p.add_argument('--bench', action='store_true', help='also run oxygen-bench per backend')
    p.add_argument('--bench-frames', type=int, default=40)
    return p.parse_args(argv)


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


def _backend(name: str, args: argparse.Namespace, model, num_blocks: int):
    """Return (backend, warm-up seconds) for ``name``."""
    from oxygen_ros.backends import fast_backend
    from oxygen_ros.engine.config import BackendKind, CompileMode, EngineConfig
    from oxygen_ros.backends.tensorrt_backend import TensorRTBackend
    from oxygen_ros.backends.torch_backend import TorchBackend

    cfg = EngineConfig(preset=args.preset, dtype=args.dtype, device=args.device, block_size=16,
                       max_running_requests=max(args.decode_batches),
                       decode_budget=args.decode_ctx, compile_mode=CompileMode(
                           args.compile_mode), backend=BackendKind.TORCH)
    if name == 'eager':
        return TorchBackend(model, num_blocks, 16), 0.0
    if name == 'compiled':
        b = fast_backend.CompiledTorchBackend.create(cfg.backend_config(), model, num_blocks,
                                                     backend=args.compile_backend)
        return b, b.compile_seconds
    b = TensorRTBackend.create(cfg.backend_config(), model, num_blocks)
    return b, b.compile_seconds


def _components(backend, args: argparse.Namespace, sync: Callable[[], None]) -> dict:
    """Time the five model calls on ``backend.model`` over ``backend.cache``."""
    import torch

    m, cache, dev = backend.model, backend.cache, backend.device
    cfg = m.cfg
    gen = torch.Generator().manual_seed(args.seed)
    size = cfg.vision.image_size
    images = (torch.rand(1, args.cameras, 3, size, size, generator=gen) * 2 - 1).to(dev)
    tokens = torch.randint(3, 1000, (1, args.prompt_tokens), generator=gen).to(dev)
    tmask = torch.ones_like(tokens, dtype=torch.bool)
    p = args.cameras * cfg.image_tokens_per_camera + args.prompt_tokens
    slots = torch.arange(16, 16 + p, device=dev)[None]     # block 0 is the null block
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=gen).to(dev)
    out, ms = {}, {}
    with torch.inference_mode():
        embeds = m.encode_images(images)
        ms['vision'] = _timed(lambda: m.encode_images(images), args.repeats, sync)
        prefix = m.prefill(tokens, tmask, image_embeds=embeds, cache=cache, slots=slots)
        ms['prefill'] = _timed(lambda: m.prefill(tokens, tmask, image_embeds=embeds,
                                                 cache=cache, slots=slots), args.repeats, sync)
        out['actions'] = m.denoise(prefix, noise)
        ms['denoise_10_steps'] = _timed(lambda: m.denoise(prefix, noise), args.repeats, sync)
        ctx_len = max(args.decode_ctx, p)
        for b in args.decode_batches:
            ctx = torch.cat([slots[0], 16 + p + torch.arange(ctx_len - p, device=dev)])
            ctx = ctx[None].expand(b, ctx_len).contiguous()
            mask = torch.ones(b, ctx_len, dtype=torch.bool, device=dev)
            write = 16 + ctx_len + torch.arange(b, device=dev)
            toks = torch.randint(3, 1000, (b,), generator=gen).to(dev)
            pos = torch.full((b,), ctx_len, dtype=torch.int64, device=dev)

            def step(toks=toks, pos=pos, write=write, ctx=ctx, mask=mask):
                return m.decode_step(toks, pos, cache, write, ctx, mask)
            out[f'decode_logits_b{b}'] = step()
            ms[f'decode_step_b{b}'] = _timed(step, args.repeats, sync)
        hidden = prefix.last_hidden.expand(max(args.decode_batches), -1).contiguous()
        ms['lm_head'] = _timed(lambda: m.lm_logits(hidden), args.repeats, sync)
    return {'ms': ms, 'outputs': out}


def main(argv: list[str] | None = None) -> int:
    """
    Run the checks; return 0, or 1 if a requested backend was unavailable or failed.

    A compiled step that fell back to eager counts as a failure (the fast path was asked for).
    """
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')
    import torch

    from oxygen_ros.config import get_preset
    from oxygen_ros.backends.errors import BackendUnavailableError
    from oxygen_ros.model.pi05 import build_model

    sync = torch.cuda.synchronize if args.device.startswith('cuda') else (lambda: None)
    torch.manual_seed(args.seed)
    cfg = get_preset(args.preset)
    model = build_model(cfg, dtype=getattr(torch, args.dtype), device=args.device)
    prefix = args.cameras * cfg.image_tokens_per_camera + args.prompt_tokens
    num_slots = 16 + max(args.decode_ctx, prefix) + max(args.decode_batches)
    num_blocks = -(-num_slots // 16) + 1
    report = {'preset': args.preset, 'dtype': args.dtype, 'device': args.device,
              'device_name': torch.cuda.get_device_name() if args.device.startswith('cuda')
              else 'cpu', 'torch': torch.__version__, 'cameras': args.cameras,
              'prompt_tokens': args.prompt_tokens, 'decode_ctx': args.decode_ctx,
              'backends': {}}
    failed = False
    reference = None
    for name in args.backends:
        try:
            backend, warm = _backend(name, args, model, num_blocks)
            result = _components(backend, args, sync)
        except BackendUnavailableError as exc:
            print(f'{name}: unavailable: {exc}', file=sys.stderr)
            report['backends'][name] = {'error': str(exc)}
            failed = True
            continue
        entry = {'warmup_s': warm, 'ms': result['ms'], 'fallbacks': backend.fallbacks}
        if backend.fallbacks:
            failed = True
            print(f'{name}: compiled steps FELL BACK to eager: {backend.fallbacks}',
                  file=sys.stderr)
        if reference is None:
            reference = result['outputs']
        else:
            entry['max_abs_diff_vs_first'] = {
                k: float((v.float() - reference[k].float()).abs().max())
                for k, v in result['outputs'].items()}
        report['backends'][name] = entry
        del backend
        print(f'{name:9} warm-up {warm:7.1f} s  ' + '  '.join(
            f'{k} {v:.2f} ms' for k, v in result['ms'].items()))
    if args.bench:
        del model
        from oxygen_ros.tools.bench import main as bench_main
        for name in args.backends:
            if 'error' in report['backends'].get(name, {}):
                continue
            path = (args.json.parent if args.json else Path('.')) / f'bench_{name}.json'
            bench_args = ['--preset', args.preset, '--cameras', '3', '--decode-budget', '30',
                          '--tokens-per-cycle', '5', '--text-every', '1', '--dtype', args.dtype,
                          '--device', args.device, '--frames', str(args.bench_frames),
                          '--backend', 'tensorrt' if name == 'tensorrt' else 'torch',
                          '--compile', args.compile_mode if name == 'compiled' else 'none',
                          '--no-progress', '--json', str(path)]
            rc = bench_main(bench_args)
            bench = json.loads(path.read_text()) if rc == 0 else {'error': f'exit code {rc}'}
            report['backends'][name]['bench'] = bench
            failed |= rc != 0 or bool(bench.get('fallbacks'))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
