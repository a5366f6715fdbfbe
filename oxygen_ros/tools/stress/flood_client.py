"""
The ``oxygen_stress flood`` client: asks the node's ``~/ask`` and collects what comes back.

``FloodClient`` sends questions on a schedule (``Phase``: a count spread over some seconds,
phases back to back) as ``std_msgs/String`` on ``~/ask``, as goals of the ``~/ask`` action
through independent action clients, or alternating both; it keeps every reply, the DDS receive
time of every action chunk and the node's ``/diagnostics``, and tallies them exactly
(``FloodTally``). ``test/ros/test_node_flood.py`` floods with it too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
import enum
import re
import threading
import time
from typing import Sequence

from action_msgs.msg import GoalStatus
from diagnostic_msgs.msg import DiagnosticArray
from oxygen_ros.ros.diagnostics import STATUS_NAME, status_values
from oxygen_ros.ros.outcomes import NO_ANSWER, OUTCOME_NAMES
from oxygen_ros.units import NS_PER_S
from oxygen_ros_interfaces.action import Ask
from rclpy.action import ActionClient
from rclpy.executors import Executor
from rclpy.node import Node
from rclpy.qos import QoSProfile
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

DEEP = QoSProfile(depth=1000)
"""Reliable, keep last 1000: no reply, goal response or result of a flood is overwritten
before this process takes it (the services' default depth 10 would lose some)."""


class Via(enum.Enum):
    """How the flood asks."""

    TOPIC = 'topic'
    ACTION = 'action'
    BOTH = 'both'
    """Alternating: even questions on the topic, odd ones as goals."""


@dataclass(frozen=True, slots=True)
class Phase:
    """``count`` questions spread evenly over ``seconds`` (all at once when 0)."""

    count: int
    seconds: float

    @classmethod
    def parse(cls, text: str) -> Phase:
        """
        Read ``COUNT:SECONDS`` (``'100:1'``: 100 questions in 1 s).

        :raises ValueError: not two numbers, a negative count or time.
        """
        count, sep, seconds = text.partition(':')
        phase = cls(int(count), float(seconds)) if sep else None
        if phase is None or phase.count < 0 or not phase.seconds >= 0:
            raise ValueError(f'a phase is COUNT:SECONDS with COUNT, SECONDS >= 0, got {text!r}')
        return phase


def send_offsets(phases: Sequence[Phase]) -> list[float]:
    """
    Return when each question goes (seconds after the first), phase after phase.

    Question ``i`` of a phase goes ``i * seconds / count`` after the phase starts; the next
    phase starts ``seconds`` after it (``[Phase(100, 1), Phase(50, 10)]``: 100 in the first
    second, then one every 0.2 s for 10 s).
    """
    offsets: list[float] = []
    start = 0.0
    for phase in phases:
        offsets += [start + i * phase.seconds / phase.count for i in range(phase.count)]
        start += phase.seconds
    return offsets


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
        self.chunk_topic = f'{target}/action_chunk'
        self.ask_pub = node.create_publisher(String, f'{target}/ask', DEEP)
        self.replies: list[tuple[int, str]] = []
        self.chunk_ns: list[int] = []
        self.diagnostics: list[tuple[int, dict[str, str]]] = []
        node.create_subscription(String, f'{target}/answer', self._on_reply, DEEP)
        node.create_subscription(JointTrajectory, self.chunk_topic, self._on_chunk, DEEP)
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

    def num_nodes(self) -> int:
        """
        Return how many nodes publish the target's action chunks (1 when alone).

        More than one: another node of that name shares this ROS domain (on a shared machine
        another run drew the same random domain); its chunks and replies would count here.
        """
        return self.node.count_publishers(self.chunk_topic)

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

    def flood(self, via: Via, count: int, seconds: float, **kwargs: float) -> FloodTally:
        """Ask ``count`` questions evenly over ``seconds`` (``flood_phases`` of one phase)."""
        return self.flood_phases(via, [Phase(count, seconds)], **kwargs)

    def flood_phases(self, via: Via, phases: Sequence[Phase], *, max_tokens: int = 0,
                     reply_timeout_s: float = 60.0, settle_s: float = 1.0) -> FloodTally:
        """
        Ask questions at ``send_offsets(phases)``; wait for every reply; tally them.

        Waits until each String question has a reply and each goal a response and (accepted)
        a result, or ``reply_timeout_s`` after the last one is sent, then ``settle_s`` more (a
        duplicate reply would arrive then).

        :param max_tokens: each goal's token budget (0: the node's ``decode_budget``).
        """
        first_reply, first_goal = len(self.replies), len(self.goals)
        tally = FloodTally(first_sent_ns=time.time_ns())
        start = time.monotonic()
        for i, offset in enumerate(send_offsets(phases)):
            if self.stop.is_set():
                break
            due = start + offset
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


__all__ = ['DEEP', 'FloodClient', 'FloodTally', 'Phase', 'Via', 'reason_kind', 'send_offsets']
