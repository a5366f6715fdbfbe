"""
``oxygen_bench engine --robots N [N ...]``: one engine serving N robots, their frames batched.

For each N, two OxyGen engines on the same weights and the same backend (one warm-up, the KV
pool in two halves, as the two policies of ``oxygen_bench engine``) serve the same N robots
(``robot0`` ...), each robot with its own observations (the bundled photographs, robot i's
view ``OBSERVATION_STRIDE`` frames on from robot i-1's) and its own text requests (the
workload's arrivals, per robot). In a *round* every robot is due once:

- **batched**: one cycle plans every robot's frame (``Engine.begin`` with a mapping of the N
  observations); the backend batches each stage of their action paths
  (``docs/design.md#several-robots``) and hands each chunk out as soon as it is denoised;
- **one after another**: N cycles, one robot's frame each, in the robots' order.

The two alternate round by round (which goes first switching), so that a noisy machine slows
both alike. A robot's action latency counts from the start of the round (its tick: every
robot's observation is there) until its chunk came out of ``Cycle.actions``. The first
ceil(budget / k) rounds of each N are not timed (the decode batch filling up).

A named robot's noise depends on its name and its own frame count only (``Engine``'s several
robots), so each robot's chunks in the batched run must equal its chunks served one after
another (float32: up to summation order, ``ACTION_TOLERANCE``) and its texts must be the
same tokens: ``outputs_equal``.

The ideal is the batched cycle that the forward passes alone would take, from component
times measured in the same run between rounds (medians): the action path of N frames as the
backend batches it (``ComponentProbe.measure_frames``) and one decode step at the decode
batch each way of serving had, with n text requests per robot per round and k tokens per
cycle:

    batched round    = V(N) + P(N) + D(N) + n (X(N) + S(N)) + k d(B_batched)
    one after another = N (V(1) + P(1) + D(1) + n (X(1) + S(1)) + k d(B_one))

V vision, P the action prefill, D the denoise (10 Euler steps), X the causal suffix of a text
request on its root, S its seed, each of N frames in one call; d(b) one decode step of b rows.
The ideal aggregate chunk rate is N / round; the target is ``TARGET_OF_IDEAL`` of it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
import datetime
import json
import math
import time
from typing import Mapping

import numpy as np

from oxygen_ros.tools.bench.summary import percentile
from oxygen_ros.tools.common.machine import machine_summary

TARGET_OF_IDEAL = 0.9
"""The batched aggregate chunk rate must reach this share of its ideal."""
OBSERVATION_STRIDE = 101
"""Robot i sees frame ``g + i * OBSERVATION_STRIDE`` of the workload in round g."""
ACTION_TOLERANCE = {'float32': 1e-5, 'bfloat16': 2e-2}
"""Largest |difference| of a robot's chunk, batched against one after another, in robot
units: summation order (float32, ``test/backends/test_frame_batch.py``); in bf16 twice the
1.0e-2 of sums rounded at another point (``docs/benchmarks.md``, OxyGen vs isolated)."""
MODES = ('batched', 'one_after_another')


def robot_names(count: int) -> tuple[str, ...]:
    """Return the benchmark's robot names: ``robot0`` ... (ROS name tokens)."""
    return tuple(f'robot{i}' for i in range(count))


@dataclass
class _Records:
    """What one way of serving produced over one N's rounds."""

    rounds_s: list[float] = field(default_factory=list)
    cycles: list = field(default_factory=list)
    latency_s: dict[str, list[float]] = field(default_factory=dict)
    chunks: dict[str, list[np.ndarray]] = field(default_factory=dict)
    texts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    tokens: int = 0


