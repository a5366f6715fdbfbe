"""
One control cycle in two parts, the action chunk first: what ``Engine.begin`` returns.

``Cycle.action`` runs the cycle's plan on the backend up to its action chunk (the backend's
``execute`` yields it with its frame's id the moment it is on the host) and returns it in
robot units; ``Cycle.finish`` runs the rest of the plan (the text jobs) and books the
results: the tokens into the scheduler, one ``TextOutput`` per text request with news, the
cycle's timings. The caller publishes the chunk in between, so it goes out before the cycle's
decoding without the backend or the engine calling back up: the chunk comes back as a value,
at every layer.

Threads: one thread runs a cycle (the caller of ``Engine.begin``); the scheduler is touched
under the engine's lock only while the results are booked, so ``submit_text`` and ``abort``
from other threads go on meanwhile (a request aborted while the plan runs is left out of the
cycle's outputs).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Generator

import numpy as np
from oxygen_ros.backends.interface import Backend, BackendOutput, FrameInputs
from oxygen_ros.control.rtc import ChunkHistory
from oxygen_ros.engine.outputs import ActionChunk, cycle_stats, StepOutput
from oxygen_ros.engine.text_request import TextRequest
from oxygen_ros.sched.output import SchedulerOutput
from oxygen_ros.sched.scheduler import Scheduler
from oxygen_ros.transforms.inputs import PreparedObservation
from oxygen_ros.transforms.normalize import Normalizer
import torch

_LOG = logging.getLogger('oxygen_ros.engine.engine')
"""The engine's logger: its lines name the engine, whichever of its modules writes them."""


class Cycle:
    """
    A control cycle planned and begun: take its chunk (:meth:`action`), then :meth:`finish`.

    Made by ``Engine.begin`` with the engine's parts; run to its end (``finish``) before the
    next cycle begins: the scheduler waits for this plan's results.

    :param plan: the cycle's plan (the scheduler made it).
    :param prepared: the cycle's observation, or None (a cycle without a valid one).
    :param inputs: the frame's inputs for the backend (None with ``prepared``).
    :param t0: ``time.perf_counter()`` when the cycle began (its timings count from here).
    :param dropped: text requests dropped as the cycle began (their own prompt could not be
        built on its frame): their last outputs end the cycle's.
    :param lock: the engine's lock (held while the results are booked).
    :param bytes_per_block: KV bytes of one block of the pool (for the cycle's stats).
    """

    def __init__(self, plan: SchedulerOutput, prepared: PreparedObservation | None,
                 inputs: FrameInputs | None, t0: float, dropped: list[TextRequest], *,
                 scheduler: Scheduler,
                 backend: Backend, lock: threading.Lock, normalizer: Normalizer,
                 history: ChunkHistory, bytes_per_block: int) -> None:
        self._plan, self._prepared, self._t0, self._dropped = plan, prepared, t0, dropped
        self._guided = inputs is not None and inputs.guidance is not None
        self._scheduler, self._lock, self._normalizer = scheduler, lock, normalizer
        self._history, self._bytes_per_block = history, bytes_per_block
        self._run: Generator[tuple[int, torch.Tensor], None, BackendOutput] = \
            backend.execute(plan, inputs)
        self._acted = False
        self._chunk: ActionChunk | None = None
        self._latency = float('nan')
        self._result: BackendOutput | None = None
        self._output: StepOutput | None = None

    def action(self) -> ActionChunk | None:
        """
        Run the plan up to the action chunk and return it (robot units; once per cycle).

        :returns: the chunk, also in the cycle's ``StepOutput``; None for a cycle without a
            valid observation or with non-finite actions (logged), or when called again.
        """
        if self._acted:
            return None
        self._acted = True
        try:
            _, actions = next(self._run)   # the plan's one frame
        except StopIteration as done:   # no denoise job: no frame
            self._result = done.value
            return None
        self._chunk = self._action_chunk(actions)
        self._latency = time.perf_counter() - self._t0
        return self._chunk

    def finish(self) -> StepOutput:
        """
        Run the rest of the plan and book its results; return the cycle's output.

        Takes the action chunk first if :meth:`action` was not called.
        """
        if self._output is not None:
            return self._output
        self.action()
        if self._result is None:
            try:
                next(self._run)   # a plan yields one chunk at most
            except StopIteration as done:
                self._result = done.value
            else:  # pragma: no cover - the Backend contract
                raise RuntimeError('the backend yielded a second action chunk in one cycle')
        result, plan, sched = self._result, self._plan, self._scheduler
        with self._lock:
            decoding = [(req, req.num_output_tokens) for req in map(
                sched.requests.get, result.runner.sampled_token_ids) if req is not None]
            sched.update_from_output(plan, result.runner)
            outputs = [req.output(num_before) for req, num_before in decoding]
            outputs += [req.output(0) for req in self._dropped]
            stats = cycle_stats(plan, result, sched, self._bytes_per_block,
                                time.perf_counter() - self._t0, self._latency)
        self._output = StepOutput(self._chunk, tuple(o for o in outputs if o is not None),
                                  stats)
        return self._output

    def _action_chunk(self, actions: torch.Tensor) -> ActionChunk | None:
        """Return the chunk in robot units (unnormalized) and keep it for RTC; None: NaN/Inf."""
        prepared, frame_id = self._prepared, self._plan.frame_id
        x = actions[0].float().cpu().numpy()
        if not np.all(np.isfinite(x)):
            _LOG.error('frame %d: the model produced NaN/Inf actions; not publishing them',
                       frame_id)
            return None
        robot = self._normalizer.actions_to_robot(x, prepared.state)
        chunk = ActionChunk(np.ascontiguousarray(robot, dtype=np.float32), prepared.stamp_ns,
                            frame_id, prepared.state, self._guided)
        self._history.record(prepared.stamp_ns, x, chunk.actions)
        return chunk


__all__ = ['Cycle']
