"""Real-time chunking in the engine: the previous chunk's target, the mask, the guided chunk."""

from dataclasses import replace

import numpy as np
from oxygen_ros.config import PrefixAttention
from oxygen_ros.control.rtc import RtcRequest, soft_mask
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.observation import Observation
from oxygen_ros.policies import preset_robot
from oxygen_ros.policies.aloha import ALOHA, AlohaPolicy
from oxygen_ros.transforms.norm_stats import NormStats
from oxygen_ros.transforms.normalize import Normalizer, QuantityNorm
import pytest
import torch

DT = 50_000_000
CAMERAS = ('base_0_rgb', 'left_wrist_0_rgb')


def observation(stamp_ns, seed=0, state=None, prompt='pick up the cup'):
    rng = np.random.default_rng(seed)
    images = {slot: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for slot in CAMERAS}
    state = np.zeros(8, np.float32) if state is None else np.asarray(state, np.float32)
    return Observation(images, state, prompt, stamp_ns)


@pytest.fixture
def engine(tiny_models, tokenizer):
    cfg = EngineConfig(preset='tiny', seed=2)
    return Engine(cfg, model=tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERAS),
                  tokenizer=tokenizer)


def record_cycles(engine):
    """Return the list each cycle appends (its frame's guidance, its normalized actions) to."""
    seen, execute = [], engine.backend.execute

    def recording(plan, frame):          # a plan runs as a generator: its chunk, then this
        out = yield from execute(plan, frame)
        if frame is not None:
            seen.append((frame.guidance, out.actions[0].clone()))
        return out
    engine.backend.execute = recording
    return seen


def test_the_target_is_the_previous_chunk_at_the_new_chunks_times(engine):
    rtc = RtcRequest(delay_steps=1, action_dt_ns=DT)
    history = engine.chunk_history
    state = np.zeros(8)
    assert history.guidance(0, state, rtc) is None  # no previous chunk
    first = engine.step(observation(0), rtc=rtc)
    prev = history.previous.model
    guidance = history.guidance(2 * DT, state, rtc)  # two steps later: H = 4 -> 2 points left
    torch.testing.assert_close(guidance.target[:2], prev[2:])
    np.testing.assert_allclose(guidance.soft_mask, soft_mask(4, 1, 2))
    half = history.guidance(DT // 2, state, rtc)  # half a step: interpolated, 3 points left
    torch.testing.assert_close(half.target[:3], (prev[:3] + prev[1:]) / 2)
    assert history.guidance(-DT, state, rtc) is None  # time went back
    assert history.guidance(5 * DT, state, replace(rtc, delay_steps=0)) is None  # all gone
    assert first.action is not None


def test_guided_chunks_keep_the_frozen_points_of_the_previous_chunk(engine, tokenizer):
    rtc = RtcRequest(delay_steps=2, action_dt_ns=DT, max_guidance_weight=50.0)
    engine.step(observation(0, seed=1), rtc=rtc)
    prev = engine.chunk_history.previous.model.copy()
    guided = engine.step(observation(DT, seed=2), rtc=rtc).action.actions
    free_engine = Engine(EngineConfig(preset='tiny', seed=2), model=engine.model,
                         tokenizer=tokenizer)
    free_engine.step(observation(0, seed=1))
    free = free_engine.step(observation(DT, seed=2)).action.actions
    # robot units = normalized here (identity stats); new points 0, 1 are previous 1, 2
    want = prev[1:3, :7]
    assert np.abs(guided[:2] - want).mean() < 0.5 * np.abs(free[:2] - want).mean()
    engine.reset_chunk_history()
    assert engine.chunk_history.previous is None


# -- relative actions: the previous chunk is re-anchored to the new frame's state ------------

def aloha_normalizer(cfg, _robot, stats):
    """Return a normalizer with ALOHA's transforms (arm joints relative to the state)."""
    rng = np.random.default_rng(5)
    low = rng.uniform(-1.5, -0.5, 14)
    actions = NormStats(mean=np.zeros(14), std=np.ones(14), q01=low, q99=low + 2.0)
    # every state in bin 0 of the prompt: 14 numbers fit the tiny preset's 64 prompt tokens
    state = NormStats(mean=np.zeros(14), std=np.ones(14), q01=np.full(14, 1e3),
                      q99=np.full(14, 1e3 + 1))
    return Normalizer(QuantityNorm(state), QuantityNorm(actions), ALOHA.with_cameras(CAMERAS),
                      cfg.action_dim)


def engine_with(normalizer, tiny_models, tokenizer, monkeypatch):
    """Return a tiny engine whose normalizer ``normalizer(cfg, robot, stats)`` makes."""
    monkeypatch.setattr(Normalizer, 'from_config', staticmethod(normalizer))
    out = Engine(EngineConfig(preset='tiny', seed=2),
                 model=tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERAS), tokenizer=tokenizer)
    monkeypatch.undo()
    return out


