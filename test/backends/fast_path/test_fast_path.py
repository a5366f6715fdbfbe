"""
The fast path on the CPU: every per-cycle call at static shapes equals eager, loud fallbacks.

The compiler here is ``aot_eager`` (Dynamo's full graph capture, ``fullgraph=True``: a graph
break fails the warm-up; no code generation, which takes minutes per graph on this CPU);
Inductor's own kernels are checked in ``test_parity.py`` (bf16, real differences) and, with
CUDA graphs, in ``test/gpu``. Without CUDA the graphs are not captured, but the buffers, the
padding and the routing are those of the GPU.
"""

from dataclasses import replace
import logging

import numpy as np
from oxygen_adapter import oxygen_arrays
from oxygen_ros.backends.config import CompileMode
from oxygen_ros.backends.fast_path import backend as fast_backend
from oxygen_ros.backends.fast_path.backend import FastPathBackend
from oxygen_ros.backends.fast_path.buckets import (
    batch_buckets, bucket_for, ctx_buckets, EngineLimits, prompt_buckets, StaticShapes,
    suffix_buckets)
from oxygen_ros.backends.fast_path.graph_builder import GraphBuilder, Kernels, Step
from oxygen_ros.backends.fast_path.model import FastPathModel
from oxygen_ros.backends.fast_path.static_calls import DenoiseCall
from oxygen_ros.backends.fast_path.warmup import JUST_IN_TIME
from oxygen_ros.backends.interface import Backend, WarmupReport
from oxygen_ros.backends.torch_backend import TorchBackend
from oxygen_ros.config import CAMERA_SLOTS, get_preset, PrefixAttention
from oxygen_ros.control.rtc import RtcRequest, soft_mask
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.loading import make_backend_for
from oxygen_ros.model.guidance import (
    guidance_weights, guided_denoise, GuidedDenoiseCall, RtcGuidance)
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.model.lora import AdapterRows, from_oxygen_arrays
from oxygen_ros.tools.common.workload import make_observation
from oxygen_ros.transforms.prompt import TextTask
import pytest
import torch

CAMS = CAMERA_SLOTS[:2]
SLOTS = 2048


def _limits(model, max_batch=4):
    return EngineLimits.for_model(model.cfg, num_slots=SLOTS, max_batch=max_batch,
                                  max_decode_tokens=8, max_cameras=2)


def _warm(model, backend='aot_eager', only=None, max_batch=4, fold_norms=None):
    comp = FastPathModel(model, CompileMode.DEFAULT, _limits(model, max_batch), backend=backend,
                         only=only, fold_norms=fold_norms)
    pool = KVCache(model.cfg.vlm, SLOTS)
    comp.warmup(pool, progress=False)
    return comp, pool


pytestmark = pytest.mark.usefixtures('fresh_dynamo')


def test_buckets():
    assert batch_buckets(1) == (1,) and batch_buckets(2) == (2,) and batch_buckets(3) == (2, 3)
    assert batch_buckets(32) == (2, 4, 8, 16, 32)                # batch 1 runs padded to 2
    assert batch_buckets(40) == (2, 4, 8, 16, 32, 40)
    assert prompt_buckets(200) == (16, 32, 64, 128, 208)    # 16-aligned: one compile
    assert prompt_buckets(10) == (16,)
    assert suffix_buckets(200) == (16, 64, 208) and suffix_buckets(16) == (16,)
    assert ctx_buckets(1024) == (256, 512, 768, 1024)
    assert ctx_buckets(1000) == (256, 512, 768, 1000)
    assert ctx_buckets(1024, min_ctx=257) == (512, 768, 1024)
    assert bucket_for(0, (16, 32)) == 16 and bucket_for(17, (16, 32)) == 32
    assert bucket_for(33, (16, 32)) is None
    cfg = get_preset('pi05_droid').model
    shapes = StaticShapes.for_model(cfg, max_batch=32, max_ctx=1024, max_cameras=3)
    assert shapes.camera_counts == (1, 2, 3) and shapes.batch[-1] == 32
    assert shapes.ctx == (512, 768, 1024)          # a context holds a camera's 256 tokens
    assert len(shapes.denoise) == 15 and shapes.denoise[-1] == 3 * 256 + 208
    assert bucket_for(3 * 256 + 50, shapes.denoise) == 3 * 256 + 64   # 818 slots, not 1024
    only3 = StaticShapes.for_model(cfg, max_batch=8, max_ctx=1024, max_cameras=3,
                                   camera_counts=(3,))
    assert only3.camera_counts == (3,) and only3.ctx == (1024,)
    assert only3.denoise == tuple(768 + t for t in only3.prompt)
    with pytest.raises(ValueError, match='longest prefix'):
        StaticShapes.for_model(cfg, max_batch=32, max_ctx=900, max_cameras=3)
    with pytest.raises(ValueError, match='camera_counts'):
        StaticShapes.for_model(cfg, max_batch=32, max_ctx=1024, max_cameras=3,
                               camera_counts=(4,))
    with pytest.raises(ValueError):
        batch_buckets(0)


