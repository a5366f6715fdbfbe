"""An rclpy node that watches the oxygen node's outputs and asks it questions."""

from __future__ import annotations

from dataclasses import dataclass, field
import time
from typing import Sequence

from action_msgs.msg import GoalStatus
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.msg import State
from lifecycle_msgs.srv import GetState
import numpy as np
from oxygen_ros.engine import TextTask
from oxygen_ros.ros.diagnostics import status_values
from oxygen_ros.ros.endpoints import (
    ACTION_CHUNK, ASK_ACTION, ASK_TOPIC, DIAGNOSTICS, GET_STATE, NODE_NAME, text_endpoints)
from oxygen_ros.ros.outcomes import OUTCOME_NAMES
from oxygen_ros.ros.stamps import stamp_to_ns
from oxygen_ros.ros.text_stream import TEXT_QOS
from oxygen_ros.tools.common.children import Child
from oxygen_ros.tools.common.text_timing import AskTiming, TextTiming
from oxygen_ros.tools.keystore.names import NodeNames
from oxygen_ros_interfaces.action import Ask
from oxygen_ros_interfaces.msg import DecodedText
import rclpy
from rclpy.action import ActionClient
from rclpy.executors import SingleThreadedExecutor
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

_NAMES = NodeNames(NODE_NAME)
"""The node with its default name, in the root namespace."""
_TEXTS = {task: text_endpoints(task) for task in (TextTask.SUBTASK, TextTask.ANSWER,
                                                  TextTask.MEMORY)}
OUTPUTS = tuple(_NAMES.resolve(ep.name) for ep in (
    ACTION_CHUNK, *(whole for whole, _ in _TEXTS.values()), DIAGNOSTICS))
"""The node's action chunks, whole texts (subtask, answer, memory) and ``/diagnostics``."""
STREAMS = tuple(_NAMES.resolve(stream.name) for _, stream in _TEXTS.values())
"""The node's streamed texts (subtask, answer, memory)."""
GET_STATE_SERVICE = _NAMES.resolve(GET_STATE.name)
ASK_ACTION_NAME = _NAMES.resolve(ASK_ACTION.name)
_START_TIMEOUT_S = 120.0


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
        self._get_state = self.node.create_client(GetState, GET_STATE_SERVICE)
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
        self.ask_client = ActionClient(self.node, Ask, ASK_ACTION_NAME)
        if ask_topic:
            self.ask_pub = self.node.create_publisher(
                String, _NAMES.resolve(ASK_TOPIC.name), TEXT_QOS)

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
