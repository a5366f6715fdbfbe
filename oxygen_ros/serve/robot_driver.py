"""
Every connection a robot of one engine: the frames that arrive together run in one cycle.

With ``--max-robots`` N > 1, ``oxygen_serve`` gives each connection a robot of its own in the
engine (``Engine.add_robot``, named by the connection id): its own noise, chunk history and
text requests, which are admitted onto its own frames only (``docs/design.md#several-robots``).
A frame is queued for the next cycle; a cycle takes every frame queued when it starts, one
per connection, and runs them as one engine cycle (``Engine.step`` of the robots due: their
vision, prefills and denoise batched where shapes agree, one decode over every robot's text).
A frame that arrives while a cycle runs waits for the next one, never for another
connection's next frame. Each connection's reply carries its own chunk, its own timing and
its own text news; a connection that closes takes its robot with it (its requests end).

One thread (the driver's ``executor``) makes every engine call, as ``driver.CycleDriver``.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, replace
import threading
import time

from oxygen_ros.engine import Observation, ObservationError
from oxygen_ros.serve.driver import CycleDriver, FrameResult, NoAction, policy_timing, Session
from oxygen_ros.serve.language import LanguageRequest


@dataclass(slots=True)
class _Frame:
    session: Session
    obs: Observation
    requests: list[LanguageRequest]
    queued_at: float
    future: Future


class RobotsDriver(CycleDriver):
    """
    Serve every connection as a robot of one engine, the frames due together in one cycle.

    :param engine: built and warm, serving no robot (``Engine(config, robots=())``), with
        ``config.scheduler.max_robots`` the most connections served at once.
    :param max_language_requests: open text requests per connection.
    :raises ValueError: an engine that serves robots already.
    """

    def __init__(self, engine, *, max_language_requests: int) -> None:
        if engine.robots:
            raise ValueError(f'the engine serves robots {engine.robots} already; the policy '
                             f'server makes one per connection')
        super().__init__(engine, max_language_requests=max_language_requests)
        self._lock = threading.Lock()
        self._pending: dict[str, _Frame] = {}
        self._queued = False

    def open_session(self, peer: str) -> Session:
        """
        Return a new connection's session, its robot added to the engine (any thread).

        :raises ValueError: ``max_robots`` connections are served already.
        """
        session = super().open_session(peer)
        self.engine.add_robot(session.conn_id)
        return session

    def submit(self, session: Session, obs: Observation, requests: list[LanguageRequest],
               queued_at: float) -> Future:
        """
        Queue the connection's frame for the next cycle (any thread).

        :returns: a future of its ``FrameResult`` (or of what ``CycleDriver.serve_frame``
            raises for it).
        :raises RuntimeError: a frame of this connection is queued already (a client waits
            for its reply before it sends the next frame, as openpi's does).
        """
        future: Future = Future()
        with self._lock:
            if session.conn_id in self._pending:
                raise RuntimeError(f'{session.conn_id}: a frame is queued already')
            self._pending[session.conn_id] = _Frame(session, obs, requests, queued_at, future)
            start, self._queued = not self._queued, True
        if start:
            self.executor.submit(self._run_cycle)
        return future

    def _run_cycle(self) -> None:
        """Run one engine cycle over every queued frame (the driver's thread)."""
        with self._lock:
            frames, self._pending, self._queued = self._pending, {}, False
        start = time.monotonic()
        due = {}
        for conn_id, frame in frames.items():
            frame.session.texts.ask(frame.requests)
            try:
                due[conn_id] = self.engine.prepare(replace(frame.obs, stamp_ns=self._stamp()))
            except ObservationError as exc:
                frame.future.set_exception(exc)
                continue
            self._submit(frame.session.texts, robot=conn_id)
        try:
            out = self.engine.step(due)
        except BaseException as exc:  # noqa: B902 - each waiting connection gets it
            for conn_id in due:
                frames[conn_id].future.set_exception(exc)
            return
        self._route(out)
        chunks = {chunk.robot: chunk for chunk in out.actions}
        stats = out.stats
        for conn_id in due:
            frame, chunk = frames[conn_id], chunks.get(conn_id)
            frame.session.frames += 1
            if chunk is None:
                frame.future.set_exception(NoAction())
                continue
            timing = {**policy_timing(start, frame.queued_at, stats.action_latencies_s[conn_id],
                                      stats), 'robots': len(due)}
            frame.future.set_result(FrameResult(chunk.actions, timing,
                                                frame.session.texts.take_updates()))

    def close_session(self, session: Session) -> int:
        """End a closed connection's robot and its text requests (the driver's thread)."""
        with self._lock:
            self._pending.pop(session.conn_id, None)
        ended = len(session.texts.pending) + len(session.texts.in_engine)
        session.texts.pending = []
        for req_id in session.texts.in_engine:
            self._owner.pop(req_id, None)
        session.texts.in_engine.clear()
        self.engine.remove_robot(session.conn_id)
        return ended


__all__ = ['RobotsDriver']
