"""The node's smoothing state: measured delay, RTC requests, ensembled chunks."""

import numpy as np
from oxygen_ros.control.rtc import RtcRequest
from oxygen_ros.control.smoothing import ChunkSmoothing
from oxygen_ros.engine.outputs import ActionChunk
from oxygen_ros.ros.chunk_smoother import ChunkSmoother

DT = 0.1
MS = 1_000_000


def chunk(value, stamp_ns, guided=False):
    return ActionChunk(np.full((4, 2), value, np.float32), stamp_ns, 0, np.zeros(2), guided)


def test_rtc_requests_carry_the_delay_measured_on_guided_chunks_after_the_cold_start():
    smoother = ChunkSmoother(ChunkSmoothing.RTC, 0.01, rtc_max_guidance_weight=3.0)
    # nothing measured yet: guide, freezing all the previous chunk covers
    assert smoother.rtc_request(DT) == RtcRequest(None, 100 * MS, 3.0)
    smoother.before_publish(chunk(1.0, 0), 50 * MS, DT)   # unguided (no previous chunk)
    assert smoother.delay_steps(DT) is None                # not measured: no guidance cost
    for i, latency_ms in enumerate((900, 700, 130, 180), 1):  # two cold-start samples skipped
        out = smoother.before_publish(chunk(1.0, i * 100 * MS, guided=True),
                                      i * 100 * MS + latency_ms * MS, DT)
        np.testing.assert_array_equal(out.actions, 1.0)  # rtc changes nothing here
    assert smoother.rtc_request(DT) == RtcRequest(2, 100 * MS, 3.0)  # ceil(0.18 / 0.1)
    assert smoother.delay_steps(DT) == 2
    smoother.reset()
    assert smoother.rtc_request(DT) == RtcRequest(None, 100 * MS, 3.0)


def test_ensemble_mode_publishes_the_ensembled_chunk_and_asks_no_guidance():
    smoother = ChunkSmoother(ChunkSmoothing.ENSEMBLE, ensemble_decay=0.0,
                             rtc_max_guidance_weight=5.0)
    smoother.before_publish(chunk(0.0, 0), 50 * MS, DT)
    out = smoother.before_publish(chunk(1.0, 100 * MS), 150 * MS, DT)
    np.testing.assert_allclose(out.actions[:, 0], [0.5, 0.5, 0.5, 1.0])
    assert out.actions.dtype == np.float32 and smoother.rtc_request(DT) is None


def test_none_mode_passes_chunks_through():
    smoother = ChunkSmoother(ChunkSmoothing.NONE, 0.01, 5.0)
    c = chunk(2.0, 0)
    assert smoother.before_publish(c, 10 * MS, DT) is c
    assert smoother.rtc_request(DT) is None
