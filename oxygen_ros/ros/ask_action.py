"""
The ``~/ask`` action server (``oxygen_ros_interfaces/action/Ask``) of the ``oxygen`` node.

- **Goal** (goal callback): the question is queued in the engine there and then, or the goal
  is rejected at once (``accepted`` = false): empty question, ``max_tokens`` over
  ``decode_budget``, waiting queue full (``max_waiting_requests``, shared with the ``~/ask``
  topic and the periodic requests), node not configured. The ROS 2 action protocol carries no
  reason with a rejection: the reason is logged (WARN) and shown in ``/diagnostics`` (``last
  text rejection``). Queued before rclpy accepts the goal, the bound is exact.
- **Execution**: the goal is EXECUTING from acceptance (waiting, then decoding). Its execute
  coroutine awaits a future that the text group completes when the answer ends; each cycle
  that decoded a piece of it publishes feedback (the piece, and the text so far).
- **Cancel**: accepted while the answer is open; the request is aborted in the engine at once
  (``Engine.abort``: it leaves the queue, or its KV blocks are freed). The result is CANCELED
  with the text decoded until then.
- **Result**: the whole answer as a ``DecodedText`` plus a status and a reason (the request's
  ``FinishReason`` as ``outcomes.OUTCOMES`` says it); SUCCEEDED for EOS / LENGTH, CANCELED, or
  ABORTED when the node dropped it (engine failed or cleaned up).

The server lives as long as the node (not only while configured), so goals still open at
cleanup get their result.

**Exceptions.** rclpy runs these callbacks as executor tasks; an exception escaping one is
stored in its task and never shown (the node's executor does not re-raise it), and the goal
would wait forever: no response, no result. Every callback here catches it, logs it with its
traceback (ERROR, ``/diagnostics`` ``last text rejection``) and still answers: the goal is
rejected, or ends DROPPED with ``reason`` = ``internal error: ...``.
"""

from __future__ import annotations

import threading
import time
import traceback

from oxygen_ros.engine import FinishReason
from oxygen_ros.ros.endpoints import ASK_ACTION
from oxygen_ros.ros.outcomes import answered, OUTCOMES
from oxygen_ros.ros.text_requests import TextDone, TextJob, TextRequests
from oxygen_ros_interfaces.action import Ask
from oxygen_ros_interfaces.msg import DecodedText
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.action.server import ServerGoalHandle
from rclpy.callback_groups import CallbackGroup
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.task import Future

ACTION_NAME = ASK_ACTION.name
RESULT_TIMEOUT_S = 30.0
"""Seconds a finished goal (and its result) is kept. rclpy's default, 900 s, keeps every goal
of the last 15 minutes, and every status message lists them all: 18,000 goals at a sustained
20 questions/s, published on each goal's every transition and parsed by every client. Clients
take the result right after acceptance (``oxygen_ask``, ``ros2 action send_goal``)."""
_CANCEL_TRANSITION_S = 1.0
_SERVICE_QOS = QoSProfile(depth=200)
"""Goal, cancel and result services: deep enough for a burst of goals (default depth 10)."""


class _NextTurn:
    """Awaitable: yield once to the executor, woken so that the next turn comes at once."""

    def __init__(self, executor: object) -> None:
        self._executor = executor

    def __await__(self):
        self._executor.wake()
        yield


