"""
The node's text requests: questions, periodic subtask and memory requests, and their events.

Threads: ``ask_topic`` / ``reserve`` / ``enqueue`` / ``cancel`` run in subscription and action
callbacks (any thread); ``apply_cancels``, ``submit`` and ``finish`` in the control cycle, the
only thread touching the engine; ``take`` in the text callback group, which detokenizes and
publishes. All state is behind one lock held for O(1) work: refusing a question never waits
for a control cycle.

**One bounded question queue** holds the questions of the ``~/ask`` topic and of the ``~/ask``
action that have not reached the engine yet (``max_queued_questions``); the control cycle
hands all of them to the engine. Every question gets exactly one reply (``TextDone``): the
answer (EOS or LENGTH), or a reason: refused at once when it arrives (queue full, empty
question, budget over ``decode_budget``; the action rejects such goals instead), dropped later
(engine busy, not admitted in time, bad prompt, engine shut down), or cancelled (action).

A periodic SUBTASK or MEMORY request is only submitted in a cycle with a valid observation,
and not while the previous one of its kind is still open.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
import enum
import itertools
import threading
from typing import Callable, Iterable

from oxygen_ros.engine.config import StepOutput, TextOutput
from oxygen_ros.engine.engine import Engine, EngineBusyError
from oxygen_ros.model.prompt import TextTask
from oxygen_ros.ros.diagnostics import EngineDiagnostics
from oxygen_ros.sched.request import FinishReason
from rclpy.impl.rcutils_logger import RcutilsLogger

NO_ANSWER = 'no answer: '
"""Prefix of the ``~/answer`` text for a question that could not be answered."""


class Origin(enum.Enum):
    """Where a text request came from."""

    TOPIC = 'topic'
    """A ``std_msgs/String`` on ``~/ask`` (answered on ``~/answer``)."""
    ACTION = 'action'
    """A goal of the ``~/ask`` action (answered by its result)."""
    PERIODIC = 'periodic'
    """The node's own SUBTASK / MEMORY timer."""


class TextStatus(enum.Enum):
    """How a text request ended."""

    EOS = 'eos'
    LENGTH = 'length'
    CANCELED = 'canceled'
    DROPPED = 'dropped'
    """Taken, then not answered (the reason says why)."""
    REFUSED = 'refused'
    """Refused on arrival (the reason says why)."""


@dataclass(slots=True, eq=False)
class TextJob:
    """
    One text request of the node, from arrival to its ``TextDone``.

    :ivar arrival_s: monotonic seconds when the request arrived (time_from_request counts
        from here).
    :ivar max_tokens: budget; None = the node's ``decode_budget``.
    :ivar goal: the action's goal handle (``Origin.ACTION``), opaque here.
    """

    req_id: str
    task: TextTask
    origin: Origin
    arrival_s: float
    question: str | None = None
    max_tokens: int | None = None
    goal: object | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class TextPiece:
    """The tokens a request decoded in one cycle (the text group detokenizes them)."""

    job: TextJob
    token_ids: tuple[int, ...]
    num_tokens: int
    frame_stamp_ns: int
    final: bool


@dataclass(frozen=True, slots=True)
class TextDone:
    """
    The end of a request: its whole text, or why there is none.

    :ivar text: the engine's decoded text (EOS, LENGTH); ``''`` otherwise (a cancelled
        request's partial text is what its pieces said).
    :ivar frame_stamp_ns: 0 if it never read a frame.
    """

    job: TextJob
    status: TextStatus
    text: str = ''
    num_tokens: int = 0
    frame_stamp_ns: int = 0
    reason: str = ''


TextEvent = TextPiece | TextDone


