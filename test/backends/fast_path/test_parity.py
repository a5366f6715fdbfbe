"""
The parity gate knows bfloat16: real compiled-vs-eager bf16 differences pass, wrong code fails.

The H100 run of 2026-11-22 rejected ordinary bf16 differences (denoise velocity 0.0265, decode
logits 0.10) with a float32-sized tolerance and fell back silently; here the same kind of
difference (Inductor kernels vs eager, bf16, on the CPU) must pass, and a compiled function
that is genuinely wrong must fail loudly, in bf16 and in fp32.
"""

import logging

from oxygen_ros.backends.config import CompileMode
from oxygen_ros.backends.fast_path.buckets import EngineLimits
from oxygen_ros.backends.fast_path.graph_builder import Step
from oxygen_ros.backends.fast_path.model import FastPathModel
from oxygen_ros.backends.parity import check_parity, FACTOR, float32_copy, FLOOR
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.loading import build_model
from oxygen_ros.model.kv_cache import KVCache
import pytest
import torch

MODE = PrefixAttention.CAUSAL_TEXT


def _model(dtype):
    cfg = EngineConfig(preset='tiny', prefix_attention=MODE, cameras=CAMERA_SLOTS[:2], seed=3,
                       dtype=dtype)
    return build_model(cfg, cfg.model_config())


def _compiled(model, backend, max_batch=1):
    """Warm up the denoise and decode steps only (Inductor on this CPU: minutes a step)."""
    limits = EngineLimits.for_model(model.cfg, num_slots=1024, max_batch=max_batch,
                                    max_decode_tokens=8, max_cameras=2)
    comp = FastPathModel(model, CompileMode.DEFAULT, limits, backend=backend,
                         only=[Step.DENOISE, Step.DECODE])
    comp.warmup(KVCache(model.cfg.vlm, 1024, dtype=model.dtype), progress=False)
    return comp


pytestmark = pytest.mark.usefixtures('fresh_dynamo')


def test_rule_float32_uses_the_floor_and_bfloat16_the_reference():
    eager = [torch.tensor([10.0, -2.0])]
    ok = check_parity('x', [torch.tensor([10.0005, -2.0])], eager)
    assert ok.passed and ok.tolerance == pytest.approx(FLOOR * 10) and ok.reference_error == 0
    assert not check_parity('x', [torch.tensor([10.01, -2.0])], eager).passed
    ref = [torch.tensor([10.02, -2.0])]                       # eager is 0.02 from float32
    bf16 = check_parity('x', [torch.tensor([10.05, -2.0])], eager, ref)
    assert bf16.passed and bf16.tolerance == pytest.approx(FACTOR * 0.02, rel=1e-4)
    assert not check_parity('x', [torch.tensor([10.07, -2.0])], eager, ref).passed
    nan = check_parity('x', [torch.tensor([float('nan'), -2.0])], eager, ref)
    assert not nan.passed and 'non-finite' in nan.describe()
    wrong = check_parity('x', [torch.tensor([10.07, -2.0])], eager, ref)
    assert '0.07 > tolerance 0.06' in wrong.describe()
    with pytest.raises(ValueError, match='compiled output'):
        check_parity('x', [torch.zeros(3)], eager)


def test_float32_copy_holds_the_same_weights():
    model = _model('bfloat16')
    ref = float32_copy(model)
    assert ref.dtype == torch.float32 and float32_copy(ref) is None
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert q.dtype == torch.float32 and torch.equal(p.float(), q), name


def test_real_bfloat16_compile_differences_pass_the_gate():
    """Inductor (C++ kernels from the system gcc) vs eager, bf16: no fallback."""
    comp = _compiled(_model('bfloat16'), 'inductor')
    assert comp.fallbacks == {} and set(comp._graphs) == {Step.DENOISE, Step.DECODE}
    assert set(comp.parity) == {'denoise', 'decode'}
    for result in comp.parity.values():
        assert result.passed and result.reference_error > 0
    # the differences are real bf16 ones, beyond the old float32 tolerance (1e-3 * scale)
    assert max(r.error for r in comp.parity.values()) > 2e-3, comp.parity