def test_compile_mode_auto_is_the_fast_path_on_cuda_only():
    assert CompileMode.AUTO.resolve('cuda') is CompileMode.REDUCE_OVERHEAD
    assert CompileMode.AUTO.resolve('cuda:1') is CompileMode.REDUCE_OVERHEAD
    assert CompileMode.AUTO.resolve('cpu') is CompileMode.NONE
    assert CompileMode.DEFAULT.resolve('cpu') is CompileMode.DEFAULT


def _drive(m, model, pool):
    """Every call the engine makes, through ``m``; returns the outputs, in order."""
    gen = torch.Generator().manual_seed(4)
    cfg = model.cfg
    size, ti = cfg.vision.image_size, cfg.image_tokens_per_camera
    outs, prefixes, slot = [], [], 16
    for cams, t in ((2, 7), (1, 20)):
        images = torch.rand(1, cams, 3, size, size, generator=gen) * 2 - 1
        embeds = m.encode_images(images)
        outs.append(embeds)
        tokens = torch.randint(3, 1000, (1, t), generator=gen)
        if cfg.prefix_attention is PrefixAttention.CAUSAL_TEXT:
            image = m.prefill(tokens[:, :0], None, image_embeds=embeds, cache=pool,
                              slots=torch.arange(slot, slot + cams * ti)[None])
            slot += cams * ti
            prefix = m.prefill(tokens, None, context=image, cache=pool,
                               slots=torch.arange(slot, slot + t)[None])
            slot += t
        else:
            prefix = m.prefill(tokens, None, image_embeds=embeds, cache=pool,
                               slots=torch.arange(slot, slot + cams * ti + t)[None])
            slot += cams * ti + t
        prefixes.append(prefix)
        outs += [prefix.last_hidden, m.denoise(prefix, torch.randn(
            1, cfg.action_horizon, cfg.action_dim, generator=gen))]
    # five causal suffixes of different lengths on the first root (text on the action prefix;
    # more rows than the largest suffix batch: they go in turns of 4 and 1)
    root = prefixes[0]
    context = PrefixKV(pool, root.slots.expand(5, -1), root.mask.expand(5, -1),
                       root.num_tokens.expand(5), root.last_hidden.expand(5, -1))
    suffix = torch.randint(3, 1000, (5, 5), generator=gen)
    suffix_mask = torch.arange(5)[None] < torch.tensor([[5], [2], [4], [1], [3]])
    out = m.prefill_suffix(suffix, suffix_mask, context,
                           slots=slot + torch.arange(25).view(5, 5))
    slot += 25
    outs += [out.last_hidden, out.num_tokens, out.slots, out.mask]
    hidden = torch.cat([p.last_hidden for p in prefixes + prefixes[:1]])
    outs += [m.lm_logits(hidden), getattr(m, 'lm_greedy', lambda h: m.lm_logits(h).argmax(-1))(
        hidden)]
    rows = [prefixes[i] for i in (0, 1, 0)]       # rows of two frames and lengths
    own = slot + torch.arange(3 * 4).view(3, 4)
    tokens = torch.randint(3, 1000, (3,), generator=gen)
    for s in range(4):                              # the backend's layout: prefix, then own
        per_row = [torch.cat([p.slots[0], own[i, :s]]) for i, p in enumerate(rows)]
        width = max(r.numel() for r in per_row)
        ctx = torch.stack([torch.nn.functional.pad(r, (0, width - r.numel())) for r in per_row])
        pos = torch.tensor([r.numel() for r in per_row])
        ctx_mask = torch.arange(width)[None] < pos[:, None]
        logits = m.decode_step(tokens, pos, pool, own[:, s], ctx, ctx_mask)
        outs.append(logits)
        tokens = logits.argmax(-1)
    # every slot but the null block's (padded rows and tokens write there)
    outs += [pool.k[:, 16:slot + 12].clone(), pool.v[:, 16:slot + 12].clone()]
    return outs


