"""RTC's policy: the soft mask, the guidance target of the previous chunk, the inference delay."""

import math

import numpy as np
from oxygen_ros.control.rtc import ChunkHistory, InferenceDelay, RtcRequest, soft_mask
import pytest

DT = 100_000_000  # 0.1 s


def test_soft_mask_follows_the_paper():
    w = soft_mask(horizon=10, delay=2, overlap=7)
    assert list(w[:2]) == [1.0, 1.0]  # executed before the chunk arrives: frozen
    c = (7 - np.arange(2, 7)) / (7 - 2 + 1)  # paper eq. 5
    np.testing.assert_allclose(w[2:7], c * (np.exp(c) - 1) / (math.e - 1))
    assert list(w[7:]) == [0.0, 0.0, 0.0]  # no previous point there: no pull at all
    assert np.all(np.diff(w) <= 0) and 0 < w[6] < w[2] < 1


def test_soft_mask_edge_cases():
    assert list(soft_mask(4, delay=0, overlap=0)) == [0.0] * 4
    assert list(soft_mask(4, delay=3, overlap=3)) == [1.0, 1.0, 1.0, 0.0]


def test_a_delay_beyond_the_overlap_freezes_the_held_points_too():
    """Past the previous chunk's end the robot holds its last point until the chunk arrives."""
    assert list(soft_mask(4, delay=3, overlap=1)) == [1.0, 1.0, 1.0, 0.0]
    assert list(soft_mask(4, delay=6, overlap=3)) == [1.0] * 4   # clamped to H
    assert list(soft_mask(4, delay=2, overlap=0)) == [1.0, 1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match='overlap <= horizon'):
        soft_mask(4, delay=1, overlap=5)


def test_inference_delay_skips_the_cold_start_and_keeps_the_worst_recent_latency():
    est = InferenceDelay(window=3, skip=1)
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


def test_guided_only_counts_guided_chunks_and_builds_the_request():
    est = InferenceDelay(window=3, skip=1, guided_only=True)
    assert est.rtc_request(DT, 3.0) == RtcRequest(None, DT, 3.0)
    est.record(50_000_000)                      # unguided: no guidance cost, not counted
    est.record(900_000_000, guided=True)        # the cold start: skipped
    assert est.steps(DT) is None
    est.record(50_000_000)                      # unguided again: still not counted
    est.record(180_000_000, guided=True)
    assert est.rtc_request(DT, 3.0) == RtcRequest(2, DT, 3.0)   # ceil(0.18 / 0.1)


@pytest.mark.parametrize('fields', [(-1, DT, 5.0), (1, 0, 5.0), (None, DT, 0.0)])
def test_a_request_out_of_range_is_refused(fields):
    with pytest.raises(ValueError, match='RtcRequest needs delay_steps >= 0, action_dt_ns > 0'):
        RtcRequest(*fields)


class AbsoluteActions:
    """Model units where no action is relative to the state (``Normalizer`` without adapter)."""

    relative_actions = False

    def actions_to_model(self, actions, state=None):
        raise AssertionError('absolute actions are never re-anchored')


def test_the_target_is_the_previous_chunk_in_float32_and_held_past_its_end():
    history = ChunkHistory(AbsoluteActions())
    model = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    history.record(0, model, np.zeros((4, 2)))
    model[:] = 0.0                               # the caller's buffer is reused: a copy is kept
    prev = history.previous.model
    assert prev.dtype == np.float32 and np.abs(prev).min() > 0
    third = history.guidance(DT // 3, np.zeros(2), RtcRequest(3, DT, 7.0))
    frac = np.float32(1 / 3)
    assert third.target.dtype == np.float32 and third.max_guidance_weight == 7.0
    np.testing.assert_array_equal(third.target[:3], prev[:3] * (1 - frac) + prev[1:] * frac)
    assert not third.target[3].any()             # not covered, not executed: no target
    late = history.guidance(3 * DT, np.zeros(2), RtcRequest(3, DT))
    np.testing.assert_array_equal(late.target[:3], np.repeat(prev[3:], 3, axis=0))
    np.testing.assert_array_equal(late.soft_mask, [1.0, 1.0, 1.0, 0.0])