def test_relative_actions_are_guided_toward_the_previous_chunk_in_the_new_frame(
        tiny_models, tokenizer, monkeypatch):
    """pi05_base's ALOHA arm joints are offsets from the state: the target follows the state."""
    engine = engine_with(aloha_normalizer, tiny_models, tokenizer, monkeypatch)
    assert isinstance(engine.normalizer.robot, AlohaPolicy)
    seen = record_cycles(engine)
    rtc = RtcRequest(delay_steps=1, action_dt_ns=DT)
    s0 = np.linspace(-0.4, 0.4, 14)
    s0[[6, 13]] = 0.5                                    # grippers half open
    s1 = s0 + np.where(np.arange(14) % 7 == 6, 0.0, 0.3)  # every arm joint moved 0.3 rad
    first = engine.step(observation(0, seed=1, state=s0, prompt='go'), rtc=rtc).action
    engine.step(observation(2 * DT, seed=2, state=s1, prompt='go'), rtc=rtc)
    target = seen[1][0].target[0].numpy()
    # the target, read as the new frame reads its actions, is where the previous chunk went
    np.testing.assert_allclose(engine.normalizer.actions_to_robot(target, s1)[:2],
                               first.actions[2:], atol=1e-4)
    # padded dims are the previous chunk's model output
    torch.testing.assert_close(seen[1][0].target[0, :2, 14:], seen[0][1][2:, 14:])


@pytest.mark.parametrize('preset', ['pi05_droid', 'pi05_libero', 'tiny'])
def test_absolute_velocity_and_delta_policies_guide_in_model_space_as_before(
        preset, tiny_models, tokenizer, monkeypatch):
    """Actions not relative to the state: the target is the previous chunk as the model made it."""
    robot = preset_robot(preset)
    assert not robot.relative_actions

    def normalizer(cfg, _robot, _stats):
        rng = np.random.default_rng(7)
        low = rng.uniform(-1.5, -0.5, 8)
        stats = NormStats(mean=np.zeros(8), std=np.ones(8), q01=low, q99=low + 3.0)
        return Normalizer(QuantityNorm(stats), QuantityNorm(stats), robot, cfg.action_dim)
    engine = engine_with(normalizer, tiny_models, tokenizer, monkeypatch)
    seen = record_cycles(engine)
    rtc = RtcRequest(delay_steps=1, action_dt_ns=DT)
    engine.step(observation(0, seed=1, state=np.zeros(8)), rtc=rtc)
    engine.step(observation(DT, seed=2, state=np.full(8, 0.3)), rtc=rtc)
    assert torch.equal(seen[1][0].target[0, :3], seen[0][1][1:])


# -- the same camera frame twice (a slow or dropping camera) ---------------------------------

