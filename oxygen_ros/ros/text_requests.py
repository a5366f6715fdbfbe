"""
The node's text requests: ROS origins mapped to the engine's request ids, and their events.

The origins are the ``~/ask`` topic and action and the node's own periodic requests. The
engine's scheduler holds every request's state (its one request table); here the node keeps
only what ROS alone holds per request id (``TextJob``): where the reply goes (its origin and
task), the action's goal handle, what was asked and when (the node's clock), and the one reply
it is owed.

**One queue, one bound, one refusal.** The engine's scheduler holds the only queue of waiting
requests (``max_waiting_requests``, vLLM's ``Scheduler.waiting``): a question goes to
``Engine.submit_text`` the moment it arrives, in its callback's thread, and is queued or
refused there (``QueueFullError``: ``queue full (16 requests waiting, max_waiting_requests
16)``); refusing never waits for a control cycle.

Every question gets exactly one reply (``TextDone``, with the engine's ``FinishReason``): the
answer (STOP or LENGTH), or a reason:
refused at once (queue full, empty question, one over ``MAX_QUESTION_BYTES``, budget over
``decode_budget`` or more than the KV pool could ever hold, node not configured; the action
rejects such goals instead), dropped later (bad prompt, engine shut down), or cancelled.

**Goals.** A goal's question is queued in the goal callback, so the bound is exact when rclpy
accepts the goal; rclpy hands the goal handle over in the accepted callback
(``goal_accepted``: the same goal request object, rclpy ``action/server.py``
``_execute_goal_request``), and until then the request's events wait here. If the handle never
comes (rclpy failed to create it or to send the response), the request is aborted after
``RESERVATION_TIMEOUT_S``.

A periodic SUBTASK or MEMORY request is only asked in a cycle with a valid observation, and not
while the previous one of its kind is still open; while the queue is full it is asked again the
next cycle (no one awaits its reply: it is not a refusal).

Threads: ``ask_topic``, ``ask_goal``, ``goal_accepted`` and ``cancel`` run in subscription and
action callbacks (any thread); ``ask_periodic`` and ``finish`` in the control cycle; ``take``
in the text group, which publishes. The state is behind one lock held for O(1) work, never
while the engine is called. The control cycle never calls the rclpy logger (``deferred_log``):
``take`` writes its lines.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Callable, Iterable

from oxygen_ros.engine import (
    Engine, EngineClosedError, FinishReason, QueueFullError, StepOutput, TextOutput, TextTask)
from oxygen_ros.ros.deferred_log import DeferredLog, LogLevel
from oxygen_ros.ros.diagnostics import EngineDiagnostics
from oxygen_ros.ros.input_limits import question_refusal
from oxygen_ros.ros.outcomes import answered, OUTCOMES
from oxygen_ros.ros.text_events import (  # re-exported: the events are part of this API
    NO_ANSWER, Origin, TextDone, TextEvent, TextJob, TextPiece)
from rclpy.impl.rcutils_logger import RcutilsLogger

INFO = LogLevel.INFO
NOT_CONFIGURED = 'the node is not configured'
REFUSAL_LOG_PERIOD_S = 1.0
"""At most one 'question refused' log line per this period (each is counted in /diagnostics)."""
RESERVATION_TIMEOUT_S = 5.0
"""A goal's request is aborted if rclpy has not handed over its goal handle within this time:
rclpy calls the goal callback, then may fail to create the goal handle or to send the response
(client gone) and never calls the accepted callback; the request would run for no one."""


class TextRequests:
    """
    Bookkeeping between ``~/ask`` (topic and action), the engine and the text publishers.

    :param logger: where requests and refusals are logged (the node's logger).
    :param diagnostics: counts refused and dropped requests, shows the waiting ones.
    :param notify: called (any thread) when events wait in ``take`` (the text guard condition).
    :param clock: monotonic seconds (goal handles missing for ``RESERVATION_TIMEOUT_S``).
    :param robot: the robot whose frames its requests read (``Engine.submit_text``); its
        request ids start with ``<robot>/`` ('': the one robot, ``answer-0``).
    """

    def __init__(self, logger: RcutilsLogger, diagnostics: EngineDiagnostics,
                 notify: Callable[[], None], clock: Callable[[], float] = time.monotonic, *,
                 robot: str = '') -> None:
        self.robot = robot
        self._clock = clock
        self._log = logger
        self._diag = diagnostics
        self._notify = notify
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._jobs: dict[str, TextJob] = {}
        """Open requests: in the engine (waiting or decoding), reply not sent yet."""
        self._goals: dict[int, tuple[object, TextJob, float]] = {}
        """Goals asked but not handed over: id(goal request) -> (goal request, job, clock)."""
        self._parked: dict[str, list[TextEvent]] = {}
        """Events of goals not handed over yet, in order."""
        self._outbox: list[TextEvent] = []
        self._deferred = DeferredLog(logger)
        """The control cycle's log lines; ``take`` writes them."""
        self._counters = {task: itertools.count() for task in TextTask}
        self._refusal_logged_s = -float('inf')
        self._unlogged_refusals = 0
        self._next_due: dict[TextTask, float] = {}

    def connect(self, engine: Engine | None) -> None:
        """Hand new requests to ``engine`` (None: refuse them, the node is not configured)."""
        with self._lock:
            self._engine = engine

    @property
    def max_tokens(self) -> int:
        """Return the node's ``decode_budget`` (0: not configured, questions are refused)."""
        engine = self._engine
        return engine.decode_budget if engine is not None else 0

    # -- questions (any thread) ---------------------------------------------------------
    def _refusal(self, question: str, max_tokens: int | None) -> str | None:
        if not question.strip():
            return 'empty question'
        too_long = question_refusal(question)
        if too_long is not None:
            return too_long
        budget = self.max_tokens
        if budget <= 0:
            return NOT_CONFIGURED
        if max_tokens is not None and not 1 <= max_tokens <= budget:
            return f'max_tokens {max_tokens} outside [1, {budget}] (decode_budget)'
        return None

    def _submit(self, job: TextJob) -> Exception | None:
        """
        Hand ``job`` to the engine; return why it was refused, or None (queued).

        The job is open before the engine has it, so that no event of it can come first; a
        refused job is forgotten again, unless ``drop_all`` ended it meanwhile (the engine
        shut down): that was its one reply, and None is returned.
        """
        with self._lock:
            engine = self._engine
            self._jobs[job.req_id] = job
        try:
            if engine is None:
                raise EngineClosedError(NOT_CONFIGURED)
            engine.submit_text(job.task, question=job.question, max_tokens=job.max_tokens,
                               req_id=job.req_id, robot=self.robot)
        except (QueueFullError, EngineClosedError, ValueError) as exc:
            with self._lock:
                mine = self._jobs.pop(job.req_id, None) is not None
            self._record_waiting(exc.num_waiting if isinstance(exc, QueueFullError) else None)
            return exc if mine else None
        self._record_waiting()
        return None

    def _ask(self, job: TextJob) -> str | None:
        """Validate and submit a question; return the reason it is refused, or None."""
        self._expire_goals()
        reason = self._refusal(job.question or '', job.max_tokens)
        if reason is None:
            exc = self._submit(job)
            if exc is not None:
                reason = NOT_CONFIGURED if isinstance(exc, EngineClosedError) else str(exc)
        if reason is None:
            self._deferred.later(INFO, f'question {job.req_id} ({job.origin.value}): '
                                 f'{job.question!r}')
            self._notify()  # the text group writes the line
        else:
            self._refused(reason)
        return reason

    def ask_topic(self, question: str, arrival_s: float) -> TextJob:
        """
        Queue a ``~/ask`` String question, or refuse it at once (its reply is queued).

        :returns: the job (its id names it in the logs and on ``~/answer/stream``).
        """
        job = TextJob(self._new_id(TextTask.ANSWER), TextTask.ANSWER, Origin.TOPIC, arrival_s,
                      question)
        reason = self._ask(job)
        if reason is not None:
            self._emit([TextDone(job, FinishReason.REFUSED, reason=reason)])
        return job

    def ask_goal(self, goal: object, question: str, max_tokens: int | None,
                 arrival_s: float) -> str | None:
        """
        Queue the question of an ``~/ask`` goal request (the goal callback).

        :param goal: the goal request message, which rclpy hands over again as
            ``handle.request`` in the accepted callback (``goal_accepted``).
        :returns: None if it is queued (accept the goal), else the reason it is refused.
        """
        job = TextJob(self._new_id(TextTask.ANSWER), TextTask.ANSWER, Origin.ACTION, arrival_s,
                      question, max_tokens)
        with self._lock:
            self._goals[id(goal)] = (goal, job, self._clock())
        reason = self._ask(job)
        if reason is not None:
            with self._lock:
                self._goals.pop(id(goal), None)
        return reason

    def goal_accepted(self, handle: object) -> TextJob:
        """
        Give the request of an accepted goal its handle; its events go out from now on.

        :raises RuntimeError: no request waits for this goal (its handle came after
            ``RESERVATION_TIMEOUT_S``, the request was aborted).
        """
        goal = handle.request
        with self._lock:
            entry = self._goals.pop(id(goal), None)
            if entry is None or entry[0] is not goal:
                raise RuntimeError(f'the goal came more than {RESERVATION_TIMEOUT_S:g} s after '
                                   'its request, which was aborted')
            job = entry[1]
            job.goal = handle
            parked = self._parked.pop(job.req_id, [])
            self._outbox.extend(parked)
        if parked:
            self._notify()
        return job

    def cancel(self, req_id: str) -> bool:
        """
        Cancel an open request (waiting or decoding) now; its KV blocks are freed.

        :returns: whether it was cancelled (False: not open, or ending: its reply is on its
            way).
        """
        with self._lock:
            engine = self._engine if req_id in self._jobs else None
        out = engine.abort(req_id) if engine is not None else None
        if out is None:
            return False
        with self._lock:
            job = self._pop_job(req_id)
        if job is None:
            return False  # ended meanwhile (engine shut down): that reply is on its way
        self._deferred.later(INFO, f'{req_id} cancelled: KV blocks freed')
        self._emit([TextDone(job, FinishReason.ABORT, out.text, len(out.token_ids),
                             out.frame_stamp_ns, reason='cancelled')])
        self._record_waiting()
        return True

    def _expire_goals(self) -> None:
        """Abort the requests of goals whose handle never came (``RESERVATION_TIMEOUT_S``)."""
        now = self._clock()
        with self._lock:
            stale = [(key, job) for key, (_, job, since) in self._goals.items()
                     if now - since > RESERVATION_TIMEOUT_S]
            for key, job in stale:
                del self._goals[key]
                self._parked.pop(job.req_id, None)
                self._pop_job(job.req_id)
            engine = self._engine
        for _, job in stale:
            if engine is not None:
                engine.abort(job.req_id)
            self._deferred.later(LogLevel.WARNING, f'aborted {job.req_id}: its goal never came '
                                 f'in {RESERVATION_TIMEOUT_S:g} s (rclpy could not accept it or '
                                 'send its response)')
        if stale:
            self._record_waiting()

    def _record_waiting(self, observed: int | None = None) -> None:
        """Show the waiting and open requests in ``/diagnostics`` (``observed``: at a refusal)."""
        engine = self._engine
        waiting = engine.num_waiting if engine is not None else 0
        with self._lock:
            num_open = len(self._jobs)
        self._diag.record_texts(max(waiting, observed or 0), num_open)

    def _pop_job(self, req_id: str) -> TextJob | None:
        """Forget an open request (lock held); return it, or None if it was not open."""
        return self._jobs.pop(req_id, None)

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
        caller, a cost each refusal of a flood paid
        (``docs/robustness.md#overload-a-flood-of-questions-on-ask``).
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
        robot = f'{self.robot}/' if self.robot else ''
        return f'{robot}{task.value}-{next(self._counters[task])}'

    # -- control cycle ------------------------------------------------------------------
    def start(self, now: float) -> None:
        """Make the periodic requests due at ``now`` (monotonic seconds; at activation)."""
        self._next_due = {TextTask.SUBTASK: now, TextTask.MEMORY: now}

    def ask_periodic(self, now: float, subtask_period: float, memory_period: float,
                     valid_observation: bool) -> None:
        """
        Ask the due SUBTASK and MEMORY requests (control thread).

        :param now: monotonic seconds.
        :param subtask_period: seconds between SUBTASK requests, 0 = never.
        :param memory_period: seconds between MEMORY requests, 0 = never.
        :param valid_observation: this cycle has one (periodic requests wait for it).
        """
        self._expire_goals()
        if not valid_observation:
            return
        for task, period in ((TextTask.SUBTASK, subtask_period),
                             (TextTask.MEMORY, memory_period)):
            if period <= 0 or now < self._next_due.get(task, now) or self._open(task):
                continue
            exc = self._submit(TextJob(self._new_id(task), task, Origin.PERIODIC, now))
            if isinstance(exc, QueueFullError):
                self._deferred.later(LogLevel.THROTTLED_WARNING, f'{task.value} request waits '
                                     f'for room: {exc}')
                continue  # still due: asked again next cycle
            self._next_due[task] = now + period
            if exc is not None:
                self._diag.record_text_rejected(f'{task.value} request refused: {exc}')
                self._deferred.later(LogLevel.WARNING, f'{task.value} request refused: {exc}')

    def _open(self, task: TextTask) -> bool:
        with self._lock:
            return any(j.task is task and j.origin is Origin.PERIODIC
                       for j in self._jobs.values())

    def finish(self, out: StepOutput) -> None:
        """
        Turn a cycle's text outputs of this robot into events (control thread).

        Each output with new text is a piece; each that ends its request, its ``TextDone``
        (after every piece of the cycle). Other robots' outputs (``TextOutput.robot``) are
        theirs.
        """
        outputs = [t for t in out.outputs if t.robot == self.robot]
        with self._lock:
            events: list[TextEvent] = [
                TextPiece(self._jobs[t.req_id], t.new_text, t.num_tokens, t.frame_stamp_ns,
                          t.finished)
                for t in outputs if t.new_token_ids and t.req_id in self._jobs]
        for text in (t for t in outputs if t.finished):
            done = self._done(text)
            if done is not None:
                events.append(done)
        self._emit(events)
        self._record_waiting()

    def _done(self, out: TextOutput) -> TextDone | None:
        with self._lock:
            job = self._pop_job(out.req_id)
        if job is None:
            return None  # not ours (the engine's warm-up), or cancelled already
        if answered(out.finish_reason) and not out.error:
            self._deferred.later(INFO, f'{job.task.value} {job.req_id} ({out.num_cycles} '
                                 f'cycles, {OUTCOMES[out.finish_reason].logged}): {out.text!r}')
            return TextDone(job, out.finish_reason, out.text, len(out.token_ids),
                            out.frame_stamp_ns)
        return self._dropped(job, out.error or 'request aborted', out)

    def _dropped(self, job: TextJob, reason: str, out: TextOutput | None = None) -> TextDone:
        self._diag.record_text_rejected(f'{job.req_id}: {reason}')
        self._deferred.later(LogLevel.THROTTLED_WARNING,
                             f'{job.task.value} {job.req_id}: no text: {reason}')
        if out is None:
            return TextDone(job, FinishReason.DROPPED, reason=reason)
        return TextDone(job, FinishReason.DROPPED, out.text, len(out.token_ids),
                        out.frame_stamp_ns, reason)

    def drop_all(self, outputs: Iterable[TextOutput], reason: str) -> None:
        """
        End every open request (the engine was shut down; ``outputs`` are its last words).

        A request the engine did not name ends too, so every action goal gets its result.
        """
        events = [d for d in (self._done(out) for out in outputs) if d is not None]
        with self._lock:
            left = list(self._jobs.values())
            self._jobs.clear()
        events += [self._dropped(job, reason) for job in left]
        self._emit(events)
        self._record_waiting()
        self._deferred.write()  # the text group may not run again (shutdown)

    def _emit(self, events: list[TextEvent]) -> None:
        if not events:
            return
        with self._lock:
            for event in events:
                job = event.job
                if job.origin is Origin.ACTION and job.goal is None:
                    self._parked.setdefault(job.req_id, []).append(event)
                else:
                    self._outbox.append(event)
        self._notify()

    # -- text group ---------------------------------------------------------------------
    def take(self) -> list[TextEvent]:
        """Return the events to publish, in order, after writing the queued logs (text group)."""
        self._deferred.write()
        with self._lock:
            events, self._outbox = self._outbox, []
        return events

    @property
    def live(self) -> dict[str, TextTask]:
        """Return ``req_id -> task`` of the open requests (waiting or decoding)."""
        with self._lock:
            return {req_id: job.task for req_id, job in self._jobs.items()}


__all__ = ['NO_ANSWER', 'Origin', 'TextDone', 'TextEvent', 'TextJob', 'TextPiece',
           'TextRequests']