@pytest.mark.parametrize('mode', list(PrefixAttention), ids=lambda m: m.value)
def test_every_call_on_the_fast_path_equals_eager(tiny_models, mode):
    model = tiny_models(mode, CAMS)
    comp, pool = _warm(model)
    assert comp.fallbacks == {}
    assert (pool.k == 0).all() and (pool.v == 0).all()            # probes leave nothing
    steps = comp.steps()
    assert (Step.TEXT_PREFILL in steps) == (mode is PrefixAttention.CAUSAL_TEXT)
    assert {s: len(g) for s, g in comp._graphs.items()} == {s: len(k) for s, k in steps.items()}
    calls_before = {s: sum(g.num_calls for g in gs.values()) for s, gs in comp._graphs.items()}
    with torch.inference_mode():
        got = _drive(comp, model, pool)
        want = _drive(model, model, KVCache(model.cfg.vlm, SLOTS))
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0, msg=f'output {i}')
    used = {s: sum(g.num_calls for g in gs.values()) - calls_before[s]
            for s, gs in comp._graphs.items()}
    assert all(n > 0 for n in used.values()), used                # every step took a graph
    assert used[Step.DECODE] == 4 and used[Step.DENOISE] == 2 and used[Step.SUFFIX] == 2


def test_the_denoise_loop_is_one_graph_without_breaks(tiny_models):
    """The N-step loop compiles as ONE Dynamo graph (fullgraph) and equals the model's loop."""
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    loop = torch.compile(DenoiseCall(model), backend=counting, fullgraph=True)
    pool = KVCache(model.cfg.vlm, 256)
    pool.k.normal_()
    pool.v.normal_()
    slots = torch.arange(16, 16 + 140)[None]
    mask = torch.arange(140)[None] < 129
    noise = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim)
    with torch.inference_mode():
        got = loop(pool.k, pool.v, slots, mask, torch.tensor([129]), noise)
        want = DenoiseCall(model)(pool.k, pool.v, slots, mask, torch.tensor([129]), noise)
    assert len(graphs) == 1
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_decode_compiles_once_or_twice_for_all_buckets(tiny_models):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    comp, _ = _warm(model, backend=counting, only=[Step.DECODE], max_batch=16)
    assert comp.fallbacks == {} and set(comp._graphs) == {Step.DECODE}
    assert len(comp._graphs[Step.DECODE]) == 4 * len(comp.shapes.ctx)
    assert len(graphs) <= 2, len(graphs)           # no batch 1 to specialize: symbolic
    assert comp.compiles == {'decode': len(graphs)}


