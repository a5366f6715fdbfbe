"""
``oxygen_stress soak``: the node for N minutes under steady load and bursts, watched for leaks.

The node (a subprocess, ``config/test.yaml`` for ``--preset tiny``, ``config/demo.yaml`` for
``demo``; periodic subtask/memory requests off so that questions are the only text) acts on the
demo bag replayed in a loop while this process asks ``--questions-per-s`` questions on
``/oxygen/ask`` (each decoded to 32 tokens, EOS off, so several hold KV blocks at once).
``--bursts`` times (at 1/3 and 2/3 of the run for 2) the same burst comes: questions at
``--burst-questions-per-s`` for ``--burst-s`` seconds, and at its start a stalled camera: the
replay stops (SIGSTOP) for ``--stall-s``, longer than ``max_observation_age``, then resumes
(SIGCONT), so the questions pile up in the waiting queue and run at once, the decode batch
full. Every ``--sample-every`` seconds it samples the node process (psutil: RSS, USS, open file
descriptors, threads, CPU), the KV blocks in use, the decode batch and the node's own memory
section (``/diagnostics``: RSS, glibc malloc in use / free / mmapped, trims) and the
action-chunk rate received. After ``--minutes`` the questions stop and the load drains.

Verdict (exit 1 if any fails, 0 otherwise; 2 if the node never acted):

- **memory**: RSS grows at most ``--max-rss-growth`` (5 %) after warm-up: the median RSS of the
  last minute against the median of the first minute after warm-up. Warm-up is the first
  ``max(60 s, 20 % of the run)``: torch's allocator, the Python heap and DDS buffers reach
  their working size then. A least-squares slope (MiB/hour) over the post-warm-up samples is
  reported beside it.
- **bursts**: each burst is judged on its own: the median RSS of the minute after it (from
  ``SETTLE_S`` after its end) against the minute before it, growth beyond
  ``--max-burst-growth`` (1 %) counting as grown. The verdict names what the bursts show:
  ``flat`` (none grew), ``high-water mark`` (the first grew, the later ones did not: reached
  and held; the memory check then measures from after the first burst), ``leak`` (the last
  grew too: memory follows every burst; a failure), or ``grew`` (the only burst grew: one
  cannot tell, the memory check decides).
- **KV**: after the load drains (every question answered), the KV blocks in use return to the
  baseline measured before the first question (actions only), within ``--drain-s``.
- **rate**: in every full minute after warm-up, action chunks arrive at >= 95 % of
  ``control_rate_hz`` (the stalls' seconds left out: the node must not act then).

Writes ``soak.json`` (settings, samples, bursts, verdict) and ``soak.png`` (bursts marked)
into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path
import platform
import signal
import sys
import time
from typing import Sequence

import numpy as np
from oxygen_ros.resources import config_file
from oxygen_ros.ros.outcomes import NO_ANSWER
from oxygen_ros.tools.bag.make_demo import demo_bag
from oxygen_ros.tools.bag.topics import CAMERA_TOPICS, JOINT_STATES_TOPIC
from oxygen_ros.tools.common.children import Child, replay_args, ros_environment
from oxygen_ros.tools.common.machine import cpu_name
from oxygen_ros.tools.common.node_client import ProcessFigures
from oxygen_ros.tools.common.observer import Observer
from oxygen_ros.tools.stress.soak_report import plot, SETTLE_S, Verdict, verdict
from oxygen_ros.units import NS_PER_S
import rclpy
from rclpy.signals import SignalHandlerOptions
from std_msgs.msg import String
import yaml

PARAMS_FILES = {'tiny': 'test', 'demo': 'demo'}
_NODE_TOPICS = ('/oxygen/action_chunk', '/oxygen/subtask', '/oxygen/answer', '/oxygen/memory',
                '/oxygen/ask', '/oxygen/get_state', '/oxygen/instruction', '/diagnostics')
"""Names the observer and the replay use, moved under a private prefix (``isolation``)."""
NODE_OVERRIDES = ('subtask_period:=0.0', 'memory_period:=0.0', 'decode_budget:=32',
                  'stop_on_eos:=false')
"""Questions are the only text, each decodes 32 tokens (k = 4: ~8 cycles holding KV)."""
_MIB = float(1 << 20)
NODE_KEYS = {'decode_batch': 'decode batch', 'cycle_p50_ms': 'cycle time p50 (ms)',
             'cycle_p99_ms': 'cycle time p99 (ms)', 'node_rss': 'RSS (MiB)',
             'malloc_arenas': 'malloc arenas (MiB)', 'malloc_in_use': 'malloc in use (MiB)',
             'malloc_free': 'malloc free (MiB)', 'malloc_mmapped': 'malloc mmapped (MiB)',
             'malloc_trims': 'malloc trims', 'malloc_trimmed': 'malloc trimmed (MiB)',
             'malloc_last_trim_ms': 'malloc last trim (ms)'}
"""Sample fields read from the node's last ``/diagnostics`` (its memory section in MiB)."""


