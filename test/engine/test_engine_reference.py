"""
The engine's outputs equal the model's uncached reference paths (an independent ground truth).

The OxyGen-vs-isolated tests cannot see a bug both policies share (they run one backend);
here every text token is checked against a full recomputation of the sequence and every
action chunk against ``reference_sample_actions`` with the engine's noise.
"""

import numpy as np
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.sched.request import TextContext
from oxygen_ros.sched.scheduler import Policy
from oxygen_ros.tools.common.workload import make_observation
from oxygen_ros.transforms.prompt import TextTask, tokenize_text_prompt, tokenize_text_suffix
import pytest
from reference import reference_sample_actions, reference_text_logits
import torch


def greedy_reference(model, embeds, image_mask, ids, budget, suffix=()):
    """Greedy tokens after the prefix ``ids`` (bidirectional) and a causal ``suffix``."""
    tokens = torch.tensor([ids])
    mask = torch.ones_like(tokens, dtype=torch.bool)
    generated = torch.tensor([list(suffix)], dtype=torch.int64).view(1, -1)
    for _ in range(budget):
        logits = reference_text_logits(model, embeds, image_mask, tokens, mask, generated)
        generated = torch.cat([generated, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tuple(generated[0, len(suffix):].tolist())


QUESTION = 'where is the cup?'


def text_reference(engine, tokenizer, model, obs, task, budget):
    """Return the engine's text of ``task`` on ``obs``, recomputed without any cache."""
    prepared = engine.prepare(obs)
    embeds = model.encode_images(torch.from_numpy(prepared.images)[None])
    image_mask = torch.ones(1, embeds.shape[1], dtype=torch.bool)
    question = QUESTION if task is TextTask.ANSWER else None
    max_len = engine.model_cfg.max_token_len
    if engine.config.text_context(task) is TextContext.ACTION_PREFIX:
        suffix = tokenize_text_suffix(tokenizer, task, question=question, max_len=max_len).ids
        return greedy_reference(model, embeds, image_mask, prepared.action_prompt_ids, budget,
                                suffix)
    ids = tokenize_text_prompt(tokenizer, obs.prompt, task, question=question,
                               max_len=max_len).ids
    return greedy_reference(model, embeds, image_mask, ids, budget)


@pytest.mark.parametrize('policy', list(Policy))
@pytest.mark.parametrize('mode', list(PrefixAttention))
def test_engine_matches_uncached_reference(policy, mode, tiny_models, tokenizer):
    cameras = CAMERA_SLOTS[:2]
    model = tiny_models(mode, cameras)
    cfg = EngineConfig.create(preset='tiny', policy=policy, prefix_attention=mode, cameras=cameras,
                              tokens_per_cycle=3, stop_on_eos=False, seed=7)
    engine = Engine(cfg, model=model, tokenizer=tokenizer)
    mcfg = engine.model_cfg
    budgets = {'sub0': 6, 'mem1': 4, 'ans2': 5, 'mem2': 3}
    tasks = {0: [TextTask.SUBTASK], 1: [TextTask.MEMORY], 2: [TextTask.ANSWER, TextTask.MEMORY]}
    frames = {}
    texts = {}
    for f in range(3):
        obs = make_observation(f, cameras, engine.robot.state_dim)
        for task in tasks[f]:
            req_id = f'{task.value[:3]}{f}'
            engine.submit_text(task, max_tokens=budgets[req_id], req_id=req_id,
                               question=QUESTION if task is TextTask.ANSWER else None)
        out = engine.step(obs)
        frames[f] = (obs, out.action.actions)
        texts.update({t.req_id: t.token_ids for t in out.finished})
    while engine.num_running:
        texts.update({t.req_id: t.token_ids for t in engine.step(None).finished})

    with torch.inference_mode():
        for f, (obs, actions) in frames.items():
            prepared = engine.prepare(obs)
            images = torch.from_numpy(prepared.images)[None]
            embeds = model.encode_images(images)
            image_mask = torch.ones(1, len(cameras), dtype=torch.bool)
            # actions: same prefix, same noise, no cache, recomputed joint forward per step
            noise = torch.randn((1, mcfg.action_horizon, mcfg.action_dim),
                                generator=torch.Generator().manual_seed(7 * 1_000_003 + f))
            act_ids = torch.tensor([prepared.action_prompt_ids])
            ref = reference_sample_actions(model, embeds, image_mask, act_ids,
                                           torch.ones_like(act_ids, dtype=torch.bool), noise)
            ref_robot = engine.normalizer.actions.unnormalize(ref[0].numpy())
            np.testing.assert_allclose(actions, ref_robot[:, :engine.robot.robot_action_dim],
                                       atol=1e-5, rtol=0)
            # text: greedy over full recomputation of prefix (+ suffix) + generated tokens
            for task in tasks[f]:
                req_id = f'{task.value[:3]}{f}'
                assert texts[req_id] == text_reference(engine, tokenizer, model, obs, task,
                                                       budgets[req_id]), req_id


@pytest.mark.parametrize('mode', list(PrefixAttention))
def test_decode_logits_of_mixed_batches_match_full_recomputation(mode, tiny_models, tokenizer,
                                                                 monkeypatch):
    """Every logit row the backend computes (seed and batched decode) vs the reference."""
    cameras = CAMERA_SLOTS[:1]
    model = tiny_models(mode, cameras)
    cfg = EngineConfig.create(preset='tiny', prefix_attention=mode, cameras=cameras,
                              tokens_per_cycle=2, stop_on_eos=False, seed=1)
    engine = Engine(cfg, model=model, tokenizer=tokenizer)
    backend = engine.backend
    records = []      # (req_id, index of the predicted generated token, logits)
    current = {}

    def spy_decode_step(tokens, positions, *args):
        logits = type(model).decode_step(model, tokens, positions, *args)
        job, step = current['job'], current['step']
        for i, (req_id, num_tokens) in enumerate(zip(job.req_ids, job.num_tokens)):
            if step < num_tokens:                              # rows with a step left
                row = backend._rows[req_id]
                records.append((req_id, int(positions[i]) - row.num_prefix_tokens + 1,
                                logits[i].clone()))
        current['step'] += 1
        return logits

    def spy_lm_logits(hidden):
        logits = type(model).lm_logits(model, hidden)
        if current.get('seed'):
            for i, req_id in enumerate(current['seed']):
                records.append((req_id, 0, logits[i].clone()))
        return logits

    orig_decode, orig_seed = backend._decode, backend._seed

    def decode(job, sampled):
        current['job'], current['step'] = job, 0
        return orig_decode(job, sampled)

    def seed(job, sampled):
        current['seed'] = job.req_ids
        try:
            return orig_seed(job, sampled)
        finally:
            current['seed'] = None
    monkeypatch.setattr(model, 'decode_step', spy_decode_step)
    monkeypatch.setattr(model, 'lm_logits', spy_lm_logits)
    monkeypatch.setattr(backend, '_decode', decode)
    monkeypatch.setattr(backend, '_seed', seed)

    budgets = [5, 3, 6, 2]
    observations, texts = {}, {}
    for f, budget in enumerate(budgets):      # requests of different lengths share batches
        obs = make_observation(f, cameras, engine.robot.state_dim)
        observations[f'r{f}'] = (obs, budget)
        engine.submit_text(TextTask.SUBTASK, max_tokens=budget, req_id=f'r{f}')
        texts.update({t.req_id: t.token_ids for t in engine.step(obs).finished})
    while engine.num_running:
        texts.update({t.req_id: t.token_ids for t in engine.step(None).finished})
    monkeypatch.undo()

    assert len(records) == sum(budgets)
    with torch.inference_mode():
        for req_id, (obs, budget) in observations.items():
            prepared = engine.prepare(obs)
            embeds = model.encode_images(torch.from_numpy(prepared.images)[None])
            ids = torch.tensor([tokenize_text_prompt(
                tokenizer, obs.prompt, TextTask.SUBTASK, max_len=engine.model_cfg.max_token_len
            ).ids])
            generated = torch.tensor([texts[req_id][:-1]])
            ref = reference_text_logits(model, embeds, torch.ones(1, 1, dtype=torch.bool), ids,
                                        torch.ones_like(ids, dtype=torch.bool), generated)[0]
            mine = sorted((i, lg) for r, i, lg in records if r == req_id)
            assert [i for i, _ in mine] == list(range(budget))
            for i, lg in mine:
                torch.testing.assert_close(lg, ref[i], atol=1e-5, rtol=0)