def test_batch_1_runs_padded_to_2_and_equals_batch_1(tiny_models):
    """No batch-1 graph: a lone decode row and a lone seed run in the graphs of batch 2."""
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    comp, pool = _warm(model, only=[Step.DECODE, Step.SEED], max_batch=4)
    assert comp.shapes.batch == (2, 4) and all(b > 1 for b, _ in comp._graphs[Step.DECODE])
    pool.k.normal_(generator=torch.Generator().manual_seed(0))
    pool.v.normal_(generator=torch.Generator().manual_seed(1))
    c = 150
    args = (torch.tensor([7]), torch.tensor([c]), pool, torch.tensor([c + 16]),
            torch.arange(16, 16 + c)[None], torch.ones(1, c, dtype=torch.bool))
    hidden = torch.randn(1, model.cfg.vlm.width)
    key = (2, bucket_for(c, comp.shapes.ctx))
    before = comp._graphs[Step.DECODE][key].num_calls, comp._graphs[Step.SEED][(2,)].num_calls
    with torch.inference_mode():
        got = comp.decode_step(*args), comp.lm_logits(hidden), comp.lm_greedy(hidden)
        got_k = pool.k[:, c + 16].clone()
        want = model.decode_step(*args), model.lm_logits(hidden)
        want_k = pool.k[:, c + 16].clone()
    assert (comp._graphs[Step.DECODE][key].num_calls, comp._graphs[Step.SEED][(2,)].num_calls) \
        == (before[0] + 1, before[1] + 2)
    assert got[0].shape == want[0].shape == (1, model.cfg.vocab_size)
    torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=0)
    assert torch.equal(got[2], want[1].argmax(-1))
    torch.testing.assert_close(got_k, want_k, atol=1e-5, rtol=0)      # its K/V, its slot


def test_denoise_pads_a_prefix_to_its_prompt_bucket_only(tiny_models):
    """A 2-camera prefix of 20 tokens takes the graph of 2 x 64 + 32 slots, not the longest."""
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    comp, pool = _warm(model, only=[Step.DENOISE])
    ti = model.cfg.image_tokens_per_camera
    assert comp.shapes.denoise == tuple(sorted({n * ti + t for n in (1, 2)
                                                for t in comp.shapes.prompt}))
    assert list(comp._graphs[Step.DENOISE]) == [(1, c) for c in comp.shapes.denoise]
    with torch.inference_mode():
        prefix = model.prefill(torch.randint(3, 1000, (1, 20)), None,
                               image_embeds=model.encode_images(torch.rand(1, 2, 3, 224, 224)),
                               cache=pool, slots=torch.arange(16, 16 + 2 * ti + 20)[None])
        noise = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim)
        got, want = comp.denoise(prefix, noise), model.denoise(prefix, noise)
    used = [c for (_, c), g in comp._graphs[Step.DENOISE].items() if g.num_calls > 1]
    assert used == [2 * ti + 32]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def _failing(gm, example_inputs):
    raise RuntimeError('no codegen today')


def _wrong(gm, example_inputs):
    def run(*args):
        outs = gm(*args)
        return type(outs)(o * 1.5 if o.is_floating_point() else o for o in outs)
    return run


@pytest.mark.parametrize('backend,reason', [(_failing, 'no codegen today'),
                                            (_wrong, 'parity gate failed')])
def test_a_broken_compiler_falls_back_to_eager_loudly(tiny_models, caplog, backend, reason):
    model = tiny_models(PrefixAttention.CAUSAL_TEXT, CAMS)
    with caplog.at_level(logging.ERROR, logger='oxygen_ros.backends.fast_path.model'):
        comp, pool = _warm(model, backend=backend, max_batch=2)
    assert set(comp.fallbacks) == {s.value for s in comp.steps()}
    assert all(reason in why and 'EAGERLY' in why for why in comp.fallbacks.values())
    assert len([r for r in caplog.records if 'runs EAGERLY' in r.getMessage()]) == len(
        comp.fallbacks)
    with torch.inference_mode():
        got = _drive(comp, model, pool)
        want = _drive(model, model, KVCache(model.cfg.vlm, SLOTS))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=0, rtol=0)


