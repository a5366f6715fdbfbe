"""
Measured job times, and how many decode tokens fit before the action deadline (stdlib only).

The scheduler never guesses a cost: every estimate is an exponential moving average of wall
times the backend measured (``RunnerOutput.timings``). Decode-step and denoise times depend
on the batch size (text rows; action chunks of the robots due together), so they are kept per
batch size; an unmeasured batch size is estimated from the nearest measured larger one, or
scaled up linearly from the largest smaller one (an upper bound, since neither is ever more
than linear in the batch).
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
    denoise_s: dict[int, float] = field(default_factory=dict)
    """Seconds of one denoise call (N Euler steps) per number of action chunks in it."""
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
        elif timing.kind is JobKind.DENOISE and timing.batch_size > 0:
            batch = timing.batch_size
            self.denoise_s[batch] = self._ema(self.denoise_s.get(batch), timing.seconds)
        elif timing.kind is JobKind.SEED and timing.batch_size > 0:
            self.seed_s_per_row = self._ema(self.seed_s_per_row,
                                            timing.seconds / timing.batch_size)
        elif timing.kind is JobKind.DECODE and timing.num_tokens > 0 and timing.batch_size > 0:
            batch = timing.batch_size
            self.decode_step_s[batch] = self._ema(self.decode_step_s.get(batch),
                                                  timing.seconds / timing.num_tokens)

    def decode_step(self, batch_size: int) -> float | None:
        """Return the estimated seconds of one decode step at ``batch_size``, if measurable."""
        return _at_batch(self.decode_step_s, batch_size)

    def denoise(self, batch_size: int) -> float | None:
        """Return the estimated seconds of denoising ``batch_size`` chunks in one call."""
        return _at_batch(self.denoise_s, batch_size)

    def action_path(self, num_images: int, num_prefill_tokens: int, num_seed_rows: int,
                    num_suffix_tokens: int = 0, num_chunks: int = 1) -> float:
        """
        Return the estimated seconds of vision + prefill + denoise + suffix + seed.

        Unmeasured parts count 0. Suffix tokens (short causal rows on a cached root) cost
        per token what the last suffix jobs cost, not what a long prefill does.

        :param num_chunks: action chunks denoised together (one per robot due; 0: none).
        """
        total = 0.0
        if self.suffix_s_per_token is not None:
            total += self.suffix_s_per_token * num_suffix_tokens
        if self.vision_s_per_image is not None:
            total += self.vision_s_per_image * num_images
        if self.prefill_s_per_token is not None:
            total += self.prefill_s_per_token * num_prefill_tokens
        denoise = self.denoise(num_chunks) if num_chunks > 0 else None
        if denoise is not None:
            total += denoise
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


def _at_batch(measured: dict[int, float], batch_size: int) -> float | None:
    """
    Return the time at ``batch_size`` from times measured per batch size (None: none).

    The time measured at that size, else at the nearest larger one, else the largest smaller
    one's scaled up linearly.
    """
    if batch_size in measured:
        return measured[batch_size]
    larger = [b for b in measured if b > batch_size]
    if larger:
        return measured[min(larger)]
    smaller = [b for b in measured if b < batch_size]
    if smaller:
        b = max(smaller)
        return measured[b] * batch_size / b
    return None