def test_the_same_frame_twice_is_guided_over_the_whole_chunk(engine, tokenizer):
    """Shift 0: the previous chunk covers every point; an unguided chunk would jump away."""
    seen = record_cycles(engine)
    rtc = RtcRequest(delay_steps=1, action_dt_ns=DT)
    first = engine.step(observation(0, seed=1), rtc=rtc).action.actions
    again = engine.step(observation(0, seed=1), rtc=rtc).action.actions
    guidance = seen[1][0]
    assert guidance is not None
    torch.testing.assert_close(guidance.target[0], seen[0][1])
    np.testing.assert_allclose(guidance.soft_mask.numpy(), soft_mask(4, 1, 4))
    free_engine = Engine(EngineConfig(preset='tiny', seed=2), model=engine.model,
                         tokenizer=tokenizer)
    free_engine.step(observation(0, seed=1))
    free = free_engine.step(observation(0, seed=1)).action.actions   # what it was before
    assert np.abs(again[:2] - first[:2]).max() < 0.5 * np.abs(free[:2] - first[:2]).max()


# -- a delay beyond the overlap (dropped cycles, latency near H dt) --------------------------

def test_points_executed_past_the_previous_chunks_end_are_guided_to_its_held_last_point(
        engine, tokenizer):
    """H = 4: three steps later one point is left, but three are executed before arrival."""
    seen = record_cycles(engine)
    rtc = RtcRequest(delay_steps=3, action_dt_ns=DT, max_guidance_weight=50.0)
    engine.step(observation(0, seed=1), rtc=rtc)
    late = engine.step(observation(3 * DT, seed=2), rtc=rtc).action.actions
    guidance, prev = seen[1][0], seen[0][1]
    np.testing.assert_allclose(guidance.soft_mask.numpy(), [1.0, 1.0, 1.0, 0.0])
    torch.testing.assert_close(guidance.target[0, :3], prev[3:].expand(3, -1))
    free_engine = Engine(EngineConfig(preset='tiny', seed=2), model=engine.model,
                         tokenizer=tokenizer)
    free_engine.step(observation(0, seed=1))
    free = free_engine.step(observation(3 * DT, seed=2)).action.actions
    held = prev[3, :7].numpy()              # robot units = normalized (identity stats)
    assert np.abs(late[1:3] - held).mean() < 0.5 * np.abs(free[1:3] - held).mean()
    # nothing left and nothing executed before arrival: no guidance at all
    assert engine.chunk_history.guidance(9 * DT, np.zeros(8), replace(rtc, delay_steps=0)) \
        is None


# -- warm-up: the guided path is warmed up too ------------------------------------------------

def test_the_warm_up_of_an_rtc_engine_runs_the_guided_path_and_forgets_its_chunks(
        tiny_models, tokenizer):
    engine = Engine(EngineConfig.create(preset='tiny', seed=2, rtc=True),
                    model=tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERAS),
                    tokenizer=tokenizer)
    seen = record_cycles(engine)
    engine.warmup(observation(0, seed=1))
    assert seen[-1][0] is not None                          # the last warm-up cycle guided
    assert all(g is None for g, _ in seen[:-1])
    assert engine.chunk_history.previous is None            # the robot's first chunk is free
    plain = Engine(EngineConfig(preset='tiny', seed=2),
                   model=tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERAS),
                   tokenizer=tokenizer)
    plain_seen = record_cycles(plain)
    plain.warmup(observation(0, seed=1))
    assert all(g is None for g, _ in plain_seen)            # no guided cycle without rtc
    out = engine.step(observation(DT, seed=2), rtc=RtcRequest(None, DT))
    assert not out.action.guided and seen[-1][0] is None    # no previous chunk yet
    out = engine.step(observation(2 * DT, seed=3), rtc=RtcRequest(None, DT))
    assert out.action.guided                                # the node measures this one
    np.testing.assert_allclose(seen[-1][0].soft_mask.numpy(), [1.0, 1.0, 1.0, 0.0])  # frozen