def test_shapes_beyond_the_graphs_run_eagerly_with_a_warning(tiny_models, caplog):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    comp, pool = _warm(model, only=[Step.DECODE], max_batch=2)
    c = comp.shapes.ctx[-1] + 10
    args = (torch.tensor([5]), torch.tensor([c]), pool, torch.tensor([c + 16]),
            torch.arange(16, 16 + c)[None], torch.ones(1, c, dtype=torch.bool))
    with caplog.at_level(logging.WARNING, logger='oxygen_ros.backends.fast_path.model'), \
            torch.inference_mode():
        got = comp.decode_greedy(*args)
    assert torch.equal(got, model.decode_step(*args).argmax(-1))
    assert any('outside the compiled ones' in r.getMessage() for r in caplog.records)
    assert comp.fallbacks == {}


def _engine_run(cfg, model, tokenizer, engine=None):
    engine = engine or Engine(cfg, model=model, tokenizer=tokenizer)
    actions, texts = [], {}
    for f, budget in enumerate((4, 6, 2)):
        engine.submit_text(TextTask.SUBTASK, max_tokens=budget, req_id=f'r{f}')
        out = engine.step(make_observation(f, cfg.robot().cameras, 8))
        actions.append(out.action.actions)
        texts.update({t.req_id: t.token_ids for t in out.finished})
    while engine.num_running:
        texts.update({t.req_id: t.token_ids for t in engine.step(None).finished})
    return actions, texts, engine


@pytest.mark.parametrize('mode', list(PrefixAttention), ids=lambda m: m.value)
def test_engine_on_the_fast_path_equals_eager(tiny_models, tokenizer, monkeypatch, mode):
    model = tiny_models(mode, CAMS)
    monkeypatch.setattr(fast_backend, 'DEFAULT_COMPILE_BACKEND', 'aot_eager')
    cfg = EngineConfig.create(preset='tiny', prefix_attention=mode, cameras=CAMS,
                              max_running_requests=4, tokens_per_cycle=3, stop_on_eos=False,
                              seed=2)
    want = _engine_run(cfg, model, tokenizer)
    got = _engine_run(cfg.with_settings(compile_mode=CompileMode.DEFAULT), model, tokenizer)
    backend = got[2].backend
    assert type(want[2].backend) is TorchBackend and isinstance(backend, FastPathBackend)
    assert isinstance(backend, Backend) and backend.source_model is model
    assert backend.warmup_report.seconds > 0 and got[2].fallbacks == {}
    assert backend.model.shapes.batch == (2, 4)
    for a, b in zip(want[0], got[0]):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
    assert got[1] == want[1] and len(got[1]) == 3


def test_make_backend_compiles_only_when_asked(tiny_models):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    cfg = EngineConfig(preset='tiny', cameras=CAMS)
    for mode in (CompileMode.NONE, CompileMode.AUTO):      # AUTO on the CPU: eager
        backend = make_backend_for(cfg.with_settings(compile_mode=mode), model, 8)
        assert type(backend) is TorchBackend and backend.warmup_report == WarmupReport()
    with pytest.raises(ValueError, match='other than NONE'):
        FastPathModel(model, CompileMode.AUTO, _limits(model))


