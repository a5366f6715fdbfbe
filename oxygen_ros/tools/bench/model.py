"""
Time the π0.5 model entry points with random weights (console script ``oxygen_bench model``).

Prints the parameter count and the median wall time of: image encoding (SigLIP + projector),
prefill with 1 and 2 cameras (+ a prompt of ``--prompt-len`` tokens), denoise (``--steps``
Euler steps on the 2-camera prefix) and one decode step for batch 1 and 8 (context = a
2-camera prefix). Decode rows read random K/V: the cost does not depend on the values.

Example::

    oxygen_bench model --preset small
    oxygen_bench model --preset pi05_droid --dtype bfloat16 --repeats 2
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
import datetime
import statistics
import time

from oxygen_ros.config import get_preset, preset_names
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model, Pi05Model
from oxygen_ros.tools.common.machine import cpu_name

import torch


DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16}


def _median_ms(fn: Callable[[], object], repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def run(preset: str, dtype: torch.dtype, repeats: int, warmup: int, prompt_len: int,
        steps: int, seed: int) -> list[tuple[str, float]]:
    """
    Build a random model and time its entry points.

    :returns: ``(label, value)`` rows; times in milliseconds.
    """
    torch.manual_seed(seed)
    cfg = get_preset(preset).model
    start = time.perf_counter()
    model = build_model(cfg, dtype=dtype)
    rows = [('parameters (M)', model.count_parameters() / 1e6),
            ('build + random init (ms)', (time.perf_counter() - start) * 1e3)]
    size = cfg.vision.image_size
    images = torch.rand(1, 2, 3, size, size) * 2 - 1
    tokens = torch.randint(3, 1000, (1, prompt_len))
    token_mask = torch.ones(1, prompt_len, dtype=torch.bool)
    with torch.no_grad():
        embeds = model.encode_images(images)
    for cams in (1, 2):
        rows.append((f'encode_images, {cams} cam (ms)', _median_ms(
            lambda c=cams: model.encode_images(images[:, :c]), repeats, warmup)))
        rows.append((f'prefill, {cams} cam + {prompt_len} tok (ms)', _median_ms(
            lambda c=cams: model.prefill(tokens, token_mask, image_embeds=embeds[:, :c]),
            repeats, warmup)))
    prefix = model.prefill(tokens, token_mask, image_embeds=embeds)
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim)
    rows.append((f'denoise, {steps} steps, H={cfg.action_horizon} (ms)', _median_ms(
        lambda: model.denoise(prefix, noise, num_steps=steps), repeats, warmup)))
    for batch in (1, 8):
        rows.append((f'decode_step, batch {batch}, ctx {prefix.slots.shape[1]} (ms)',
                     _decode_ms(model, batch, prefix.slots.shape[1], repeats, warmup)))
    return rows


def _decode_ms(model: Pi05Model, batch: int, ctx_len: int, repeats: int, warmup: int) -> float:
    cfg = model.cfg
    stride = ctx_len + 1
    cache = KVCache(cfg.vlm, batch * stride, dtype=model.dtype)
    cache.k.normal_()
    cache.v.normal_()
    base = torch.arange(batch)[:, None] * stride
    ctx_slots = base + torch.arange(ctx_len)
    ctx_mask = torch.ones(batch, ctx_len, dtype=torch.bool)
    write_slots = base[:, 0] + ctx_len
    tokens = torch.randint(3, 1000, (batch,))
    positions = torch.full((batch,), ctx_len, dtype=torch.int64)
    return _median_ms(lambda: model.decode_step(tokens, positions, cache, write_slots,
                                                ctx_slots, ctx_mask), repeats, warmup)


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run the benchmark, print a Markdown table."""
    parser = argparse.ArgumentParser(prog='oxygen_bench model',
                                     description=__doc__.split('\n\n')[0])
    parser.add_argument('--preset', default='small', choices=preset_names())
    parser.add_argument('--dtype', default='float32', choices=sorted(DTYPES))
    parser.add_argument('--repeats', type=int, default=5, help='timed runs per entry point')
    parser.add_argument('--warmup', type=int, default=1, help='untimed runs before timing')
    parser.add_argument('--prompt-len', type=int, default=50,
                        help='valid prompt tokens (π0.5 with an 8-d state: ~40-55)')
    parser.add_argument('--steps', type=int, default=10, help='denoise Euler steps')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    rows = run(args.preset, DTYPES[args.dtype], args.repeats, args.warmup, args.prompt_len,
               args.steps, args.seed)
    print(f'# oxygen_bench model --preset {args.preset} --dtype {args.dtype} '
          f'(median of {args.repeats}, {args.warmup} warm-up)')
    print(f'# {datetime.date.today()}, {cpu_name()}, '
          f'{torch.get_num_threads()} threads, torch {torch.__version__}')
    print('| measure | value |')
    print('|---|---:|')
    for label, value in rows:
        print(f'| {label} | {value:,.1f} |')


if __name__ == '__main__':
    main()
