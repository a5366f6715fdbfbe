"""Chunk smoothing: RTC's soft mask, the measured delay, ACT's temporal ensembling."""

import math

import numpy as np
from oxygen_ros.control.smoothing import DelayEstimator, rtc_prefix_weights, TemporalEnsemble
import pytest

DT = 100_000_000  # 0.1 s


def test_rtc_prefix_weights_follow_the_paper():
    w = rtc_prefix_weights(horizon=10, delay=2, overlap=7)
    assert list(w[:2]) == [1.0, 1.0]  # executed before the chunk arrives: frozen
    c = (7 - np.arange(2, 7)) / (7 - 2 + 1)  # paper eq. 5
    np.testing.assert_allclose(w[2:7], c * (np.exp(c) - 1) / (math.e - 1))
    assert list(w[7:]) == [0.0, 0.0, 0.0]  # no previous point there: no pull at all
    assert np.all(np.diff(w) <= 0) and 0 < w[6] < w[2] < 1


def test_rtc_prefix_weights_edge_cases():
    assert list(rtc_prefix_weights(4, delay=0, overlap=0)) == [0.0] * 4
    assert list(rtc_prefix_weights(4, delay=3, overlap=3)) == [1.0, 1.0, 1.0, 0.0]


def test_a_delay_beyond_the_overlap_freezes_the_held_points_too():
    """Past the previous chunk's end the robot holds its last point until the chunk arrives."""
    assert list(rtc_prefix_weights(4, delay=3, overlap=1)) == [1.0, 1.0, 1.0, 0.0]
    assert list(rtc_prefix_weights(4, delay=6, overlap=3)) == [1.0] * 4   # clamped to H
    assert list(rtc_prefix_weights(4, delay=2, overlap=0)) == [1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match='overlap <= horizon'):
        rtc_prefix_weights(4, delay=1, overlap=5)


def test_delay_estimator_skips_the_cold_start_and_keeps_the_worst_recent_latency():
    est = DelayEstimator(window=3, skip=1)
    assert est.steps(DT) is None
    est.record(2_000_000_000)  # cold start: skipped
    assert est.steps(DT) is None
    for latency in (120_000_000, 250_000_000, 90_000_000):
        est.record(latency)
    assert est.steps(DT) == 3  # ceil(0.25 s / 0.1 s)
    for latency in (90_000_000, 80_000_000, 100_000_000):
        est.record(latency)
    assert est.steps(DT) == 1  # the window moved on
    est.reset()
    est.record(50_000_000)
    assert est.steps(DT) is None


def test_temporal_ensemble_averages_every_prediction_for_a_time():
    ens = TemporalEnsemble(decay=0.0)
    first = np.arange(4, dtype=float)[:, None] * np.ones((1, 2))  # 0, 1, 2, 3 at t0 + i dt
    np.testing.assert_allclose(ens.apply(first, 0, DT), first)
    second = np.full((4, 2), 10.0)  # stamped one step later: overlaps points 1..3 of first
    out = ens.apply(second, DT, DT)
    np.testing.assert_allclose(out[:, 0], [(1 + 10) / 2, (2 + 10) / 2, (3 + 10) / 2, 10.0])


def test_temporal_ensemble_weights_the_oldest_most_and_interpolates_off_grid():
    ens = TemporalEnsemble(decay=1.0)
    ens.apply(np.zeros((3, 1)), 0, DT)
    out = ens.apply(np.ones((3, 1)), DT // 2, DT)  # half a step later: interpolated
    w_old, w_new = 1.0, math.exp(-1.0)
    np.testing.assert_allclose(out[:2, 0], w_new / (w_old + w_new))
    np.testing.assert_allclose(out[2, 0], 1.0)  # beyond the first chunk's last point


def test_temporal_ensemble_restarts_when_time_goes_back():
    ens = TemporalEnsemble()
    ens.apply(np.zeros((3, 1)), 10 * DT, DT)
    np.testing.assert_allclose(ens.apply(np.ones((3, 1)), 0, DT), 1.0)