@pytest.mark.parametrize('fold', [False, True], ids=['plain', 'folded'])
def test_the_memory_adapter_runs_inside_the_suffix_and_decode_graphs(tiny_models, fold):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    adapter = from_oxygen_arrays(oxygen_arrays(model.cfg, rank=4, std=0.2), model.cfg)
    comp = FastPathModel(model, CompileMode.DEFAULT, _limits(model), backend='aot_eager',
                         only=[Step.SUFFIX, Step.DECODE], fold_norms=fold, adapter=adapter)
    pool = KVCache(model.cfg.vlm, SLOTS)
    comp.warmup(pool, progress=False)
    assert comp.fallbacks == {}
    gen = torch.Generator().manual_seed(9)
    size, ti = model.cfg.vision.image_size, model.cfg.image_tokens_per_camera

    def drive(m, cache):
        with torch.inference_mode():
            embeds = model.encode_images(torch.rand(1, 2, 3, size, size, generator=gen) * 2 - 1)
            root = model.prefill(torch.randint(3, 1000, (1, 9), generator=gen), None,
                                 image_embeds=embeds, cache=cache,
                                 slots=torch.arange(16, 16 + 2 * ti + 9)[None])
            p = root.slots.shape[1]
            ctx = PrefixKV(cache, root.slots.expand(3, -1), root.mask.expand(3, -1),
                           root.num_tokens.expand(3), root.last_hidden.expand(3, -1))
            rows = AdapterRows(adapter, torch.tensor([True, False, True]))
            out = m.prefill_suffix(torch.randint(3, 1000, (3, 3), generator=gen), None, ctx,
                                   slots=16 + p + torch.arange(9).view(3, 3), adapter=rows)
            tokens = model.lm_logits(out.last_hidden).argmax(-1)
            logits = m.decode_step(tokens, out.num_tokens, cache, 16 + p + 9 + torch.arange(3),
                                   out.slots, out.mask, rows)
            return [out.last_hidden, logits, cache.k[:, 16:16 + p + 12].clone()]  # not null

    calls = {s: sum(g.num_calls for g in gs.values()) for s, gs in comp._graphs.items()}
    state = gen.get_state()
    got = drive(comp, pool)
    gen.set_state(state)
    want = drive(model, KVCache(model.cfg.vlm, SLOTS))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0)
    assert all(sum(g.num_calls for g in gs.values()) > calls[s]
               for s, gs in comp._graphs.items())


def test_engine_exposes_the_fallbacks(tiny_models, tokenizer, monkeypatch):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    monkeypatch.setattr(fast_backend, 'DEFAULT_COMPILE_BACKEND', _failing)
    cfg = EngineConfig.create(preset='tiny', cameras=CAMS, compile_mode=CompileMode.DEFAULT,
                              max_running_requests=2)
    engine = Engine(cfg, model=model, tokenizer=tokenizer)
    assert {'denoise', 'decode', 'decode_steps', 'prefill', 'suffix', 'vision',
            'seed'} == set(engine.fallbacks)        # decode_steps: tokens_per_cycle 5
    assert 'no codegen today' in engine.fallbacks['decode']
    assert engine.fallbacks['decode_steps'].endswith('decoding step by step')
    eager = Engine(cfg.with_settings(compile_mode=CompileMode.NONE), model=model,
                   tokenizer=tokenizer)
    assert eager.fallbacks == {}


def test_two_engines_share_one_fast_path_on_two_halves_of_its_pool(tiny_models, tokenizer):
    """``TorchBackend.sharing_pool``: the bench's isolated engine reuses OxyGen's warm-up."""
    from oxygen_ros.sched.scheduler import Policy

    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    cfg = EngineConfig.create(preset='tiny', cameras=CAMS, compile_mode=CompileMode.DEFAULT,
                              max_running_requests=4, tokens_per_cycle=3, stop_on_eos=False,
                              seed=2)
    blocks = cfg.pool_blocks()
    shared = make_backend_for(cfg, model, 2 * blocks, backend='aot_eager', progress=False,
                              only=[Step.DECODE, Step.SEED])
    iso = Engine(cfg.with_settings(policy=Policy.ISOLATED), model=model, tokenizer=tokenizer,
                 backend=shared.sharing_pool(blocks))
    graphs = [g for gs in shared.model._graphs.values() for g in gs.values()]
    calls = sum(g.num_calls for g in graphs)
    block_size = cfg.scheduler.block_size
    half = blocks * block_size
    got = _engine_run(cfg.with_settings(policy=Policy.ISOLATED), model, tokenizer, engine=iso)
    assert sum(g.num_calls for g in graphs) > calls                 # through the graphs
    low = shared.cache.k[:, block_size:half]                        # block 0: padding rows
    assert (low == 0).all() and (shared.cache.k[:, half:] != 0).any()
    oxy = Engine(cfg, model=model, tokenizer=tokenizer, backend=shared)
    both = _engine_run(cfg, model, tokenizer, engine=oxy)
    assert (shared.cache.k[:, block_size:half] != 0).any()          # its own half
    want = _engine_run(cfg.with_settings(compile_mode=CompileMode.NONE), model, tokenizer)
    assert got[1] == want[1] == both[1]
    for a, b in zip(want[0], got[0]):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match='does not fit'):
        Engine(cfg, model=model, tokenizer=tokenizer, backend=shared.sharing_pool(2 * blocks - 5))