def isolation(prefix: str) -> tuple[list[str], list[str]]:
    """
    Return remap arguments that move the soak's traffic under ``prefix``.

    A random ``ROS_DOMAIN_ID`` alone is not private on a shared machine: a test on the same
    domain would answer our questions and publish chunks we would count. The node runs in the
    namespace ``prefix`` with its absolute inputs (cameras, joint states) and ``/diagnostics``
    remapped under it; the replay and this process remap the same names.

    :returns: ``(node arguments after --ros-args, remap arguments for the other processes)``.
    """
    inputs = [*CAMERA_TOPICS.values(), JOINT_STATES_TOPIC]
    moved = [a for t in (*inputs, '/diagnostics') for a in ('-r', f'{t}:={prefix}{t}')]
    node = ['-r', f'__ns:={prefix}', *moved]
    others = [a for t in (*inputs, *_NODE_TOPICS) for a in ('-r', f'{t}:={prefix}{t}')]
    return node, others


def _kv_used(observer: Observer) -> int | None:
    diags = observer.got.diagnostics
    return int(diags[-1]['KV blocks used']) if diags else None


def _number(text: str | None) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _node_figures(observer: Observer) -> dict[str, float | None]:
    """Return ``NODE_KEYS`` of the node's last ``/diagnostics`` (None where absent)."""
    last = observer.got.diagnostics[-1] if observer.got.diagnostics else {}
    return {field: _number(last.get(key)) for field, key in NODE_KEYS.items()}


def burst_starts(minutes: float, count: int) -> list[float]:
    """Return when each burst starts, seconds since the load started: ``i / (count + 1)``."""
    return [minutes * 60.0 * i / (count + 1) for i in range(1, count + 1)]


class Bursts:
    """
    The bursts of a run: the question rate at each moment, and the replay stalled and resumed.

    :param replay: the bag replay (its process is stopped for each stall).
    """

    def __init__(self, args: argparse.Namespace, replay: Child) -> None:
        self._args, self._replay = args, replay
        self.starts = burst_starts(args.minutes, args.bursts)
        self.stalled = False
        self.log: list[dict] = [{'start_s': t, 'end_s': t + args.burst_s,
                                 'stall_end_s': t + args.stall_s, 'asked': 0}
                                for t in self.starts]

    def current(self, t_s: float) -> dict | None:
        """Return the burst under way at ``t_s`` (its log entry), or None."""
        return next((b for b in self.log if b['start_s'] <= t_s < b['end_s']), None)

    def rate(self, t_s: float) -> float:
        """Return questions per second at ``t_s``."""
        a = self._args
        return a.burst_questions_per_s if self.current(t_s) else a.questions_per_s

    def update(self, t_s: float) -> None:
        """Stop the replay at a burst's start, resume it at its stall's end."""
        stall = any(b['start_s'] <= t_s < b['stall_end_s'] for b in self.log)
        if stall != self.stalled and self._replay.alive:
            self._replay.popen.send_signal(signal.SIGSTOP if stall else signal.SIGCONT)
            self.stalled = stall
            print(f"[{t_s:7.1f} s] camera {'stalled' if stall else 'resumed'}", flush=True)

    def resume(self) -> None:
        """Let a stopped replay go on (before it is stopped for good)."""
        if self.stalled and self._replay.alive:
            self._replay.popen.send_signal(signal.SIGCONT)
        self.stalled = False