class AskAction:
    """
    The ``~/ask`` action server.

    :param node: the node that owns the server.
    :param texts: the node's text requests.
    :param callback_group: a ``ReentrantCallbackGroup`` (goals run concurrently).
    :param result_timeout_s: how long a finished goal's result is kept [s].
    :param name: the action's name (a robot's: ``endpoints.robot_topic``).
    """

    def __init__(self, node: Node, texts: TextRequests, callback_group: CallbackGroup, *,
                 result_timeout_s: float = RESULT_TIMEOUT_S, name: str = ACTION_NAME) -> None:
        self._node = node
        self._texts = texts
        self._lock = threading.Lock()
        self._open: dict[bytes, tuple[TextJob, Future]] = {}
        self._server = ActionServer(
            node, Ask, name, execute_callback=self._execute,
            goal_callback=self._on_goal, handle_accepted_callback=self._on_accepted,
            cancel_callback=self._on_cancel, callback_group=callback_group,
            goal_service_qos_profile=_SERVICE_QOS, result_service_qos_profile=_SERVICE_QOS,
            cancel_service_qos_profile=_SERVICE_QOS, result_timeout=result_timeout_s)

    # -- rclpy callbacks (executor threads) --------------------------------------------
    def _on_goal(self, goal: Ask.Goal) -> GoalResponse:
        try:
            reason = self._texts.ask_goal(goal, goal.question, goal.max_tokens or None,
                                          time.monotonic())
        except Exception as exc:  # noqa: B902 (rclpy would drop it silently: see the module)
            self._texts.record_error('the ~/ask goal callback', exc, traceback.format_exc())
            return GoalResponse.REJECT
        return GoalResponse.REJECT if reason is not None else GoalResponse.ACCEPT

    def _on_accepted(self, handle: ServerGoalHandle) -> None:
        future = Future(executor=self._node.executor)
        key = bytes(handle.goal_id.uuid)
        with self._lock:  # before its events can come (goal_accepted releases them)
            self._open[key] = (None, future)
        try:
            job = self._texts.goal_accepted(handle)
        except Exception as exc:  # noqa: B902 (the goal must still end: DROPPED)
            future.set_result((FinishReason.DROPPED, self._internal_error(
                'the ~/ask accepted callback', exc)))
        else:
            with self._lock:
                self._open[key] = (job, future)
        handle.execute()

    async def _execute(self, handle: ServerGoalHandle) -> Ask.Result:
        try:
            with self._lock:
                _, future = self._open[bytes(handle.goal_id.uuid)]
            reason, result = await future
        except Exception as exc:  # noqa: B902 (rclpy would return an empty result)
            reason, result = FinishReason.DROPPED, self._internal_error(
                'the ~/ask execute callback', exc)
        with self._lock:
            self._open.pop(bytes(handle.goal_id.uuid), None)
        if reason is FinishReason.ABORT:
            await self._cancel_transition(handle)
        if not handle.is_active:
            pass  # (ended elsewhere; rclpy sends the result all the same)
        elif reason is FinishReason.ABORT and handle.is_cancel_requested:
            handle.canceled()
        elif answered(reason):
            handle.succeed()
        else:
            handle.abort()
        return result

    def _internal_error(self, where: str, exc: Exception) -> Ask.Result:
        """Log an exception caught in ``where``; return the DROPPED result that says so."""
        self._texts.record_error(where, exc, traceback.format_exc())
        return Ask.Result(answer=DecodedText(task=DecodedText.TASK_ANSWER, is_final=True),
                          status=Ask.Result.STATUS_DROPPED,
                          reason=f'internal error in {where}: {type(exc).__name__}: {exc}')

    async def _cancel_transition(self, handle: ServerGoalHandle) -> None:
        """
        Wait until rclpy has moved a goal whose cancel we accepted to CANCELING.

        rclpy makes that transition after the cancel callback returns, in the cancel
        request's task; the abort started in the callback can end the request first. Ending
        the goal before the transition would abort it and lose the cancel response.
        """
        deadline = time.monotonic() + _CANCEL_TRANSITION_S
        while not handle.is_cancel_requested and time.monotonic() < deadline:
            await _NextTurn(self._node.executor)

    def _on_cancel(self, handle: ServerGoalHandle) -> CancelResponse:
        try:
            with self._lock:
                entry = self._open.get(bytes(handle.goal_id.uuid))
            if entry is None or entry[0] is None or not self._texts.cancel(entry[0].req_id):
                return CancelResponse.REJECT  # already ending: its result is on its way
        except Exception as exc:  # noqa: B902 (the cancel request must still be answered)
            self._texts.record_error('the ~/ask cancel callback', exc, traceback.format_exc())
            return CancelResponse.REJECT
        return CancelResponse.ACCEPT

    # -- text group ---------------------------------------------------------------------
    def feedback(self, job: TextJob, piece: DecodedText, text_so_far: str) -> None:
        """Send a piece of the answer to the goal's client (ignored once the goal ended)."""
        handle = job.goal
        if handle is not None and handle.is_active:
            handle.publish_feedback(Ask.Feedback(piece=piece, text_so_far=text_so_far))

    def finish(self, done: TextDone, answer: DecodedText | None) -> None:
        """
        Complete the goal of ``done.job`` with its result (the execute coroutine resumes).

        :param answer: None when building it failed (``done`` is then an internal error):
            the result carries an empty answer.
        """
        handle = done.job.goal
        if handle is None:
            return
        with self._lock:
            entry = self._open.get(bytes(handle.goal_id.uuid))
        if entry is None or entry[1].done():
            return
        if answer is None:
            answer = DecodedText(request_id=done.job.req_id, task=DecodedText.TASK_ANSWER,
                                 is_final=True)
        result = Ask.Result(answer=answer, status=OUTCOMES[done.finish_reason].status,
                            reason=done.reason)
        entry[1].set_result((done.finish_reason, result))
        self._node.executor.wake()  # resume the execute coroutine now


__all__ = ['ACTION_NAME', 'AskAction', 'RESULT_TIMEOUT_S']
