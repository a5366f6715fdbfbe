"""
torch.compile of the denoise and decode steps: equal to eager, static shapes, eager fallback.

On the CPU the plumbing is checked with the ``aot_eager`` compiler backend (same graph
capture by dynamo, no codegen); Inductor and CUDA graphs (``reduce-overhead``) are checked
in ``test/gpu``.
"""

from dataclasses import replace
import logging

import numpy as np
from oxygen_ros.backends import compiled as compiled_mod
from oxygen_ros.backends.compiled import batch_buckets, CompiledModel, CompiledTorchBackend
from oxygen_ros.backends.factory import make_backend
from oxygen_ros.backends.torch_backend import TorchBackend
from oxygen_ros.backends.trt_profiles import EngineLimits
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine.config import CompileMode, EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.prompt import TextTask
from oxygen_ros.tools.workload import make_observation
import pytest
import torch

MODE = PrefixAttention.CAUSAL_TEXT


def _limits(model, num_slots, max_batch=4):
    return EngineLimits.for_model(model.cfg, num_slots=num_slots, max_batch=max_batch,
                                  max_decode_tokens=model.cfg.decode_budget)


def _prefixes(model, cache):
    """Two frames' prefixes (CAUSAL_TEXT: image segment + prompt) in ``cache``."""
    gen = torch.Generator().manual_seed(0)
    size, ti = model.cfg.vision.image_size, model.cfg.image_tokens_per_camera
    out, slot = [], 20
    for f, cams in enumerate((2, 1)):
        embeds = model.encode_images(torch.rand(1, cams, 3, size, size, generator=gen) * 2 - 1)
        img = model.prefill(torch.zeros(1, 0, dtype=torch.int64),
                            torch.zeros(1, 0, dtype=torch.bool), image_embeds=embeds,
                            cache=cache, slots=torch.arange(slot, slot + cams * ti)[None])
        slot += cams * ti
        n = 7 + 3 * f
        tokens = torch.randint(3, 1000, (1, n), generator=gen)
        out.append(model.prefill(tokens, torch.ones(1, n, dtype=torch.bool), context=img,
                                 slots=torch.arange(slot, slot + n)[None]))
        slot += n
    return out, slot


def _drive(m, model, cache):
    """Denoise both prefixes and decode 3 rows (batch 3: padded to bucket 4) with ``m``."""
    prefixes, slot = _prefixes(model, cache)
    gen = torch.Generator().manual_seed(1)
    outs = []
    for p in prefixes:
        outs.append(m.denoise(p, torch.randn(1, model.cfg.action_horizon,
                                             model.cfg.action_dim, generator=gen)))
    rows = [prefixes[i] for i in (0, 1, 0)]
    base = torch.cat([p.num_tokens for p in rows])
    width = int(base.max())
    ctx = torch.stack([torch.nn.functional.pad(p.slots[0], (0, width - p.slots.shape[1]))
                       for p in rows])
    own = slot + torch.arange(3 * 4).view(3, 4)
    for s in range(4):
        pos = base + s
        ctx_mask = torch.arange(width + s)[None] < pos[:, None]
        ctx_s = torch.cat([ctx, own[:, :s]], 1) if s else ctx
        tokens = torch.randint(3, 1000, (3,), generator=gen)
        outs.append(m.decode_step(tokens, pos, cache, own[:, s], ctx_s, ctx_mask))
    return outs, cache


def test_compiled_steps_equal_eager(tiny_models):
    model = tiny_models(MODE, CAMERA_SLOTS[:2])
    cache = KVCache(model.cfg.vlm, 1024)
    comp = CompiledModel(model, CompileMode.DEFAULT, _limits(model, 1024), backend='aot_eager')
    with torch.inference_mode():
        assert comp.warmup(cache) > 0 and comp.compile_seconds > 0
        assert comp._denoise is not None and comp._decode is not None
        assert (cache.k == 0).all()                      # warm-up never writes the pool
        want, want_cache = _drive(model, model, KVCache(model.cfg.vlm, 1024))
        got, got_cache = _drive(comp, model, cache)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_cache.k, want_cache.k, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_cache.v, want_cache.v, atol=1e-5, rtol=0)


def _failing(gm, example_inputs):
    raise RuntimeError('no codegen today')


def _wrong(gm, example_inputs):
    def run(*args):
        outs = gm(*args)
        return type(outs)(o * 1.5 if o.is_floating_point() else o for o in outs)
    return run


@pytest.mark.parametrize('backend,reason', [(_failing, 'no codegen today'),
                                            (_wrong, 'parity gate failed')])
