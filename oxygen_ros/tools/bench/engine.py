"""
``oxygen_bench engine``: OxyGen vs isolated execution on the same workload, side by side.

Both policies run in one process on the same weights, the same observations (real
photographs, see ``tools/workload.py``) and the same flow-matching noise; their frames are
interleaved (alternating which goes first) so that a noisy, shared machine slows both alike.
Component times of the model are probed between frames and predict ``ideal_speedup``
(``tools/bench_probe.py``). Text requests decode to their full budget (EOS off, as in
OxyGen's experiments) unless ``--stop-on-eos``.

Text requests read the frame's action prefix plus their own causal suffix by default
(``--text-context action_prefix``: OxyGen's root and language suffix, one full prefill per
frame; the isolated baseline prefills a copy per request, OxyGen's ``blocking_baseline``), or
a prompt of their own (``own_prompt``). They arrive uniformly (``--text-every``), in bursts or
as a Poisson process (``--arrival``), as in OxyGen's benchmark. Each policy's JSON records its
full prefills, prefill tokens and suffix tokens per frame.

The probe also times real-time chunking's guided denoise beside the plain one (the result's
``denoise`` line): compiled on the fast path with ``--rtc``, else eagerly.

The engines are driven through the engine's public API (``oxygen_ros.engine``); what the
benchmark builds and probes beneath it (the shared backend, the adapter, the component probe)
is in ``engine_parts.py``. The probe runs on slots the OxyGen engine lends from its own pool
(``Engine.borrow_kv_slots``).

With ``--robots N [N ...]`` it measures one OxyGen engine serving N robots instead, their
frames batched, against the same robots served one after another (``robots.py``).

Frame time = wall time of one ``Engine.step`` (one control cycle). The first
ceil(budget / k) frames are excluded from the timing statistics: OxyGen's decode batch is
still filling (OxyGen's warm-up frames).
"""

from __future__ import annotations

import argparse
from dataclasses import fields, replace
import datetime
import json
import logging
import math
from pathlib import Path
import statistics
import sys
from typing import Callable

import numpy as np

from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention, preset_names
from oxygen_ros.engine import AttentionBackend, TextContext
from oxygen_ros.tools.bench.arrivals import Arrival, ArrivalPattern
from oxygen_ros.tools.bench.options import (
    add_fast_path_arguments, add_quantization_argument, COMPILE_MODES)
