"""
The bounds of ``oxygen_serve``: connections, message sizes, waits (pure).

Everything a client can make the server hold is bounded here, and each bound is a command-line
option of ``oxygen_serve`` (docs/serving.md#limits): connections, the bytes of one message
(websockets refuses a larger one before reading it whole), the frames websockets buffers per
connection, image sides, text lengths, open text requests per connection, and how long an
idle or slow client may hold its connection.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

MIB = 2**20


@dataclass(frozen=True, slots=True)
class ServeLimits:
    """
    The server's bounds (docs/serving.md#limits).

    :param max_connections: open websocket connections; one more is refused with HTTP 503.
    :param max_message_bytes: one observation message; 0: the robot layout's images at
        ``max_image_side`` in uint8 plus ``TEXT_ALLOWANCE`` (``layouts.message_bytes``).
    :param max_image_side: the longest side of a camera image, pixels.
    :param max_text_bytes: a prompt or a question, UTF-8 bytes.
    :param max_language_requests: text requests a connection may have open (waiting or
        decoding) at once; one more is answered with an error in ``language_updates``.
    :param max_queued_frames: frames websockets buffers per connection before it stops reading
        the socket (its ``max_queue``); a client that sends ahead waits on TCP.
    :param idle_timeout_s: a connection without an observation this long is closed
        (``IdleTimeout``); None: never.
    :param send_timeout_s: a reply the client does not take this long closes the connection
        (``SlowClient``).
    :param open_timeout_s: the TLS and websocket opening handshakes together.
    :raises ValueError: a bound out of range.
    """

    max_connections: int = 4
    max_message_bytes: int = 0
    max_image_side: int = 1920
    max_text_bytes: int = 4096
    max_language_requests: int = 8
    max_queued_frames: int = 2
    idle_timeout_s: float | None = 600.0
    send_timeout_s: float = 30.0
    open_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ('max_connections', 'max_image_side', 'max_text_bytes',
                     'max_language_requests', 'max_queued_frames'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
        if self.max_message_bytes < 0:
            raise ValueError(f'max_message_bytes must be >= 0, got {self.max_message_bytes}')
        for name in ('send_timeout_s', 'open_timeout_s'):
            if not getattr(self, name) > 0:
                raise ValueError(f'{name} must be > 0, got {getattr(self, name)}')
        if self.idle_timeout_s is not None and not self.idle_timeout_s > 0:
            raise ValueError(f'idle_timeout_s must be > 0 or None, got {self.idle_timeout_s}')

    def check_robots(self, max_robots: int) -> None:
        """
        Check the connections against the engine's robots (each connection one, N > 1).

        :raises ValueError: ``max_robots`` > 1 but fewer than ``max_connections``.
        """
        if 1 < max_robots < self.max_connections:
            raise ValueError(f'--max-connections {self.max_connections} is more than '
                             f'--max-robots {max_robots}: each connection is a robot')

    def as_metadata(self) -> dict[str, object]:
        """Return the bounds as the metadata sent on connect names them."""
        return asdict(self)


TEXT_ALLOWANCE = MIB
"""Bytes of a message beside its images: the state, the prompt, the text requests, framing."""

__all__ = ['MIB', 'ServeLimits', 'TEXT_ALLOWANCE']
