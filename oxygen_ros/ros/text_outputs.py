"""
The text group's side of the node's texts: events in, messages and action results out.

``TextRequests.take`` gives ``TextPiece`` and ``TextDone`` events in order; per event:

- a piece (text the engine detokenized) → ``TextStreams`` → ``~/<task>/stream``
  (``DecodedText``), and the ``~/ask`` action's feedback when the request is a goal;
- a done → the stream's last piece if one is owed, then the whole text: the goal's result
  (action), or ``~/<task>`` (``std_msgs/String``: every finished subtask and memory note, the
  answer of each ``~/ask`` topic question, ``no answer: <reason>`` for one that got none),
  as ``outcomes.py`` says each ``FinishReason``.

Answers to action goals are not published on ``~/answer``: that topic answers the ``~/ask``
topic, one message per question.

An exception while handling one event is caught (``on_error``: logged with its traceback),
never lets it escape into the executor (which would discard it silently and lose the rest of
the batch): the other events are published, and a question whose end failed still gets one
reply (``no answer: internal error ...``, or a DROPPED goal result).
"""

from __future__ import annotations

import time
import traceback
from typing import Callable, Iterable

from oxygen_ros.engine import FinishReason
from oxygen_ros.ros.ask_action import AskAction
from oxygen_ros.ros.outcomes import answered, reply_text
from oxygen_ros.ros.text_requests import Origin, TextDone, TextEvent, TextJob, TextPiece
from oxygen_ros.ros.text_stream import TextStreams
from oxygen_ros_interfaces.msg import DecodedText
from std_msgs.msg import String


class TextOutputs:
    """
    Publishes text events (text group only).

    :param publish: ``publish(key, msg)`` on the node's publisher ``key`` (``'answer'``,
        ``'answer/stream'``, ...); a no-op for a publisher that does not exist (cleaned up).
    :param ask: the ``~/ask`` action server.
    :param on_error: ``on_error(where, exception, traceback)`` for an exception caught while
        handling an event (default: ignored after the reply; the node logs it).
    """

    def __init__(self, publish: Callable[[str, object], None], ask: AskAction,
                 on_error: Callable[[str, BaseException, str], None] | None = None) -> None:
        self._publish = publish
        self.ask = ask
        self._on_error = on_error
        self._streams = TextStreams()

    @property
    def frame_id(self) -> str:
        """Return the ``header.frame_id`` of every message (the node's ``frame_id``)."""
        return self._streams.frame_id

    @frame_id.setter
    def frame_id(self, value: str) -> None:
        self._streams.frame_id = value

    def handle(self, events: Iterable[TextEvent]) -> None:
        """Publish the events of ``TextRequests.take``, in order."""
        for event in events:
            try:
                self._handle(event)
            except Exception as exc:  # noqa: B902 (see the module docstring)
                if self._on_error is not None:
                    self._on_error(f'publishing {event.job.req_id}', exc, traceback.format_exc())
                if isinstance(event, TextDone):
                    self._failed(event, f'internal error: {type(exc).__name__}: {exc}')

    def _handle(self, event: TextEvent) -> None:
        streams = self._streams
        job, now = event.job, time.monotonic()
        if isinstance(event, TextPiece):
            piece = streams.piece(event, now)
            self._piece(job, piece, lambda: streams.text_so_far(job.req_id))
            return
        last, whole = streams.done(event, now)
        self._piece(job, last, lambda: whole.text)
        self._done(event, whole)

    def _failed(self, done: TextDone, reason: str) -> None:
        """Give a question whose end could not be published its one reply all the same."""
        job = done.job
        try:
            if job.origin is Origin.ACTION:
                self.ask.finish(TextDone(job, FinishReason.DROPPED, reason=reason), None)
            elif job.origin is Origin.TOPIC:
                self._publish(job.task.value,
                              String(data=reply_text(FinishReason.DROPPED, '', reason)))
        except Exception as exc:  # noqa: B902 (nothing more can be done; logged)
            if self._on_error is not None:
                self._on_error(f'replying to {job.req_id}', exc, traceback.format_exc())

    def _piece(self, job: TextJob, piece: DecodedText | None,
               text_so_far: Callable[[], str]) -> None:
        if piece is None:
            return
        self._publish(f'{job.task.value}/stream', piece)
        if job.origin is Origin.ACTION:
            self.ask.feedback(job, piece, text_so_far())

    def _done(self, done: TextDone, whole: DecodedText) -> None:
        job = done.job
        if job.origin is Origin.ACTION:
            self.ask.finish(done, whole)
        elif answered(done.finish_reason) or job.origin is Origin.TOPIC:
            self._publish(job.task.value,
                          String(data=reply_text(done.finish_reason, whole.text, done.reason)))


__all__ = ['TextOutputs']
