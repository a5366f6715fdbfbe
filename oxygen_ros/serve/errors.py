"""
The refusals of ``oxygen_serve``: what a client did wrong, one class each (pure).

A refusal reaches the client as one text frame, ``'{class}: {message}'`` on one line, then the
connection closes (openpi's protocol: a text frame is an error); the server logs the same
line with the peer's address. Nothing the client sends ever gets a traceback back.
"""

from __future__ import annotations

POLICY_VIOLATION = 1008
"""Websocket close code (RFC 6455 section 7.4.1): a message that violates the policy."""
UNSUPPORTED_DATA = 1003
"""Websocket close code: data of a type the endpoint cannot accept."""


class Refusal(ValueError):
    """
    A message or connection the server refuses; its class name goes on the wire.

    :cvar close_code: the websocket close code the connection ends with.
    """

    close_code: int = POLICY_VIOLATION

    def line(self) -> str:
        """Return the class name, a colon and the message, flat: what the client and log get."""
        return one_line(f'{type(self).__name__}: {self}')


class NotBinary(Refusal):
    """A text frame where a msgpack observation (a binary frame) was expected."""

    close_code = UNSUPPORTED_DATA


class MalformedMessage(Refusal):
    """Not one msgpack map within the wire's bounds (docs/serving.md#the-wire)."""

    close_code = UNSUPPORTED_DATA


class BadArray(Refusal):
    """An ``__ndarray__``/``__npgeneric__`` entry whose dtype, shape or data is refused."""

    close_code = UNSUPPORTED_DATA


class MissingKey(Refusal):
    """A key the robot layout needs is absent."""


class UnknownKey(Refusal):
    """A key the robot layout does not know (a misspelt key, or another robot's)."""


class BadValue(Refusal):
    """A known key with the wrong type, dtype, shape or range."""


class BadLanguageRequest(Refusal):
    """A malformed entry of ``language_requests`` (docs/serving.md#language-updates)."""


class IdleTimeout(Refusal):
    """No observation within ``--idle-timeout`` seconds."""


class SlowClient(Refusal):
    """A reply the client did not take within the send timeout."""


def one_line(text: str, limit: int = 500) -> str:
    """Return ``text`` on one line (newlines and tabs as spaces), cut to ``limit`` characters."""
    flat = ' '.join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 3] + '...'


__all__ = ['BadArray', 'BadLanguageRequest', 'BadValue', 'IdleTimeout', 'MalformedMessage',
           'MissingKey', 'NotBinary', 'POLICY_VIOLATION', 'Refusal', 'SlowClient',
           'UNSUPPORTED_DATA', 'UnknownKey', 'one_line']
