"""The attention-kernel switch: from the config or the environment, applied to every cycle."""

from dataclasses import replace

import numpy as np
from oxygen_ros.backends.attention import sdpa_context
from oxygen_ros.backends.config import ATTENTION_ENV, AttentionBackend, CompileMode, Step
from oxygen_ros.backends.fast_path.buckets import EngineLimits
from oxygen_ros.backends.fast_path.model import FastPathModel
from oxygen_ros.backends.fast_path.paged_attention import use_paged_kernel
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.model.flex import prefill_attention
from oxygen_ros.model.guidance import guided_denoise, RtcGuidance
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.tools.common.workload import make_observation
from oxygen_ros.transforms.prompt import TextTask
from paged_cases import interpreted_kernel
import pytest
import torch
from torch._dynamo.backends.registry import lookup_backend


def test_the_config_wins_then_the_environment_then_auto(monkeypatch):
    monkeypatch.delenv(ATTENTION_ENV, raising=False)
    assert AttentionBackend.resolve(None) is AttentionBackend.AUTO
    monkeypatch.setenv(ATTENTION_ENV, ' Math ')
    assert AttentionBackend.resolve(None) is AttentionBackend.MATH
    assert AttentionBackend.resolve('flash') is AttentionBackend.FLASH
    assert EngineConfig(preset='tiny').backend.attention is AttentionBackend.MATH
    monkeypatch.setenv(ATTENTION_ENV, 'fast')
    with pytest.raises(ValueError, match="OXYGEN_ROS_ATTENTION='fast'.*auto, math, efficient"):
        EngineConfig(preset='tiny')
    cfg = EngineConfig.create(preset='tiny', attention_backend=AttentionBackend.CUDNN)
    assert cfg.backend.attention is AttentionBackend.CUDNN
    monkeypatch.setenv(ATTENTION_ENV, 'triton')
    assert EngineConfig(preset='tiny').backend.attention is AttentionBackend.TRITON


def test_only_triton_and_auto_compiled_for_cuda_use_the_paged_kernel():
    interpreted_kernel()
    x = torch.zeros(1)
    with sdpa_context(AttentionBackend.TRITON):
        assert use_paged_kernel(x, 1)
    for backend in (AttentionBackend.AUTO, AttentionBackend.MATMUL, AttentionBackend.MATH):
        with sdpa_context(backend):
            assert not use_paged_kernel(x, 1), backend         # AUTO: CPU, not compiling


def _run(cfg, model, tokenizer):
    engine = Engine(cfg, model=model, tokenizer=tokenizer)
    engine.submit_text(TextTask.SUBTASK, max_tokens=3, req_id='r')
    out = engine.step(make_observation(0, cfg.robot().cameras, 8))
    return out.action.actions


def test_every_cycle_runs_with_the_chosen_kernel(tiny_models, tokenizer, monkeypatch):
    """CPU has the math and flash kernels only: 'efficient' fails the cycle, math equals auto."""
    monkeypatch.delenv(ATTENTION_ENV, raising=False)
    cfg = EngineConfig(preset='tiny', cameras=CAMERA_SLOTS[:2], seed=1)
    model = tiny_models(cfg.model_config().prefix_attention, CAMERA_SLOTS[:2])
    auto = _run(cfg, model, tokenizer)
    math = _run(cfg.with_settings(attention_backend=AttentionBackend.MATH), model, tokenizer)
    np.testing.assert_allclose(math, auto, atol=1e-4, rtol=0)
    matmul = _run(cfg.with_settings(attention_backend=AttentionBackend.MATMUL), model, tokenizer)
    np.testing.assert_allclose(matmul, auto, atol=1e-4, rtol=0)
    with pytest.raises(RuntimeError, match='No viable backend'):
        _run(cfg.with_settings(attention_backend=AttentionBackend.EFFICIENT), model, tokenizer)


