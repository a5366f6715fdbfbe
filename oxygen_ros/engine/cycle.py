"""
One control cycle in two parts, the action chunk first: what ``Engine.begin`` returns.

``Cycle.action`` runs the cycle's plan on the backend up to its action chunk (the backend's
``execute`` yields it with its frame's id the moment it is on the host) and returns it in
robot units (``Cycle.actions``: each robot's in turn, when the cycle plans several robots'
frames); ``Cycle.finish`` runs the rest of the plan (the text jobs) and books the
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

from dataclasses import dataclass
import logging
import threading
import time
from typing import Generator, Iterator, Mapping, Sequence

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


@dataclass(frozen=True, slots=True)
class CycleFrame:
    """
    One robot's frame in a cycle: what its chunk is made from and kept for.

    :ivar robot: the robot observed.
    :ivar prepared: its observation, prepared.
    :ivar history: its chunk history (real-time chunking's target; the chunk is kept there).
    :ivar guided: its chunk is denoised toward its previous one.
    """

    robot: str
    prepared: PreparedObservation
    history: ChunkHistory
    guided: bool


class Cycle:
    """
    A control cycle planned and begun: take its chunks (:meth:`actions`), then :meth:`finish`.

    Made by ``Engine.begin`` with the engine's parts; run to its end (``finish``) before the
    next cycle begins: the scheduler waits for this plan's results.

    :param plan: the cycle's plan (the scheduler made it).
    :param frames: the plan's frames by frame id (none: a cycle without a valid observation).
    :param inputs: the frames' inputs for the backend, in the order of ``frames``.
    :param t0: ``time.perf_counter()`` when the cycle began (its timings count from here).
    :param dropped: text requests dropped as the cycle began (their own prompt could not be
        built on its frame): their last outputs end the cycle's.
    :param lock: the engine's lock (held while the results are booked).
    :param bytes_per_block: KV bytes of one block of the pool (for the cycle's stats).
    """

    def __init__(self, plan: SchedulerOutput, frames: Mapping[int, CycleFrame],
                 inputs: Sequence[FrameInputs], t0: float, dropped: list[TextRequest], *,
                 scheduler: Scheduler, backend: Backend, lock: threading.Lock,
                 normalizer: Normalizer, bytes_per_block: int) -> None:
        self._plan, self._frames, self._t0, self._dropped = plan, frames, t0, dropped
        self._scheduler, self._lock, self._normalizer = scheduler, lock, normalizer
        self._bytes_per_block = bytes_per_block
        self._run: Generator[tuple[int, torch.Tensor], None, BackendOutput] = \
            backend.execute(plan, inputs[0] if len(inputs) == 1 else list(inputs) or None)
        self._acted = False
        self._chunks: list[ActionChunk] = []
        self._latencies: dict[str, float] = {}
        self._result: BackendOutput | None = None
        self._output: StepOutput | None = None

    def action(self) -> ActionChunk | None:
        """
        Run the plan up to the action chunk and return it (robot units; once per cycle).

        For a cycle of one robot's frame (several: :meth:`actions`).

        :returns: the chunk, also in the cycle's ``StepOutput``; None for a cycle without a
            valid observation or with non-finite actions (logged), or when called again.
        """
        if self._acted or self._result is not None:
            return None
        self._acted = True
        return self._advance()

    def actions(self) -> Iterator[ActionChunk]:
        """
        Run the plan chunk by chunk: yield each robot's chunk as soon as it is denoised.

        The caller publishes a chunk before it takes the next: a robot's chunk never waits
        for the denoise of another's that comes after it in the plan. Chunks with non-finite
        actions are left out (logged). Chunks already taken (:meth:`action`) are not again.
        """
        self._acted = True
        while self._result is None:
            chunk = self._advance()
            if chunk is not None:
                yield chunk

    def finish(self) -> StepOutput:
        """
        Run the rest of the plan and book its results; return the cycle's output.

        Takes the chunks not taken yet first (they are in ``StepOutput.actions``).
        """
        if self._output is not None:
            return self._output
        self._acted = True
        while self._result is None:
            self._advance()
        result, plan, sched = self._result, self._plan, self._scheduler
        with self._lock:
            decoding = [(req, req.num_output_tokens) for req in map(
                sched.requests.get, result.runner.sampled_token_ids) if req is not None]
            sched.update_from_output(plan, result.runner)
            outputs = [req.output(num_before) for req, num_before in decoding]
            outputs += [req.output(0) for req in self._dropped]
            stats = cycle_stats(plan, result, sched, self._bytes_per_block,
                                time.perf_counter() - self._t0, self._latencies)
        self._output = StepOutput(tuple(self._chunks),
                                  tuple(o for o in outputs if o is not None), stats)
        return self._output

    def _advance(self) -> ActionChunk | None:
        """Run the plan to its next chunk and return it (None: non-finite, or the plan's end)."""
        try:
            frame_id, actions = next(self._run)
        except StopIteration as done:
            self._result = done.value
            return None
        chunk = self._action_chunk(self._frames[frame_id], frame_id, actions)
        if chunk is not None:
            self._chunks.append(chunk)
            self._latencies[chunk.robot] = time.perf_counter() - self._t0
        return chunk

    def _action_chunk(self, frame: CycleFrame, frame_id: int,
                      actions: torch.Tensor) -> ActionChunk | None:
        """Return the chunk in robot units (unnormalized) and keep it for RTC; None: NaN/Inf."""
        prepared = frame.prepared
        x = actions[0].float().cpu().numpy()
        if not np.all(np.isfinite(x)):
            _LOG.error('frame %d%s: the model produced NaN/Inf actions; not publishing them',
                       frame_id, f' (robot {frame.robot})' if frame.robot else '')
            return None
        robot = self._normalizer.actions_to_robot(x, prepared.state)
        chunk = ActionChunk(np.ascontiguousarray(robot, dtype=np.float32), prepared.stamp_ns,
                            frame_id, prepared.state, frame.guided, frame.robot)
        frame.history.record(prepared.stamp_ns, x, chunk.actions)
        return chunk


__all__ = ['Cycle', 'CycleFrame']
