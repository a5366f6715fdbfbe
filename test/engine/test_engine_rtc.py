"""Real-time chunking in the engine: the previous chunk's target, the mask, the guided chunk."""

import numpy as np
from oxygen_ros.config import PrefixAttention
from oxygen_ros.control.smoothing import rtc_prefix_weights
from oxygen_ros.engine.config import EngineConfig, RtcRequest
from oxygen_ros.engine.engine import Engine
from oxygen_ros.observation import Observation
import pytest
import torch

DT = 50_000_000
CAMERAS = ('base_0_rgb', 'left_wrist_0_rgb')


def observation(stamp_ns, seed=0):
    rng = np.random.default_rng(seed)
    images = {slot: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for slot in CAMERAS}
    return Observation(images, np.zeros(8, np.float32), 'pick up the cup', stamp_ns)


@pytest.fixture
def engine(tiny_models, tokenizer):
    cfg = EngineConfig(preset='tiny', seed=2)
    return Engine(cfg, model=tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERAS),
                  tokenizer=tokenizer)


def test_the_target_is_the_previous_chunk_at_the_new_chunks_times(engine):
    rtc = RtcRequest(delay_steps=1, action_dt_ns=DT)
    assert engine._rtc_guidance(0, rtc) is None  # no previous chunk
    first = engine.step(observation(0), rtc=rtc)
    prev = engine._prev_chunk[1]
    guidance = engine._rtc_guidance(2 * DT, rtc)  # two steps later: H = 4 -> 2 points left
    torch.testing.assert_close(guidance.target[0, :2], prev[2:])
    np.testing.assert_allclose(guidance.weights.numpy(), rtc_prefix_weights(4, 1, 2))
    half = engine._rtc_guidance(DT // 2, rtc)  # half a step: interpolated, 3 points left
    torch.testing.assert_close(half.target[0, :3], (prev[:3] + prev[1:]) / 2)
    assert engine._rtc_guidance(0, rtc) is None  # the same frame: no splice
    assert engine._rtc_guidance(5 * DT, rtc) is None  # nothing left of it
    assert first.action is not None


def test_guided_chunks_keep_the_frozen_points_of_the_previous_chunk(engine, tokenizer):
    rtc = RtcRequest(delay_steps=2, action_dt_ns=DT, max_guidance_weight=50.0)
    engine.step(observation(0, seed=1), rtc=rtc)
    prev = engine._prev_chunk[1].clone()
    guided = engine.step(observation(DT, seed=2), rtc=rtc).action.actions
    free_engine = Engine(EngineConfig(preset='tiny', seed=2), model=engine.model,
                         tokenizer=tokenizer)
    free_engine.step(observation(0, seed=1))
    free = free_engine.step(observation(DT, seed=2)).action.actions
    # robot units = normalized here (identity stats); new points 0, 1 are previous 1, 2
    want = prev[1:3, :7].numpy()
    assert np.abs(guided[:2] - want).mean() < 0.5 * np.abs(free[:2] - want).mean()
    engine.reset_chunk_history()
    assert engine._prev_chunk is None
