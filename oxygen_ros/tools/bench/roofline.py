"""
Rooflines and targets for ``oxygen_bench gpu``: measured times beside their bounds (pure).

Each measured component gets its FLOPs and bytes (``call_costs.py``), its bound on the GPU
it ran on (``gpu_specs.py``) and the fraction of the bound reached. The Jetson AGX
Thor column is a PROJECTION, not a measurement: Thor's bound divided by the fraction of the
bound reached here (same software efficiency assumed; Thor's 273 GB/s makes the memory-bound
calls ~12x slower than on an H100). ``show`` holds the figures against the targets
(``docs/gpu.md#targets``).
"""

from __future__ import annotations

from oxygen_ros.config import ModelConfig
from oxygen_ros.tools.bench.call_costs import (
    CallCost, decode_cost, denoise_cost, gemma_layer_linear_params, prefill_cost, seed_cost,
    vision_cost)
from oxygen_ros.tools.bench.gpu_specs import GpuSpec, JETSON_AGX_THOR

TARGETS_MS = {'vision': 3.0, 'prefill': 8.0, 'denoise_10_steps': 4.5, 'decode_step_b1': 2.5,
              'decode_step_b8': 2.2}
"""Component targets on an H100, bf16 (``docs/gpu.md#targets``)."""
PIPELINE_TARGETS = {'action_latency_ms_p50': 12.0, 'frames_per_s': 40.0, 'tokens_per_s': 1000.0}
"""End-to-end targets on an H100, bf16: ``pi05_droid``, 3 cameras, a text request every
frame, budget 30, k = 5 (``docs/gpu.md#targets``)."""
COLD_WARMUP_S = 180.0
"""The fast path's cold warm-up of ``pi05_droid`` with 3 cameras on an H100, at most (s)."""
GUIDED_VS_PLAIN = 1.6
"""RTC's guided denoise against the plain one on the same backend, the ratio aimed at
(an exact guided step costs about 2x: docs/gpu.md, "RTC on the fast path")."""


def component_costs(cfg: ModelConfig, *, cameras: int, prompt_tokens: int,
                    decode_batches: list[int], decode_ctx: int, dtype_bytes: int,
                    fp8_weights: bool = False) -> dict[str, CallCost]:
    """
    Return the work of each component ``gpu_components`` times, by its name there.

    :param fp8_weights: the large linears in FP8 (``call_costs.py``).
    """
    prefix = cameras * cfg.image_tokens_per_camera + prompt_tokens
    kw = {'dtype_bytes': dtype_bytes, 'fp8_weights': fp8_weights}
    costs = {'vision': vision_cost(cfg, cameras, **kw),
             'prefill': prefill_cost(cfg, prefix, **kw),
             'suffix': _suffix_cost(cfg, prefix, **kw),
             'denoise_10_steps': denoise_cost(cfg, prefix, **kw),
             'guided_denoise_10_steps': denoise_cost(cfg, prefix, guided=True, **kw)}
    for b in decode_batches:
        costs[f'decode_step_b{b}'] = decode_cost(cfg, b, max(decode_ctx, prefix), **kw)
    costs['lm_head'] = seed_cost(cfg, max(decode_batches), dtype_bytes)
    return costs


def _suffix_cost(cfg: ModelConfig, prefix: int, *, dtype_bytes: int,
                 fp8_weights: bool) -> CallCost:
    """Return two rows of 4 causal tokens on one prefix (``gpu_components``' suffix call)."""
    row = prefill_cost(cfg, 4, context=prefix, causal=True, dtype_bytes=dtype_bytes,
                       fp8_weights=fp8_weights)
    weights = cfg.vlm.depth * gemma_layer_linear_params(cfg.vlm) * \
        (1 if fp8_weights else dtype_bytes)
    return CallCost(2 * row.flops, 2 * row.num_bytes - weights,   # the weights read once
                    2 * row.fp8_flops)


def bound_ms(cost: CallCost, gpu: GpuSpec) -> float:
    """Return the roofline bound of ``cost`` on ``gpu`` in ms (FP8 FLOPs at its FP8 rate)."""
    return 1e3 * cost.bound_seconds(gpu.bandwidth, gpu.bf16_flops, gpu.fp8_flops)


def roofline(ms: dict[str, float], costs: dict[str, CallCost],
             gpu: GpuSpec | None) -> dict[str, dict]:
    """
    Return per component: measured ms, GFLOP, GB, and on ``gpu`` the bound and % of it.

    Thor: the bound and a projected time (``projected: true``), never a measured one.
    """
    out = {}
    for name, cost in costs.items():
        row: dict = {'ms': ms.get(name), 'gflop': cost.flops / 1e9, 'gbytes': cost.num_bytes / 1e9,
                     'bound_ms': None, 'bound_by': None, 'pct_of_bound': None}
        if gpu is not None:
            bound = bound_ms(cost, gpu)
            row['bound_ms'] = bound
            compute = cost.compute_seconds(gpu.bf16_flops, gpu.fp8_flops)
            row['bound_by'] = 'memory' if cost.num_bytes / gpu.bandwidth >= compute else \
                'compute'
            measured = ms.get(name)
            row['pct_of_bound'] = 100 * bound / measured if measured else None
        thor = bound_ms(cost, JETSON_AGX_THOR)
        row['thor'] = {'bound_ms': thor, 'projected': True}
        if gpu is not None and ms.get(name):
            efficiency = min(1.0, row['bound_ms'] / ms[name])
            row['thor']['projected_ms'] = thor / efficiency
        out[name] = row
    return out


