"""
The node's chunk-boundary smoothing (parameter ``chunk_smoothing``, ``control.smoothing``).

- ``none``: chunks go out as the model made them.
- ``ensemble``: every chunk is replaced by ACT's temporal ensemble before it is published.
- ``rtc``: the engine denoises each chunk toward the previous one (``control/rtc.py``); the
  inference delay it freezes is measured here, from the node clock at publication minus the
  observation stamp (so it includes waiting for the control tick, vision, prefill and
  denoising, in the node clock's time: sim time on a simulator), on guided chunks only
  (``control.rtc.InferenceDelay``).

Control thread only (no lock).
"""

from __future__ import annotations

from dataclasses import replace

from oxygen_ros.control.rtc import InferenceDelay, RtcRequest
from oxygen_ros.control.smoothing import ChunkSmoothing, TemporalEnsemble
from oxygen_ros.engine import ActionChunk
from oxygen_ros.units import NS_PER_S


class ChunkSmoother:
    """
    One smoothing policy with its state.

    :param mode: the policy.
    :param ensemble_decay: ACT's ``m``.
    :param rtc_max_guidance_weight: RTC's ``beta``.
    """

    def __init__(self, mode: ChunkSmoothing, ensemble_decay: float,
                 rtc_max_guidance_weight: float) -> None:
        self.mode = ChunkSmoothing(mode)
        self.rtc_max_guidance_weight = rtc_max_guidance_weight
        self.ensemble = TemporalEnsemble(ensemble_decay)
        self.delay = InferenceDelay(guided_only=self.mode is ChunkSmoothing.RTC)

    def reset(self) -> None:
        """Start over (at activation): no previous chunk, no delay sample."""
        self.ensemble.reset()
        self.delay.reset()

    def rtc_request(self, action_dt: float) -> RtcRequest | None:
        """
        Return the engine's RTC request for the next cycle (None: not RTC).

        Its delay is None until a guided chunk's latency is measured
        (``InferenceDelay.rtc_request``).
        """
        if self.mode is not ChunkSmoothing.RTC:
            return None
        return self.delay.rtc_request(round(action_dt * NS_PER_S), self.rtc_max_guidance_weight)

    def delay_steps(self, action_dt: float) -> int | None:
        """Return the measured inference delay in action steps (None before a sample)."""
        return self.delay.steps(round(action_dt * NS_PER_S))

    def before_publish(self, chunk: ActionChunk, now_ns: int, action_dt: float) -> ActionChunk:
        """
        Record the chunk's latency and return the chunk to publish.

        :param now_ns: node clock at publication.
        """
        self.delay.record(now_ns - chunk.stamp_ns, chunk.guided)
        if self.mode is not ChunkSmoothing.ENSEMBLE:
            return chunk
        smoothed = self.ensemble.apply(chunk.actions, chunk.stamp_ns,
                                       round(action_dt * NS_PER_S))
        return replace(chunk, actions=smoothed.astype(chunk.actions.dtype))


__all__ = ['ChunkSmoother']
