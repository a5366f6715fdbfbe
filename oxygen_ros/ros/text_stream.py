"""
Streaming text: each cycle's text pieces → ``oxygen_ros_interfaces/DecodedText`` messages.

Runs in the node's text callback group, never in the control cycle. The engine detokenizes
(``TextOutput.new_text``, one ``IncrementalDetokenizer`` per request); here the pieces only
become messages: a piece per cycle that completed some text, the last one ``is_final``. The
pieces of a request concatenate to its whole text (``TextDone.text``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from oxygen_ros.engine import TextTask
from oxygen_ros.ros.stamps import ns_to_duration, ns_to_stamp
from oxygen_ros.ros.text_requests import TextDone, TextJob, TextPiece
from oxygen_ros.units import NS_PER_S
from oxygen_ros_interfaces.msg import DecodedText
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import Header

TEXT_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1000,
                      reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)
"""QoS of ``~/ask`` (topic) and of the text topics ``~/<task>`` and ``~/<task>/stream``:
reliable, and deep enough that a burst of questions, replies or pieces (one per running
request per cycle) is not overwritten before the other side takes it (keep last 10 loses
messages of a burst of a few hundred)."""

TASK_CONSTANTS = {TextTask.ANSWER: DecodedText.TASK_ANSWER,
                  TextTask.SUBTASK: DecodedText.TASK_SUBTASK,
                  TextTask.MEMORY: DecodedText.TASK_MEMORY}
"""``TextTask`` → ``DecodedText.TASK_*``."""


def decoded_text(job: TextJob, text: str, *, final: bool, num_tokens: int,
                 frame_stamp_ns: int, frame_id: str, now_s: float) -> DecodedText:
    """
    Build one ``DecodedText``.

    :param frame_stamp_ns: stamp of the camera frame the text was decoded from (0: none).
    :param now_s: monotonic seconds now; ``time_from_request`` = now - ``job.arrival_s``.
    """
    stamp_ns = max(frame_stamp_ns, 0)
    elapsed_ns = max(round((now_s - job.arrival_s) * NS_PER_S), 0)
    return DecodedText(
        header=Header(stamp=ns_to_stamp(stamp_ns), frame_id=frame_id), request_id=job.req_id,
        task=TASK_CONSTANTS[job.task], text=text, is_final=final, num_tokens=num_tokens,
        time_from_request=ns_to_duration(elapsed_ns))


@dataclass(slots=True)
class _Stream:
    pieces: list[str] = field(default_factory=list)
    num_tokens: int = 0
    frame_stamp_ns: int = 0
    closed: bool = False

    @property
    def text(self) -> str:
        return ''.join(self.pieces)


class TextStreams:
    """
    The streaming state of every request that decoded at least one token.

    Text group only (not thread-safe).

    :param frame_id: ``header.frame_id`` of the messages (the node's ``frame_id``).
    """

    def __init__(self, frame_id: str = '') -> None:
        self.frame_id = frame_id
        self._streams: dict[str, _Stream] = {}

    def text_so_far(self, req_id: str) -> str:
        """Return the text of the pieces of ``req_id`` built so far ('' if none)."""
        stream = self._streams.get(req_id)
        return stream.text if stream is not None else ''

    def piece(self, event: TextPiece, now_s: float) -> DecodedText | None:
        """
        Build the message of one cycle's piece of a request.

        :returns: the piece to publish; None when the cycle completed no text and is not the
            request's last.
        """
        stream = self._streams.setdefault(event.job.req_id, _Stream())
        stream.num_tokens, stream.frame_stamp_ns = event.num_tokens, event.frame_stamp_ns
        stream.pieces.append(event.text)
        stream.closed = event.final
        if not event.text and not event.final:
            return None
        return self._message(event.job, stream, event.text, event.final, now_s)

    def done(self, event: TextDone, now_s: float) -> tuple[DecodedText | None, DecodedText]:
        """
        Close a request's stream.

        :returns: ``(last piece, whole text)``: the final piece still to publish (None if the
            final piece was already built, or the request never decoded a token): the text
            the engine let out at its end (cancelled, dropped: the rest of ``event.text``);
            and the whole text as one message (``is_final``).
        """
        stream = self._streams.pop(event.job.req_id, None)
        so_far = stream.text if stream is not None else ''
        text = event.text or so_far
        last = None
        if stream is not None and not stream.closed:
            last = self._message(event.job, stream, text[len(so_far):], True, now_s)
        num_tokens = event.num_tokens or (stream.num_tokens if stream is not None else 0)
        stamp = event.frame_stamp_ns or (stream.frame_stamp_ns if stream is not None else 0)
        whole = decoded_text(event.job, text, final=True, num_tokens=num_tokens,
                             frame_stamp_ns=stamp, frame_id=self.frame_id, now_s=now_s)
        return last, whole

    def _message(self, job: TextJob, stream: _Stream, text: str, final: bool,
                 now_s: float) -> DecodedText:
        return decoded_text(job, text, final=final, num_tokens=stream.num_tokens,
                            frame_stamp_ns=stream.frame_stamp_ns, frame_id=self.frame_id,
                            now_s=now_s)


__all__ = ['TEXT_QOS', 'TASK_CONSTANTS', 'TextStreams', 'decoded_text']
