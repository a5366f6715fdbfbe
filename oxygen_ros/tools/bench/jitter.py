"""
``python -m oxygen_ros.tools.bench.jitter``: action-chunk timing of the node while texts decode.

Two runs of the real node over DDS on the looped demo bag, same preset and control rate:

- ``actions only``: no subtask, memory or question requests;
- ``with text``: long texts decode all the time (``decode_budget`` 200, EOS off, subtask and
  memory requests every 0.5 s, and ``--questions`` questions kept open: each answer is
  followed by a new question).

Reported per run: the arrival period of ``~/action_chunk`` at a subscriber (p50/p99), its
jitter ``|period - 1/control_rate_hz|`` (p50/p99), the chunk rate, and the node's cycle time,
decode tokens/s and decode batch from ``/diagnostics``. Random weights (timing only).
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
import platform
import sys
import tempfile
import time
from typing import Sequence

import numpy as np
from oxygen_ros.resources import config_file
from oxygen_ros.tools.bag.make_demo import demo_bag
from oxygen_ros.tools.common.children import Child, replay_args, ros_environment
from oxygen_ros.tools.common.machine import cpu_name
from oxygen_ros.tools.common.observer import Observer, period_stats
import rclpy
from rclpy.signals import SignalHandlerOptions
from std_msgs.msg import String

TEXT_PARAMS = ('subtask_period:=0.5', 'memory_period:=0.5', 'decode_budget:=200',
               'stop_on_eos:=false', 'max_running_requests:=16')
PARAMS_FILES = {'demo': 'demo', 'tiny': 'test'}


def run_once(name: str, params_file: Path, extra: Sequence[str], bag: Path, seconds: float,
             warmup_s: float, questions: int, target_hz: float, log_dir: Path) -> dict:
    """Start the node, replay, measure for ``seconds`` after ``warmup_s``; return the stats."""
    args = ['oxygen_ros.ros.node', '--ros-args', '--params-file', str(params_file)]
    for p in extra:
        args += ['-p', p]
    observer = Observer(f'jitter_bench_{name.replace(" ", "_")}', ask_topic=True)
    node = Child(f'node_{name.replace(" ", "_")}', args, log_dir)
    children = [node]
    try:
        if not observer.wait_active(node):
            raise RuntimeError(f'{name}: the node did not become active:\n{node.tail()}')
        children.append(Child('replay', replay_args(bag), log_dir))
        if not observer.wait_for(lambda: len(observer.got.chunk_ns) > 0, 30.0):
            raise RuntimeError(f'{name}: no action chunk:\n{node.tail()}')
        asked = 0
        start = time.monotonic()
        measure_from_ns = None
        while time.monotonic() - start < warmup_s + seconds:
            answered = len(observer.got.texts['answer'])
            while asked - answered < questions:
                observer.ask_pub.publish(String(data=f'Describe the scene in detail ({asked}).'))
                asked += 1
            if measure_from_ns is None and time.monotonic() - start >= warmup_s:
                measure_from_ns = time.time_ns()
                first_diag = len(observer.got.diagnostics)
            observer.spin_for(0.05)
        got = observer.got
        times = [t for t in got.chunk_ns if t >= measure_from_ns]
        diags = got.diagnostics[first_diag:] or got.diagnostics[-1:]
        result = {'run': name, **period_stats(times, target_hz), 'chunks': len(times)}
        for key in ('cycle time p50 (ms)', 'cycle time p99 (ms)', 'tokens/s', 'decode batch',
                    'tokens per cycle (k)'):
            result[key] = float(np.mean([float(d[key]) for d in diags]))
        result['texts'] = {task: len(texts) for task, texts in got.texts.items()}
        return result
    finally:
        for child in reversed(children):
            child.stop()
        observer.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='oxygen_bench jitter',
                                     description=__doc__.split('\n\n')[0])
    parser.add_argument('--preset', choices=sorted(PARAMS_FILES), default='demo',
                        help='demo: config/demo.yaml; tiny: config/test.yaml')
    parser.add_argument('--seconds', type=float, default=15.0, help='measured seconds per run')
    parser.add_argument('--warmup', type=float, default=3.0, help='seconds before measuring')
    parser.add_argument('--questions', type=int, default=4, help='questions kept open')
    parser.add_argument('--json', type=Path, default=None, help='write the results here')
    parser.add_argument('--domain-id', type=int, default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run both configurations and print a comparison; return the exit status."""
    import yaml
    args = _parser().parse_args(argv)
    domain_id = ros_environment(args.domain_id)
    params_file = config_file(PARAMS_FILES[args.preset])
    target_hz = yaml.safe_load(params_file.read_text())['/**']['ros__parameters'][
        'control_rate_hz']
    bag = demo_bag()
    rclpy.init(args=['jitter_bench'], signal_handler_options=SignalHandlerOptions.NO)
    results = []
    with tempfile.TemporaryDirectory(prefix='jitter_bench_') as log_dir:
        try:
            results.append(run_once('actions only', params_file,
                                    ('subtask_period:=0.0', 'memory_period:=0.0'), bag,
                                    args.seconds, args.warmup, 0, target_hz, Path(log_dir)))
            results.append(run_once('with text', params_file, TEXT_PARAMS, bag, args.seconds,
                                    args.warmup, args.questions, target_hz, Path(log_dir)))
        except RuntimeError as exc:
            print(f'jitter_bench: {exc}', file=sys.stderr)
            return 1
        finally:
            rclpy.try_shutdown()
    header = (f'jitter_bench {datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.node()}, '
              f'{cpu_name()}, preset {args.preset}, '
              f'{target_hz:g} Hz, ROS_DOMAIN_ID {domain_id}')
    print(header)
    print(f'{"run":<13}{"chunks":>7}{"rate Hz":>9}{"period p50/p99 ms":>19}'
          f'{"jitter p50/p99 ms":>19}{"cycle p50/p99 ms":>18}{"tok/s":>7}{"batch":>7}')
    for r in results:
        print(f'{r["run"]:<13}{r["chunks"]:>7}{r.get("rate_hz", 0):>9.2f}'
              f'{r.get("period_p50_ms", 0):>10.1f}/{r.get("period_p99_ms", 0):<8.1f}'
              f'{r.get("jitter_p50_ms", 0):>10.1f}/{r.get("jitter_p99_ms", 0):<8.1f}'
              f'{r["cycle time p50 (ms)"]:>9.1f}/{r["cycle time p99 (ms)"]:<8.1f}'
              f'{r["tokens/s"]:>7.1f}{r["decode batch"]:>7.1f}')
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({'header': header, 'results': results}, indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
