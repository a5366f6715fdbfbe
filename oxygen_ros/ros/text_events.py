"""
The events of the node's text requests: where a request came from, how it ended, its pieces.

``TextRequests`` (text_requests.py) makes them from the engine's one stream of
``TextOutput``; the text group publishes them (text_outputs, text_stream) and the ``~/ask``
action server ends its goals with them (ask_action). How a request ended is the engine's
``FinishReason``, said in ROS terms in one place (``outcomes.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import enum

from oxygen_ros.engine import FinishReason, TextTask
from oxygen_ros.ros.outcomes import NO_ANSWER


class Origin(enum.Enum):
    """Where a text request came from."""

    TOPIC = 'topic'
    """A ``std_msgs/String`` on ``~/ask`` (answered on ``~/answer``)."""
    ACTION = 'action'
    """A goal of the ``~/ask`` action (answered by its result)."""
    PERIODIC = 'periodic'
    """The node's own SUBTASK / MEMORY timer."""


@dataclass(slots=True, eq=False)
class TextJob:
    """
    One text request of the node, from arrival to its ``TextDone``.

    :ivar arrival_s: monotonic seconds when the request arrived (time_from_request counts
        from here).
    :ivar max_tokens: budget; None = the node's ``decode_budget``.
    :ivar goal: the action's goal handle (``Origin.ACTION``), opaque here; None until rclpy
        hands it over (``TextRequests.goal_accepted``).
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
    """The text a request decoded in one cycle (``TextOutput.new_text``, the engine's piece)."""

    job: TextJob
    text: str
    num_tokens: int
    frame_stamp_ns: int
    final: bool


@dataclass(frozen=True, slots=True)
class TextDone:
    """
    The end of a request: its whole text, or why there is none.

    :ivar finish_reason: how it ended: STOP, LENGTH (answered), ABORT (cancelled), DROPPED
        (taken, then not answered), REFUSED (on arrival); ``reason`` says why for the last
        three.
    :ivar text: the engine's text of the request (``TextOutput.text``): whole (STOP,
        LENGTH), or as far as it got (cancelled, dropped); ``''`` when it never decoded.
    :ivar frame_stamp_ns: 0 if it never read a frame.
    """

    job: TextJob
    finish_reason: FinishReason
    text: str = ''
    num_tokens: int = 0
    frame_stamp_ns: int = 0
    reason: str = ''


TextEvent = TextPiece | TextDone


__all__ = ['NO_ANSWER', 'Origin', 'TextDone', 'TextEvent', 'TextJob', 'TextPiece']
