"""One prefill per frame: text on the action's prefix, and the memory adapter in the engine."""

import numpy as np
from oxygen_adapter import oxygen_arrays, write_oxygen_adapter
from oxygen_ros.backends.config import BackendKind
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.model.lora import AdapterFormatError, from_oxygen_arrays
from oxygen_ros.sched.request import TextContext
from oxygen_ros.sched.scheduler import Policy
from oxygen_ros.tools.common.workload import make_observation
from oxygen_ros.transforms.prompt import TextTask, tokenize_text_suffix
import pytest
from reference import reference_text_logits
import torch

CAMS = CAMERA_SLOTS[:2]
ON_ROOT = {'subtask_context': TextContext.ACTION_PREFIX}


def run(engine, frames=4, texts=True):
    """Frames with a memory note and a question each (and a subtask every other frame)."""
    actions, out_texts, stats = [], {}, []
    for f in range(frames):
        if texts:
            engine.submit_text(TextTask.MEMORY, max_tokens=4, req_id=f'mem{f}')
            engine.submit_text(TextTask.ANSWER, question=f'where is block {f}?', max_tokens=3,
                               req_id=f'ask{f}')
            if f % 2 == 0:
                engine.submit_text(TextTask.SUBTASK, max_tokens=5, req_id=f'sub{f}')
        out = engine.step(make_observation(f, engine.robot.cameras,
                                           engine.robot.state_dim))
        actions.append(out.action.actions)
        stats.append(out.stats)
        out_texts.update({t.req_id: t.token_ids for t in out.finished})
    while engine.num_running:
        out_texts.update({t.req_id: t.token_ids for t in engine.step(None).finished})
    return actions, out_texts, stats


def config(mode=PrefixAttention.BIDIRECTIONAL, **kw):
    return EngineConfig.create(preset='tiny', prefix_attention=mode, cameras=CAMS,
                               tokens_per_cycle=2, stop_on_eos=False, seed=4, **kw)


@pytest.mark.parametrize('mode', list(PrefixAttention), ids=lambda m: m.value)
def test_actions_are_bit_identical_with_and_without_text_on_their_prefix(mode, tiny_models,
                                                                         tokenizer):
    model = tiny_models(mode, CAMS)
    alone, _, _ = run(Engine(config(mode), model=model, tokenizer=tokenizer), texts=False)
    shared, texts, _ = run(Engine(config(mode, **ON_ROOT), model=model, tokenizer=tokenizer))
    assert len(texts) == 10
    for a, b in zip(alone, shared):
        assert np.array_equal(a, b)


def test_one_full_prefill_per_frame_against_isolated_execution(tiny_models, tokenizer):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    results = {}
    for policy in Policy:
        engine = Engine(config(policy=policy, **ON_ROOT), model=model, tokenizer=tokenizer)
        results[policy] = run(engine)
    (iso_a, iso_t, iso_s), (oxy_a, oxy_t, oxy_s) = results[Policy.ISOLATED], \
        results[Policy.OXYGEN]
    # every frame: the action's prefix once; isolated: once more per text job of the frame
    assert [s.full_prefills for s in oxy_s] == [1, 1, 1, 1]
    assert [s.full_prefills for s in iso_s] == [4, 3, 4, 3]
    assert all(s.suffix_tokens > 0 for s in oxy_s)
    assert oxy_t == iso_t and len(oxy_t) == 10
    for a, b in zip(iso_a, oxy_a):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
    # own prompts (today's default for subtasks) need a prefix of their own in bidirectional
    own = run(Engine(config(), model=model, tokenizer=tokenizer))[2]
    assert [s.full_prefills for s in own] == [2, 1, 2, 1]


def test_the_memory_adapter_in_the_engine(tiny_models, tokenizer, tmp_path):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    arrays = oxygen_arrays(model.cfg, rank=4, seed=3, std=0.3)
    path = write_oxygen_adapter(tmp_path / 'adapter_step_1500.npz', arrays)
    base = run(Engine(config(**ON_ROOT), model=model, tokenizer=tokenizer))
    engine = Engine(config(memory_adapter=str(path), **ON_ROOT), model=model,
                    tokenizer=tokenizer)
    assert 'memory adapter ' + str(path) + ' (rank 4, alpha 16)' in engine.describe_text()
    actions, texts, _ = run(engine)
    for a, b in zip(base[0], actions):       # the action path never sees the adapter
        assert np.array_equal(a, b)
    for req_id in texts:                     # rows without the adapter: the base model's
        if not req_id.startswith('mem'):
            assert texts[req_id] == base[1][req_id], req_id
    assert any(texts[f'mem{f}'] != base[1][f'mem{f}'] for f in range(4))
    # a memory note equals the merged-weights model on prefix + "Memory: " (uncached)
    lora = from_oxygen_arrays(arrays, model.cfg)
    merged = lora.merged(model.vlm.layers)
    obs = make_observation(1, CAMS, engine.robot.state_dim)
    prepared = engine.prepare(obs)
    with torch.inference_mode():
        embeds = model.encode_images(torch.from_numpy(prepared.images)[None])
        tokens = torch.tensor([prepared.action_prompt_ids])
        seq = torch.tensor([tokenize_text_suffix(tokenizer, TextTask.MEMORY,
                                                 max_len=engine.model_cfg.max_token_len).ids])
        seed_len = seq.shape[1]
        for _ in range(4):
            logits = reference_text_logits(model, embeds, torch.ones(1, 2, dtype=torch.bool),
                                           tokens, torch.ones_like(tokens, dtype=torch.bool),
                                           seq, generated_layers=merged)
            seq = torch.cat([seq, logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert texts['mem1'] == tuple(seq[0, seed_len:].tolist())


def test_a_zeroed_adapter_gives_the_base_models_notes(tiny_models, tokenizer, tmp_path):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    zero = {k: v * 0 for k, v in oxygen_arrays(model.cfg).items()}
    path = write_oxygen_adapter(tmp_path / 'zero.npz', zero)
    base = run(Engine(config(), model=model, tokenizer=tokenizer))[1]
    assert run(Engine(config(memory_adapter=str(path)), model=model,
                      tokenizer=tokenizer))[1] == base


def test_adapter_and_context_settings_are_checked(tiny_models, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="it needs memory_context 'action_prefix'"):
        config(memory_adapter='/x.npz', memory_context=TextContext.OWN_PROMPT)
    with pytest.raises(ValueError, match='memory_adapter runs on the torch backend only'):
        config(memory_adapter='/x.npz', backend=BackendKind.TENSORRT)
    with pytest.raises(ValueError, match="'bogus' is not a valid TextContext"):
        config(answer_context='bogus')
    assert config(answer_context='own_prompt').text_context(TextTask.ANSWER) is \
        TextContext.OWN_PROMPT
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    with pytest.raises(FileNotFoundError, match='memory adapter .*missing.npz: no such file'):
        Engine(config(memory_adapter=str(tmp_path / 'missing.npz')), model=model,
               tokenizer=tokenizer)
    bad = write_oxygen_adapter(tmp_path / 'extra.npz',
                               oxygen_arrays(model.cfg) | {'extra': np.zeros(1)})
    with pytest.raises(AdapterFormatError, match='unexpected 1: extra'):
        Engine(config(memory_adapter=str(bad)), model=model, tokenizer=tokenizer)
