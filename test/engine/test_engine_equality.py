"""OxyGen and isolated execution give the same actions and texts (sharing changes nothing)."""

from dataclasses import replace

import numpy as np
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.observation import Observation
from oxygen_ros.sched.scheduler import Policy
from oxygen_ros.transforms.prompt import TextTask
import pytest


def random_observation(rng: np.random.Generator, cameras, state_dim: int, frame: int):
    images = {slot: rng.integers(0, 256, size=(rng.integers(40, 90), rng.integers(40, 90), 3),
                                 dtype=np.uint8) for slot in cameras}
    return Observation(images=images, state=rng.uniform(-1, 1, state_dim).astype(np.float32),
                       prompt='pick up the red block', stamp_ns=frame * 66_000_000)


def run_policy(policy, mode, cameras, model, tokenizer, frames=6, k=2, stop_on_eos=False):
    cfg = EngineConfig.create(preset='tiny', policy=policy, prefix_attention=mode, cameras=cameras,
                              tokens_per_cycle=k, stop_on_eos=stop_on_eos, seed=11)
    engine = Engine(cfg, model=model, tokenizer=tokenizer)
    rng = np.random.default_rng(5)
    actions, texts = [], {}
    budgets = [3, 7, 1, 5, 6, 4]
    for f in range(frames):
        engine.submit_text(TextTask.SUBTASK, max_tokens=budgets[f % len(budgets)],
                           req_id=f'sub{f}')
        if f % 2 == 1:
            engine.submit_text(TextTask.ANSWER, question=f'where is block {f}?',
                               max_tokens=budgets[(f + 3) % len(budgets)], req_id=f'ask{f}')
        if f % 3 == 0:
            engine.submit_text(TextTask.MEMORY, max_tokens=4, req_id=f'mem{f}')
        out = engine.step(random_observation(rng, cameras, cfg.robot().state_dim, f))
        assert out.action is not None and out.action.frame_id == f
        actions.append(out.action.actions)
        texts.update({t.req_id: (t.token_ids, t.finish_reason) for t in out.finished})
    while engine.num_running:
        texts.update({t.req_id: (t.token_ids, t.finish_reason)
                      for t in engine.step(None).finished})
    return actions, texts, engine


@pytest.mark.parametrize('mode', list(PrefixAttention))
@pytest.mark.parametrize('num_cams', [1, 2, 3])
def test_oxygen_equals_isolated(mode, num_cams, tiny_models, tokenizer):
    cameras = CAMERA_SLOTS[:num_cams]
    model = tiny_models(mode, cameras)
    iso_a, iso_t, _ = run_policy(Policy.ISOLATED, mode, cameras, model, tokenizer)
    oxy_a, oxy_t, oxy = run_policy(Policy.OXYGEN, mode, cameras, model, tokenizer)
    assert len(iso_a) == len(oxy_a) == 6
    for a, b in zip(iso_a, oxy_a):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
    assert set(iso_t) == set(oxy_t) and len(oxy_t) == 6 + 3 + 2
    assert oxy_t == iso_t
    # the texts depend on their prefix (else equality would prove little)
    assert len({ids for ids, _ in oxy_t.values()}) >= len(oxy_t) // 2
    # requests of different lengths shared decode batches
    assert oxy.scheduler.kv.num_used_blocks == 0


def test_texts_stop_at_eos_in_both_policies(tiny_models, tokenizer):
    cameras = CAMERA_SLOTS[:2]
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, cameras)
    results = [run_policy(pol, PrefixAttention.BIDIRECTIONAL, cameras, model, tokenizer,
                          stop_on_eos=True)[1] for pol in (Policy.ISOLATED, Policy.OXYGEN)]
    assert results[0] == results[1]


def test_actions_depend_on_the_observation(tiny_models, tokenizer):
    """Guards the equality test: a model that ignored its prefix would pass it trivially."""
    cameras = CAMERA_SLOTS[:2]
    model = tiny_models(PrefixAttention.CAUSAL_TEXT, cameras)
    cfg = EngineConfig(preset='tiny', prefix_attention=PrefixAttention.CAUSAL_TEXT,
                       cameras=cameras, seed=11)
    rng = np.random.default_rng(0)
    obs = random_observation(rng, cameras, 8, 0)
    a = Engine(cfg, model=model, tokenizer=tokenizer).step(obs).action.actions
    other = replace(obs, images={**obs.images, cameras[1]: 255 - obs.images[cameras[1]]})
    b = Engine(cfg, model=model, tokenizer=tokenizer).step(other).action.actions
    assert np.abs(a - b).max() > 1e-3
