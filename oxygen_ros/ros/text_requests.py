"""
The node's text requests: questions, periodic subtask and memory requests, and their events.

Threads: ``ask_topic`` / ``reserve`` / ``enqueue`` / ``cancel`` run in subscription and action
callbacks (any thread); ``apply_cancels``, ``submit`` and ``finish`` in the control cycle, the
only thread touching the engine; ``take`` in the text callback group, which detokenizes and
publishes. All state is behind one lock held for O(1) work: refusing a question never waits
for a control cycle.

**One bounded question queue** holds the questions of the ``~/ask`` topic and of the ``~/ask``
action that have not reached the engine yet; the control cycle hands all of them to the
engine. ``max_queued_questions`` bounds the questions *waiting*: those in this queue, the slots
held by goals being accepted, and those handed to the engine that have not decoded a token yet
(still in the engine's pending line, waiting for KV space or a decode slot). Counting the
engine's line too makes a flood refused at arrival ("queue full") instead of accepted and then
dropped a cycle later by the engine (``EngineBusyError`` at ``max_pending_requests``) or after
``max_wait_cycles``. Every question gets exactly one reply (``TextDone``): the
answer (EOS or LENGTH), or a reason: refused at once when it arrives (queue full, empty
question, one over ``MAX_QUESTION_BYTES``, budget over ``decode_budget``; the action rejects
such goals instead), dropped later
(engine busy, not admitted in time, bad prompt, engine shut down), or cancelled (action).

A periodic SUBTASK or MEMORY request is only submitted in a cycle with a valid observation,
and not while the previous one of its kind is still open.

The control cycle never calls the rclpy logger (``deferred_log``): ``take`` writes its lines.
"""

from __future__ import annotations

from collections import deque
import itertools
import threading
import time
from typing import Callable, Iterable

from oxygen_ros.engine.config import StepOutput, TextOutput
from oxygen_ros.engine.engine import Engine, EngineBusyError
from oxygen_ros.model.prompt import TextTask
from oxygen_ros.ros.deferred_log import DeferredLog, LogLevel
from oxygen_ros.ros.diagnostics import EngineDiagnostics
from oxygen_ros.ros.input_limits import question_refusal
from oxygen_ros.ros.text_events import (  # re-exported: the events are part of this API
    NO_ANSWER, Origin, TextDone, TextEvent, TextJob, TextPiece, TextStatus)
from oxygen_ros.sched.request import FinishReason
from rclpy.impl.rcutils_logger import RcutilsLogger

INFO = LogLevel.INFO
REFUSAL_LOG_PERIOD_S = 1.0
"""At most one 'question refused' log line per this period (each is counted in /diagnostics)."""
RESERVATION_TIMEOUT_S = 5.0
"""A goal's question slot (``reserve``) is released if its goal is not enqueued within this
time: rclpy calls the goal callback, then may fail to create the goal handle or to send the
response (client gone) and never calls the accepted callback; the slot would leak for good."""


