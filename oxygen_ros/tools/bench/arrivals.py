"""
Text-request arrival patterns of ``oxygen_bench engine``, as OxyGen's benchmark has them (pure).

OxyGen ``experiments/common/workload.py``: ``uniform_arrivals`` (one request every ``rate``
frames, or ``1 / rate`` per frame), ``bursty_arrivals`` (``burst_size`` requests every
``burst_every`` frames) and ``poisson_arrivals`` (a Poisson number of requests per frame with
mean ``lam``, seeded). An arrival pattern here is how many requests arrive at frame ``i``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
import enum
import math
import random


class Arrival(str, enum.Enum):
    UNIFORM = 'uniform'
    BURSTY = 'bursty'
    POISSON = 'poisson'


@dataclass(frozen=True, slots=True)
class ArrivalPattern:
    """
    How many text requests arrive at each frame.

    :ivar pattern: uniform, bursty or poisson.
    :ivar every: uniform: one request every ``every`` frames.
    :ivar burst_size: bursty: requests per burst.
    :ivar burst_every: bursty: frames between bursts.
    :ivar rate: poisson: mean requests per frame.
    :ivar seed: poisson: the generator's seed (OxyGen's default: 42).
    :raises ValueError: a count, period or rate out of range.
    """

    pattern: Arrival = Arrival.UNIFORM
    every: int = 1
    burst_size: int = 4
    burst_every: int = 8
    rate: float = 1.0
    seed: int = 42

    def __post_init__(self) -> None:
        object.__setattr__(self, 'pattern', Arrival(self.pattern))
        if min(self.every, self.burst_size, self.burst_every) < 1:
            raise ValueError(f'every, burst_size and burst_every must be >= 1: {self}')
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f'the Poisson rate must be > 0, got {self.rate}')

    @property
    def mean_per_frame(self) -> float:
        """Return the expected requests per frame."""
        if self.pattern is Arrival.UNIFORM:
            return 1.0 / self.every
        if self.pattern is Arrival.BURSTY:
            return self.burst_size / self.burst_every
        return self.rate

    def counts(self, num_frames: int) -> list[int]:
        """Return the requests arriving at frames ``0 .. num_frames - 1`` (reproducible)."""
        if self.pattern is Arrival.UNIFORM:
            return [int(i % self.every == 0) for i in range(num_frames)]
        if self.pattern is Arrival.BURSTY:
            return [self.burst_size if i % self.burst_every == 0 else 0
                    for i in range(num_frames)]
        rng = random.Random(self.seed)
        limit = math.exp(-self.rate)
        out = []
        for _ in range(num_frames):      # Knuth's algorithm, as OxyGen's poisson_arrivals
            k, p = 0, rng.random()
            while p >= limit:
                k += 1
                p *= rng.random()
            out.append(k)
        return out

    def describe(self) -> dict:
        """Return the pattern's fields for the results (JSON)."""
        out = asdict(self)
        out['pattern'] = self.pattern.value
        out['mean_per_frame'] = self.mean_per_frame
        return out


__all__ = ['Arrival', 'ArrivalPattern']
