"""
The scheduler's waiting queue: one queue, one bound, a share per robot (stdlib only).

vLLM v1 keeps the requests not yet scheduled in one queue (``v1/core/sched/request_queue.py``,
first come first served); here that queue is the only place a text request waits, from its
submission until a cycle admits it onto a frame, and it also holds the one bound:
``max_waiting_requests`` requests wait at most, one more is refused (``QueueFullError``).
docs/design.md explains why, with first come first served admission, no request waits forever
(and so no timeout).

With several robots (``docs/design.md#several-robots``) the bound is shared without eviction
(a request once queued is never dropped for another): each robot is guaranteed
:func:`queue_share` places, and a robot beyond its guarantee takes a free place only while the
other robots' unused guaranteed places stay free, so one robot flooding never takes the place
of another's request within its guarantee. Invariant: the waiting requests plus every robot's
unused guaranteed places are at most the bound (while the robots and the bound stay as they
are; after a change, a robot within its guarantee still takes any free place, and the others
wait for the queue to drain).

Not thread-safe: the engine makes every call under its lock.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Collection, Iterator

from oxygen_ros.sched.request import Request


def queue_share(limit: int, num_robots: int) -> int:
    """Return the places guaranteed to each robot: ``floor(limit / num_robots)``, at least 1."""
    return max(1, limit // num_robots)


class QueueFullError(RuntimeError):
    """
    No place in the waiting queue for one more request of a robot: it is refused.

    One robot: ``queue full (16 requests waiting, max_waiting_requests 16)``. Several: ``queue
    full for robot 'left' (8 requests waiting, 8 of them its own; 8 places kept for the other
    robots, max_waiting_requests 16)``.

    :ivar num_waiting: the requests waiting (all robots') when it was refused.
    :ivar limit: ``max_waiting_requests`` then.
    :ivar robot: the refused request's robot; None for an engine of one robot.
    :ivar num_own: that robot's requests waiting.
    :ivar num_kept: the other robots' unused guaranteed places (kept free for them).
    """

    def __init__(self, num_waiting: int, limit: int, robot: str | None = None,
                 num_own: int = 0, num_kept: int = 0) -> None:
        if robot is None:
            message = f'queue full ({num_waiting} requests waiting, max_waiting_requests {limit})'
        else:
            message = (f'queue full for robot {robot!r} ({num_waiting} requests waiting, '
                       f'{num_own} of them its own; {num_kept} places kept for the other '
                       f'robots, max_waiting_requests {limit})')
        super().__init__(message)
        self.num_waiting, self.limit = num_waiting, limit
        self.robot, self.num_own, self.num_kept = robot, num_own, num_kept


class RequestQueue:
    """Waiting requests, oldest first (first come first served), counted per robot."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()
        self._per_robot: Counter[str] = Counter()

    def check_room(self, limit: int, robot: str = '',
                   robots: Collection[str] | None = None) -> None:
        """
        Raise ``QueueFullError`` if no place is left for one more request of ``robot``.

        :param limit: ``max_waiting_requests``.
        :param robot: the robot of the request.
        :param robots: the robots sharing the queue (the engine's), ``robot`` among them;
            None: ``robot`` alone, the whole queue its own.
        :raises QueueFullError: ``limit`` requests wait, or ``robot`` has its guaranteed
            places (:func:`queue_share`) and one more would take one kept for another robot.
            Its message is the refusal the node sends back (one robot: ``queue full (16
            requests waiting, max_waiting_requests 16)``).
        :raises ValueError: ``robot`` is not among ``robots``.
        """
        if robots is not None and robot not in robots:
            raise ValueError(f'robot {robot!r} does not share this queue '
                             f'(robots: {sorted(robots)})')
        others = set() if robots is None else set(robots) - {robot}
        share = queue_share(limit, len(others) + 1)
        own, waiting = self._per_robot[robot], len(self._queue)
        kept = sum(max(0, share - self._per_robot[other]) for other in others)
        free = limit - waiting if own < share else limit - waiting - kept
        if free >= 1:
            return
        if others:
            raise QueueFullError(waiting, limit, robot, own, kept)
        raise QueueFullError(waiting, limit)

    def add(self, request: Request, limit: int,
            robots: Collection[str] | None = None) -> None:
        """
        Append ``request`` at the tail.

        :raises QueueFullError: no place for it (:meth:`check_room` of its robot).
        :raises ValueError: its robot is not among ``robots``.
        """
        self.check_room(limit, request.robot, robots)
        self._queue.append(request)
        self._per_robot[request.robot] += 1

    def remove(self, request: Request) -> bool:
        """Remove ``request`` (admitted or cancelled); return whether it was waiting."""
        try:
            self._queue.remove(request)
        except ValueError:
            return False
        self._per_robot[request.robot] -= 1
        if not self._per_robot[request.robot]:
            del self._per_robot[request.robot]
        return True

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


__all__ = ['queue_share', 'QueueFullError', 'RequestQueue']
