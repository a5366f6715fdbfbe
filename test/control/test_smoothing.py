"""Chunk smoothing: ACT's temporal ensembling (RTC's policy: ``test_rtc.py``)."""

import math

import numpy as np
from oxygen_ros.control.smoothing import TemporalEnsemble

DT = 100_000_000  # 0.1 s


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