from oxygen_ros.tools.bench.summary import percentile
from oxygen_ros.tools.common.machine import machine_summary


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog='oxygen_bench engine', description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--preset', default='small', choices=preset_names())
    p.add_argument('--cameras', type=int, default=1, choices=(1, 2, 3))
    p.add_argument('--frames', type=int, default=40, help='measured frames (after warm-up)')
    p.add_argument('--decode-budget', type=int, default=100, help='tokens per text request')
    p.add_argument('--tokens-per-cycle', type=int, default=5, help='k')
    p.add_argument('--text-every', type=int, default=1,
                   help='uniform arrivals: a text request every N frames')
    p.add_argument('--arrival', default='uniform', choices=[a.value for a in Arrival],
                   help="text request arrivals (OxyGen's patterns)")
    p.add_argument('--burst-size', type=int, default=4, help='bursty: requests per burst')
    p.add_argument('--burst-every', type=int, default=8, help='bursty: frames between bursts')
    p.add_argument('--arrival-rate', type=float, default=1.0,
                   help='poisson: mean requests per frame')
    p.add_argument('--arrival-seed', type=int, default=42, help='poisson: random seed')
    p.add_argument('--text-context', default=TextContext.ACTION_PREFIX.value,
                   choices=[c.value for c in TextContext],
                   help="what text requests read: the frame's action prefix + a causal suffix "
                        '(one full prefill per frame) or a prompt of their own')
    p.add_argument('--memory-every', type=int, default=0,
                   help='a memory request every N frames (0: none)')
    p.add_argument('--memory-adapter', default=None,
                   help="OxyGen's textual-memory LoRA (.npz) for the memory requests, or "
                        "'random' (rank 16, random values); its decode cost is measured")
    p.add_argument('--prefix-attention', choices=[m.value for m in PrefixAttention],
                   default=None, help="default: the preset's")
    p.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'))
    add_quantization_argument(p)
    p.add_argument('--device', default='cpu')
    p.add_argument('--backend', default='torch', choices=('torch', 'tensorrt'))
    p.add_argument('--compile', default='none', choices=COMPILE_MODES,
                   help='fast path of the torch backend (docs/gpu.md)')
    add_fast_path_arguments(p)
    p.add_argument('--threads', type=int, default=0, help='torch threads (0: default)')
    p.add_argument('--max-running', type=int, default=64, help='largest decode batch')
    p.add_argument('--stop-on-eos', action='store_true')
    p.add_argument('--probe-every', type=int, default=5, help='frames between probe rounds')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--json', type=Path, default=None, help='write the results here')
    p.add_argument('--plot', type=Path, default=None, help='draw a per-cycle timeline here')
    p.add_argument('--no-progress', action='store_true')
    p.add_argument('--resize-on-device', action=argparse.BooleanOptionalAction, default=None,
                   help='camera images go up as uint8 and are resized on the device '
                        '(EngineConfig.resize_on_device; default: on CUDA)')
    p.add_argument('--rtc', action='store_true',
                   help="put RTC's guided denoise on the fast path too (EngineConfig.rtc); "
                        'its time is reported beside the plain denoise either way')
    p.add_argument('--rtc-jacobian-steps', type=int, default=None, metavar='K',
                   help="RTC's Euler steps that take the vector-Jacobian product, the first K "
                        '(EngineConfig.rtc_jacobian_steps; default: every step)')
    p.add_argument('--robots', type=int, nargs='+', default=None, metavar='N',
                   help='serve N robots from one engine, their frames batched, against the '
                        'same robots one after another (tools/bench/robots.py); '
                        'OxyGen only, text on the action prefix')
    args = p.parse_args(argv)
    if args.robots and (min(args.robots) < 1 or args.text_context != 'action_prefix'):
        p.error('--robots needs N >= 1 and --text-context action_prefix')
    for name in ('frames', 'decode_budget', 'tokens_per_cycle', 'text_every', 'probe_every'):
        if getattr(args, name) < 1:
            p.error(f'--{name.replace("_", "-")} must be >= 1')
    if args.memory_every < 0:
        p.error('--memory-every must be >= 0')
    try:
        args.arrivals = ArrivalPattern(Arrival(args.arrival), args.text_every, args.burst_size,
                                       args.burst_every, args.arrival_rate, args.arrival_seed)
    except ValueError as exc:
        p.error(str(exc))
    return args


def _policy_summary(cycles: list, tokens: int, seconds: float) -> dict:
    totals = [c.total_s for c in cycles]
    forward = sum(c.forward_s for c in cycles)
    return {
        'frame_ms_p50': 1e3 * percentile(totals, 50), 'frame_ms_p99': 1e3 * percentile(totals, 99),
        'frame_ms_mean': 1e3 * statistics.fmean(totals),
        'action_latency_ms_p50': 1e3 * percentile([c.action_latency_s for c in cycles], 50),
        'action_latency_ms_p99': 1e3 * percentile([c.action_latency_s for c in cycles], 99),
        'action_hz': len(cycles) / sum(totals), 'tokens_per_s': tokens / seconds,
        'forward_ms_mean': 1e3 * forward / len(cycles),
        'manager_overhead_frac': 1.0 - forward / sum(totals),
        'decode_batch_p50': percentile([c.decode_batch for c in cycles], 50),
        'tokens_per_cycle_p50': percentile([c.tokens_per_cycle for c in cycles], 50),
        'kv_bytes_peak': max(c.kv_peak_bytes for c in cycles),
        'full_prefills_per_frame': statistics.fmean(c.full_prefills for c in cycles),
        'prefill_tokens_per_frame': statistics.fmean(c.prefill_tokens for c in cycles),
        'suffix_tokens_per_frame': statistics.fmean(c.suffix_tokens for c in cycles),
        'seconds_by_job_mean_ms': {
            k: 1e3 * sum(c.seconds_by_job.get(k, 0.0) for c in cycles) / len(cycles)
            for k in sorted({k for c in cycles for k in c.seconds_by_job})},
    }


