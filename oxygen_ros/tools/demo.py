"""
``make demo`` / ``oxygen-demo``: the oxygen node on real photographs, end to end over DDS.

Steps: make (or reuse, in the cache directory) a demo bag of scikit-image photographs; start
``oxygen_node`` with ``config/demo.yaml`` (demo preset, RANDOM weights: the actions and texts
are meaningless, the timing, KV cache and ROS plumbing are real); wait until it is active;
record its outputs with ``oxygen_record`` into ``out/demo_<timestamp>/bag``; replay the bag in
a loop; ask two questions through the ``/oxygen/ask`` action (their answers stream as feedback);
stop everything with SIGINT and print a summary, with the streamed pieces' timing.

It runs on its own ROS domain (random unless ``--domain-id``) with
``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST``. Exits 1 if no action chunk arrived or a process
failed.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
import datetime
import os
from pathlib import Path
import random
import shutil
import signal
import subprocess
import sys
import time
from typing import Sequence

from action_msgs.msg import GoalStatus
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.msg import State
from lifecycle_msgs.srv import GetState
import numpy as np
from oxygen_ros.resources import cache_dir, config_file
from oxygen_ros.ros.ask_action import OUTCOME_NAMES
from oxygen_ros.ros.convert import stamp_to_ns
from oxygen_ros.ros.diagnostics import status_values
from oxygen_ros.ros.text_stream import TEXT_QOS
from oxygen_ros.signals import stop_event_on_signals
from oxygen_ros.tools.bag_topics import CAMERA_TOPICS, INSTRUCTION_TOPIC, JOINT_STATES_TOPIC
from oxygen_ros.tools.make_demo_bag import DemoBagConfig, write_demo_bag
from oxygen_ros.tools.text_timing import AskTiming, TextTiming
from oxygen_ros_interfaces.action import Ask
from oxygen_ros_interfaces.msg import DecodedText
import rclpy
from rclpy.action import ActionClient
from rclpy.executors import SingleThreadedExecutor
from rclpy.signals import SignalHandlerOptions
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory
import yaml

OUTPUTS = ('/oxygen/action_chunk', '/oxygen/subtask', '/oxygen/answer', '/oxygen/memory',
           '/diagnostics')
STREAMS = ('/oxygen/subtask/stream', '/oxygen/answer/stream', '/oxygen/memory/stream')
QUESTIONS = ('What is on the table?', 'Which object should the robot pick up first?')
BAG_CONFIG = DemoBagConfig(duration_s=5.0, camera_rate_hz=15.0, joint_rate_hz=50.0)
_DOMAIN_IDS = tuple(range(1, 102))  # clear of the ephemeral port range (ROS 2 docs)
_START_TIMEOUT_S = 120.0


class Child:
    """A ROS tool run as ``python -m module``, output in a log file."""

    def __init__(self, name: str, args: Sequence[str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f'{name}.log'
        with open(self.log_path, 'wb') as log:
            self.popen = subprocess.Popen([sys.executable, '-m', *args], stdout=log,
                                          stderr=subprocess.STDOUT)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGINT, then SIGKILL after ``timeout_s``; return the exit status."""
        if self.alive:
            self.popen.send_signal(signal.SIGINT)
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait()

    def tail(self, lines: int = 15) -> str:
        return '\n'.join(self.log_path.read_text(errors='replace').splitlines()[-lines:])


@dataclass(slots=True)
class Received:
    """What the observer got from the node, with DDS receive times (system clock, ns)."""

    chunk_ns: list[int] = field(default_factory=list)
    chunk_stamps_ns: list[int] = field(default_factory=list)
    texts: dict[str, list[str]] = field(default_factory=dict)
    diagnostics: list[dict[str, str]] = field(default_factory=list)
    timing: TextTiming = field(default_factory=TextTiming)


