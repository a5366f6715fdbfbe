"""
``make demo`` / ``oxygen_demo``: the oxygen node on real photographs, end to end over DDS.

Steps: make (or reuse, in the cache directory) a demo bag of scikit-image photographs; start
``oxygen_node`` with ``config/demo.yaml`` (demo preset, RANDOM weights: the actions and texts
are meaningless, the timing, KV cache and ROS plumbing are real); wait until it is active;
record its outputs with ``oxygen_bag record`` into ``out/demo_<timestamp>/bag``; replay the bag in
a loop; ask two questions through the ``/oxygen/ask`` action (their answers stream as feedback);
stop everything with SIGINT and print a summary, with the streamed pieces' timing.

It runs on its own ROS domain (random unless ``--domain-id``) with
``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST``. ``--keystore DIR`` runs it with DDS security
(Enforce), every process in the enclave of its role (``children.DEMO_ENCLAVES``; a keystore
from ``oxygen_keystore create DIR --preset demo``, made for this node's configuration: one
made for another is refused before anything starts, its missing grants named): the replay as
the robot's drivers publishes the cameras and joint states but not the instruction, which the
node then takes from its ``instruction`` parameter (the bag's). Exits 1 if no action chunk
arrived, a process failed, or security would not hold (the reason is printed; the ROS 2
wheels from PyPI have no security plugins).
"""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path
import sys
import time
from typing import Sequence

import numpy as np
from oxygen_ros.resources import config_file
from oxygen_ros.ros.security import SecuritySettings
from oxygen_ros.signals import stop_event_on_signals
from oxygen_ros.tools.bag.make_demo import demo_bag
from oxygen_ros.tools.bag.topics import bag_instruction
from oxygen_ros.tools.common.children import (
    Child, DEMO_ENCLAVES, enclave_args, replay_args, ros_environment, secure_environment,
    stop_children)
from oxygen_ros.tools.common.observer import Observer, OUTPUTS, period_stats, Received, STREAMS
import rclpy
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.signals import SignalHandlerOptions
import yaml

PRESET = 'demo'
"""The node's params file, ``config/demo.yaml`` (its keystore: ``oxygen_keystore create DIR
--preset demo``)."""
QUESTIONS = ('What is on the table?', 'Which object should the robot pick up first?')


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='oxygen_demo bag', description=__doc__.split('\n\n')[0])
    parser.add_argument('--duration', type=float, default=20.0, help='seconds of replay')
    parser.add_argument('--out', type=Path, default=Path('out'), help='output folder')
    parser.add_argument('--domain-id', type=int, default=None,
                        help="ROS_DOMAIN_ID (default: random; with --keystore the keystore's)")
    parser.add_argument('--bag', type=Path, default=None,
                        help='replay this bag (default: the cached demo bag, made once)')
    parser.add_argument('--keystore', type=Path, default=None,
                        help='run with DDS security, each process in its enclave of this '
                             'keystore (oxygen_keystore create DIR --preset demo; needs ROS 2 '
                             'with security plugins, docs/security.md)')
    return parser


def _summary(got: Received, run_s: float, target_hz: float, bag_dir: Path,
             counts: dict[str, int]) -> str:
    stats = period_stats(got.chunk_ns, target_hz)
    last = got.diagnostics[-1] if got.diagnostics else {}
    lines = [f'action chunks: {len(got.chunk_ns)} in {run_s:.1f} s'
             + (f', {stats["rate_hz"]:.2f} Hz (target {target_hz:g} Hz)' if stats else '')]
    if last:
        acting = [d for d in got.diagnostics if float(d['action chunk rate (Hz)']) > 0]
        tokens_s = np.mean([float(d['tokens/s']) for d in acting]) if acting else 0.0
        kv_peak = max(float(d['KV use (%)']) for d in got.diagnostics)
        lines.append(f'cycle time (node): p50 {last["cycle time p50 (ms)"]} ms, '
                     f'p99 {last["cycle time p99 (ms)"]} ms; decode {tokens_s:.1f} tokens/s; '
                     f'k {last["tokens per cycle (k)"]}; KV peak {kv_peak:.1f} %')
        if last['random weights'] == 'yes':
            lines.append('random weights (no checkpoint): actions and texts are meaningless')
    if stats:
        lines.append(f'chunk period: p50 {stats["period_p50_ms"]:.1f} ms, p99 '
                     f'{stats["period_p99_ms"]:.1f} ms; jitter |period - '
                     f'{1e3 / target_hz:.0f} ms|: p50 {stats["jitter_p50_ms"]:.1f} ms, '
                     f'p99 {stats["jitter_p99_ms"]:.1f} ms')
    lines += got.timing.summary()
    for task, texts in got.texts.items():
        examples = '; '.join(repr(t[:60]) for t in texts[:3])
        lines.append(f'{task}: {len(texts)} message(s){": " + examples if texts else ""}')
    lines.append(f'recorded bag: {bag_dir} ({", ".join(f"{t} {n}" for t, n in counts.items())})')
    return '\n'.join(lines)