@pytest.mark.slow
def test_the_guided_denoise_compiled_by_inductor_passes_the_bfloat16_gate():
    """The guided step of RTC (velocity and its vector-Jacobian product), Inductor's C++."""
    model = _model('bfloat16')
    limits = EngineLimits.for_model(model.cfg, num_slots=1024, max_batch=1,
                                    max_decode_tokens=8, max_cameras=2)
    comp = FastPathModel(model, CompileMode.DEFAULT, limits, backend='inductor',
                         only=[Step.GUIDED_DENOISE], guided=True)
    comp.warmup(KVCache(model.cfg.vlm, 1024, dtype=model.dtype), progress=False)
    assert comp.fallbacks == {} and set(comp.parity) == {'guided_denoise'}
    assert comp.compiles['guided_denoise'] + comp.loaded['guided_denoise'] == 1  # all buckets
    result = comp.parity['guided_denoise']
    assert result.passed and result.reference_error > 0, result.describe()


@pytest.mark.slow
def test_inductor_compiles_vision_and_prefill_in_full_graphs_equal_to_eager():
    """Inductor's C++ kernels (fullgraph=True: no graph break) for SigLIP and the prefill."""
    model = _model('float32')
    limits = EngineLimits.for_model(model.cfg, num_slots=1024, max_batch=1,
                                    max_decode_tokens=8, max_cameras=2)
    comp = FastPathModel(model, CompileMode.DEFAULT, limits, backend='inductor',
                         only=[Step.VISION, Step.PREFILL], camera_counts=(2,))
    pool = KVCache(model.cfg.vlm, 1024)
    comp.warmup(pool, progress=False)
    assert comp.fallbacks == {} and set(comp.parity) == {'vision', 'prefill'}
    for step in ('vision', 'prefill'):                      # one graph for every bucket,
        assert comp.compiles[step] + comp.loaded[step] == 1  # traced now or loaded (AOT)
    gen = torch.Generator().manual_seed(7)
    size, ti = model.cfg.vision.image_size, model.cfg.image_tokens_per_camera
    images = torch.rand(1, 2, 3, size, size, generator=gen) * 2 - 1
    with torch.inference_mode():
        got = comp.encode_images(images)
        want = model.encode_images(images)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        for t in (5, 30, 64):                                # every prompt bucket
            tokens = torch.randint(3, 1000, (1, t), generator=gen)
            slots = torch.arange(16, 16 + 2 * ti + t)[None]
            fast = comp.prefill(tokens, None, image_embeds=want, cache=pool, slots=slots)
            k = pool.k[:, slots[0]].clone()
            eager = model.prefill(tokens, None, image_embeds=want, cache=pool, slots=slots)
            torch.testing.assert_close(fast.last_hidden, eager.last_hidden, atol=1e-4,
                                       rtol=1e-4)
            torch.testing.assert_close(k, pool.k[:, slots[0]], atol=1e-4, rtol=1e-4)
    assert all(g.num_calls >= 2 for g in comp._graphs[Step.PREFILL].values())


def _wrong(gm, example_inputs):
    """Return a compiled function whose outputs are 10 % off (must never be used)."""
    def run(*args):
        outs = gm(*args)
        return type(outs)(o * 1.1 if o.is_floating_point() else o for o in outs)
    return run


@pytest.mark.parametrize('dtype', ['bfloat16', 'float32'])
def test_a_wrong_compiled_function_is_rejected_loudly(dtype, caplog):
    model = _model(dtype)
    with caplog.at_level(logging.ERROR, logger='oxygen_ros.backends.fast_path.model'):
        comp = _compiled(model, _wrong, max_batch=2)
    assert comp._graphs == {} and comp.parity == {}
    assert set(comp.fallbacks) == {'denoise', 'decode'}
    for step, reason in comp.fallbacks.items():
        assert 'parity gate failed' in reason and '> tolerance' in reason, reason
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len([m for m in errors if 'runs EAGERLY' in m]) == 2, errors
    assert all('> tolerance' in m for m in errors), errors