class Observer:
    """
    An rclpy node that watches the oxygen node and asks it questions.

    :param ask_topic: also ask through the ``~/ask`` String topic (``ask_pub``) and collect
        its ``~/answer`` replies in ``got.texts['answer']`` (the soak and the jitter bench);
        the demo asks through the action only.
    """

    def __init__(self, name: str, *, ask_topic: bool = False) -> None:
        self.node = rclpy.create_node(name)
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(self.node)
        self.got = Received()
        self._get_state = self.node.create_client(GetState, '/oxygen/get_state')
        self.node.create_subscription(JointTrajectory, OUTPUTS[0], self._on_chunk, 100)
        for topic in OUTPUTS[1:4] if ask_topic else (OUTPUTS[1], OUTPUTS[3]):
            task = topic.rsplit('/', 1)[1]
            self.got.texts[task] = []
            self.node.create_subscription(
                String, topic, lambda msg, task=task: self.got.texts[task].append(msg.data),
                TEXT_QOS)
        self.node.create_subscription(DiagnosticArray, OUTPUTS[4], self._on_diagnostics, 100)
        for topic in STREAMS:
            task = topic.split('/')[2]
            self.node.create_subscription(
                DecodedText, topic, lambda msg, task=task: self.got.timing.on_piece(task, msg),
                TEXT_QOS)
        self.ask_client = ActionClient(self.node, Ask, '/oxygen/ask')
        if ask_topic:
            self.ask_pub = self.node.create_publisher(String, '/oxygen/ask', TEXT_QOS)

    def ask(self, question: str) -> None:
        """Send ``question`` to the ``~/ask`` action; its timing goes to ``got.timing``."""
        timing = AskTiming(question)
        self.got.timing.asks.append(timing)
        sent = self.ask_client.send_goal_async(Ask.Goal(question=question),
                                               feedback_callback=timing.on_feedback)

        def accepted(future: object) -> None:
            handle = future.result()
            if not handle.accepted:
                timing.on_result(False, '', 'rejected: see /diagnostics')
                return
            handle.get_result_async().add_done_callback(lambda f: timing.on_result(
                f.result().status == GoalStatus.STATUS_SUCCEEDED,
                f.result().result.answer.text,
                OUTCOME_NAMES.get(f.result().result.status, '?') +
                (f': {f.result().result.reason}' if f.result().result.reason else '')))
        sent.add_done_callback(accepted)

    def _on_chunk(self, msg: JointTrajectory, info: dict) -> None:
        self.got.chunk_ns.append(info['received_timestamp'])
        self.got.chunk_stamps_ns.append(stamp_to_ns(msg.header.stamp))

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name == 'oxygen: engine':
                self.got.diagnostics.append(
                    {'level': str(status.level[0]), 'message': status.message,
                     **status_values(status)})

    def spin_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.executor.spin_once(timeout_sec=min(0.05, max(end - time.monotonic(), 0)))

    def wait_active(self, node: Child, timeout_s: float = _START_TIMEOUT_S) -> bool:
        """Poll ``/oxygen/get_state`` until active; False on timeout, failure or exit."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and node.alive and not any(
                'configure failed' in d['message'] for d in self.got.diagnostics):
            if self._get_state.service_is_ready():
                future = self._get_state.call_async(GetState.Request())
                self.executor.spin_until_future_complete(future, timeout_sec=5.0)
                if future.done() and \
                        future.result().current_state.id == State.PRIMARY_STATE_ACTIVE:
                    return True
            self.spin_for(0.2)
        return False

    def wait_for(self, predicate: object, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() >= deadline:
                return False
            self.spin_for(0.05)
        return True

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()


def ros_environment(domain_id: int | None) -> int:
    """Set this process's (and its children's) ROS domain; return it."""
    if domain_id is None:
        domain_id = random.SystemRandom().choice(_DOMAIN_IDS)
    os.environ['ROS_DOMAIN_ID'] = str(domain_id)
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    os.environ.setdefault('AMENT_PREFIX_PATH', sys.prefix)
    os.environ['PYTHONUNBUFFERED'] = '1'
    return domain_id


def demo_bag(config: DemoBagConfig = BAG_CONFIG) -> Path:
    """Return the cached demo bag, writing it first if missing (atomically)."""
    path = cache_dir() / f'demo_bag_{config.duration_s:g}s_{config.camera_rate_hz:g}hz'
    if (path / 'metadata.yaml').is_file():
        return path
    tmp = path.with_name(path.name + f'.tmp{os.getpid()}')
    shutil.rmtree(tmp, ignore_errors=True)
    print(f'writing the demo bag {path} (once) ...', flush=True)
    write_demo_bag(tmp, config)
    tmp.rename(path)
    return path


def replay_args(bag: Path, cameras: Sequence[str] = ('base_0_rgb', 'left_wrist_0_rgb')
                ) -> list[str]:
    """Return ``oxygen_replay`` arguments: loop the node's input topics of ``bag``."""
    return ['oxygen_ros.tools.replay', str(bag), '--loop', '--wait-for-subscribers', '20',
            '--topics', *(CAMERA_TOPICS[c] for c in cameras), JOINT_STATES_TOPIC,
            INSTRUCTION_TOPIC]