def _burst_facts(bursts: Bursts, diagnostics: list[tuple[float, dict]],
                 chunk_times_s: list[float]) -> list[dict]:
    """Add to each burst what the node did then: peaks, rejections, the longest chunk gap."""
    out = []
    for b in bursts.log:
        lo, hi = b['start_s'], b['end_s'] + SETTLE_S
        seen = [d for t, d in diagnostics if lo <= t < hi]
        times = [lo, *(t for t in chunk_times_s if lo <= t < hi), hi]
        stale = [int(d.get('rejected: stale', 0)) for d in seen]
        out.append({**b, 'peak_kv_used': max((int(d['KV blocks used']) for d in seen),
                                             default=None),
                    'peak_decode_batch': max((int(d['decode batch']) for d in seen),
                                             default=None),
                    'peak_waiting': max((int(d['text requests waiting peak']) for d in seen),
                                        default=None),
                    'stale_rejections': max(stale) - min(stale) if stale else 0,
                    'longest_chunk_gap_s': max(np.diff(times)) if len(times) > 1 else 0.0})
    return out


def _baseline(observer: Observer, seconds: float) -> tuple[int, int]:
    """Watch ``seconds`` with actions only; return (max KV blocks used, capacity)."""
    first = len(observer.got.diagnostics)
    observer.spin_for(seconds)
    seen = observer.got.diagnostics[first:] or observer.got.diagnostics[-1:]
    return (max(int(d['KV blocks used']) for d in seen),
            int(seen[-1]['KV blocks capacity']))


