"""
The node's text requests: questions, periodic subtask and memory requests, finished texts.

``ask`` is called from the ``~/ask`` callback (any thread); ``submit`` and ``finish`` from the
control cycle, the only thread touching the engine; ``take`` from the text callback group,
which publishes. Every question gets exactly one reply: the decoded answer, or
``no answer: <reason>`` when the engine refuses it (busy, empty question), drops it (not
admitted in time) or aborts it. A periodic SUBTASK or MEMORY request is only submitted in a
cycle with a valid observation, and not while the previous one of its kind still decodes.
"""

from __future__ import annotations

import logging
import queue
from typing import Iterable

from oxygen_ros.engine.config import TextOutput
from oxygen_ros.engine.engine import Engine, EngineBusyError
from oxygen_ros.model.prompt import TextTask
from oxygen_ros.ros.convert import NS_PER_S
from oxygen_ros.ros.diagnostics import EngineDiagnostics
from oxygen_ros.sched.request import FinishReason

NO_ANSWER = 'no answer: '
"""Prefix of the ``~/answer`` text for a question that could not be answered."""


class TextRequests:
    """
    Bookkeeping between ``~/ask``, the engine and the text publishers.

    :param logger: where requests and texts are logged (the node's logger).
    :param diagnostics: counts refused and dropped requests.
    """

    def __init__(self, logger: logging.Logger, diagnostics: EngineDiagnostics) -> None:
        self._log = logger
        self._diag = diagnostics
        self._inbox: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[tuple[TextTask, str]] = queue.SimpleQueue()
        self._live: dict[str, TextTask] = {}
        self._next_due: dict[TextTask, float] = {}

    def ask(self, question: str) -> None:
        """Queue a question (thread-safe; it reaches the engine in the next cycle)."""
        self._inbox.put(question)

    def start(self, now: float) -> None:
        """Make the periodic requests due at ``now`` (monotonic seconds; at activation)."""
        self._next_due = {TextTask.SUBTASK: now, TextTask.MEMORY: now}

    def clear(self) -> None:
        """Forget live requests (the engine was shut down)."""
        self._live.clear()

    @property
    def live(self) -> dict[str, TextTask]:
        """Return ``req_id -> task`` of the requests in the engine."""
        return dict(self._live)

    def submit(self, engine: Engine, now: float, subtask_period: float, memory_period: float,
               valid_observation: bool) -> None:
        """
        Hand queued questions and due periodic requests to the engine (control thread).

        :param now: monotonic seconds.
        :param subtask_period: seconds between SUBTASK requests, 0 = never.
        :param memory_period: seconds between MEMORY requests, 0 = never.
        :param valid_observation: this cycle has one (periodic requests wait for it).
        """
        while True:
            try:
                question = self._inbox.get_nowait()
            except queue.Empty:
                break
            try:
                req_id = engine.submit_text(TextTask.ANSWER, question=question)
            except (EngineBusyError, ValueError) as exc:
                self._diag.record_text_rejected()
                self._log.warning(f'question {question!r} refused: {exc}')
                self._outbox.put((TextTask.ANSWER, f'{NO_ANSWER}{exc}'))
                continue
            self._live[req_id] = TextTask.ANSWER
            self._log.info(f'question {req_id}: {question!r}')
        if not valid_observation:
            return
        for task, period in ((TextTask.SUBTASK, subtask_period),
                             (TextTask.MEMORY, memory_period)):
            if period <= 0 or now < self._next_due.get(task, now) or \
                    task in self._live.values():
                continue
            try:
                self._live[engine.submit_text(task)] = task
            except EngineBusyError as exc:
                self._diag.record_text_rejected()
                self._log.warning(f'{task.value} request refused: {exc}')
            self._next_due[task] = now + period

    def finish(self, outputs: Iterable[TextOutput]) -> bool:
        """
        Turn finished (or dropped) requests into texts to publish (control thread).

        :returns: whether anything is waiting in ``take``.
        """
        for out in outputs:
            self._live.pop(out.req_id, None)
            if out.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) and not out.error:
                self._log.info(
                    f'{out.task.value} {out.req_id} (frame stamp '
                    f'{out.frame_stamp_ns / NS_PER_S:.3f}, {out.num_cycles} cycles, '
                    f'{out.finish_reason.value}): {out.text!r}')
                self._outbox.put((out.task, out.text))
                continue
            self._diag.record_text_rejected()
            reason = out.error or 'request aborted'
            self._log.warning(f'{out.task.value} {out.req_id}: no text: {reason}')
            if out.task is TextTask.ANSWER:
                self._outbox.put((out.task, f'{NO_ANSWER}{reason}'))
        return not self._outbox.empty()

    def take(self) -> list[tuple[TextTask, str]]:
        """Return the texts to publish, in order (text group)."""
        texts = []
        while True:
            try:
                texts.append(self._outbox.get_nowait())
            except queue.Empty:
                return texts


__all__ = ['NO_ANSWER', 'TextRequests']
