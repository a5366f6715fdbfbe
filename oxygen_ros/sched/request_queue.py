"""
The scheduler's waiting queue: one queue, one bound, one refusal (stdlib only).

vLLM v1 keeps the requests not yet scheduled in one queue (``v1/core/sched/request_queue.py``,
first come first served); here that queue is the only place a text request waits, from its
submission until a cycle admits it onto a frame, and it also holds the one bound:
``max_waiting_requests`` requests wait at most, one more is refused (``QueueFullError``).
docs/design.md explains why, with first come first served admission, no request waits forever
(and so no timeout).

Not thread-safe: the engine makes every call under its lock.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator

from oxygen_ros.sched.request import Request


class QueueFullError(RuntimeError):
    """
    The waiting queue holds ``max_waiting_requests`` requests: one more is refused.

    :ivar num_waiting: the requests waiting when it was refused.
    :ivar limit: ``max_waiting_requests`` then.
    """

    def __init__(self, num_waiting: int, limit: int) -> None:
        super().__init__(f'queue full ({num_waiting} requests waiting, max_waiting_requests '
                         f'{limit})')
        self.num_waiting, self.limit = num_waiting, limit


class RequestQueue:
    """Waiting requests, oldest first (first come first served)."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def check_room(self, limit: int) -> None:
        """
        Raise ``QueueFullError`` if ``limit`` requests wait already.

        :raises QueueFullError: its message is the refusal the node sends back
            (``queue full (16 requests waiting, max_waiting_requests 16)``).
        """
        if len(self._queue) >= limit:
            raise QueueFullError(len(self._queue), limit)

    def add(self, request: Request, limit: int) -> None:
        """
        Append ``request`` at the tail.

        :raises QueueFullError: ``limit`` requests wait already.
        """
        self.check_room(limit)
        self._queue.append(request)

    def remove(self, request: Request) -> bool:
        """Remove ``request`` (admitted or cancelled); return whether it was waiting."""
        try:
            self._queue.remove(request)
        except ValueError:
            return False
        return True

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


__all__ = ['QueueFullError', 'RequestQueue']
