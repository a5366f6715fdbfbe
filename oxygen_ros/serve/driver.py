"""
The cycle driver: every connection's frames through one engine, one frame at a time.

One thread (``executor``, a single worker) makes every engine call, so frames are served in
the order they arrive and the per-connection text state needs no lock. A frame is one engine
cycle (``Engine.step``, as the node's control cycle): the connection's new text requests are
submitted just before it, so that they are admitted onto *its* frame (their prefix is its
robot's observation); one the scheduler could not admit this cycle (the KV pool or the decode
batch is full) is taken back and waits for the connection's next frame, never for another
robot's. Running requests of every connection decode k tokens per served frame, whoever's
frame it is; each connection's reply carries its own news. A connection that closes ends
its requests (docs/serving.md#language-updates). Only the engine's public API is used
(``oxygen_ros.engine``).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
import itertools
import logging
import time
from typing import Any

import numpy as np

from oxygen_ros.engine import (
    CycleStats, Engine, EngineClosedError, Observation, QueueFullError, StepOutput)
from oxygen_ros.serve.language import ConnectionTexts, LanguageRequest

_LOG = logging.getLogger('oxygen_serve')


class NoAction(RuntimeError):
    """The model made no usable action chunk for a frame (NaN/Inf): nothing to send."""

    def __init__(self) -> None:
        super().__init__('the model produced NaN/Inf actions for this frame; nothing to act on')


def policy_timing(start: float, queued_at: float, action_s: float,
                  stats: CycleStats) -> dict[str, float]:
    """
    Return a reply's ``policy_timing`` (``FrameResult``), ms and the cycle's k and batch.

    :param start: ``time.monotonic()`` when the engine began the frame's work.
    :param queued_at: ``time.monotonic()`` when the frame was handed over.
    :param action_s: from the cycle's start until the frame's chunk was denoised.
    """
    return {'infer_ms': 1e3 * (time.monotonic() - start), 'action_ms': 1e3 * action_s,
            'queue_ms': 1e3 * (start - queued_at), 'tokens_per_cycle': stats.tokens_per_cycle,
            'decode_batch': stats.decode_batch}


@dataclass(slots=True, eq=False)
class Session:
    """One connection as the driver knows it."""

    conn_id: str
    peer: str
    texts: ConnectionTexts
    frames: int = 0


@dataclass(frozen=True, slots=True)
class FrameResult:
    """
    What one frame gives its connection.

    :ivar actions: ``float32 [H, robot_action_dim]`` in robot units (the engine's
        ``ActionChunk.actions``: openpi's output transforms applied).
    :ivar policy_timing: ``infer_ms`` (the engine's work for the frame: the observation
        prepared, the cycle run, as ``Engine.step`` of an ``Observation`` does it),
        ``action_ms`` (from the cycle's start until the chunk was denoised), ``queue_ms``
        (waiting behind other connections' frames), k and the decode batch of the cycle.
    :ivar language_updates: the connection's text news (``ConnectionTexts.take_updates``).
    """

    actions: np.ndarray
    policy_timing: dict[str, float]
    language_updates: list[dict[str, Any]]


class CycleDriver:
    """
    Serve frames of many connections through one engine, one at a time, in one thread.

    :param engine: built and warm; the driver shuts it down in :meth:`shutdown`.
    :param max_language_requests: open text requests per connection.
    """

    def __init__(self, engine: Engine, *, max_language_requests: int) -> None:
        self.engine = engine
        self.executor = ThreadPoolExecutor(1, thread_name_prefix='oxygen-engine')
        """Run every method below but :meth:`open_session` here (``loop.run_in_executor``)."""
        self._max_open = max_language_requests
        self._owner: dict[str, tuple[ConnectionTexts, LanguageRequest]] = {}
        self._ids = itertools.count(1)
        self._last_stamp_ns = 0

    def open_session(self, peer: str) -> Session:
        """Return a new connection's session (any thread)."""
        conn_id = f'c{next(self._ids)}'
        return Session(conn_id, peer, ConnectionTexts(conn_id, self._max_open))

    def _stamp(self) -> int:
        """Return a wall-clock stamp later than every earlier frame's (the frame's id)."""
        self._last_stamp_ns = max(time.time_ns(), self._last_stamp_ns + 1)
        return self._last_stamp_ns

    def submit(self, session: Session, obs: Observation, requests: list[LanguageRequest],
               queued_at: float) -> Future:
        """Queue :meth:`serve_frame` in the driver's thread (any thread); return its future."""
        return self.executor.submit(self.serve_frame, session, obs, requests, queued_at)

    def serve_frame(self, session: Session, obs: Observation,
                    requests: list[LanguageRequest], queued_at: float) -> FrameResult:
        """
        Run one engine cycle on ``obs`` for ``session`` (the driver's thread).

        :param requests: text requests the message asked (refused ones become updates).
        :param queued_at: ``time.monotonic()`` when the frame was handed over.
        :raises ObservationError: the engine refuses ``obs`` (nothing has changed).
        :raises NoAction: the cycle made no action chunk (NaN/Inf); its text went on.
        :raises EngineClosedError: the server is shutting down.
        """
        start = time.monotonic()
        session.texts.ask(requests)
        obs = replace(obs, stamp_ns=self._stamp())
        prepared = self.engine.prepare(obs)
        submitted = self._submit(session.texts)
        out = None
        try:
            out = self.engine.step(prepared)
        finally:
            self._take_back(session.texts, submitted, out, obs.stamp_ns)
        self._route(out)
        session.frames += 1
        if out.action is None:
            raise NoAction()
        timing = policy_timing(start, queued_at, out.stats.action_latency_s, out.stats)
        return FrameResult(out.action.actions, timing, session.texts.take_updates())

    def _submit(self, texts: ConnectionTexts, robot: str = '') -> list[LanguageRequest]:
        """Hand the connection's pending requests to the engine; return those it queued."""
        submitted = []
        for req in texts.pending:
            req_id = texts.engine_id(req)
            try:
                self.engine.submit_text(req.task, question=req.question,
                                        max_tokens=req.max_tokens, req_id=req_id, robot=robot)
            except (QueueFullError, EngineClosedError, ValueError) as exc:
                texts.refuse(req, f'{type(exc).__name__}: {exc}')
                continue
            texts.in_engine[req_id] = req
            self._owner[req_id] = (texts, req)
            submitted.append(req)
        texts.pending = []
        return submitted

    def _take_back(self, texts: ConnectionTexts, submitted: list[LanguageRequest],
                   out: StepOutput | None, stamp_ns: int) -> None:
        """Take back the requests this frame did not admit: they wait for the next one."""
        admitted = set() if out is None else {
            t.req_id for t in out.outputs if t.frame_stamp_ns == stamp_ns or t.finished}
        back = [req for req in submitted if texts.engine_id(req) not in admitted]
        for req in back:
            req_id = texts.engine_id(req)
            self.engine.abort(req_id)
            del texts.in_engine[req_id], self._owner[req_id]
        texts.pending = back + texts.pending

    def _route(self, out: StepOutput) -> None:
        """Hand each text output of the cycle to its connection."""
        for output in out.outputs:
            owner = self._owner.get(output.req_id)
            if owner is None:
                continue
            owner[0].on_output(owner[1], output)
            if output.finished:
                del self._owner[output.req_id]
                owner[0].in_engine.pop(output.req_id, None)

    def close_session(self, session: Session) -> int:
        """End a closed connection's text requests (the driver's thread); return how many."""
        ended = len(session.texts.pending)
        session.texts.pending = []
        for req_id in list(session.texts.in_engine):
            self.engine.abort(req_id)
            self._owner.pop(req_id, None)
            ended += 1
        session.texts.in_engine.clear()
        return ended

    @property
    def num_open_requests(self) -> int:
        """Return the text requests in the engine for every connection."""
        return len(self._owner)

    def shutdown(self) -> None:
        """Finish the frame in hand, then shut the engine down (any thread but the driver's)."""
        self.executor.submit(self.engine.shutdown).result()
        self.executor.shutdown(wait=True)
        _LOG.info('engine shut down')


__all__ = ['CycleDriver', 'FrameResult', 'NoAction', 'Session']