class TextRequests:
    """
    Bookkeeping between ``~/ask`` (topic and action), the engine and the text publishers.

    :param logger: where requests and refusals are logged (the node's logger).
    :param diagnostics: counts refused and dropped requests.
    :param notify: called (any thread) when events wait in ``take`` (the text guard condition).
    """

    def __init__(self, logger: RcutilsLogger, diagnostics: EngineDiagnostics,
                 notify: Callable[[], None]) -> None:
        self._log = logger
        self._diag = diagnostics
        self._notify = notify
        self._lock = threading.Lock()
        self._queue: deque[TextJob] = deque()
        self._reserved = 0
        self._jobs: dict[str, TextJob] = {}
        """Open requests: queued here or in the engine."""
        self._to_abort: set[str] = set()
        self._outbox: deque[TextEvent] = deque()
        self._counters = {task: itertools.count() for task in TextTask}
        self._next_due: dict[TextTask, float] = {}
        self.max_queued_questions = 16
        self.max_tokens = 0
        """The node's ``decode_budget`` (0: no engine configured, questions are refused)."""

    # -- questions (any thread) ---------------------------------------------------------
    def _refusal(self, question: str, max_tokens: int | None) -> str | None:
        if not question.strip():
            return 'empty question'
        if self.max_tokens <= 0:
            return 'the node is not configured'
        if max_tokens is not None and not 1 <= max_tokens <= self.max_tokens:
            return f'max_tokens {max_tokens} outside [1, {self.max_tokens}] (decode_budget)'
        queued = len(self._queue) + self._reserved
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
                self._reserved += 1
        if reason is not None:
            self._refused(reason)
        return reason

    def enqueue(self, question: str, max_tokens: int | None, arrival_s: float, *,
                goal: object) -> TextJob:
        """Queue the question of an accepted goal into the slot ``reserve`` held."""
        job = TextJob(self._new_id(TextTask.ANSWER), TextTask.ANSWER, Origin.ACTION, arrival_s,
                      question, max_tokens, goal)
        with self._lock:
            self._reserved = max(self._reserved - 1, 0)
            self._queue.append(job)
            self._jobs[job.req_id] = job
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
                del self._jobs[req_id]
                self._outbox.append(TextDone(job, TextStatus.CANCELED, reason='cancelled'))
            else:
                self._to_abort.add(req_id)
                return True
        self._notify()
        return True

    def _refused(self, reason: str) -> None:
        self._diag.record_text_rejected(f'question refused: {reason}')
        self._log.warning(f'question refused: {reason}', throttle_duration_sec=1.0)

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
                job = self._jobs.pop(req_id, None) if existed else None
            if job is not None:
                self._log.info(f'{req_id} cancelled: KV blocks freed')
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
        dropped = []
        for job in questions:
            try:
                engine.submit_text(TextTask.ANSWER, question=job.question,
                                   max_tokens=job.max_tokens, req_id=job.req_id)
            except (EngineBusyError, ValueError) as exc:
                dropped.append(self._dropped(job, f'engine busy: {exc}'
                                             if isinstance(exc, EngineBusyError) else str(exc)))
                continue
            self._log.info(f'question {job.req_id} ({job.origin.value}): {job.question!r}')
        self._emit(dropped)
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
                self._log.warning(f'{task.value} request refused: {exc}')
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
        for text in out.texts:
            done = self._done(text)
            if done is not None:
                events.append(done)
        self._emit(events)

    def _done(self, out: TextOutput) -> TextDone | None:
        with self._lock:
            job = self._jobs.pop(out.req_id, None)
        if job is None:
            return None  # not ours (the engine's warm-up)
        if out.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) and not out.error:
            status = TextStatus.EOS if out.finish_reason is FinishReason.STOP \
                else TextStatus.LENGTH
            self._log.info(f'{job.task.value} {job.req_id} ({out.num_cycles} cycles, '
                           f'{status.value}): {out.text!r}')
            return TextDone(job, status, out.text, len(out.token_ids), out.frame_stamp_ns)
        return self._dropped(job, out.error or 'request aborted', len(out.token_ids),
                             out.frame_stamp_ns)

    def _dropped(self, job: TextJob, reason: str, num_tokens: int = 0,
                 frame_stamp_ns: int = 0) -> TextDone:
        with self._lock:
            self._jobs.pop(job.req_id, None)
        self._diag.record_text_rejected(f'{job.req_id}: {reason}')
        self._log.warning(f'{job.task.value} {job.req_id}: no text: {reason}',
                          throttle_duration_sec=1.0)
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
        events += [self._dropped(job, reason) for job in left]
        self._emit(events)

    def _emit(self, events: list[TextEvent]) -> None:
        if events:
            with self._lock:
                self._outbox.extend(events)
            self._notify()

    # -- text group ---------------------------------------------------------------------
    def take(self) -> list[TextEvent]:
        """Return the events to publish, in order (text group)."""
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
            return len(self._queue) + self._reserved


__all__ = ['NO_ANSWER', 'Origin', 'TextDone', 'TextEvent', 'TextJob', 'TextPiece',
           'TextRequests', 'TextStatus']
