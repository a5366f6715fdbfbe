"""
Measured job times, and how many decode tokens fit before the action deadline (stdlib only).

The scheduler never guesses a cost: every estimate is an exponential moving average of wall
times the backend measured (``RunnerOutput.timings``). Decode-step time depends on the batch
size, so it is kept per batch size; an unmeasured batch size is estimated from the nearest
measured larger one, or scaled up linearly from the largest smaller one (an upper bound,
since a decode step is never more than linear in the batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import math

from oxygen_ros.sched.output import JobKind, JobTiming


@dataclass(slots=True)
class CostModel:
    """
    EMA estimates of job wall times in seconds.

    :param alpha: weight of a new measurement, in (0, 1].
    """

    alpha: float = 0.3
    vision_s_per_image: float | None = None
    prefill_s_per_token: float | None = None
    suffix_s_per_token: float | None = None
    denoise_s: float | None = None
    seed_s_per_row: float | None = None
    decode_step_s: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f'alpha must be in (0, 1], got {self.alpha}')

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.alpha * (new - old)

    def observe(self, timing: JobTiming) -> None:
        """Fold one measured job into the estimates."""
        if timing.seconds < 0 or not math.isfinite(timing.seconds):
            return
        if timing.kind is JobKind.VISION and timing.batch_size > 0:
            self.vision_s_per_image = self._ema(self.vision_s_per_image,
                                                timing.seconds / timing.batch_size)
        elif timing.kind is JobKind.PREFILL and timing.num_tokens > 0:
            self.prefill_s_per_token = self._ema(self.prefill_s_per_token,
                                                 timing.seconds / timing.num_tokens)
        elif timing.kind is JobKind.SUFFIX and timing.num_tokens > 0:
            self.suffix_s_per_token = self._ema(self.suffix_s_per_token,
                                                timing.seconds / timing.num_tokens)
        elif timing.kind is JobKind.DENOISE:
            self.denoise_s = self._ema(self.denoise_s, timing.seconds)
        elif timing.kind is JobKind.SEED and timing.batch_size > 0:
            self.seed_s_per_row = self._ema(self.seed_s_per_row,
                                            timing.seconds / timing.batch_size)
        elif timing.kind is JobKind.DECODE and timing.num_tokens > 0 and timing.batch_size > 0:
            batch = timing.batch_size
            self.decode_step_s[batch] = self._ema(self.decode_step_s.get(batch),
                                                  timing.seconds / timing.num_tokens)

    def decode_step(self, batch_size: int) -> float | None:
        """Return the estimated seconds of one decode step at ``batch_size``, if measurable."""
        if batch_size in self.decode_step_s:
            return self.decode_step_s[batch_size]
        larger = [b for b in self.decode_step_s if b > batch_size]
        if larger:
            return self.decode_step_s[min(larger)]
        smaller = [b for b in self.decode_step_s if b < batch_size]
        if smaller:
            b = max(smaller)
            return self.decode_step_s[b] * batch_size / b
        return None

    def action_path(self, num_images: int, num_prefill_tokens: int, num_seed_rows: int,
                    num_suffix_tokens: int = 0) -> float:
        """
        Return the estimated seconds of vision + prefill + denoise + suffix + seed.

        Unmeasured parts count 0. Suffix tokens (short causal rows on a cached root) cost
        per token what the last suffix jobs cost, not what a long prefill does.
        """
        total = 0.0
        if self.suffix_s_per_token is not None:
            total += self.suffix_s_per_token * num_suffix_tokens
        if self.vision_s_per_image is not None:
            total += self.vision_s_per_image * num_images
        if self.prefill_s_per_token is not None:
            total += self.prefill_s_per_token * num_prefill_tokens
        if self.denoise_s is not None:
            total += self.denoise_s
        if self.seed_s_per_row is not None:
            total += self.seed_s_per_row * num_seed_rows
        return total

    def tokens_within(self, seconds_left: float, batch_size: int, k_max: int,
                      k_min: int) -> int:
        """
        Return how many decode steps of ``batch_size`` rows fit in ``seconds_left``.

        The answer is clamped to [k_min, k_max]; with no decode measurement yet it is k_max.
        """
        step = self.decode_step(batch_size)
        if step is None or step <= 0.0:
            return k_max
        fit = math.floor(max(seconds_left, 0.0) / step)
        return max(k_min, min(k_max, fit))
