"""
What the engine hands back per cycle (no torch): the action chunk, texts, timings.

``Engine.step`` returns a ``StepOutput``: the cycle's ``ActionChunk`` (robot units, stamped
with its observation), the ``TextDelta`` of every text request that decoded and the
``TextOutput`` of every one that finished, and the cycle's ``CycleStats``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from oxygen_ros.model.prompt import TextTask
from oxygen_ros.sched.request import FinishReason


@dataclass(frozen=True, slots=True)
class ActionChunk:
    """
    One action chunk in robot units.

    :ivar actions: ``float32 [H, robot_action_dim]`` in robot units (openpi ``Unnormalize``
        and the robot's output transforms); their meaning is ``ModelConfig.action_space``.
    :ivar stamp_ns: stamp of the observation it was computed from.
    :ivar state: ``float64 [state_dim]`` the robot state of that observation (robot units,
        the node's ``joint_names`` order): where a velocity chunk starts.
    :ivar guided: denoised toward the previous chunk (real-time chunking).
    """

    actions: np.ndarray
    stamp_ns: int
    frame_id: int
    state: np.ndarray
    guided: bool = False


@dataclass(frozen=True, slots=True)
class TextOutput:
    """
    A finished (or rejected) text request.

    :ivar text: its text: the concatenation of its ``TextDelta`` pieces (for an aborted
        request, with the text they held back let out); equal to ``tokenizer.decode`` of
        ``token_ids``.
    :ivar finish_reason: STOP (EOS), LENGTH (budget), ABORT; None when it was rejected
        before it ever ran (``error`` says why).
    :ivar frame_stamp_ns: stamp of the observation whose prefix it read (0: none).
    :ivar num_cycles: control cycles from seeding to finish (0: it did not finish).
    """

    req_id: str
    task: TextTask
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None
    frame_stamp_ns: int
    num_cycles: int = 0
    error: str = ''


@dataclass(frozen=True, slots=True)
class TextDelta:
    """
    The tokens one text request decoded in one cycle, and their text (for streaming).

    :ivar token_ids: the new ids in decode order, cut after EOS or the budget (as the
        request keeps them: an EOS that ended it is included).
    :ivar text: the text these ids completed (``IncrementalDetokenizer.push``): ``''`` when
        they complete no character yet; a request's pieces concatenate to its
        ``TextOutput.text``.
    :ivar num_tokens: ids generated so far, these included.
    :ivar frame_stamp_ns: stamp of the observation whose prefix the request reads.
    :ivar finished: this cycle ended the request (its ``TextOutput`` is in the same step).
    """

    req_id: str
    task: TextTask
    token_ids: tuple[int, ...]
    text: str
    num_tokens: int
    frame_stamp_ns: int
    finished: bool


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
        (handed to ``on_action``); NaN in a cycle without one.
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

    @property
    def overhead_s(self) -> float:
        return max(self.total_s - self.forward_s, 0.0)


@dataclass(frozen=True, slots=True)
class StepOutput:
    """
    What one ``Engine.step`` produced.

    :ivar texts: requests that finished (or were dropped) this cycle.
    :ivar text_deltas: per text request that decoded this cycle, its new tokens and their
        text (a finished request's last delta comes in the same step as its ``TextOutput``).
    """

    action: ActionChunk | None
    texts: tuple[TextOutput, ...]
    stats: CycleStats
    text_deltas: tuple[TextDelta, ...] = ()


__all__ = ['ActionChunk', 'CycleStats', 'StepOutput', 'TextDelta', 'TextOutput']