# -- real-time chunking's guided denoise on the fast path ------------------------------------

def _guidance(model, seed=5):
    gen = torch.Generator().manual_seed(seed)
    h, a = model.cfg.action_horizon, model.cfg.action_dim
    return RtcGuidance(torch.randn(1, h, a, generator=gen),
                       torch.tensor(soft_mask(h, 1, h - 1), dtype=torch.float32))


def _prefix(model, pool, cams, num_tokens):
    ti = model.cfg.image_tokens_per_camera
    gen = torch.Generator().manual_seed(cams * 100 + num_tokens)
    images = torch.rand(1, cams, 3, 224, 224, generator=gen) * 2 - 1
    return model.prefill(torch.randint(3, 1000, (1, num_tokens), generator=gen), None,
                         image_embeds=model.encode_images(images), cache=pool,
                         slots=torch.arange(16, 16 + cams * ti + num_tokens)[None])


@pytest.mark.parametrize('jacobian_steps', [None, 4])
def test_the_guided_denoise_on_the_fast_path_equals_the_eager_reference(
        tiny_models, jacobian_steps, caplog):
    """
    One graph per denoise bucket; padding masked; equal to autograd's guided denoise.

    With ``jacobian_steps`` k the graphs take the vector-Jacobian product at the first k Euler
    steps and the error alone after, as the eager reference; a guidance asking another k
    runs eagerly (a warning), never through graphs of the wrong k.
    """
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    n = model.cfg.num_denoise_steps
    comp = FastPathModel(model, CompileMode.DEFAULT, _limits(model), backend='aot_eager',
                         only=[Step.GUIDED_DENOISE], guided=True,
                         jacobian_steps=(jacobian_steps,))
    pool = KVCache(model.cfg.vlm, SLOTS)
    comp.warmup(pool, progress=False)
    k = n if jacobian_steps is None else jacobian_steps
    assert comp.fallbacks == {} and set(comp._graphs) == {Step.GUIDED_DENOISE}
    assert list(comp._graphs[Step.GUIDED_DENOISE]) == [(c, k) for c in comp.shapes.denoise]
    assert comp.parity['guided_denoise'].passed
    guidance = replace(_guidance(model), jacobian_steps=jacobian_steps)
    for cams, t in ((2, 20), (1, 7)):
        with torch.inference_mode():
            prefix = _prefix(model, pool, cams, t)
            noise = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim)
            calls = {k: g.num_calls for k, g in comp._graphs[Step.GUIDED_DENOISE].items()}
            got = comp.guided_denoise(prefix, noise, guidance)
            want = guided_denoise(model, prefix, noise, guidance)
            plain = model.denoise(prefix, noise)
        used = [key for key, g in comp._graphs[Step.GUIDED_DENOISE].items()
                if g.num_calls > calls[key]]
        assert used == [(bucket_for(prefix.slots.shape[1], comp.shapes.denoise), k)]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        assert (got - plain).abs().max() > 0.1                  # it did guide
    other = replace(guidance, jacobian_steps=n - 1 - (k == n - 1))
    calls = sum(g.num_calls for g in comp._graphs[Step.GUIDED_DENOISE].values())
    with torch.inference_mode(), caplog.at_level(logging.WARNING):
        got = comp.guided_denoise(prefix, noise, other)
        want = guided_denoise(model, prefix, noise, other)
    assert sum(g.num_calls for g in comp._graphs[Step.GUIDED_DENOISE].values()) == calls
    assert torch.equal(got, want)
    assert 'guided_denoise of shape' in caplog.text and 'outside the compiled ones' in caplog.text


