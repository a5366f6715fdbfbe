"""
``oxygen_ask``: ask the oxygen node a question and print the answer as it streams.

Usage::

    oxygen_ask "what is on the table?" [--node /oxygen] [--max-tokens N] [--timeout S]
               [--ros-args --enclave /oxygen_ros/operator ...]

Sends a goal to the node's ``~/ask`` action (``oxygen_ros_interfaces/action/Ask``) and writes
each piece of the answer to stdout as its feedback arrives (the pieces concatenate to the
answer; whatever feedback was missed is completed from the result), then one summary line to
stderr: request id, tokens, how it ended, time to the first piece and pieces received.
Ctrl-C cancels the goal (the node frees its KV blocks at once) and prints what was decoded.

With DDS security (docs/security.md) it runs in the operator's enclave
(``--ros-args --enclave /oxygen_ros/operator``) and refuses to start, with the reason, where
the security settings would not hold (``ros.security``), as the node does.

Exits 0 when the answer is complete (EOS or token budget); 1 when there is no server, the goal
was rejected (the reason the node published on ``/diagnostics`` is printed when one arrives),
the node dropped it, or security would not hold; 130 after Ctrl-C.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
import sys
import threading
import time
from typing import Sequence, TextIO

from action_msgs.msg import GoalStatus
from diagnostic_msgs.msg import DiagnosticArray
from oxygen_ros.ros.diagnostics import STATUS_NAME, status_values
from oxygen_ros.ros.outcomes import OUTCOME_NAMES
from oxygen_ros.ros.security import OPERATOR_ENCLAVE
from oxygen_ros.signals import stop_event_on_signals
from oxygen_ros.tools.common.secure_node import start_node
from oxygen_ros_interfaces.action import Ask
import rclpy
from rclpy.action import ActionClient
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.task import Future
from rclpy.utilities import remove_ros_args

NODE_NAME = 'oxygen_ask'
_REJECTION_WAIT_S = 2.0


@dataclass(slots=True)
class AnswerPrinter:
    """Writes the pieces of one answer as they come, and the rest from the result."""

    out: TextIO
    sent_s: float = field(default_factory=time.monotonic)
    printed: str = ''
    num_pieces: int = 0
    first_piece_s: float | None = None

    def on_feedback(self, msg: object) -> None:
        piece = msg.feedback.piece
        if self.first_piece_s is None:
            self.first_piece_s = time.monotonic() - self.sent_s
        self.num_pieces += 1
        text = msg.feedback.text_so_far
        new = text[len(self.printed):] if text.startswith(self.printed) else piece.text
        self.out.write(new)
        self.out.flush()
        self.printed += new

    def finish(self, answer_text: str) -> None:
        """Print what the feedback did not bring (a lost or late final piece), then a newline."""
        if answer_text.startswith(self.printed):
            self.out.write(answer_text[len(self.printed):])
        self.out.write('\n')
        self.out.flush()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='oxygen_ask', description=__doc__.split('\n\n')[0])
    parser.add_argument('question', help='the question (quote it)')
    parser.add_argument('--node', default='/oxygen', help='the oxygen node (default /oxygen)')
    parser.add_argument('--max-tokens', type=int, default=0, metavar='N',
                        help="token budget of the answer (default: the node's decode_budget)")
    parser.add_argument('--timeout', type=float, default=60.0, metavar='S',
                        help='give up (and cancel) after S seconds (default 60)')
    return parser


def _spin_until(executor: SingleThreadedExecutor, done: object, stop: threading.Event,
                deadline: float) -> bool:
    """Spin until ``done()``; False on stop or deadline."""
    while not done():
        if stop.is_set() or time.monotonic() >= deadline:
            return False
        executor.spin_once(timeout_sec=0.05)
    return True


def _rejection_reason(node: Node, executor: SingleThreadedExecutor, since_ns: int) -> str:
    """Return the ``last text rejection`` the node reports after ``since_ns``, if any comes."""
    reasons: list[str] = []

    def on_status(msg: DiagnosticArray, info: dict) -> None:
        if info['received_timestamp'] < since_ns:
            return
        for status in msg.status:
            if status.name == STATUS_NAME:
                reasons.append(status_values(status).get('last text rejection', ''))

    sub = node.create_subscription(DiagnosticArray, '/diagnostics', on_status, 10)
    deadline = time.monotonic() + _REJECTION_WAIT_S
    while not reasons and time.monotonic() < deadline:
        executor.spin_once(timeout_sec=0.05)
    node.destroy_subscription(sub)
    return reasons[-1] if reasons else ''


def ask(node: Node, executor: SingleThreadedExecutor, args: argparse.Namespace,
        stop: threading.Event, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Ask one question; return the exit status (see the module docstring)."""
    action = f'{args.node.rstrip("/")}/ask'
    client = ActionClient(node, Ask, action)
    deadline = time.monotonic() + args.timeout
    if not _spin_until(executor, client.server_is_ready, stop, min(deadline,
                                                                   time.monotonic() + 10.0)):
        print(f'oxygen_ask: no action server at {action} (is oxygen_node running and '
              f'configured?)', file=err)
        return 1
    printer = AnswerPrinter(out)
    sent_ns = time.time_ns()
    sent: Future = client.send_goal_async(
        Ask.Goal(question=args.question, max_tokens=args.max_tokens),
        feedback_callback=printer.on_feedback)
    if not _spin_until(executor, sent.done, stop, deadline):
        print('oxygen_ask: the goal was not answered', file=err)
        return 1
    handle = sent.result()
    if not handle.accepted:
        reason = _rejection_reason(node, executor, sent_ns)
        print(f'oxygen_ask: rejected{": " + reason if reason else ""}', file=err)
        return 1
    result: Future = handle.get_result_async()
    interrupted = not _spin_until(executor, result.done, stop, deadline)
    if interrupted:
        handle.cancel_goal_async()
        _spin_until(executor, result.done, threading.Event(), time.monotonic() + 5.0)
    if not result.done():
        print('\noxygen_ask: no result', file=err)
        return 1
    res = result.result()
    answer = res.result.answer
    printer.finish(answer.text)
    first = f'{printer.first_piece_s:.2f} s' if printer.first_piece_s is not None else '-'
    reason = f' ({res.result.reason})' if res.result.reason else ''
    print(f'[{answer.request_id}: {answer.num_tokens} tokens, '
          f'{OUTCOME_NAMES.get(res.result.status, res.result.status)}{reason}; first piece '
          f'after {first}, {printer.num_pieces} pieces, '
          f'{time.monotonic() - printer.sent_s:.2f} s]', file=err)
    if interrupted:
        return 130 if stop.is_set() else 1
    return 0 if res.status == GoalStatus.STATUS_SUCCEEDED else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_ask``; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(remove_ros_args([NODE_NAME, *argv])[1:])
    stop = stop_event_on_signals()
    node = start_node('oxygen_ask', NODE_NAME, argv, OPERATOR_ENCLAVE)
    if node is None:
        return 1
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    try:
        return ask(node, executor, args, stop)
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == '__main__':
    sys.exit(main())