def run_soak(args: argparse.Namespace, out: Path) -> dict:
    """Run the soak; return the JSON-able result (``verdict`` inside)."""
    params = config_file(PARAMS_FILES[args.preset])
    node_params = yaml.safe_load(params.read_text())['/**']['ros__parameters']
    for override in args.param:  # as the node reads them (-p NAME:=VALUE, YAML values)
        name, _, value = override.partition(':=')
        node_params[name] = yaml.safe_load(value)
    target_hz, max_age = node_params['control_rate_hz'], node_params['max_observation_age']
    if args.bursts and 0 < args.stall_s <= max_age:
        raise RuntimeError(f'--stall-s {args.stall_s:g} must exceed the max_observation_age '
                           f'of {params.name} ({max_age:g} s): else the camera never stalls')
    node_remaps, remaps = isolation(args.prefix)
    node_args = ['oxygen_ros.ros.node', '--ros-args', '--params-file', str(params), *node_remaps]
    for p in (*NODE_OVERRIDES, *args.param):
        node_args += ['-p', p]
    observer = Observer('oxygen_soak', ask_topic=True)
    node = Child('node', node_args, out)
    children = [node]
    samples: list[dict] = []
    asked = 0
    bursts: Bursts | None = None
    try:
        if not observer.wait_active(node):
            raise RuntimeError(f'the node did not become active:\n{node.tail()}')
        replay = Child('replay', [*replay_args(demo_bag()), '--ros-args', *remaps], out)
        children.append(replay)
        bursts = Bursts(args, replay)
        if not observer.wait_for(lambda: len(observer.got.chunk_ns) > 0, 60.0):
            raise RuntimeError(f'no action chunk:\n{node.tail()}')
        figures = ProcessFigures(node.popen.pid)
        kv_baseline, kv_capacity = _baseline(observer, args.baseline_s)
        print(f'node pid {node.popen.pid} acting; KV baseline {kv_baseline} of {kv_capacity} '
              f'blocks; soaking {args.minutes:g} min', flush=True)
        start, start_wall_ns = time.monotonic(), time.time_ns()
        end = start + args.minutes * 60.0
        next_ask, next_sample = start, start + args.sample_every
        last_chunks, last_t = len(observer.got.chunk_ns), start
        first_diag = len(observer.got.diagnostics)
        diag_times: list[float] = []
        while (now := time.monotonic()) < end and node.alive:
            t_s = now - start
            bursts.update(t_s)
            diag_times += [t_s] * (len(observer.got.diagnostics) - first_diag - len(diag_times))
            if now >= next_ask:
                observer.ask_pub.publish(String(data=f'What is on the table? ({asked})'))
                asked += 1
                burst = bursts.current(t_s)
                if burst is not None:
                    burst['asked'] += 1
                next_ask += 1.0 / bursts.rate(t_s)
            if now >= next_sample:
                n = len(observer.got.chunk_ns)
                sample = figures.sample().as_dict()
                sample.update(t_s=t_s, kv_used=_kv_used(observer),
                              chunk_rate_hz=(n - last_chunks) / max(now - last_t, 1e-9),
                              chunks=n, asked=asked,
                              answered=len(observer.got.texts['answer']),
                              **_node_figures(observer))
                samples.append(sample)
                last_chunks, last_t = n, now
                next_sample += args.sample_every
                print(f"[{sample['t_s']:7.1f} s] RSS {sample['rss'] / _MIB:7.1f} MiB, USS "
                      f"{sample['uss'] / _MIB:7.1f} MiB, malloc free "
                      f"{sample['malloc_free'] or 0:.1f} MiB, trims "
                      f"{sample['malloc_trims'] or 0:.0f}, fds {sample['num_fds']}, threads "
                      f"{sample['num_threads']}, KV {sample['kv_used']}, "
                      f"{sample['chunk_rate_hz']:.2f} chunks/s, answers "
                      f"{sample['answered']}/{asked}", flush=True)
            observer.spin_for(min(0.05, max(0.0, min(next_ask, next_sample) - now)))
        bursts.resume()
        if not node.alive:
            raise RuntimeError(f'the node exited:\n{node.tail()}')
        drain_start = time.monotonic()
        drained = observer.wait_for(
            lambda: (_kv_used(observer) or 0) <= kv_baseline and
            len(observer.got.texts['answer']) >= asked, args.drain_s)
        kv_after = _kv_used(observer)
        drain_s = time.monotonic() - drain_start
        chunk_times_s = [(t - start_wall_ns) / NS_PER_S for t in observer.got.chunk_ns]
        burst_log = _burst_facts(bursts, list(zip(
            diag_times, observer.got.diagnostics[first_diag:])), chunk_times_s)
    finally:
        if bursts is not None:
            bursts.resume()
        for child in reversed(children):
            child.stop()
        observer.close()
    answered = len(observer.got.texts['answer'])
    refused = sum(t.startswith(NO_ANSWER) for t in observer.got.texts['answer'])
    result = {
        'date': f'{datetime.datetime.now():%Y-%m-%d %H:%M}', 'host': platform.node(),
        'cpu': cpu_name(), 'preset': args.preset, 'minutes': args.minutes,
        'target_hz': target_hz, 'questions_per_s': args.questions_per_s,
        'sample_every_s': args.sample_every, 'warmup_s': warmup_s(args.minutes),
        'kv_baseline': kv_baseline, 'kv_capacity': kv_capacity, 'kv_after_drain': kv_after,
        'drained': drained, 'drain_s': drain_s, 'asked': asked, 'answered': answered,
        'refused': refused, 'prefix': args.prefix, 'samples': samples,
        'max_rss_growth': args.max_rss_growth, 'min_rate_fraction': args.min_rate_fraction,
        'burst_questions_per_s': args.burst_questions_per_s, 'burst_s': args.burst_s,
        'stall_s': args.stall_s, 'max_observation_age': max_age,
        'max_burst_growth': args.max_burst_growth, 'params': args.param, 'bursts': burst_log}
    result['verdict'] = verdict(result, chunk_times_s).as_dict()
    result['chunk_times_s'] = [round(t, 4) for t in chunk_times_s]
    return result


