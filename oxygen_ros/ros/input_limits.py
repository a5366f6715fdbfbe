"""
Size bounds of the node's inputs, beyond which a message is refused with its reason.

Every input the node acts on is bounded before it costs more than a look at its length: a
``sensor_msgs/Image`` or ``CompressedImage`` by ``images.raw.MAX_IMAGE_SIDE`` per side (read
from the message or the JPEG/PNG header before decoding), a ``JointState`` by
``MAX_JOINT_STATE_LENGTH`` entries, an instruction and a question by their UTF-8 bytes; an
instruction whose action prompt does not fit the model's ``max_token_len`` is refused when
the prompt is built (``transforms.inputs``). docs/diagnostics.md lists what is refused and how it
shows.
"""

from __future__ import annotations

MAX_INSTRUCTION_BYTES = 4096
"""An instruction (``~/instruction`` or the ``instruction`` parameter), UTF-8 bytes. The action
prompt holds at most ``max_token_len`` tokens (200 for pi0.5): a few hundred characters."""
MAX_QUESTION_BYTES = 4096
"""A question (``~/ask`` topic or action), UTF-8 bytes."""
MAX_JOINT_STATE_LENGTH = 1024
"""Entries of each array of a ``JointState`` (``name``, ``position``, ``velocity``,
``effort``)."""


def text_refusal(what: str, text: str, max_bytes: int) -> str | None:
    """Return why ``text`` is refused (more than ``max_bytes`` UTF-8 bytes), or None."""
    if len(text) <= max_bytes // 4:  # 4 bytes per character at most: no need to encode
        return None
    num_bytes = len(text.encode('utf-8', errors='surrogatepass'))
    if num_bytes > max_bytes:
        return f'{what} of {num_bytes} bytes is longer than the {max_bytes}-byte limit'
    return None


def instruction_refusal(text: str) -> str | None:
    """Return why an instruction is refused at arrival (too long), or None."""
    return text_refusal('instruction', text, MAX_INSTRUCTION_BYTES)


def question_refusal(text: str) -> str | None:
    """Return why a question is refused at arrival (too long), or None."""
    return text_refusal('question', text, MAX_QUESTION_BYTES)


__all__ = ['MAX_INSTRUCTION_BYTES', 'MAX_JOINT_STATE_LENGTH', 'MAX_QUESTION_BYTES',
           'instruction_refusal', 'question_refusal', 'text_refusal']