def paper_cycle(rows: dict[str, dict], *, tokens_per_cycle: int, batch_name: str) -> dict:
    """
    Return one OxyGen paper-workload cycle from components (one prefill per frame).

    vision + the action prefix's prefill + the new text requests' suffixes on it + denoise +
    seed + k decode steps at the decode batch: measured sum, bound sum, and Thor's projected
    sum (``formula`` names the parts).
    """
    parts = {'vision': 1, 'prefill': 1, 'suffix': 1, 'denoise_10_steps': 1, 'lm_head': 1,
             batch_name: tokens_per_cycle}
    out = {}
    for key in ('ms', 'bound_ms'):
        if all(rows.get(p, {}).get(key) is not None for p in parts):
            out[key] = sum(n * rows[p][key] for p, n in parts.items())
    if all('projected_ms' in rows.get(p, {}).get('thor', {}) for p in parts):
        out['thor_projected_ms'] = sum(n * rows[p]['thor']['projected_ms']
                                       for p, n in parts.items())
    out['thor_bound_ms'] = sum(n * rows[p]['thor']['bound_ms'] for p, n in parts.items()
                               if p in rows)
    out['formula'] = ' + '.join(f'{n} x {p}' for p, n in parts.items())
    return out


def _target(measured: float | bool | None, target: float | bool, at_most: bool = True) -> dict:
    if measured is None:
        return {'target': target, 'measured': None, 'ok': None}
    if isinstance(target, bool):
        return {'target': target, 'measured': measured, 'ok': measured == target}
    ok = measured <= target if at_most else measured >= target
    return {'target': target, 'measured': measured, 'ok': ok}


def show(report: dict) -> dict[str, dict]:
    """
    Return the targets with the measured figures of ``report`` (None: not run).

    The targets: ``docs/gpu.md#targets``.

    Keys: no fallback, no feature dropped by the fast path, actions within the gate of eager,
    OxyGen text equal to isolated on the fast path, action latency, frames/s, tokens/s,
    speedup / ideal, components, guided vs plain denoise, the cold warm-up, second start,
    several robots (N = 4 against one: aggregate chunks/s, action latency).
    """
    backends = report.get('backends', {})
    compiled = backends.get('compiled', {})
    bench = compiled.get('bench') or {}
    oxygen = bench.get('oxygen', {})
    start = report.get('second_start', {})
    runs = [*backends.values(), *(b['bench'] for b in backends.values() if b.get('bench')),
            start]                  # every warm-up: compiled, bench, FP8, the second start
    ran = bool(compiled or start)
    parity = report.get('pipeline_parity', {}).get('passed')
    out = {
        'no_fallback': _target(not any(r.get('fallbacks') for r in runs) if ran else None,
                               True),
        'no_dropped_feature': _target(not any(r.get('dropped') for r in runs) if ran else None,
                                      True),
        'actions_within_gate_of_eager': _target(parity, True),
        'text_equal_oxygen_vs_isolated': _target(bench.get('text_equal'), True),
        'action_latency_ms_p50': _target(oxygen.get('action_latency_ms_p50'),
                                         PIPELINE_TARGETS['action_latency_ms_p50']),
        'frames_per_s': _target(oxygen.get('action_hz'), PIPELINE_TARGETS['frames_per_s'],
                                at_most=False),
        'tokens_per_s': _target(oxygen.get('tokens_per_s'), PIPELINE_TARGETS['tokens_per_s'],
                                at_most=False),
        'speedup_over_ideal': _target(
            bench['speedup'] / bench['ideal_speedup'] if bench.get('ideal_speedup') else None,
            0.9, at_most=False),
    }
    for name, limit in TARGETS_MS.items():
        out[f'{name}_ms'] = _target(compiled.get('ms', {}).get(name), limit)
    ms = compiled.get('ms', {})
    ratio = ms['guided_denoise_10_steps'] / ms['denoise_10_steps'] \
        if ms.get('guided_denoise_10_steps') and ms.get('denoise_10_steps') else None
    out['guided_vs_plain_denoise'] = _target(ratio, GUIDED_VS_PLAIN)
    first = report.get('first_start', {}).get('fast_path_warmup_s')
    out['cold_warmup_s'] = _target(first, COLD_WARMUP_S)
    out['second_start_first_chunk_s'] = _target(start.get('first_chunk_s'), 20.0)
    robots = report.get('robots') or {}              # session 7 (``gpu_robots.py``)
    out['robots_aggregate_vs_one'] = _target(robots.get('aggregate_vs_one'),
                                             robots.get('target_aggregate', 3.0),
                                             at_most=False)
    out['robots_latency_p50_vs_one'] = _target(robots.get('latency_p50_vs_one'),
                                               robots.get('target_latency', 1.5))
    return out


__all__ = ['COLD_WARMUP_S', 'GUIDED_VS_PLAIN', 'PIPELINE_TARGETS', 'TARGETS_MS', 'bound_ms',
           'component_costs', 'paper_cycle', 'roofline', 'show']
