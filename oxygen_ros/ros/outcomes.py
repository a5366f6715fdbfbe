"""
The engine's vocabulary in ROS terms, in one place: how a request ended, why an input was refused.

The engine ends every text request with one ``FinishReason`` and refuses every input with one
``RefusalReason`` (``oxygen_ros.engine``); the node says each here, and nowhere else:

- ``OUTCOMES``: per ``FinishReason``, the ``~/ask`` action's ``Ask.Result.status``, the name
  clients print for it (``OUTCOME_NAMES``, read back from the status they receive), the word
  the node's log line says, and whether the request was answered (the goal SUCCEEDED,
  ``~/<task>`` carries the text) or not (a ``~/ask`` question's ``~/answer`` says
  ``no answer: <reason>``: :func:`reply_text`).
- ``REJECTION_NAMES``: per ``RefusalReason``, the name ``/diagnostics`` counts it under
  (``rejected: <name>``) and the node logs it with (``not acting (<name>): ...``).
"""

from __future__ import annotations

from dataclasses import dataclass

from oxygen_ros.engine import FinishReason, RefusalReason
from oxygen_ros_interfaces.action import Ask

NO_ANSWER = 'no answer: '
"""Prefix of the ``~/answer`` text for a question that could not be answered."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """
    One way a text request ends, as ROS says it.

    :ivar status: ``Ask.Result.STATUS_*`` of a goal that ends so.
    :ivar name: how ``oxygen_ask``, the demo and the flood print that status.
    :ivar logged: how the node's log line of a finished request says it (``(3 cycles,
        eos)``).
    :ivar answered: the request's text is its answer: the goal SUCCEEDED; ``~/<task>``
        carries the text (else a question's ``~/answer`` says ``no answer: <reason>``).
    """

    status: int
    name: str
    logged: str
    answered: bool = False


OUTCOMES = {
    FinishReason.STOP: Outcome(Ask.Result.STATUS_EOS, 'EOS', 'eos', answered=True),
    FinishReason.LENGTH: Outcome(Ask.Result.STATUS_LENGTH, 'token budget', 'length',
                                 answered=True),
    FinishReason.ABORT: Outcome(Ask.Result.STATUS_CANCELED, 'cancelled', 'canceled'),
    FinishReason.DROPPED: Outcome(Ask.Result.STATUS_DROPPED, 'dropped', 'dropped'),
    FinishReason.REFUSED: Outcome(Ask.Result.STATUS_DROPPED, 'dropped', 'refused'),
}
"""``FinishReason`` → its ``Outcome`` (``REFUSED``: a topic question's reply; a goal whose
question is refused is rejected, it never gets a result)."""

OUTCOME_NAMES = {outcome.status: outcome.name for outcome in OUTCOMES.values()}
"""``Ask.Result.STATUS_*`` → how the clients print it (what a client receives is the status)."""

REJECTION_NAMES = {
    RefusalReason.STALE: 'stale',
    RefusalReason.MISSING_CAMERA: 'missing camera',
    RefusalReason.BAD_IMAGE: 'bad image',
    RefusalReason.BAD_STATE: 'bad joints',
    RefusalReason.NO_INSTRUCTION: 'no instruction',
    RefusalReason.BAD_PROMPT: 'bad prompt',
}
"""``RefusalReason`` → its name in ``/diagnostics`` and the logs (the state is the joints')."""


def answered(reason: FinishReason) -> bool:
    """Return whether a request that ended so has its answer (``Outcome.answered``)."""
    return OUTCOMES[reason].answered


def reply_text(reason: FinishReason, text: str, why: str) -> str:
    """
    Return the ``~/<task>`` text of a request that ended so.

    :param text: its text (the whole answer when answered).
    :param why: why it got none (the ``TextDone`` reason).
    :returns: ``text`` when answered, else ``no answer: <why>``.
    """
    return text if answered(reason) else f'{NO_ANSWER}{why}'


__all__ = ['NO_ANSWER', 'OUTCOME_NAMES', 'OUTCOMES', 'Outcome', 'REJECTION_NAMES', 'answered',
           'reply_text']