def warmup_s(minutes: float) -> float:
    """Return the warm-up of a run: ``max(60 s, 20 % of it)``."""
    return max(60.0, 0.2 * minutes * 60.0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='oxygen_stress soak',
                                     description=__doc__.split('\n\n')[0])
    parser.add_argument('--minutes', type=float, default=10.0, help='loaded minutes')
    parser.add_argument('--preset', choices=sorted(PARAMS_FILES), default='tiny',
                        help='tiny: config/test.yaml; demo: config/demo.yaml')
    parser.add_argument('--questions-per-s', type=float, default=2.0)
    parser.add_argument('--sample-every', type=float, default=5.0, help='seconds')
    parser.add_argument('--baseline-s', type=float, default=10.0,
                        help='seconds of actions only before the questions (KV baseline)')
    parser.add_argument('--drain-s', type=float, default=60.0,
                        help='seconds the load may take to drain after the run')
    parser.add_argument('--bursts', type=int, default=2,
                        help='bursts, evenly spaced (2: at 1/3 and 2/3 of the run); 0 = none')
    parser.add_argument('--burst-s', type=float, default=10.0, help='seconds a burst lasts')
    parser.add_argument('--burst-questions-per-s', type=float, default=10.0)
    parser.add_argument('--stall-s', type=float, default=2.0,
                        help="seconds the camera stalls at a burst's start (the replay stops); "
                             '0 = no stall')
    parser.add_argument('--param', action='append', default=[], metavar='NAME:=VALUE',
                        help='a node parameter over the preset (repeatable), e.g. '
                             'malloc_trim_mb:=0.0 to watch the heap untrimmed')
    parser.add_argument('--max-rss-growth', type=float, default=0.05)
    parser.add_argument('--max-burst-growth', type=float, default=0.01,
                        help='RSS growth the last burst may leave behind')
    parser.add_argument('--min-rate-fraction', type=float, default=0.95)
    parser.add_argument('--out', type=Path, default=None,
                        help='output folder (default out/soak_<time>)')
    parser.add_argument('--domain-id', type=int, default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the soak; return 0 if every check passed, 1 if one failed, 2 on a setup error."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not (args.minutes > 0 and args.questions_per_s > 0 and args.sample_every > 0 and
            args.burst_questions_per_s > 0 and args.burst_s > 0):
        parser.error('--minutes, --questions-per-s, --sample-every, --burst-s and '
                     '--burst-questions-per-s must be > 0')
    if args.bursts < 0 or not 0 <= args.stall_s <= args.burst_s:
        parser.error('--bursts must be >= 0 and --stall-s within 0..--burst-s')
    out = args.out or Path('out') / f'soak_{datetime.datetime.now():%Y%m%d-%H%M%S}'
    out.mkdir(parents=True, exist_ok=True)
    domain_id = ros_environment(args.domain_id)
    print(f'ROS_DOMAIN_ID={domain_id} (localhost only), topics under /soak_{os.getpid()}; '
          f'output {out}', flush=True)
    args.prefix = f'/soak_{os.getpid()}'
    rclpy.init(args=['oxygen_soak', '--ros-args', *isolation(args.prefix)[1]],
               signal_handler_options=SignalHandlerOptions.NO)
    try:
        result = run_soak(args, out)
    except RuntimeError as exc:
        print(f'oxygen_stress soak: {exc}', file=sys.stderr)
        return 2
    finally:
        rclpy.try_shutdown()
    (out / 'soak.json').write_text(json.dumps(result, indent=1))
    plot(result, out / 'soak.png')
    v = Verdict(**result['verdict'])
    print(v.summary(result))
    print(f'wrote {out / "soak.json"} and {out / "soak.png"}')
    return 0 if v.passed else 1


__all__ = ['Bursts', 'NODE_KEYS', 'burst_starts', 'main', 'run_soak', 'warmup_s']


if __name__ == '__main__':
    sys.exit(main())
