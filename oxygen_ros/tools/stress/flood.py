"""
``oxygen_stress flood``: flood the node's ``~/ask`` with questions and measure what it does.

Usage::

    oxygen_stress flood [--via topic|action|both]
                        [--count 200 --seconds 1 | --rate 20 --seconds 30]
                        [--clients 8] [--node /oxygen] [--settle 2] [--json PATH] [--ros-args ...]

Sends ``count`` questions (or ``rate`` per second) spread evenly over ``seconds`` to a running
node: as ``std_msgs/String`` on ``~/ask`` (each answered on ``~/answer``), as goals of the
``~/ask`` action through ``--clients`` independent action clients (``rclpy.action``, round
robin), or alternating both. Then waits until every question has its reply (a String on
``~/answer``; a goal response and, when accepted, its result) and ``--settle`` seconds more.

Reports (stdout, and ``--json``): questions asked, answered, refused or dropped by reason, goals
rejected, lost questions (no reply at the end); the action chunk rate at this subscriber
(``~/action_chunk`` DDS receive times) over the flood window against ``control_rate_hz``; the
largest question-queue and pending figures ``/diagnostics`` showed. Exits 1 if a question got no
reply, a String question got more than one, or the chunk rate fell below ``--min-rate`` of the
target.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import asdict, dataclass, field
import datetime
import enum
import json
from pathlib import Path
import platform
import re
import sys
import threading
import time
from typing import Sequence

from action_msgs.msg import GoalStatus
from diagnostic_msgs.msg import DiagnosticArray
from oxygen_ros.ros.ask_action import OUTCOME_NAMES
from oxygen_ros.ros.convert import NS_PER_S
from oxygen_ros.ros.diagnostics import STATUS_NAME, status_values
from oxygen_ros.ros.text_requests import NO_ANSWER
from oxygen_ros.signals import stop_event_on_signals
from oxygen_ros_interfaces.action import Ask
import rclpy
from rclpy.action import ActionClient
from rclpy.executors import Executor, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.signals import SignalHandlerOptions
from rclpy.utilities import remove_ros_args
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

NODE_NAME = 'oxygen_flood'
DEEP = QoSProfile(depth=1000)
"""Reliable, keep last 1000: no reply, goal response or result of a flood is overwritten
before this process takes it (the services' default depth 10 would lose some)."""


class Via(enum.Enum):
    """How the flood asks."""

    TOPIC = 'topic'
    ACTION = 'action'
    BOTH = 'both'
    """Alternating: even questions on the topic, odd ones as goals."""


def reason_kind(reason: str) -> str:
    """Return a refusal reason without its figures: ``'queue full (3 ...)'`` → ``'queue full'``."""
    return re.sub(r'\s+\d+', ' N', re.split(r'[(:]', reason, maxsplit=1)[0]).strip()


@dataclass(slots=True)
class _Goal:
    sent_ns: int
    done_ns: int = 0
    """When the rejection or the result came (system clock)."""
    accepted: bool | None = None
    outcome: str | None = None
    """``'EOS'``, ``'token budget'``, ``'dropped: <kind>'``, ``'cancelled'``, ``'aborted'``."""


@dataclass(slots=True)
class FloodTally:
    """
    What came back for the questions of one flood (exact counts).

    :ivar asked: questions sent (topic + action).
    :ivar answered: String replies with an answer plus goals that SUCCEEDED.
    :ivar refused: reason kind → count: ``no answer: <reason>`` replies, rejected goals
        (``'goal rejected'``: the protocol carries no reason), goals ended DROPPED.
    :ivar lost: questions without a reply (String) or without a response or result (goal).
    :ivar extra_replies: String replies beyond one per String question.
    """

    asked: int = 0
    asked_topic: int = 0
    asked_action: int = 0
    answered: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    extra_replies: int = 0
    first_sent_ns: int = 0
    last_sent_ns: int = 0
    last_reply_ns: int = 0

    @property
    def num_refused(self) -> int:
        return sum(self.refused.values())


class FloodClient:
    """
    Sends questions to the oxygen node and collects replies, action chunks and diagnostics.

    Spin ``executor`` (which must hold ``node``) through ``spin_until`` / ``flood``; receive
    times are DDS receive times (system clock, ns), so a busy client does not distort them.

    :param node: an rclpy node of this process.
    :param executor: the executor spinning ``node``.
    :param target: the oxygen node's name (``/oxygen``).
    :param num_clients: independent action clients the goals are spread over.
    :param stop: once set (SIGINT, SIGTERM), every wait ends at once and sending stops.
    """

    def __init__(self, node: Node, executor: Executor, target: str = '/oxygen',
                 num_clients: int = 8, stop: threading.Event | None = None) -> None:
        self.node, self.executor = node, executor
        self.stop = stop or threading.Event()
        target = target.rstrip('/')
        self.ask_pub = node.create_publisher(String, f'{target}/ask', DEEP)
        self.replies: list[tuple[int, str]] = []
        self.chunk_ns: list[int] = []
        self.diagnostics: list[tuple[int, dict[str, str]]] = []
        node.create_subscription(String, f'{target}/answer', self._on_reply, DEEP)
        node.create_subscription(JointTrajectory, f'{target}/action_chunk', self._on_chunk, DEEP)
        node.create_subscription(DiagnosticArray, '/diagnostics', self._on_diagnostics, DEEP)
        self.action_clients = [
            ActionClient(node, Ask, f'{target}/ask', goal_service_qos_profile=DEEP,
                         result_service_qos_profile=DEEP, cancel_service_qos_profile=DEEP,
                         feedback_sub_qos_profile=DEEP)
            for _ in range(num_clients)]
        self.goals: list[_Goal] = []

    # -- receiving ---------------------------------------------------------------------
    def _on_reply(self, msg: String, info: dict) -> None:
        self.replies.append((info['received_timestamp'], msg.data))

    def _on_chunk(self, msg: JointTrajectory, info: dict) -> None:
        self.chunk_ns.append(info['received_timestamp'])

    def _on_diagnostics(self, msg: DiagnosticArray, info: dict) -> None:
        for status in msg.status:
            if status.name == STATUS_NAME:
                values = status_values(status)
                values['message'] = status.message
                self.diagnostics.append((info['received_timestamp'], values))

    def spin_until(self, predicate: object, timeout_s: float) -> bool:
        """Spin until ``predicate()``; False on timeout or once ``stop`` is set."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() >= deadline or self.stop.is_set():
                return False
            self.executor.spin_once(timeout_sec=0.05)
        return True

    def ready(self) -> bool:
        """Return whether the node's ``~/ask`` subscription and action server were found."""
        return self.ask_pub.get_subscription_count() >= 1 and \
            all(c.server_is_ready() for c in self.action_clients)

    # -- asking --------------------------------------------------------------------------
    def _send_goal(self, client: ActionClient, question: str, max_tokens: int) -> None:
        goal = _Goal(time.time_ns())
        self.goals.append(goal)

        def on_result(future: object) -> None:
            res = future.result()
            goal.done_ns = time.time_ns()
            if res.status == GoalStatus.STATUS_SUCCEEDED:
                goal.outcome = OUTCOME_NAMES.get(res.result.status, str(res.result.status))
            elif res.result.status == Ask.Result.STATUS_DROPPED:
                goal.outcome = f'dropped: {reason_kind(res.result.reason)}'
            else:
                goal.outcome = OUTCOME_NAMES.get(res.result.status, 'aborted') \
                    if res.status == GoalStatus.STATUS_CANCELED else 'aborted'

        def on_response(future: object) -> None:
            handle = future.result()
            goal.accepted = bool(handle.accepted)
            if not handle.accepted:
                goal.done_ns = time.time_ns()
            else:
                handle.get_result_async().add_done_callback(on_result)
        client.send_goal_async(Ask.Goal(question=question, max_tokens=max_tokens)) \
            .add_done_callback(on_response)

    def flood(self, via: Via, count: int, seconds: float, *, max_tokens: int = 0,
              reply_timeout_s: float = 60.0, settle_s: float = 1.0) -> FloodTally:
        """
        Ask ``count`` questions evenly over ``seconds``; wait for every reply; tally them.

        Question ``i`` is sent at ``i * seconds / count`` after the start (all at once when
        ``seconds`` is 0). Waits until each String question has a reply and each goal a
        response and (accepted) a result, or ``reply_timeout_s`` after the last one is sent,
        then ``settle_s`` more (a duplicate reply would arrive then).
        """
        first_reply, first_goal = len(self.replies), len(self.goals)
        tally = FloodTally(first_sent_ns=time.time_ns())
        start = time.monotonic()
        for i in range(count):
            if self.stop.is_set():
                break
            due = start + (i * seconds / count if count else 0.0)
            while time.monotonic() < due:
                self.executor.spin_once(timeout_sec=min(0.005, max(due - time.monotonic(), 0)))
            question = f'flood question {i}: what is on the table?'
            if via is Via.TOPIC or (via is Via.BOTH and i % 2 == 0):
                self.ask_pub.publish(String(data=question))
                tally.asked_topic += 1
            else:
                client = self.action_clients[tally.asked_action % len(self.action_clients)]
                self._send_goal(client, question, max_tokens)
                tally.asked_action += 1
        tally.last_sent_ns = time.time_ns()
        tally.asked = tally.asked_topic + tally.asked_action
        goals = self.goals[first_goal:]

        def complete() -> bool:
            return len(self.replies) - first_reply >= tally.asked_topic and all(
                g.accepted is False or g.outcome is not None for g in goals)
        if not self.spin_until(complete, reply_timeout_s):
            tally.last_reply_ns = time.time_ns()
        self.spin_until(lambda: False, settle_s)
        replies = self.replies[first_reply:]
        refused: Counter[str] = Counter()
        for _, text in replies[:tally.asked_topic]:
            if text.startswith(NO_ANSWER):
                refused[reason_kind(text[len(NO_ANSWER):])] += 1
            else:
                tally.answered += 1
        for goal in goals:
            if goal.accepted is False:
                refused['goal rejected'] += 1
            elif goal.outcome in ('EOS', 'token budget'):
                tally.answered += 1
            elif goal.outcome is not None:
                refused[goal.outcome] += 1
        tally.refused = dict(refused)
        tally.extra_replies = max(len(replies) - tally.asked_topic, 0)
        tally.lost = max(tally.asked_topic - len(replies), 0) + sum(
            g.accepted is None or (g.accepted and g.outcome is None) for g in goals)
        tally.last_reply_ns = max([tally.last_reply_ns, tally.last_sent_ns] +
                                  [t for t, _ in replies[:tally.asked_topic]] +
                                  [g.done_ns for g in goals])
        return tally

    # -- measuring -----------------------------------------------------------------------
    def chunk_rate(self, start_ns: int, end_ns: int) -> tuple[float, int]:
        """
        Return the action chunk rate (Hz) over ``[start_ns, end_ns]`` and the chunks in it.

        Counted over the intervals that cover the window: from the last chunk received at or
        before ``start_ns`` to the first at or after ``end_ns`` (the window's edges then cost
        nothing, a missed chunk anywhere inside lowers the rate). Rate 0 if the stream does
        not cover the window.
        """
        times = sorted(self.chunk_ns)
        before = [t for t in times if t <= start_ns]
        after = [t for t in times if t >= end_ns]
        if not before or not after:
            return 0.0, 0
        inside = [t for t in times if before[-1] <= t <= after[0]]
        return (len(inside) - 1) * NS_PER_S / (after[0] - before[-1]), len(inside)

    def peak(self, key: str, start_ns: int, end_ns: int | None = None) -> float:
        """Return the largest value of a ``/diagnostics`` key received in the window."""
        return max((float(v[key]) for t, v in self.diagnostics
                    if t >= start_ns and (end_ns is None or t <= end_ns) and key in v),
                   default=float('nan'))


def summary(tally: FloodTally, rate_hz: float, target_hz: float, peaks: dict[str, float],
            window_s: float) -> str:
    """Return the human-readable report of one flood (``window_s``: the rate's window)."""
    sent_s = (tally.last_sent_ns - tally.first_sent_ns) / NS_PER_S
    refused = ', '.join(f'{kind} x{n}' for kind, n in sorted(tally.refused.items())) or '-'
    lines = [f'asked {tally.asked} in {sent_s:.2f} s (topic {tally.asked_topic}, action '
             f'{tally.asked_action}): answered {tally.answered}, refused {tally.num_refused} '
             f'({refused}), lost {tally.lost}, extra replies {tally.extra_replies}',
             f'action chunks {rate_hz:.2f} Hz over {window_s:.1f} s from the first question '
             f'({100 * rate_hz / target_hz:.1f} % of {target_hz:g} Hz)',
             f'last reply {(tally.last_reply_ns - tally.first_sent_ns) / NS_PER_S:.1f} s after '
             f'the first question']
    lines += [f'peak {key}: {value:g}' for key, value in peaks.items()]
    return '\n'.join(lines)


PEAK_KEYS = ('questions waiting peak', 'text requests open', 'text requests pending',
             'text requests running', 'cycle time p99 (ms)')
"""``/diagnostics`` keys whose largest value during a flood is reported."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='oxygen_stress flood',
                                     description=__doc__.split('\n\n')[0])
    parser.add_argument('--via', choices=[v.value for v in Via], default='topic')
    parser.add_argument('--count', type=int, default=None, help='questions in all')
    parser.add_argument('--rate', type=float, default=None, help='questions per second')
    parser.add_argument('--seconds', type=float, default=1.0, help='spread over this time')
    parser.add_argument('--clients', type=int, default=8, help='action clients')
    parser.add_argument('--max-tokens', type=int, default=0, help='goal token budget')
    parser.add_argument('--node', default='/oxygen')
    parser.add_argument('--settle', type=float, default=4.0,
                        help='seconds after the last reply (the chunk rate window ends there)')
    parser.add_argument('--timeout', type=float, default=60.0,
                        help='seconds to wait for the replies after the last question')
    parser.add_argument('--baseline', type=float, default=3.0,
                        help='seconds of chunk rate measured before the flood')
    parser.add_argument('--min-rate', type=float, default=0.95,
                        help='fail below this fraction of control_rate_hz')
    parser.add_argument('--json', type=Path, default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_stress flood`` against a running node; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(remove_ros_args([NODE_NAME, *argv])[1:])
    count = args.count if args.count is not None else \
        round((args.rate if args.rate is not None else 200.0) * args.seconds)
    stop = stop_event_on_signals()
    rclpy.init(args=[NODE_NAME, *argv], signal_handler_options=SignalHandlerOptions.NO)
    node = Node(NODE_NAME)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    try:
        client = FloodClient(node, executor, args.node, args.clients, stop)
        if not client.spin_until(lambda: client.ready() and len(client.chunk_ns) >= 10 and
                                 client.diagnostics, 60.0):
            if stop.is_set():
                return 130
            print(f'oxygen_stress flood: {args.node} is not acting (no ~/ask, action server, '
                  f'chunks or /diagnostics within 60 s)', file=sys.stderr)
            return 1
        target_hz = float(client.diagnostics[-1][1]['control rate target (Hz)'])
        base_from = time.time_ns()
        client.spin_until(lambda: False, args.baseline)
        base_to = time.time_ns()
        print(f'oxygen_stress flood: asking {count} questions over {args.seconds:g} s ...',
              flush=True)
        tally = client.flood(Via(args.via), count, args.seconds, max_tokens=args.max_tokens,
                             reply_timeout_s=args.timeout, settle_s=args.settle)
        if stop.is_set():
            print('oxygen_stress flood: interrupted', file=sys.stderr)
            return 130
        # the window: the first question to --settle after the last reply (the test's window)
        end_ns = max(tally.last_reply_ns, tally.last_sent_ns) + round(args.settle * NS_PER_S)
        client.spin_until(lambda: max(client.chunk_ns) > end_ns, args.settle + 5.0)
        rate, _ = client.chunk_rate(tally.first_sent_ns, end_ns)
        base_rate, _ = client.chunk_rate(base_from, base_to)
        base_p99 = client.peak('cycle time p99 (ms)', base_from, base_to)
        peaks = {k: client.peak(k, tally.first_sent_ns, end_ns) for k in PEAK_KEYS}
        print(f'oxygen_stress flood {datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.node()}, '
              f'{args.via}, {count} questions over {args.seconds:g} s')
        print(f'before the flood: action chunks {base_rate:.2f} Hz over {args.baseline:g} s, '
              f'cycle time p99 {base_p99:g} ms')
        print(summary(tally, rate, target_hz, peaks, (end_ns - tally.first_sent_ns) / NS_PER_S))
        if args.json is not None:
            args.json.write_text(json.dumps({'tally': asdict(tally), 'chunk_rate_hz': rate,
                                             'baseline_chunk_rate_hz': base_rate,
                                             'target_hz': target_hz, 'peaks': peaks,
                                             'chunk_ns': client.chunk_ns,
                                             'diagnostics': client.diagnostics}, indent=1))
        ok = tally.lost == 0 and tally.extra_replies == 0 and rate >= args.min_rate * target_hz
        return 0 if ok else 1
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == '__main__':
    sys.exit(main())
