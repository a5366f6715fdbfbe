"""OxyGen's request-arrival patterns of oxygen_bench engine."""

import math
import random

from oxygen_ros.tools.bench.arrivals import Arrival, ArrivalPattern
import pytest


def test_uniform_and_bursty_arrivals():
    assert ArrivalPattern(Arrival.UNIFORM, every=3).counts(7) == [1, 0, 0, 1, 0, 0, 1]
    assert ArrivalPattern().counts(3) == [1, 1, 1]
    bursty = ArrivalPattern(Arrival.BURSTY, burst_size=4, burst_every=8)
    assert bursty.counts(17) == [4] + [0] * 7 + [4] + [0] * 7 + [4]
    assert bursty.mean_per_frame == 0.5


def oxygen_poisson(lam, seed, frames):
    """Return the request counts of OxyGen's poisson_arrivals (experiments/common/workload.py)."""
    rng = random.Random(seed)
    out = []
    for _ in range(frames):
        limit, k, p = math.exp(-lam), 0, 1.0
        while True:
            p *= rng.random()
            if p < limit:
                break
            k += 1
        out.append(k)
    return out


def test_poisson_arrivals_are_oxygens_and_reproducible():
    pattern = ArrivalPattern(Arrival.POISSON, rate=1.5, seed=42)
    counts = pattern.counts(2000)
    assert counts == oxygen_poisson(1.5, 42, 2000) == pattern.counts(2000)
    assert sum(counts) / len(counts) == pytest.approx(1.5, abs=0.1)
    assert pattern.describe()['mean_per_frame'] == 1.5
    assert ArrivalPattern(Arrival.POISSON, rate=1.5, seed=7).counts(50) != counts[:50]


def test_bad_patterns_are_refused():
    with pytest.raises(ValueError, match='must be >= 1'):
        ArrivalPattern(Arrival.BURSTY, burst_every=0)
    with pytest.raises(ValueError, match='the Poisson rate must be > 0'):
        ArrivalPattern(Arrival.POISSON, rate=0.0)
    with pytest.raises(ValueError):
        ArrivalPattern('sometimes')