def main(argv: list[str] | None = None, *,
         on_warm: Callable[[dict], None] | None = None) -> int:
    """
    Run the benchmark; return the process exit code.

    :param on_warm: called once both engines are warm, with the warm-up's figures
        (``oxygen_bench gpu`` keeps them if the frames then run out of time).
    """
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s: %(message)s')
    import torch

    from oxygen_ros.engine import BackendUnavailableError, Engine, load_model, Policy
    from oxygen_ros.tools.bench.engine_parts import (
        attention_context, memory_adapter, shared_backend)

    if args.threads:
        torch.set_num_threads(args.threads)
    context = TextContext(args.text_context)
    try:
        base = _config(args, context)
    except ValueError as exc:
        print(f'oxygen_bench engine: {exc}', file=sys.stderr)
        return 2
    loaded = load_model(base, base.model_config())
    model = loaded.model
    blocks = base.pool_blocks()
    try:       # one backend, one warm-up: the isolated engine on the pool's upper half
        adapter = memory_adapter(args.memory_adapter, model, args.seed)
        shared = shared_backend(args, base, model, 2 * blocks, adapter, loaded.reference)
    except (BackendUnavailableError, OSError, ValueError) as exc:
        print(f'oxygen_bench engine: {exc}', file=sys.stderr)
        return 2
    loaded = replace(loaded, reference=None)        # the fast path's gate is over
    if args.robots:             # several robots: batched against one after another
        from oxygen_ros.tools.bench.robots import robot_names, run_robots
        config = base.with_settings(policy=Policy.OXYGEN)
        robots = {'batched': Engine(config, model=loaded, backend=shared,
                                    robots=robot_names(1)),
                  'one_after_another': Engine(config, model=loaded, robots=robot_names(1),
                                              backend=shared.sharing_pool(blocks))}
        with attention_context(shared):
            return run_robots(args, base, model, robots, torch)
    oxygen = Engine(base.with_settings(policy=Policy.OXYGEN), model=loaded, backend=shared)
    engines = {Policy.ISOLATED: Engine(base.with_settings(policy=Policy.ISOLATED), model=loaded,
                                       backend=shared.sharing_pool(blocks)),
               Policy.OXYGEN: oxygen}
    with attention_context(shared):              # the probes call the model directly
        return _run(args, base, model, engines, torch, on_warm)


def _config(args: argparse.Namespace, context: TextContext):
    """Return the ``EngineConfig`` both policies share (raises ValueError on a bad mix)."""
    from oxygen_ros.engine import BackendKind, CompileMode, EngineConfig

    return EngineConfig.create(
        preset=args.preset, dtype=args.dtype, quantization=args.quantization,
        device=args.device, backend=BackendKind(args.backend),
        compile_mode=CompileMode(args.compile),
        prefix_attention=PrefixAttention(args.prefix_attention) if args.prefix_attention
        else None, cameras=CAMERA_SLOTS[:args.cameras], tokens_per_cycle=args.tokens_per_cycle,
        decode_budget=args.decode_budget, max_running_requests=args.max_running,
        max_robots=max(args.robots or [1]),
        stop_on_eos=args.stop_on_eos, seed=args.seed, max_waiting_requests=10**6,
        attention_backend=AttentionBackend.resolve(args.attention),
        subtask_context=context, memory_context=context,
        memory_adapter=args.memory_adapter, rtc=args.rtc,
        rtc_jacobian_steps=args.rtc_jacobian_steps, resize_on_device=args.resize_on_device)