def run_robots(args: argparse.Namespace, base, model, engines: Mapping[str, object],
               torch) -> int:
    """
    Run every N of ``args.robots`` on ``engines`` (``MODES`` -> one-robot OxyGen engine).

    :param base: the engines' ``EngineConfig`` (``max_robots`` >= the largest N).
    :returns: the exit code (0).
    """
    from tqdm import tqdm

    from oxygen_ros.engine import TextContext
    from oxygen_ros.tools.bench.engine_parts import component_probe
    from oxygen_ros.tools.common.workload import make_observation

    batched = engines['batched']
    cameras, state_dim = batched.robot.cameras, batched.robot.state_dim
    k, budget = args.tokens_per_cycle, args.decode_budget
    warm = math.ceil(budget / k)
    counts = sorted(set(args.robots))
    for eng in engines.values():
        eng.warmup(make_observation(0, cameras, state_dim))
    probe = component_probe(batched, make_observation(0, cameras, state_dim), args, 1,
                            base.subtask_context is TextContext.ACTION_PREFIX)
    arrivals = args.arrivals.counts(warm + args.frames)
    n_text = sum(arrivals[warm:]) / args.frames + (1 / args.memory_every
                                                   if args.memory_every else 0)
    bar = tqdm(total=len(counts) * (warm + args.frames), desc='rounds', unit='round',
               disable=args.no_progress)
    runs, tick = [], 0
    for n in counts:
        names = robot_names(n)
        for eng in engines.values():
            for name in names[len(eng.robots):]:
                eng.add_robot(name)
        records = {mode: _Records() for mode in MODES}
        for r in range(warm + args.frames):
            obs = {name: make_observation(tick + i * OBSERVATION_STRIDE, cameras, state_dim)
                   for i, name in enumerate(names)}
            tick += 1
            order = MODES if r % 2 == 0 else MODES[::-1]
            for mode in order:
                _submit(engines[mode], names, arrivals[r], args.memory_every, n, r)
                _serve_round(engines[mode], records[mode], obs, mode == 'batched',
                             measured=r >= warm)
            if r % args.probe_every == 0:
                _probe_frames(batched, probe, n)
            bar.update()
        for mode in MODES:       # the last text requests finish (not timed)
            _drain(engines[mode], records[mode])
        for _ in range(3):
            _probe_frames(batched, probe, n)
        runs.append(_run_result(n, names, records, probe, batched, n_text, base.dtype))
    bar.close()
    result = {**_header(args, batched, model, torch, warm, n_text), 'runs': runs}
    _print(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    if args.plot:
        from oxygen_ros.tools.bench.plot import plot_robots
        plot_robots(args.plot, result)
    return 0


def _submit(engine, names: tuple[str, ...], count: int, memory_every: int, n: int,
            r: int) -> None:
    """Queue each robot's text requests of round ``r`` (ids name the robot, N and round)."""
    from oxygen_ros.engine import TextTask

    for name in names:
        for i in range(count):
            engine.submit_text(TextTask.SUBTASK, req_id=f'{name}-n{n}-text-{r}-{i}',
                               robot=name)
        if memory_every and r % memory_every == 0:
            engine.submit_text(TextTask.MEMORY, req_id=f'{name}-n{n}-memory-{r}', robot=name)


def _serve_round(engine, rec: _Records, obs: Mapping[str, object], batched: bool, *,
                 measured: bool) -> None:
    """Serve every robot once: one cycle of all frames, or one cycle per robot in turn."""
    groups = [tuple(obs)] if batched else [(name,) for name in obs]
    latency: dict[str, float] = {}
    outputs = []
    t0 = time.perf_counter()
    for group in groups:
        cycle = engine.begin({name: obs[name] for name in group})
        for chunk in cycle.actions():
            latency[chunk.robot] = time.perf_counter() - t0
            rec.chunks.setdefault(chunk.robot, []).append(chunk.actions)
        outputs.append(cycle.finish())
    seconds = time.perf_counter() - t0
    missing = set(obs) - set(latency)
    if missing:
        raise RuntimeError(f'no action chunk for {sorted(missing)} in a round')
    for out in outputs:
        _collect(rec, out, measured)
    if measured:
        rec.rounds_s.append(seconds)
        for name, s in latency.items():
            rec.latency_s.setdefault(name, []).append(s)


def _drain(engine, rec: _Records) -> None:
    """
    Run cycles without a robot due until every text request has finished (not timed).

    :raises RuntimeError: requests still wait with none running: each waits for a frame of
        its robot, which no drain cycle brings (the decode batch was too small for N robots).
    """
    while engine.num_running or engine.num_waiting:
        if not engine.num_running:
            raise RuntimeError(
                f'{engine.num_waiting} text requests never admitted (each waits for a frame '
                f'of its robot): raise --max-running for this many robots')
        cycle = engine.begin({})
        _collect(rec, cycle.finish(), measured=False)


def _collect(rec: _Records, out, measured: bool) -> None:
    for t in out.finished:
        rec.texts[t.req_id] = t.token_ids
    if measured:
        rec.cycles.append(out.stats)
        rec.tokens += out.stats.tokens_generated


def _probe_frames(engine, probe, n: int) -> None:
    """Time the action path of n frames and of one, on slots borrowed from the engine's pool."""
    for frames in sorted({n, 1}, reverse=True):
        with engine.borrow_kv_slots(probe.frame_slots_needed(frames)) as slots:
            probe.measure_frames(frames, engine.backend.cache if slots is not None else None,
                                 slots)


def _probe_decode(engine, probe, batch: int) -> float:
    """Return one decode step of ``batch`` rows, median of five (seconds)."""
    name = f'decode@{batch}'
    for _ in range(5):
        with engine.borrow_kv_slots(probe.slots_needed(batch)) as slots:
            probe.measure_decode(name, batch, engine.backend.cache if slots is not None
                                 else None, slots)
    return probe.median(name)


def _mode_summary(rec: _Records, names: tuple[str, ...]) -> dict:
    seconds = sum(rec.rounds_s)
    rounds = len(rec.rounds_s)
    forward = sum(c.forward_s for c in rec.cycles)
    lat = [s for name in names for s in rec.latency_s[name]]
    return {
        'chunks_per_s': len(names) * rounds / seconds, 'tokens_per_s': rec.tokens / seconds,
        'round_ms_p50': 1e3 * percentile(rec.rounds_s, 50),
        'round_ms_p99': 1e3 * percentile(rec.rounds_s, 99),
        'round_ms_mean': 1e3 * seconds / rounds,
        'action_latency_ms_p50': 1e3 * percentile(lat, 50),
        'action_latency_ms_p99': 1e3 * percentile(lat, 99),
        'per_robot': {name: {
            'chunks': len(rec.latency_s[name]),
            'chunks_per_s': len(rec.latency_s[name]) / seconds,
            'action_latency_ms_p50': 1e3 * percentile(rec.latency_s[name], 50),
            'action_latency_ms_p99': 1e3 * percentile(rec.latency_s[name], 99)}
            for name in names},
        'cycles_per_round': len(rec.cycles) / rounds,
        'decode_batch_p50': percentile([c.decode_batch for c in rec.cycles], 50),
        'tokens_per_cycle_p50': percentile([c.tokens_per_cycle for c in rec.cycles], 50),
        'manager_overhead_frac': 1.0 - forward / sum(c.total_s for c in rec.cycles),
        'kv_bytes_peak': max(c.kv_peak_bytes for c in rec.cycles),
    }


def _ideal(probe, engine, n: int, n_text: float, summary: Mapping[str, dict]) -> dict:
    """Return the ideal round of each way of serving, from the run's component times."""
    def action_path(frames: int) -> tuple[float, dict]:
        c = probe.frames_result(frames)
        return (c['vision'] + c['prefill'] + c['denoise'] +
                n_text * (c['suffix'] + c['seed'])), {k: 1e3 * v for k, v in c.items()}

    decode = {}
    for mode in MODES:
        batch = max(1, int(round(summary[mode]['decode_batch_p50'])))
        decode[mode] = (batch, summary[mode]['tokens_per_cycle_p50'],
                        _probe_decode(engine, probe, batch) if n_text else 0.0)
    path_n, comp_n = action_path(n)
    path_1, comp_1 = action_path(1)
    rounds = {'batched': path_n + decode['batched'][1] * decode['batched'][2],
              'one_after_another': n * (path_1 + decode['one_after_another'][1] *
                                        decode['one_after_another'][2])}
    return {
        'round_ms': {mode: 1e3 * s for mode, s in rounds.items()},
        'chunks_per_s': {mode: n / s for mode, s in rounds.items()},
        'speedup': rounds['one_after_another'] / rounds['batched'],
        'components_ms': {str(n): comp_n, '1': comp_1},
        'decode_ms': {mode: {'batch': b, 'k': kk, 'step_ms': 1e3 * d}
                      for mode, (b, kk, d) in decode.items()},
    }


def _run_result(n: int, names: tuple[str, ...], records: Mapping[str, _Records], probe,
                engine, n_text: float, dtype: str) -> dict:
    summary = {mode: _mode_summary(records[mode], names) for mode in MODES}
    ideal = _ideal(probe, engine, n, n_text, summary)
    bat, one = records['batched'], records['one_after_another']
    diff = max(float(np.abs(a - b).max()) for name in names
               for a, b in zip(bat.chunks[name], one.chunks[name], strict=True))
    text_equal = bat.texts == one.texts
    of_ideal = summary['batched']['chunks_per_s'] / ideal['chunks_per_s']['batched']
    per_robot = summary['batched']['per_robot']
    every_round = len({p['chunks'] for p in per_robot.values()}) == 1
    return {
        'robots': n, 'names': list(names), **summary, 'ideal': ideal,
        'speedup': summary['batched']['chunks_per_s'] /
        summary['one_after_another']['chunks_per_s'],
        'of_ideal': of_ideal, 'meets_target': of_ideal >= TARGET_OF_IDEAL,
        'action_max_abs_diff': diff, 'text_equal': text_equal, 'num_texts': len(bat.texts),
        'outputs_equal': diff <= ACTION_TOLERANCE[dtype] and text_equal,
        'every_robot_every_round': every_round,
        'chunk_rate_held': every_round and all(
            per_robot[name]['chunks_per_s'] >=
            summary['one_after_another']['per_robot'][name]['chunks_per_s'] for name in names),
    }


def _header(args: argparse.Namespace, engine, model, torch, warm: int, n_text: float) -> dict:
    return {
        'preset': args.preset, 'cameras': args.cameras, 'frames': args.frames,
        'warmup_frames': warm, 'decode_budget': args.decode_budget,
        'tokens_per_cycle': args.tokens_per_cycle, 'text_every': args.text_every,
        'memory_every': args.memory_every, 'arrival': args.arrivals.describe(),
        'requests_per_frame': n_text, 'text_context': args.text_context,
        'prefix_attention': engine.model_cfg.prefix_attention.value, 'dtype': args.dtype,
        'quantization': engine.describe_quantization(), 'device': args.device,
        'backend': args.backend, 'compile': args.compile,
        'compile_seconds': engine.backend.warmup_report.seconds,
        'fallbacks': dict(engine.fallbacks), 'dropped': dict(engine.dropped_features),
        'attention_backend': engine.backend.attention.value,
        'parameters': model.count_parameters(), 'robots': sorted(set(args.robots)),
        'target_of_ideal': TARGET_OF_IDEAL, 'machine': machine_summary(torch),
        'date': datetime.date.today().isoformat(),
    }


def _print(r: dict) -> None:
    m = r['machine']
    print(f"\n{r['preset']} ({r['parameters'] / 1e6:.1f} M params, {r['dtype']}), "
          f"{r['cameras']} camera(s), {r['prefix_attention']} prefix, budget "
          f"{r['decode_budget']}, k={r['tokens_per_cycle']}, "
          f"{r['requests_per_frame']:.2f} text requests per robot per round, {r['frames']} "
          f"rounds, {r['backend']} backend on {r['device']} ({m['processor']}, "
          f"{m['threads']} threads)")
    print(f"{'robots':>6} {'serving':18} {'chunks/s':>9} {'ideal':>7} {'tokens/s':>9} "
          f"{'round p50/p99 ms':>17} {'latency p50/p99 ms':>19} {'batch':>6}")
    for run in r['runs']:
        for mode in MODES:
            s = run[mode]
            print(f"{run['robots'] if mode == 'batched' else '':>6} "
                  f"{mode.replace('_', ' '):18} {s['chunks_per_s']:9.3f} "
                  f"{run['ideal']['chunks_per_s'][mode]:7.3f} {s['tokens_per_s']:9.1f} "
                  f"{s['round_ms_p50']:8.0f} /{s['round_ms_p99']:7.0f} "
                  f"{s['action_latency_ms_p50']:9.0f} /{s['action_latency_ms_p99']:8.0f} "
                  f"{s['decode_batch_p50']:6.0f}")
        print(f"{'':6} batched / one after another: chunks/s {run['speedup']:.2f}x (ideal "
              f"{run['ideal']['speedup']:.2f}x); batched at {run['of_ideal']:.0%} of its ideal "
              f"(target {r['target_of_ideal']:.0%}: "
              f"{'met' if run['meets_target'] else 'NOT met'}); outputs equal "
              f"{run['outputs_equal']} (max |diff| {run['action_max_abs_diff']:.1e}, "
              f"{run['num_texts']} texts); every robot's chunk rate held "
              f"{run['chunk_rate_held']}")


__all__ = ['ACTION_TOLERANCE', 'MODES', 'robot_names', 'run_robots', 'TARGET_OF_IDEAL']
