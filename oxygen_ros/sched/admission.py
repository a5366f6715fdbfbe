"""
Which waiting text requests one cycle may try to admit, robot by robot (stdlib only).

The scheduler's waiting queue is one queue in arrival order (``request_queue.py``); with
several robots each request names its robot and is admitted onto that robot's frame only
(``docs/design.md#several-robots``). A cycle walks the queue from its head:

- a request whose robot has no frame this cycle (not due, or its input stale) is passed over
  and keeps its place: a robot not due never holds up the others;
- first come first served per robot: once one request of a robot is not admitted (the time
  before the deadline, the KV pool, the decode batch), the robot's later requests wait too
  (``close``), as vLLM's ``schedule`` stops where ``allocate_slots`` fails; the other robots'
  requests are still tried;
- a request the *pool* refused (KV blocks or a decode-batch row) becomes a *claim*, kept
  across cycles until it is admitted or aborted: every later request of another robot is
  admitted only if it leaves room for every claim ahead of it, so a robot whose frames come
  rarely is not starved by the robots whose frames come often. The room a claim keeps is its
  most blocks (``Scheduler.max_blocks_needed``) and one decode row, plus, once for all claims,
  a whole action reserve: on the claim's next frame every robot due may take its action
  prefix before the claim is tried, and the claim must then leave the reserve for the next
  cycle. With that, the argument of ``docs/design.md#scheduler-oxygen_rossched`` (the head
  fits once the running requests are gone) holds per robot.

With one robot this is today's walk: the first request that does not fit ends the cycle's
admissions, and no claim ever reserves anything (a claim reserves only against other robots).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping

from oxygen_ros.sched.request import FrameSpec, Request


@dataclass(slots=True)
class QueueWalk:
    """
    One cycle's walk through the waiting queue.

    :param frames: the cycle's frames by robot.
    :param claims: ids of the requests the pool refused (the scheduler's, across cycles);
        the walk adds and removes ids in place.
    :param claim_blocks: the most blocks a request may need (what a claim keeps free).
    :param reserve_blocks: the action reserve a claim keeps free once for all claims.
    """

    frames: Mapping[str, FrameSpec]
    claims: set[str]
    claim_blocks: Callable[[Request], int]
    reserve_blocks: int
    _closed: set[str] = field(default_factory=set)
    _ahead: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per robot, the blocks and rows of its claims met so far in the walk."""

    def candidates(self, queue: Iterable[Request]) -> Iterator[tuple[Request, FrameSpec]]:
        """
        Yield the requests to try, in queue order, each with its robot's frame.

        A request is yielded before its own claim counts for the requests behind it, so the
        caller's ``close`` or ``admitted`` of it is seen by the rest of the walk.
        """
        for req in list(queue):
            frame = self.frames.get(req.robot)
            if frame is not None and req.robot not in self._closed:
                yield req, frame
            if req.req_id in self.claims:
                blocks, rows = self._ahead.get(req.robot, (0, 0))
                self._ahead[req.robot] = (blocks + self.claim_blocks(req), rows + 1)

    def reserved(self, robot: str) -> tuple[int, int]:
        """
        Return the KV blocks and decode rows a request of ``robot`` must leave free for claims.

        Those of the other robots' claims met so far, plus the action reserve once.
        """
        others = [held for owner, held in self._ahead.items() if owner != robot]
        if not others:
            return 0, 0
        return (self.reserve_blocks + sum(b for b, _ in others), sum(r for _, r in others))

    def close(self, req: Request, *, claim: bool) -> None:
        """
        Let ``req`` wait, and every later request of its robot this cycle.

        :param claim: the pool refused it (KV blocks or the decode batch): it becomes a claim.
        """
        self._closed.add(req.robot)
        if claim:
            self.claims.add(req.req_id)

    def admitted(self, req: Request) -> None:
        """Drop ``req``'s claim, if it held one (it got what it needed)."""
        self.claims.discard(req.req_id)


__all__ = ['QueueWalk']