def period_stats(times_ns: Sequence[int], target_hz: float) -> dict[str, float]:
    """Return rate, period p50/p99 and |period - 1/target| p50/p99 (ms) of arrival times."""
    if len(times_ns) < 3:
        return {}
    periods = np.diff(np.asarray(times_ns, dtype=np.float64)) / 1e6
    jitter = np.abs(periods - 1e3 / target_hz)
    return {'rate_hz': 1e3 * len(periods) / periods.sum(),
            'period_p50_ms': float(np.percentile(periods, 50)),
            'period_p99_ms': float(np.percentile(periods, 99)),
            'jitter_p50_ms': float(np.percentile(jitter, 50)),
            'jitter_p99_ms': float(np.percentile(jitter, 99))}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='oxygen-demo', description=__doc__.split('\n\n')[0])
    parser.add_argument('--duration', type=float, default=20.0, help='seconds of replay')
    parser.add_argument('--out', type=Path, default=Path('out'), help='output folder')
    parser.add_argument('--domain-id', type=int, default=None, help='ROS_DOMAIN_ID')
    parser.add_argument('--bag', type=Path, default=None,
                        help='replay this bag (default: the cached demo bag, made once)')
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return 0 if action chunks flowed and every process exited cleanly."""
    args = _parser().parse_args(argv)
    t_start = time.monotonic()
    domain_id = ros_environment(args.domain_id)
    out_dir = args.out / f'demo_{datetime.datetime.now():%Y%m%d-%H%M%S}'
    out_dir.mkdir(parents=True)
    bag = args.bag or demo_bag()
    params = config_file('demo')
    print(f'ROS_DOMAIN_ID={domain_id} (localhost only); params {params}; output {out_dir}')
    stop = stop_event_on_signals()
    rclpy.init(args=['oxygen_demo'], signal_handler_options=SignalHandlerOptions.NO)
    observer = Observer('oxygen_demo')
    node = Child('node', ['oxygen_ros.ros.node', '--ros-args', '--params-file', str(params)],
                 out_dir)
    children, ok = [node], False
    try:
        if not observer.wait_active(node):
            print(f'the node did not become active:\n{node.tail()}', file=sys.stderr)
            return 1
        print(f'node active after {time.monotonic() - t_start:.1f} s; recording and replaying')
        children.append(Child('record', ['oxygen_ros.tools.record', str(out_dir / 'bag'),
                                         *OUTPUTS, *STREAMS], out_dir))
        observer.wait_for(lambda: observer.node.count_subscribers(OUTPUTS[0]) >= 2, 20.0)
        children.append(Child('replay', replay_args(bag), out_dir))
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
        for child in reversed(children):
            code = child.stop()
            ok = ok and code == 0
            if code != 0:
                print(f'{child.name} exited with {code}:\n{child.tail()}', file=sys.stderr)
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