def test_triton_runs_decode_and_suffixes_on_the_fast_path_with_the_paged_kernel(tiny_models):
    """On the CPU in Triton's interpreter: the graphs hold the kernel, gate and equal eager."""
    interpreted_kernel()
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERA_SLOTS[:2])
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    limits = EngineLimits.for_model(model.cfg, num_slots=1024, max_batch=2,
                                    max_decode_tokens=8, max_cameras=2)
    fast = FastPathModel(model, CompileMode.DEFAULT, limits, backend=record,
                         only=[Step.DECODE, Step.SUFFIX])
    pool = KVCache(model.cfg.vlm, 1024)
    torch._dynamo.reset()
    with sdpa_context(AttentionBackend.TRITON):
        fast.warmup(pool, progress=False)
        assert fast.fallbacks == {} and set(fast.parity) == {'decode', 'suffix'}
        for gm in graphs:
            calls = [str(n.target) for n in gm.graph.nodes if n.op.startswith('call')]
            assert 'oxygen_ros.paged_attention.default' in calls
            assert not [c for c in calls if 'index_select' in c]
        gen = torch.Generator().manual_seed(2)
        pool.k.normal_(generator=gen)
        pool.v.normal_(generator=gen)
        ctx = torch.arange(16, 16 + 140).expand(2, 140)
        mask = torch.arange(140)[None] < torch.tensor([[140], [131]])
        args = (torch.tensor([5, 9]), mask.sum(1), pool, torch.tensor([400, 401]), ctx, mask)
        calls = sum(g.num_calls for g in fast._graphs[Step.DECODE].values())
        with torch.inference_mode():
            want = model.decode_step(*args)
            got = fast.decode_step(*args)
    torch._dynamo.reset()
    assert sum(g.num_calls for g in fast._graphs[Step.DECODE].values()) == calls + 1
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_triton_runs_the_denoise_on_the_fast_path_with_the_fused_kernels(tiny_models):
    """
    The denoise graphs hold the paged kernel and the fused norms, gate and equal eager.

    The guided denoise (RTC) beside them keeps the gathered velocity and its reference.
    """
    interpreted_kernel()
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERA_SLOTS[:1])
    graphs, aot_eager = [], lookup_backend('aot_eager')

    def record(gm, example_inputs):     # AOTAutograd lowers the guided step's vjp
        graphs.append(gm)
        return aot_eager(gm, example_inputs)
    limits = EngineLimits.for_model(model.cfg, num_slots=1024, max_batch=2,
                                    max_decode_tokens=8, max_cameras=1)
    fast = FastPathModel(model, CompileMode.DEFAULT, limits, backend=record,
                         only=[Step.DENOISE, Step.GUIDED_DENOISE], camera_counts=(1,),
                         guided=True)
    fast.shapes = replace(fast.shapes, denoise=fast.shapes.denoise[:1])  # one bucket: speed
    pool = KVCache(model.cfg.vlm, 1024)
    torch._dynamo.reset()
    with sdpa_context(AttentionBackend.TRITON):
        fast.warmup(pool, progress=False)
        assert fast.fallbacks == {} and set(fast.parity) == {'denoise', 'guided_denoise'}
        plain, guided = ([str(n.target) for n in gm.graph.nodes if n.op.startswith('call')]
                         for gm in graphs)
        assert plain.count('oxygen_ros.paged_attention.default') == model.cfg.expert.depth
        assert plain.count('oxygen_ros.gated_ada_rms_norm.default') == \
            2 * model.cfg.expert.depth
        assert not [c for c in plain if 'index_select' in c or 'rsqrt' in c]
        assert not [c for c in guided if 'oxygen_ros' in c]          # RTC: gathered
        gen = torch.Generator().manual_seed(2)
        pool.k.normal_(generator=gen)
        pool.v.normal_(generator=gen)
        p = fast.shapes.denoise[0] - 5
        prefix = PrefixKV(pool, torch.arange(16, 16 + p)[None], torch.ones(1, p, dtype=bool),
                          torch.tensor([p]), torch.zeros(1, model.cfg.vlm.width))
        noise = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim, generator=gen)
        guidance = RtcGuidance(torch.randn(noise.shape, generator=gen),
                               torch.linspace(1, 0, model.cfg.action_horizon))
        with torch.inference_mode():
            want = model.denoise(prefix, noise)
            got = fast.denoise(prefix, noise)
            want_guided = guided_denoise(model, prefix, noise, guidance)
            got_guided = fast.guided_denoise(prefix, noise, guidance)
    torch._dynamo.reset()
    assert sum(g.num_calls for g in fast._graphs[Step.DENOISE].values()) > 0
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_guided, want_guided, atol=1e-5, rtol=0)