def test_the_guided_denoise_is_never_built_from_functions_compiled_ahead_of_time(tiny_models):
    """Its two steps would share one name on disk; the warm-up never asks (JUST_IN_TIME)."""
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    builder = GraphBuilder(model, model.vlm.layers, KVCache(model.cfg.vlm, 64),
                           compiler='aot_eager')
    assert Step.GUIDED_DENOISE in JUST_IN_TIME
    with pytest.raises(RuntimeError, match=r'compiled just in time only \(warmup.JUST_IN_TIME'):
        builder.build(Step.GUIDED_DENOISE, (64, 10), Kernels.PRECOMPILED)


@pytest.mark.parametrize('jacobian_steps', [None, 3])
def test_the_guided_loop_is_one_graph_without_breaks(tiny_models, jacobian_steps):
    """Forward and vector-Jacobian product of all N steps trace as ONE Dynamo graph."""
    from torch._dynamo.backends.registry import lookup_backend

    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    graphs, aot_eager = [], lookup_backend('aot_eager')

    def counting(gm, example_inputs):   # AOTAutograd lowers the vjp, as Inductor's does
        graphs.append(gm)
        return aot_eager(gm, example_inputs)
    loop = torch.compile(GuidedDenoiseCall(model, jacobian_steps=jacobian_steps),
                         backend=counting, fullgraph=True)
    pool = KVCache(model.cfg.vlm, 256)
    pool.k.normal_()
    pool.v.normal_()
    slots = torch.arange(16, 16 + 140)[None]
    mask = torch.arange(140)[None] < 129
    noise = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim)
    guidance = replace(_guidance(model), jacobian_steps=jacobian_steps)
    args = (pool.k, pool.v, slots, mask, torch.tensor([129]), noise, guidance.target,
            guidance.soft_mask, guidance_weights(model.cfg.num_denoise_steps, 5.0))
    with torch.inference_mode():
        got = loop(*args)
        want = GuidedDenoiseCall(model, jacobian_steps=jacobian_steps)(*args)
        prefix = PrefixKV(pool, slots, mask, torch.tensor([129]),
                          torch.zeros(1, model.cfg.vlm.width))
        reference = guided_denoise(model, prefix, noise, guidance)
    assert len(graphs) == 1
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(want, reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize('jacobian_steps', [None, 2])
def test_an_rtc_engine_on_the_fast_path_guides_as_the_eager_engine(
        tiny_models, tokenizer, monkeypatch, jacobian_steps):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    monkeypatch.setattr(fast_backend, 'DEFAULT_COMPILE_BACKEND', 'aot_eager')
    cfg = EngineConfig.create(preset='tiny', cameras=CAMS, max_running_requests=2, seed=2,
                              rtc=True, rtc_jacobian_steps=jacobian_steps)
    fast = Engine(cfg.with_settings(compile_mode=CompileMode.DEFAULT), model=model,
                  tokenizer=tokenizer)
    assert fast.fallbacks == {} and Step.GUIDED_DENOISE in fast.backend.model._graphs
    eager = Engine(cfg, model=model, tokenizer=tokenizer)
    graphs = fast.backend.model._graphs[Step.GUIDED_DENOISE].values()
    rtc = RtcRequest(1, 100_000_000)
    for f in range(3):
        obs = make_observation(f, CAMS, 8)
        calls = sum(g.num_calls for g in graphs)
        got, want = fast.step(obs, rtc=rtc).action, eager.step(obs, rtc=rtc).action
        assert got.guided == want.guided == (f > 0)
        assert sum(g.num_calls for g in graphs) == calls + (f > 0)
        np.testing.assert_allclose(got.actions, want.actions, atol=1e-5, rtol=0)
