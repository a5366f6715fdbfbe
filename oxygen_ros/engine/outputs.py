"""
What the engine hands back per cycle (no torch): the action chunk, texts, timings.

``Engine.step`` returns a ``StepOutput``: the cycle's ``ActionChunk`` (one per robot due;
robot units, stamped with its observation), one ``TextOutput`` per text request with news
(tokens decoded, or its end), and the cycle's ``CycleStats`` (counted from the plan, what
the backend reported and the scheduler after it: :func:`cycle_stats`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, TYPE_CHECKING

import numpy as np
from oxygen_ros.sched.output import JobKind, PrefillJob, SegmentKind, SuffixJob
from oxygen_ros.sched.request import FinishReason
from oxygen_ros.transforms.prompt import TextTask

if TYPE_CHECKING:
    from oxygen_ros.backends.interface import BackendOutput
    from oxygen_ros.sched.output import SchedulerOutput
    from oxygen_ros.sched.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class ActionChunk:
    """
    One action chunk in robot units.

    :ivar actions: ``float32 [H, robot_action_dim]`` in robot units (openpi ``Unnormalize``
        and the robot's output transforms); their meaning is ``RobotPolicy.action_space``.
    :ivar stamp_ns: stamp of the observation it was computed from.
    :ivar state: ``float64 [state_dim]`` the robot state of that observation (robot units,
        the node's ``joint_names`` order): where a velocity chunk starts.
    :ivar guided: denoised toward the previous chunk (real-time chunking).
    :ivar robot: the robot it is for (``''``: the engine's one unnamed robot).
    """

    actions: np.ndarray
    stamp_ns: int
    frame_id: int
    state: np.ndarray
    guided: bool = False
    robot: str = ''


@dataclass(frozen=True, slots=True)
class TextOutput:
    """
    One text request's news of one cycle: its new tokens and their text, or its end.

    One per request per cycle, in one stream (``StepOutput.outputs``), as vLLM's
    ``RequestOutput`` with ``finished`` and ``finish_reason``: a request that decoded this
    cycle, one that finished (its last output carries the whole text), one the cycle dropped;
    ``Engine.abort`` and ``Engine.shutdown`` return the last output of the requests they end.

    :ivar new_token_ids: the ids it kept this cycle in decode order, cut after EOS or the
        budget (an EOS that ended it is included).
    :ivar new_text: the text these ids completed (``IncrementalDetokenizer.push``): ``''``
        when they complete no character yet; at the end, the text still held back let out.
        A request's pieces concatenate to its ``text``.
    :ivar num_tokens: ids generated so far, these included.
    :ivar frame_stamp_ns: stamp of the observation whose prefix it read (0: none).
    :ivar finish_reason: how it ended (``FinishReason``); None while it runs.
    :ivar text: its whole text, in its last output (``finished``), equal to
        ``tokenizer.decode`` of ``token_ids``; ``''`` before.
    :ivar token_ids: its whole ids, in its last output; ``()`` before.
    :ivar num_cycles: control cycles from seeding to finish (0: it did not finish decoding).
    :ivar error: why it ended without its text (``DROPPED``), else ``''``.
    :ivar robot: the robot it was asked for (``Engine.submit_text``).
    """

    req_id: str
    task: TextTask
    new_token_ids: tuple[int, ...]
    new_text: str
    num_tokens: int
    frame_stamp_ns: int
    finish_reason: FinishReason | None = None
    text: str = ''
    token_ids: tuple[int, ...] = ()
    num_cycles: int = 0
    error: str = ''
    robot: str = ''

    @property
    def finished(self) -> bool:
        """Return whether this output ends the request."""
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class CycleStats:
    """
    Measurements of one control cycle.

    :ivar total_s: wall time of ``Engine.step``.
    :ivar forward_s: time inside model forward passes (the rest is bookkeeping overhead).
    :ivar seconds_by_job: forward time per job kind (``JobKind.value``).
    :ivar kv_used_bytes: KV held at the end of the cycle (live requests' prefixes and
        budgets).
    :ivar kv_peak_bytes: the most KV held at any point of the cycle (the action's prefix and
        requests that finished this cycle included).
    :ivar action_latency_s: from the start of ``step`` until the action chunk was ready
        (``Cycle.action`` handed it out; with several robots' frames, the last one); NaN in a
        cycle without one.
    :ivar action_latencies_s: the same per robot whose chunk the cycle made (robot -> s).
    :ivar full_prefills: prefills over a frame's images this cycle (the action's prefix, and
        every copy or other prompt a text job needed: the waste OxyGen removes).
    :ivar prefill_tokens: tokens of those and of causal-text prompt segments.
    :ivar suffix_tokens: tokens of causal suffixes on action prefixes (text on the root).
    """

    cycle_id: int
    total_s: float
    forward_s: float
    seconds_by_job: dict[str, float]
    tokens_per_cycle: int
    decode_batch: int
    tokens_generated: int
    num_running: int
    num_waiting: int
    kv_used_blocks: int
    kv_capacity_blocks: int
    kv_used_bytes: int
    kv_peak_bytes: int = 0
    action_latency_s: float = float('nan')
    full_prefills: int = 0
    prefill_tokens: int = 0
    suffix_tokens: int = 0
    action_latencies_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def overhead_s(self) -> float:
        return max(self.total_s - self.forward_s, 0.0)


@dataclass(frozen=True, slots=True)
class StepOutput:
    """
    What one ``Engine.step`` produced.

    :ivar actions: the cycle's chunks, one per robot whose frame it denoised (finite ones),
        in the order they were made.
    :ivar outputs: one per text request with news this cycle, in order: those that decoded
        (a finished one with its end), then those the cycle dropped.
    """

    actions: tuple[ActionChunk, ...]
    outputs: tuple[TextOutput, ...]
    stats: CycleStats

    @property
    def action(self) -> ActionChunk | None:
        """
        Return the chunk of a one-robot cycle, None without one.

        :raises ValueError: the cycle made several robots' chunks (read ``actions``).
        """
        if len(self.actions) > 1:
            raise ValueError(f'chunks of {len(self.actions)} robots in this cycle: read actions')
        return self.actions[0] if self.actions else None

    @property
    def finished(self) -> tuple[TextOutput, ...]:
        """Return the outputs that end their request (finished or dropped this cycle)."""
        return tuple(out for out in self.outputs if out.finished)


def cycle_stats(plan: SchedulerOutput, result: BackendOutput, scheduler: Scheduler,
                bytes_per_block: int, total_s: float,
                action_latencies_s: Mapping[str, float]) -> CycleStats:
    """
    Return the measurements of one cycle: its plan, as the backend ran it, and the scheduler.

    :param scheduler: after ``update_from_output`` of the plan (the counts at the cycle's end).
    :param bytes_per_block: KV bytes of one block of the pool (every layer, K and V).
    :param total_s: wall time of the cycle; ``action_latencies_s`` as ``CycleStats``.
    """
    by_job: dict[str, float] = {}
    decode_batch = 0
    for t in result.runner.timings:
        by_job[t.kind.value] = by_job.get(t.kind.value, 0.0) + t.seconds
        if t.kind is JobKind.DECODE:
            decode_batch = max(decode_batch, t.batch_size)
    generated = sum(len(tokens) for tokens in result.runner.sampled_token_ids.values())
    kv = scheduler.kv
    prefills = [j for j in plan.jobs if isinstance(j, PrefillJob)]
    return CycleStats(
        cycle_id=plan.cycle_id, total_s=total_s, forward_s=result.forward_seconds,
        seconds_by_job=by_job, tokens_per_cycle=plan.tokens_per_cycle,
        decode_batch=decode_batch, tokens_generated=generated,
        num_running=scheduler.num_running, num_waiting=scheduler.num_waiting,
        kv_used_blocks=kv.num_used_blocks, kv_capacity_blocks=kv.capacity_blocks,
        kv_used_bytes=kv.num_used_blocks * bytes_per_block,
        kv_peak_bytes=kv.pool.peak_used_blocks * bytes_per_block,
        action_latency_s=max(action_latencies_s.values(), default=float('nan')),
        action_latencies_s=dict(action_latencies_s),
        full_prefills=sum(j.segment_kind is not SegmentKind.TEXT for j in prefills),
        prefill_tokens=sum(j.num_tokens for j in prefills),
        suffix_tokens=sum(j.num_tokens for j in plan.jobs if isinstance(j, SuffixJob)))


__all__ = ['ActionChunk', 'CycleStats', 'StepOutput', 'TextOutput', 'cycle_stats']