def test_flex_is_chosen_by_its_name_and_by_auto_for_the_compiled_cuda_prefix_only():
    """TRITON is AUTO without FlexAttention: the way back to SDPA for the prefix on CUDA."""
    for backend, cpu, cuda in ((AttentionBackend.FLEX, 'flex', 'flex'),
                               (AttentionBackend.AUTO, 'sdpa', 'flex'),
                               (AttentionBackend.TRITON, 'sdpa', 'sdpa'),
                               (AttentionBackend.MATMUL, 'sdpa', 'sdpa'),
                               (AttentionBackend.CUDNN, 'sdpa', 'sdpa')):
        with sdpa_context(backend):
            assert prefill_attention('cpu', compiled=True) == cpu, backend
            assert prefill_attention('cuda', compiled=True) == cuda, backend
            assert prefill_attention('cuda', compiled=False) == 'sdpa', backend


@pytest.mark.parametrize('mode', list(PrefixAttention), ids=lambda m: m.value)
def test_flex_runs_vision_and_the_prefill_on_the_fast_path(tiny_models, mode):
    """The graphs hold FlexAttention, compile once for every bucket, gate and equal eager."""
    model = tiny_models(mode, CAMERA_SLOTS[:2])
    graphs, aot_eager = [], lookup_backend('aot_eager')

    def record(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)
    limits = EngineLimits.for_model(model.cfg, num_slots=1024, max_batch=2,
                                    max_decode_tokens=8, max_cameras=2)
    fast = FastPathModel(model, CompileMode.DEFAULT, limits, backend=record,
                         only=[Step.VISION, Step.PREFILL], camera_counts=(2,))
    pool = KVCache(model.cfg.vlm, 1024)
    torch._dynamo.reset()
    with sdpa_context(AttentionBackend.FLEX):
        fast.warmup(pool, progress=False)
    torch._dynamo.reset()
    assert fast.fallbacks == {} and set(fast.parity) == {'vision', 'prefill'}
    assert fast.compiles == {'vision': 1, 'prefill': 1}, fast.compiles
    vision, prefill = ([str(n.target) for n in gm.graph.nodes if n.op == 'call_function']
                       for gm in graphs)
    assert vision.count('flex_attention') == model.cfg.vision.depth
    assert prefill.count('flex_attention') == model.cfg.vlm.depth - 1
    gen = torch.Generator().manual_seed(5)
    size, ti = model.cfg.vision.image_size, model.cfg.image_tokens_per_camera
    images = torch.rand(1, 2, 3, size, size, generator=gen) * 2 - 1
    with torch.inference_mode():
        embeds = model.encode_images(images)
        torch.testing.assert_close(fast.encode_images(images), embeds, atol=1e-5, rtol=0)
        for t in (5, 30, model.cfg.max_token_len):            # three prompt buckets
            tokens = torch.randint(3, 1000, (1, t), generator=gen)
            slots = torch.arange(16, 16 + 2 * ti + t)[None]
            got = fast.prefill(tokens, None, image_embeds=embeds, cache=pool, slots=slots)
            k, v = pool.k[:, slots[0]].clone(), pool.v[:, slots[0]].clone()
            want = model.prefill(tokens, None, image_embeds=embeds, cache=pool, slots=slots)
            torch.testing.assert_close(got.last_hidden, want.last_hidden, atol=1e-5, rtol=0)
            torch.testing.assert_close(k, pool.k[:, slots[0]], atol=1e-5, rtol=0)
            torch.testing.assert_close(v, pool.v[:, slots[0]], atol=1e-5, rtol=0)
    assert all(g.num_calls >= 2 for g in fast._graphs[Step.PREFILL].values())