def _run(args: argparse.Namespace, base, model, engines: dict, torch,
         on_warm: Callable[[dict], None] | None) -> int:
    """Interleave the two policies' frames, probe components, write the results."""
    from tqdm import tqdm

    from oxygen_ros.engine import Policy, TextTask
    from oxygen_ros.tools.bench.engine_parts import component_probe
    from oxygen_ros.tools.bench.warmup_summary import dropped_features, warmup_summary
    from oxygen_ros.tools.common.workload import make_observation

    oxygen = engines[Policy.OXYGEN]
    model_cfg = oxygen.model_cfg
    compile_s = oxygen.backend.warmup_report.seconds
    k, budget = args.tokens_per_cycle, args.decode_budget
    warm = math.ceil(budget / k)
    total_frames = warm + args.frames
    obs = [make_observation(f, oxygen.robot.cameras, oxygen.robot.state_dim)
           for f in range(total_frames)]
    for eng in engines.values():
        eng.warmup(obs[0])
    if on_warm is not None:
        on_warm({**warmup_summary(oxygen.backend), 'compile_seconds': compile_s,
                 'fallbacks': oxygen.fallbacks,
                 'compile_counts': dict(oxygen.backend.warmup_report.compiles)})

    arrivals = args.arrivals.counts(total_frames)
    n_text = sum(arrivals[warm:]) / args.frames + (1 / args.memory_every
                                                   if args.memory_every else 0)
    batch = min(args.max_running, max(1, round(n_text * math.ceil(budget / k))))
    on_root = base.subtask_context is TextContext.ACTION_PREFIX
    probe = component_probe(oxygen, obs[0], args, batch, on_root)

    def probe_round(decode_batch: int | None = None) -> None:
        """Probe on slots borrowed from the OxyGen engine's pool (its graphs' pool)."""
        need = probe.slots_needed(decode_batch or probe.batch)
        with oxygen.borrow_kv_slots(need) as slots:
            cache = oxygen.backend.cache
            if slots is None:     # pool full: the probe's own cache (eager calls)
                logging.warning('KV pool full: probing on a private cache (eager calls)')
                cache = None
            if decode_batch is None:
                probe.measure_once(cache, slots)
            else:
                probe.measure_decode('decode_b', decode_batch, cache, slots)

    records = {pol: {'cycles': [], 'all': [], 'actions': [], 'texts': {}, 'tokens': 0}
               for pol in engines}
    bar = tqdm(range(total_frames), desc='frames', disable=args.no_progress, unit='frame')
    for f in bar:
        order = list(engines) if f % 2 == 0 else list(reversed(engines))
        for pol in order:
            eng, rec = engines[pol], records[pol]
            for i in range(arrivals[f]):
                eng.submit_text(TextTask.SUBTASK, req_id=f'text-{f}-{i}')
            if args.memory_every and f % args.memory_every == 0:
                eng.submit_text(TextTask.MEMORY, req_id=f'memory-{f}')
            out = eng.step(obs[f])
            _collect(rec, out, measured=f >= warm)
            if out.action is None:
                raise RuntimeError(f'{pol.value}: no action chunk for frame {f}')
            rec['actions'].append(out.action.actions)
        if f % args.probe_every == 0:
            probe_round()
    for pol, eng in engines.items():       # let the last text requests finish (not timed)
        while eng.num_running or eng.num_waiting:
            _collect(records[pol], eng.step(None), measured=False)
    for _ in range(3):
        probe_round()

    comp = probe.result()
    iso, oxy = records[Policy.ISOLATED], records[Policy.OXYGEN]
    summary = {pol.value: _policy_summary(rec['cycles'], rec['tokens'],
                                          sum(c.total_s for c in rec['cycles']))
               for pol, rec in records.items()}
    observed_batch = summary['oxygen']['decode_batch_p50']
    if round(observed_batch) != comp.batch:
        probe.batch = max(1, int(round(observed_batch)))
        probe._samples.pop('decode_b', None)
        probe._samples.pop('decode_b_adapter', None)
        for _ in range(5):
            probe_round(probe.batch)
        comp = probe.result()
    ideal_iso = comp.isolated_frame(n_text, budget, on_root)
    ideal_oxy = comp.oxygen_frame(n_text, int(summary['oxygen']['tokens_per_cycle_p50']),
                                  model_cfg.prefix_attention, on_root)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(iso['actions'], oxy['actions']))
    text_equal = iso['texts'] == oxy['texts'] and len(iso['texts']) > 0
    result = {
        'preset': args.preset, 'cameras': args.cameras, 'frames': args.frames,
        'warmup_frames': warm, 'decode_budget': budget, 'tokens_per_cycle': k,
        'text_every': args.text_every, 'memory_every': args.memory_every,
        'arrival': args.arrivals.describe(), 'requests_per_frame': n_text,
        'text_context': args.text_context, 'memory_adapter': _adapter_summary(args, comp),
        'prefix_attention': model_cfg.prefix_attention.value, 'dtype': args.dtype,
        'quantization': oxygen.describe_quantization(),
        'device': args.device, 'resize_on_device': oxygen.resize_on_device,
        'backend': args.backend, 'compile': args.compile,
        'compile_seconds': compile_s, 'compile_backend': args.compile_backend,
        'compile_only': args.only, 'compile_cameras': args.compile_cameras,
        'compile_counts': dict(oxygen.backend.warmup_report.compiles),
        'shared_backend': True, 'attention_backend': oxygen.backend.attention.value,
        'fallbacks': {pol.value: eng.fallbacks for pol, eng in engines.items() if eng.fallbacks},
        'dropped': dropped_features(oxygen.backend),
        'stop_on_eos': args.stop_on_eos,
        'isolated': summary['isolated'], 'oxygen': summary['oxygen'],
        'speedup': summary['isolated']['frame_ms_p50'] / summary['oxygen']['frame_ms_p50'],
        'speedup_mean': summary['isolated']['frame_ms_mean'] / summary['oxygen']['frame_ms_mean'],
        'ideal_speedup': ideal_iso / ideal_oxy,
        'ideal': {'isolated_frame_ms': 1e3 * ideal_iso, 'oxygen_frame_ms': 1e3 * ideal_oxy,
                  'components_ms': _asdict_ms(comp)},
        'denoise': {**_denoise_figures(comp, oxygen, args.rtc, probe.guidance.jacobian_steps),
                    'jacobian_deviation': _jacobian_deviation(args, model, probe)},
        'action_max_abs_diff': diff, 'text_equal': text_equal,
        'num_texts': len(oxy['texts']),
        'manager_overhead_frac': summary['oxygen']['manager_overhead_frac'],
        'kv_bytes_peak': summary['oxygen']['kv_bytes_peak'],
        'kv_curve': [[c.num_running, c.kv_used_bytes, c.kv_peak_bytes] for c in oxy['all']],
        'parameters': model.count_parameters(),
        'machine': machine_summary(torch),
        'date': datetime.date.today().isoformat(),
    }
    _print(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    if args.plot:
        from oxygen_ros.tools.bench.plot import plot_timeline
        plot_timeline(args.plot, {p.value: r['cycles'] for p, r in records.items()},
                      {p.value: r['all'] for p, r in records.items()}, result)
    return 0


def _adapter_summary(args: argparse.Namespace, comp) -> dict | None:
    """Return the adapter and its decode cost over a plain step (measured side by side)."""
    if not args.memory_adapter:
        return None
    return {'adapter': args.memory_adapter, 'decode_b_ms': 1e3 * comp.decode_b,
            'decode_b_adapter_ms': 1e3 * comp.decode_b_adapter,
            'decode_overhead': comp.decode_b_adapter / comp.decode_b - 1.0}


def _jacobian_deviation(args: argparse.Namespace, model, probe) -> dict | None:
    """Return ``rtc_deviation.jacobian_steps_deviation`` on the probe's frame, if K was asked."""
    import torch

    from oxygen_ros.tools.bench.rtc_deviation import jacobian_steps_deviation

    if args.rtc_jacobian_steps is None or not hasattr(model, 'velocity'):
        return None
    with torch.inference_mode():
        prefix = model.prefill(probe.action, None,
                               image_embeds=model.encode_images(probe.images))
    return jacobian_steps_deviation(model, prefix, probe.noise, args.rtc_jacobian_steps)


def _denoise_figures(comp, engine, rtc: bool, jacobian_steps: int | None) -> dict:
    """Return plain vs guided (RTC) denoise: ms each, their ratio, where the guided ran."""
    graphs = engine.backend.warmup_report.graphs
    exact = comp.guided_denoise_exact
    return {'plain_ms': 1e3 * comp.denoise, 'guided_ms': 1e3 * comp.guided_denoise,
            'guided_vs_plain': comp.guided_denoise / comp.denoise, 'rtc': rtc,
            'guided_exact_ms': None if math.isnan(exact) else 1e3 * exact,
            'guided_exact_vs_plain': None if math.isnan(exact) else exact / comp.denoise,
            'jacobian_steps': (engine.model_cfg.num_denoise_steps if jacobian_steps is None
                               else jacobian_steps),
            'plain_on_fast_path': 'denoise' in graphs,
            'guided_on_fast_path': 'guided_denoise' in graphs}


def _asdict_ms(comp) -> dict:
    out = {}
    for f in fields(comp):
        v = getattr(comp, f.name)
        out[f.name] = 1e3 * v if isinstance(v, float) else v
    return out


def _collect(rec: dict, out, measured: bool) -> None:
    for t in out.finished:
        rec['texts'][t.req_id] = t.token_ids
    rec['all'].append(out.stats)
    if measured:
        rec['cycles'].append(out.stats)
        rec['tokens'] += out.stats.tokens_generated


def _print(r: dict) -> None:
    iso, oxy = r['isolated'], r['oxygen']
    weights = r['dtype'] + (f", {r['quantization']}" if r['quantization'] != 'none' else '')
    print(f"\n{r['preset']} ({r['parameters'] / 1e6:.1f} M params, {weights}), "
          f"{r['cameras']} camera(s), {r['prefix_attention']} prefix, budget "
          f"{r['decode_budget']}, k={r['tokens_per_cycle']}, text every {r['text_every']}, "
          f"{r['frames']} frames, {r['backend']} backend"
          + (f", compile/build {r['compile_seconds']:.1f} s" if r['compile_seconds'] else ''))
    print(f"{'':10} {'p50 ms':>9} {'p99 ms':>9} {'act. lat.':>9} {'actions/s':>10} "
          f"{'tokens/s':>9} {'batch':>6} {'overhead':>9}")
    for name, s in (('isolated', iso), ('oxygen', oxy)):
        print(f"{name:10} {s['frame_ms_p50']:9.1f} {s['frame_ms_p99']:9.1f} "
              f"{s['action_latency_ms_p50']:9.1f} {s['action_hz']:10.2f} "
              f"{s['tokens_per_s']:9.1f} {s['decode_batch_p50']:6.0f} "
              f"{100 * s['manager_overhead_frac']:8.2f}%")
    print(f"full prefills per frame: isolated {iso['full_prefills_per_frame']:.2f}, oxygen "
          f"{oxy['full_prefills_per_frame']:.2f} (text on the {r['text_context']}; "
          f"{r['arrival']['pattern']} arrivals, {r['requests_per_frame']:.2f} per frame)")
    if r['memory_adapter']:
        a = r['memory_adapter']
        print(f"memory adapter: decode step {a['decode_b_adapter_ms']:.2f} ms with it vs "
              f"{a['decode_b_ms']:.2f} ms plain (+{100 * a['decode_overhead']:.1f} %)")
    print(f"speedup {r['speedup']:.2f} (ideal {r['ideal_speedup']:.2f}, "
          f"{r['speedup'] / r['ideal_speedup']:.0%} of ideal); action max |diff| "
          f"{r['action_max_abs_diff']:.2e}; text equal {r['text_equal']} "
          f"({r['num_texts']} texts); KV peak {r['kv_bytes_peak'] / 2**20:.2f} MiB")
    d = r['denoise']
    where = ['fast path' if d[f'{k}_on_fast_path'] else 'eager' for k in ('plain', 'guided')]
    k = '' if d['guided_exact_ms'] is None else f", Jacobian on {d['jacobian_steps']} steps"
    print(f"denoise per chunk: plain {d['plain_ms']:.1f} ms ({where[0]}), guided (RTC{k}) "
          f"{d['guided_ms']:.1f} ms ({where[1]}) = {d['guided_vs_plain']:.2f}x plain")
    if d['guided_exact_ms'] is not None:
        print(f"  beside it, the Jacobian on every step: {d['guided_exact_ms']:.1f} ms = "
              f"{d['guided_exact_vs_plain']:.2f}x plain")
    if d['jacobian_deviation']:
        j = d['jacobian_deviation']
        print(f"Jacobian on {d['jacobian_steps']} steps against every step (eager, one frame, "
              f"normalized units, chunk up to {j['chunk_max_abs']:.2f}): max |diff| "
              f"{j['max_abs_vs_exact']:.3f}, frozen points {j['frozen_max_abs_vs_exact']:.3f}; "
              f"frozen gap to the target {j['frozen_gap']:.3f} "
              f"(exact {j['frozen_gap_exact']:.3f})")
    for policy, steps in r['fallbacks'].items():
        print(f'{policy}: compiled steps FELL BACK to eager: {steps}')
    for feature, reason in r['dropped'].items():
        print(f'the fast path DROPPED {feature} to stay compiled: {reason}')


if __name__ == '__main__':
    sys.exit(main())