def test_a_broken_compiler_falls_back_to_eager(tiny_models, caplog, backend, reason):
    model = tiny_models(MODE, CAMERA_SLOTS[:2])
    cache = KVCache(model.cfg.vlm, 1024)
    comp = CompiledModel(model, CompileMode.DEFAULT, _limits(model, 1024, max_batch=2),
                         backend=backend)
    with caplog.at_level(logging.WARNING, logger='oxygen_ros.backends.compiled'), \
            torch.inference_mode():
        comp.warmup(cache)
        want, _ = _drive(model, model, KVCache(model.cfg.vlm, 1024))
        got, _ = _drive(comp, model, cache)
    assert comp._denoise is None and comp._decode is None
    messages = [r.getMessage() for r in caplog.records]
    assert any('denoise step failed' in m and reason in m for m in messages), messages
    assert any('decode step failed' in m and reason in m for m in messages), messages
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, atol=0, rtol=0)


def test_batch_buckets():
    assert batch_buckets(1) == (1,)
    assert batch_buckets(32) == (1, 2, 4, 8, 16, 32)
    assert batch_buckets(40) == (1, 2, 4, 8, 16, 32, 40)
    with pytest.raises(ValueError, match='needs a compile mode other than NONE'):
        CompiledModel(None, CompileMode.NONE, None)


def test_engine_with_compile_mode_equals_eager(tiny_models, tokenizer, monkeypatch):
    model = tiny_models(MODE, CAMERA_SLOTS[:2])
    monkeypatch.setattr(compiled_mod, 'DEFAULT_COMPILE_BACKEND', 'aot_eager')
    results = []
    for mode in (CompileMode.NONE, CompileMode.REDUCE_OVERHEAD):
        cfg = EngineConfig(preset='tiny', prefix_attention=MODE, cameras=CAMERA_SLOTS[:2],
                           compile_mode=mode, max_running_requests=4, tokens_per_cycle=3,
                           stop_on_eos=False, seed=2)
        engine = Engine(cfg, model=model, tokenizer=tokenizer)
        actions, texts = [], {}
        for f, budget in enumerate((4, 6, 2)):
            engine.submit_text(TextTask.SUBTASK, max_tokens=budget, req_id=f'r{f}')
            out = engine.step(make_observation(f, cfg.model_config().cameras, 8))
            actions.append(out.action.actions)
            texts.update({t.req_id: t.token_ids for t in out.texts})
        while engine.num_running:
            texts.update({t.req_id: t.token_ids for t in engine.step(None).texts})
        results.append((actions, texts, engine.backend))
    (eager_a, eager_t, eager_b), (comp_a, comp_t, comp_b) = results
    assert type(eager_b) is TorchBackend and isinstance(comp_b, CompiledTorchBackend)
    assert comp_b.compile_seconds > 0 and comp_b.model.buckets == (1, 2, 4)
    assert comp_b.model._decode is not None
    for a, b in zip(eager_a, comp_a):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
    assert comp_t == eager_t and len(comp_t) == 3


def test_make_backend_without_compile_is_plain_torch(tiny_models):
    model = tiny_models(MODE, CAMERA_SLOTS[:2])
    cfg = EngineConfig(preset='tiny', prefix_attention=MODE, cameras=CAMERA_SLOTS[:2])
    assert type(make_backend(cfg.backend_config(), model, 8)) is TorchBackend


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts without compiled code (dynamo's recompile limit is per function)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_decode_compiles_twice_for_all_batch_buckets(tiny_models):
    model = tiny_models(MODE, CAMERA_SLOTS[:2])
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    comp = CompiledModel(model, CompileMode.DEFAULT, _limits(model, 512, max_batch=16),
                         backend=counting)
    with torch.inference_mode():
        comp.warmup(KVCache(model.cfg.vlm, 512))
    assert comp.buckets == (1, 2, 4, 8, 16) and comp._decode is not None
    assert len(graphs) == 1 + 2      # denoise; decode at batch 1, then one dynamic batch


def test_engine_exposes_the_fallbacks(tiny_models, tokenizer, monkeypatch):
    model = tiny_models(MODE, CAMERA_SLOTS[:2])
    monkeypatch.setattr(compiled_mod, 'DEFAULT_COMPILE_BACKEND', _failing)
    cfg = EngineConfig(preset='tiny', prefix_attention=MODE, cameras=CAMERA_SLOTS[:2],
                       compile_mode=CompileMode.DEFAULT, max_running_requests=2)
    engine = Engine(cfg, model=model, tokenizer=tokenizer)
    assert set(engine.fallbacks) == {'denoise', 'decode'}
    assert 'no codegen today' in engine.fallbacks['decode']
    eager = Engine(replace(cfg, compile_mode=CompileMode.NONE), model=model,
                   tokenizer=tokenizer)
    assert eager.fallbacks == {}