def _bag_counts(bag_dir: Path) -> dict[str, int]:
    from rosbags.rosbag2 import Reader
    try:
        with Reader(bag_dir) as reader:
            return {c.topic: c.msgcount for c in reader.connections}
    except Exception as exc:  # noqa: B902 (reported in the summary)
        return {f'unreadable: {exc}': 0}


def _start_observer(secure: bool) -> Observer | str:
    """Init rclpy and return the demo's node, or why security does not hold."""
    args = ['oxygen_demo', *enclave_args(DEMO_ENCLAVES['demo'] if secure else None)]
    try:
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
        return Observer('oxygen_demo')
    except _rclpy.RCLError as exc:
        if not secure:
            raise
        rclpy.try_shutdown()
        return SecuritySettings.from_environment(args, os.environ).middleware_failure(exc)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return 0 if action chunks flowed and every process exited cleanly."""
    args = _parser().parse_args(argv)
    t_start = time.monotonic()
    secure = args.keystore is not None
    domain_id = args.domain_id
    if secure:
        domain_id, problem = secure_environment(args.keystore, args.domain_id, PRESET)
        if problem is not None:
            print(f'oxygen_demo: {problem}', file=sys.stderr)
            return 1
    domain_id = ros_environment(domain_id)
    stop = stop_event_on_signals()
    observer = _start_observer(secure)
    if isinstance(observer, str):
        print(f'oxygen_demo: {observer}', file=sys.stderr)
        return 1
    out_dir = args.out / f'demo_{datetime.datetime.now():%Y%m%d-%H%M%S}'
    out_dir.mkdir(parents=True)
    bag = args.bag or demo_bag()
    params = config_file(PRESET)
    print(f'ROS_DOMAIN_ID={domain_id} (localhost only); params {params}; output {out_dir}'
          + (f'; DDS security, keystore {args.keystore}' if secure else ''))
    node_args = ['oxygen_ros.ros.node', '--ros-args', '--params-file', str(params)]
    if secure:
        node_args += ['--enclave', DEMO_ENCLAVES['node'],
                      '-p', f'instruction:={bag_instruction(bag)}']
    node = Child('node', node_args, out_dir)
    children, ok = [node], False
    try:
        if not observer.wait_active(node):
            print(f'the node did not become active:\n{node.tail()}', file=sys.stderr)
            return 1
        print(f'node active after {time.monotonic() - t_start:.1f} s; recording and replaying')
        children.append(Child('record', ['oxygen_ros.tools.bag.record', str(out_dir / 'bag'),
                                         *OUTPUTS, *STREAMS,
                                         *enclave_args(DEMO_ENCLAVES['record'] if secure
                                                       else None)], out_dir))
        observer.wait_for(lambda: observer.node.count_subscribers(OUTPUTS[0]) >= 2, 20.0)
        children.append(Child('replay', [*replay_args(bag, instruction=not secure),
                                         *enclave_args(DEMO_ENCLAVES['replay'] if secure
                                                       else None)], out_dir))
        observer.wait_for(lambda: observer.got.chunk_ns or stop.is_set(), 30.0)
        run_start = time.monotonic()
        asked = 0
        while time.monotonic() - run_start < args.duration and not stop.is_set():
            due = int((time.monotonic() - run_start) / args.duration * 3)
            if asked < min(due, len(QUESTIONS)):
                print(f'asking: {QUESTIONS[asked]!r} (~/ask action)', flush=True)
                observer.ask(QUESTIONS[asked])
                asked += 1
            observer.spin_for(0.1)
        diagnostics_at_end = list(observer.got.diagnostics)
        run_s = time.monotonic() - run_start
        ok = children[2].stop() == 0
        observer.wait_for(observer.got.timing.all_answered, 10.0)
        observer.got.diagnostics = diagnostics_at_end
    finally:
        ok = stop_children(children) and ok
        observer.close()
        rclpy.try_shutdown()
    target_hz = yaml.safe_load(params.read_text())['/**']['ros__parameters']['control_rate_hz']
    print('\n== oxygen demo summary ==')
    summary = _summary(observer.got, run_s, target_hz, out_dir / 'bag',
                       _bag_counts(out_dir / 'bag'))
    print(summary)
    (out_dir / 'summary.txt').write_text(summary + '\n')
    print(f'logs: {out_dir}; total {time.monotonic() - t_start:.1f} s')
    if not observer.got.chunk_ns:
        print('FAILED: no action chunk arrived', file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