class TextRequests:
    """
    Bookkeeping between ``~/ask`` (topic and action), the engine and the text publishers.

    :param logger: where requests and refusals are logged (the node's logger).
    :param diagnostics: counts refused and dropped requests.
    :param notify: called (any thread) when events wait in ``take`` (the text guard condition).
    :param clock: monotonic seconds (goal slots held longer than ``RESERVATION_TIMEOUT_S``
        without their goal are released).
    """

    def __init__(self, logger: RcutilsLogger, diagnostics: EngineDiagnostics,
                 notify: Callable[[], None], clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self._clock = clock
        self._log = logger
        self._diag = diagnostics
        self._notify = notify
        self._lock = threading.Lock()
        self._queue: deque[TextJob] = deque()
        self._reserved: deque[float] = deque()
        """When each goal slot was held (clock seconds), oldest first."""
        self._jobs: dict[str, TextJob] = {}
        """Open requests: queued here or in the engine."""
        self._handed: set[str] = set()
        """Questions handed to the engine that have not decoded a token yet."""
        self._to_abort: set[str] = set()
        self._outbox: deque[TextEvent] = deque()
        self._deferred = DeferredLog(logger)
        """The control cycle's log lines; ``take`` writes them."""
        self._counters = {task: itertools.count() for task in TextTask}
        self._refusal_logged_s = -float('inf')
        self._unlogged_refusals = 0
        self._next_due: dict[TextTask, float] = {}
        self.max_queued_questions = 16
        self.max_tokens = 0
        """The node's ``decode_budget`` (0: no engine configured, questions are refused)."""

    # -- questions (any thread) ---------------------------------------------------------
    def _refusal(self, question: str, max_tokens: int | None) -> str | None:
        if not question.strip():
            return 'empty question'
        too_long = question_refusal(question)
        if too_long is not None:
            return too_long
        if self.max_tokens <= 0:
            return 'the node is not configured'
        if max_tokens is not None and not 1 <= max_tokens <= self.max_tokens:
            return f'max_tokens {max_tokens} outside [1, {self.max_tokens}] (decode_budget)'
        queued = self._num_waiting()
        if queued >= self.max_queued_questions:
            return f'queue full ({queued} questions waiting, max_queued_questions ' \
                   f'{self.max_queued_questions})'
        return None

    def reserve(self, question: str, max_tokens: int | None) -> str | None:
        """
        Hold a queue slot for a question that ``enqueue`` will bring (an action goal).

        :returns: None if the slot is held, else the reason the question is refused.
        """
        with self._lock:
            reason = self._refusal(question, max_tokens)
            if reason is None:
                self._reserved.append(self._clock())
                self._waiting_changed()
        if reason is not None:
            self._refused(reason)
        return reason

    def enqueue(self, question: str, max_tokens: int | None, arrival_s: float, *,
                goal: object) -> TextJob:
        """Queue the question of an accepted goal into the slot ``reserve`` held."""
        job = TextJob(self._new_id(TextTask.ANSWER), TextTask.ANSWER, Origin.ACTION, arrival_s,
                      question, max_tokens, goal)
        with self._lock:
            if self._reserved:
                self._reserved.popleft()
            self._queue.append(job)
            self._jobs[job.req_id] = job
            self._waiting_changed()
        return job

    def ask_topic(self, question: str, arrival_s: float) -> TextJob:
        """
        Queue a ``~/ask`` String question, or refuse it at once (its reply is queued).

        :returns: the job (its id names it in the logs and on ``~/answer/stream``).
        """
        job = TextJob(self._new_id(TextTask.ANSWER), TextTask.ANSWER, Origin.TOPIC, arrival_s,
                      question)
        with self._lock:
            reason = self._refusal(question, None)
            if reason is None:
                self._queue.append(job)
                self._jobs[job.req_id] = job
                self._waiting_changed()
            else:
                self._outbox.append(TextDone(job, TextStatus.REFUSED, reason=reason))
        if reason is not None:
            self._refused(reason)
            self._notify()
        return job

    def cancel(self, req_id: str) -> bool:
        """
        Cancel an open request: at once if still queued, else in the next engine access.

        :returns: whether the request was open.
        """
        with self._lock:
            job = self._jobs.get(req_id)
            if job is None:
                return False
            if job in self._queue:
                self._queue.remove(job)
                self._pop_job(req_id)
                self._outbox.append(TextDone(job, TextStatus.CANCELED, reason='cancelled'))
            else:
                self._to_abort.add(req_id)
                return True
        self._notify()
        return True

    def _num_waiting(self) -> int:
        """Return questions queued, slots held, and handed over but not decoding (lock held)."""
        now = self._clock()
        while self._reserved and now - self._reserved[0] > RESERVATION_TIMEOUT_S:
            self._reserved.popleft()  # the goal never came: rclpy failed to accept it
            self._deferred.later(LogLevel.WARNING, 'released a question slot held '
                                 f'{RESERVATION_TIMEOUT_S:g} s for a goal that never came (rclpy '
                                 'could not accept it or send its response)')
        return len(self._queue) + len(self._reserved) + len(self._handed)

    def _waiting_changed(self) -> None:
        """Show the waiting questions and open requests in ``/diagnostics`` (lock held)."""
        self._diag.record_questions(self._num_waiting(), len(self._jobs) + len(self._reserved))

    def _pop_job(self, req_id: str) -> TextJob | None:
        """Forget an open request (lock held); return it, or None if it was not open."""
        job = self._jobs.pop(req_id, None)
        if job is not None:
            self._handed.discard(req_id)
            self._waiting_changed()
        return job

    def record_error(self, where: str, exc: BaseException, trace: str) -> None:
        """Log an exception a callback caught (ERROR, traceback); show it in ``/diagnostics``."""
        self._diag.record_text_rejected(f'internal error in {where}: {type(exc).__name__}: '
                                        f'{exc}')
        self._log.error(f'internal error in {where} (the request still gets its reply):\n'
                        f'{trace}')

    def _refused(self, reason: str) -> None:
        """
        Count a refusal; log one line a second at most, with how many it stands for.

        Throttled here, before the rclpy logger: its own throttle runs after it inspected the
        caller (about 0.3 ms), which made each refusal of a flood cost that much.
        """
        self._diag.record_text_rejected(f'question refused: {reason}')
        now = self._clock()
        with self._lock:
            self._unlogged_refusals += 1
            if now - self._refusal_logged_s < REFUSAL_LOG_PERIOD_S:
                return
            self._refusal_logged_s, more = now, self._unlogged_refusals - 1
            self._unlogged_refusals = 0
        self._log.warning(f'question refused: {reason}' + (
            f' ({more} more refused since the last such line)' if more else ''))

    def _new_id(self, task: TextTask) -> str:
        return f'{task.value}-{next(self._counters[task])}'

    # -- control cycle ------------------------------------------------------------------
    def apply_cancels(self, engine: Engine) -> None:
        """Abort cancelled requests in the engine, freeing their KV blocks (engine thread)."""
        with self._lock:
            aborts, self._to_abort = self._to_abort, set()
        done = []
        for req_id in aborts:
            existed = engine.abort(req_id)
            with self._lock:
                job = self._pop_job(req_id) if existed else None
            if job is not None:
                self._deferred.later(INFO, f'{req_id} cancelled: KV blocks freed')
                done.append(TextDone(job, TextStatus.CANCELED, reason='cancelled'))
        self._emit(done)

    def start(self, now: float) -> None:
        """Make the periodic requests due at ``now`` (monotonic seconds; at activation)."""
        self._next_due = {TextTask.SUBTASK: now, TextTask.MEMORY: now}

    def submit(self, engine: Engine, now: float, subtask_period: float, memory_period: float,
               valid_observation: bool) -> None:
        """
        Hand queued questions and due periodic requests to the engine (control thread).

        :param now: monotonic seconds.
        :param subtask_period: seconds between SUBTASK requests, 0 = never.
        :param memory_period: seconds between MEMORY requests, 0 = never.
        :param valid_observation: this cycle has one (periodic requests wait for it).
        """
        with self._lock:
            questions = list(self._queue)
            self._queue.clear()
            self._handed.update(job.req_id for job in questions)  # still waiting, counted
        dropped = []
        for job in questions:
            try:
                engine.submit_text(TextTask.ANSWER, question=job.question,
                                   max_tokens=job.max_tokens, req_id=job.req_id)
            except (EngineBusyError, ValueError) as exc:
                dropped.append(self._dropped(job, f'engine busy: {exc}'
                                             if isinstance(exc, EngineBusyError) else str(exc)))
                continue
            self._deferred.later(INFO, f'question {job.req_id} ({job.origin.value}): '
                                 f'{job.question!r}')
        self._emit(dropped)
        if questions and not dropped:
            self._notify()  # their log lines
        if not valid_observation:
            return
        for task, period in ((TextTask.SUBTASK, subtask_period),
                             (TextTask.MEMORY, memory_period)):
            if period <= 0 or now < self._next_due.get(task, now) or self._open(task):
                continue
            self._next_due[task] = now + period
            job = TextJob(self._new_id(task), task, Origin.PERIODIC, now)
            try:
                engine.submit_text(task, req_id=job.req_id)
            except EngineBusyError as exc:
                self._diag.record_text_rejected(f'{task.value} request refused: {exc}')
                self._deferred.later(LogLevel.WARNING, f'{task.value} request refused: {exc}')
                continue
            with self._lock:
                self._jobs[job.req_id] = job

    def _open(self, task: TextTask) -> bool:
        with self._lock:
            return any(j.task is task and j.origin is Origin.PERIODIC
                       for j in self._jobs.values())

    def finish(self, out: StepOutput) -> None:
        """Turn a cycle's decoded tokens and finished requests into events (control thread)."""
        with self._lock:
            events: list[TextEvent] = [
                TextPiece(self._jobs[d.req_id], d.token_ids, d.num_tokens, d.frame_stamp_ns,
                          d.finished)
                for d in out.text_deltas if d.req_id in self._jobs]
            if self._handed:
                self._handed.difference_update(d.req_id for d in out.text_deltas)
                self._waiting_changed()
        for text in out.texts:
            done = self._done(text)
            if done is not None:
                events.append(done)
        self._emit(events)

    def _done(self, out: TextOutput) -> TextDone | None:
        with self._lock:
            job = self._pop_job(out.req_id)
        if job is None:
            return None  # not ours (the engine's warm-up)
        if out.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) and not out.error:
            status = TextStatus.EOS if out.finish_reason is FinishReason.STOP \
                else TextStatus.LENGTH
            self._deferred.later(INFO, f'{job.task.value} {job.req_id} ({out.num_cycles} '
                                 f'cycles, {status.value}): {out.text!r}')
            return TextDone(job, status, out.text, len(out.token_ids), out.frame_stamp_ns)
        return self._dropped(job, out.error or 'request aborted', len(out.token_ids),
                             out.frame_stamp_ns)

    def _dropped(self, job: TextJob, reason: str, num_tokens: int = 0,
                 frame_stamp_ns: int = 0) -> TextDone:
        with self._lock:
            self._pop_job(job.req_id)
        self._diag.record_text_rejected(f'{job.req_id}: {reason}')
        self._deferred.later(LogLevel.THROTTLED_WARNING,
                             f'{job.task.value} {job.req_id}: no text: {reason}')
        return TextDone(job, TextStatus.DROPPED, num_tokens=num_tokens,
                        frame_stamp_ns=frame_stamp_ns, reason=reason)

    def drop_all(self, outputs: Iterable[TextOutput], reason: str) -> None:
        """
        End every open request (the engine was shut down; ``outputs`` are its last words).

        Requests still queued here end too, so every action goal gets its result.
        """
        events = [d for d in (self._done(out) for out in outputs) if d is not None]
        with self._lock:
            left = list(self._jobs.values())
            self._queue.clear()
            self._to_abort.clear()
            self._handed.clear()
            self._waiting_changed()
        events += [self._dropped(job, reason) for job in left]
        self._emit(events)
        self._deferred.write()  # the text group may not run again (shutdown)

    def _emit(self, events: list[TextEvent]) -> None:
        if events:
            with self._lock:
                self._outbox.extend(events)
            self._notify()

    # -- text group ---------------------------------------------------------------------
    def take(self) -> list[TextEvent]:
        """Return the events to publish, in order, after writing the queued logs (text group)."""
        self._deferred.write()
        with self._lock:
            events = list(self._outbox)
            self._outbox.clear()
        return events

    @property
    def live(self) -> dict[str, TextTask]:
        """Return ``req_id -> task`` of the open requests (queued here or in the engine)."""
        with self._lock:
            return {req_id: job.task for req_id, job in self._jobs.items()}

    @property
    def num_queued(self) -> int:
        """Return questions waiting for the engine (slots held by goals included)."""
        with self._lock:
            return len(self._queue) + len(self._reserved)

    @property
    def num_waiting(self) -> int:
        """Return questions waiting to decode (``num_queued`` + handed over, not decoding)."""
        with self._lock:
            return self._num_waiting()


__all__ = ['NO_ANSWER', 'Origin', 'TextDone', 'TextEvent', 'TextJob', 'TextPiece',
           'TextRequests', 'TextStatus']
