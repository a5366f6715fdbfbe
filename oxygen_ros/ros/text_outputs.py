"""
The text group's side of the node's texts: events in, messages and action results out.

``TextRequests.take`` gives ``TextPiece`` and ``TextDone`` events in order; per event:

- a piece → ``TextStreams`` detokenizes it → ``~/<task>/stream`` (``DecodedText``), and the
  ``~/ask`` action's feedback when the request is a goal;
- a done → the stream's last piece if one is owed, then the whole text: the goal's result
  (action), or ``~/<task>`` (``std_msgs/String``: every finished subtask and memory note, the
  answer of each ``~/ask`` topic question, ``no answer: <reason>`` for one that got none).

Answers to action goals are not published on ``~/answer``: that topic answers the ``~/ask``
topic, one message per question.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from oxygen_ros.model.detokenizer import SupportsDetokenize
from oxygen_ros.ros.ask_action import AskAction
from oxygen_ros.ros.text_requests import (
    NO_ANSWER, Origin, TextDone, TextEvent, TextJob, TextPiece, TextStatus)
from oxygen_ros.ros.text_stream import decoded_text, TextStreams
from oxygen_ros_interfaces.msg import DecodedText
from std_msgs.msg import String


class TextOutputs:
    """
    Publishes text events (text group only).

    :param publish: ``publish(key, msg)`` on the node's publisher ``key`` (``'answer'``,
        ``'answer/stream'``, ...); a no-op for a publisher that does not exist (cleaned up).
    :param ask: the ``~/ask`` action server.
    """

    def __init__(self, publish: Callable[[str, object], None], ask: AskAction) -> None:
        self._publish = publish
        self.ask = ask
        self._streams: TextStreams | None = None

    def configure(self, tokenizer: SupportsDetokenize, frame_id: str) -> None:
        """Use a (new) engine's tokenizer; ``frame_id`` goes into every header."""
        self._streams = TextStreams(tokenizer, frame_id)

    @property
    def frame_id(self) -> str:
        return self._streams.frame_id if self._streams is not None else ''

    @frame_id.setter
    def frame_id(self, value: str) -> None:
        if self._streams is not None:
            self._streams.frame_id = value

    def handle(self, events: Iterable[TextEvent]) -> None:
        """Publish the events of ``TextRequests.take``, in order."""
        streams = self._streams
        for event in events:
            job, now = event.job, time.monotonic()
            if isinstance(event, TextPiece):
                if streams is not None:
                    piece = streams.piece(event, now)
                    self._piece(job, piece, lambda: streams.text_so_far(job.req_id))
                continue
            if streams is not None:
                last, whole = streams.done(event, now)
                self._piece(job, last, lambda: whole.text)
            else:  # refused before the node was ever configured
                whole = decoded_text(job, '', final=True, num_tokens=0, frame_stamp_ns=0,
                                     frame_id='', now_s=now)
            self._done(event, whole)

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
        elif done.status in (TextStatus.EOS, TextStatus.LENGTH):
            self._publish(job.task.value, String(data=whole.text))
        elif job.origin is Origin.TOPIC:
            self._publish(job.task.value, String(data=f'{NO_ANSWER}{done.reason}'))


__all__ = ['TextOutputs']
