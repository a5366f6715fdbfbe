"""
Jetson AGX Thor latency PROJECTED from a measured GPU run, with bf16 and with FP8 weights.

Per component of the GPU session (``gpu_components``): the efficiency reached on the GPU that
ran, ``bound / measured`` (at most 1), and Thor's projected time ``Thor bound / efficiency``,
each bound from the config's bytes and FLOPs (``call_costs.py``) and the peaks of
``gpu_specs.py``: bf16 weights, and FP8 weights (the quantized linears read at 1
byte per weight, their GEMMs at the FP8 rate; ``model/fp8.py``). The same measured efficiency
serves both. Assumed, not measured: that Thor's software reaches the fraction of its bound the
H100's did, and that FP8 kernels reach the fraction bf16 ones did (FP8 has never run on a GPU
here; nothing has run on a Thor). The paper cycle is one OxyGen frame of the paper workload:
vision, the action prefix's prefill, the suffix call of the new text request, the 10-step
denoise, the LM head seed and k = 5 decode steps at batch 8.

``python -m oxygen_ros.tools.bench.thor_projection DIR/session3.json`` (the compiled
components; ``session2.json`` of the sessions before 2026-11-27, as the committed 2026-11-25
one) prints the table of docs/gpu.md ("Thor projection"), which a test holds to this code and
the committed JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import sys

from oxygen_ros.engine.config import DTYPE_BYTES
from oxygen_ros.tools.bench.gpu_components import Workload
from oxygen_ros.tools.bench.gpu_specs import GpuSpec, JETSON_AGX_THOR, lookup_gpu
from oxygen_ros.tools.bench.roofline import bound_ms, component_costs

TOKENS_PER_CYCLE = 5
CYCLE_BATCH = 8


def paper_cycle_parts(tokens_per_cycle: int = TOKENS_PER_CYCLE,
                      batch: int = CYCLE_BATCH) -> dict[str, int]:
    """Return ``{component: calls}`` of one paper-workload OxyGen frame."""
    return {'vision': 1, 'prefill': 1, 'suffix': 1, 'denoise_10_steps': 1, 'lm_head': 1,
            f'decode_step_b{batch}': tokens_per_cycle}


def project(ms: dict[str, float], work: Workload, gpu: GpuSpec, *,
            thor: GpuSpec = JETSON_AGX_THOR) -> dict:
    """
    Return Thor's projected ms per component and per paper cycle, bf16 and FP8 weights.

    :param ms: measured median ms per component on ``gpu`` (``gpu_components`` names), bf16.
    :param work: the workload measured (its sizes give the bounds).
    :returns: ``{'rows': {name: {measured_ms, bound_ms, efficiency, bf16: {bound_ms,
        projected_ms}, fp8: {...}}}, 'paper_cycle': {...}, 'gpu', 'thor', 'projected': True}``.
    """
    sizes = {'cameras': work.cameras, 'prompt_tokens': work.prompt_tokens,
             'decode_batches': list(work.decode_batches), 'decode_ctx': work.decode_ctx,
             'dtype_bytes': DTYPE_BYTES[work.dtype]}
    cfg = work.model_config()
    costs = {'bf16': component_costs(cfg, **sizes),
             'fp8': component_costs(cfg, **sizes, fp8_weights=True)}
    rows = {}
    for name, cost in costs['bf16'].items():
        if not ms.get(name):
            continue
        bound = bound_ms(cost, gpu)
        efficiency = min(1.0, bound / ms[name])
        rows[name] = {'measured_ms': ms[name], 'bound_ms': bound, 'efficiency': efficiency}
        for weights, table in costs.items():
            thor_bound = bound_ms(table[name], thor)
            rows[name][weights] = {'bound_ms': thor_bound,
                                   'projected_ms': thor_bound / efficiency}
    parts = paper_cycle_parts()
    cycle: dict = {'formula': ' + '.join(f'{n} x {p}' for p, n in parts.items())}
    if all(p in rows for p in parts):
        cycle['measured_ms'] = sum(n * rows[p]['measured_ms'] for p, n in parts.items())
        cycle['bound_ms'] = sum(n * rows[p]['bound_ms'] for p, n in parts.items())
        for weights in costs:
            cycle[weights] = {key: sum(n * rows[p][weights][key] for p, n in parts.items())
                              for key in ('bound_ms', 'projected_ms')}
    return {'gpu': gpu.name, 'thor': thor.name, 'projected': True, 'rows': rows,
            'paper_cycle': cycle}


def from_session(path: Path) -> dict:
    """
    Return :func:`project` of a GPU session's compiled components (``session3.json``).

    :raises ValueError: the file holds no compiled component times or names an unknown GPU.
    """
    data = json.loads(Path(path).read_text())
    results = data.get('results', {})
    ms = results.get('compiled_components', {}).get('ms')
    name = results.get('environment', {}).get('environment', {}).get('device_name', '')
    gpu = lookup_gpu(name)
    if not ms or gpu is None:
        raise ValueError(f'{path}: no compiled component times of a known GPU (device '
                         f'{name!r}); pass the session 3 file of oxygen_bench gpu '
                         f'(session 2 before 2026-11-27)')
    c = data['config']
    work = Workload(preset=c['preset'], dtype=c['dtype'], cameras=c['cameras'],
                    prompt_tokens=c['prompt_tokens'], decode_ctx=c['decode_ctx'])
    return project(ms, work, gpu)


def markdown(projection: dict) -> str:
    """Return the projection as the markdown table of docs/gpu.md (ms, 3 significant digits)."""
    head = (f"| call | {projection['gpu']} measured | its bound | efficiency | Thor bound bf16 "
            f'| **Thor projected bf16** | Thor bound FP8 | **Thor projected FP8** |')
    lines = [head, '|---|---:|---:|---:|---:|---:|---:|---:|']

    def line(name: str, r: dict) -> str:
        return (f"| {name} | {r['measured_ms']:.3g} | {r['bound_ms']:.3g} | "
                f"{100 * min(1.0, r['bound_ms'] / r['measured_ms']):.0f} % | "
                f"{r['bf16']['bound_ms']:.3g} | **{r['bf16']['projected_ms']:.3g}** | "
                f"{r['fp8']['bound_ms']:.3g} | **{r['fp8']['projected_ms']:.3g}** |")
    for name, r in projection['rows'].items():
        lines.append(line(name.replace('_', ' '), r))
    cycle = projection['paper_cycle']
    if 'measured_ms' in cycle:
        lines.append(line(f"paper cycle ({cycle['formula'].replace('_', ' ')})", cycle))
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the markdown table of a compiled components session file; return the exit code."""
    p = argparse.ArgumentParser(prog='thor_projection', description=__doc__.split('\n\n')[0])
    p.add_argument('session', type=Path, help='session3.json of oxygen_bench gpu '
                                              '(session2.json before 2026-11-27)')
    args = p.parse_args(argv)
    try:
        print(markdown(from_session(args.session)))
    except (OSError, ValueError, KeyError) as exc:
        print(f'thor_projection: {exc}', file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main())


__all__ = ['from_session', 'main', 'markdown', 'paper_cycle_parts', 'project']
