"""
FP8 weights behind the gates, on the CPU: the action rule at load, its fallback, the engine.

On random tiny weights the rule refuses FP8: its action error against float32 is 4-5x bf16's
(E4M3 keeps 3 mantissa bits, bf16 7; measured 2026-11-25: ratio 4.0-4.1 for ``tiny`` seed 3,
5-7 for ``small``; docs/gpu.md "FP8 weights"). Real checkpoints are held to the same rule.
"""

from dataclasses import replace
import logging

import numpy as np
from oxygen_ros.backends import fp8_gate
from oxygen_ros.backends.config import BackendKind, CompileMode, Quantization
from oxygen_ros.backends.fast_path import backend as fast_backend
from oxygen_ros.backends.fast_path.backend import FastPathBackend
from oxygen_ros.backends.fast_path.buckets import EngineLimits
from oxygen_ros.backends.fast_path.folding import FoldedGemmaLayer
from oxygen_ros.backends.fast_path.model import FastPathModel
from oxygen_ros.backends.fp8_gate import action_chunks, check_fp8_actions, probe_inputs
from oxygen_ros.backends.parity import float32_copy, model_copy
from oxygen_ros.config import CAMERA_SLOTS
from oxygen_ros.engine.config import EngineConfig, QUANTIZATION_FALLBACK
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.loading import load_model
from oxygen_ros.model.fp8 import fp8_kernel_of, Fp8Kernel, quantized_copy
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.tools.common.workload import make_observation
import pytest
import torch

CAMS = CAMERA_SLOTS[:2]
FP8 = EngineConfig.create(preset='tiny', cameras=CAMS, seed=3, quantization='fp8',
                          max_running_requests=2)


@pytest.fixture(scope='module')
def models():
    """Return the tiny float32 model, its bf16 copy and its FP8 copies (both kernels)."""
    model = load_model(replace(FP8, quantization=Quantization.NONE), FP8.model_config()).model
    return {'fp32': model, 'bf16': model_copy(model, torch.bfloat16),
            **{k: quantized_copy(model, k) for k in Fp8Kernel}}


@pytest.mark.parametrize('kernel', list(Fp8Kernel), ids=lambda k: k.value)
def test_the_rule_holds_fp8_to_1_5x_bf16s_action_error(models, kernel):
    check = check_fp8_actions(models[kernel], models['bf16'], models['fp32'],
                              num_cameras=len(CAMS))
    inputs = probe_inputs(models['fp32'], len(CAMS))
    want = action_chunks(models['fp32'], *inputs)
    assert want.shape == (2, FP8.model_config().action_horizon, 32)
    fp8_error = float((action_chunks(models[kernel], *inputs) - want).abs().max())
    bf16_error = float((action_chunks(models['bf16'], *inputs) - want).abs().max())
    assert (check.fp8_error, check.bf16_error) == (fp8_error, bf16_error)
    assert check.tolerance == max(1.5 * bf16_error, 1e-4 * max(1.0, float(want.abs().max())))
    assert check.passed == (fp8_error <= check.tolerance)
    # random tiny weights: FP8 is 3-5x further from float32 than bf16, so the rule refuses
    assert 1.5 < check.ratio < 8 and not check.passed
    assert '> tolerance' in check.describe() and "1.5 x bf16's" in check.describe()
    assert check_fp8_actions(models[kernel], models['bf16'], models['fp32'], num_cameras=2,
                             factor=8).passed


def test_non_finite_fp8_actions_always_fail(models):
    broken = quantized_copy(models['fp32'], Fp8Kernel.DEQUANT)
    broken.expert.layers[0].o.weight_scale[0] = float('nan')
    check = check_fp8_actions(broken, models['bf16'], models['fp32'], num_cameras=2,
                              factor=1e9)
    assert not check.finite and not check.passed
    assert check.describe() == 'fp8 actions are not finite'


def test_load_falls_back_to_the_unquantized_weights_loudly(caplog):
    with caplog.at_level(logging.ERROR, 'oxygen_ros.engine.loading'):
        loaded = load_model(FP8, FP8.model_config())
    assert fp8_kernel_of(loaded.model) is None and loaded.model.dtype == torch.float32
    assert loaded.reference is None                 # the model is its own float32 reference
    reason = loaded.fallbacks[QUANTIZATION_FALLBACK]
    assert reason.startswith('FP8 weights (dequant kernel) refused by the action check: fp8 '
                             'action error vs float32')
    assert reason.endswith('running the unquantized float32 weights')
    assert not loaded.check['passed'] and loaded.check['ratio'] > 1.5
    assert reason in caplog.text


def test_load_keeps_accepted_fp8_weights_and_reports_the_reference_path(monkeypatch, caplog):
    monkeypatch.setattr(fp8_gate, 'FACTOR', 8.0)
    with caplog.at_level(logging.WARNING, 'oxygen_ros.engine.loading'):
        loaded = load_model(replace(FP8, dtype='bfloat16'), FP8.model_config())
    assert fp8_kernel_of(loaded.model) is Fp8Kernel.DEQUANT
    assert loaded.model.dtype == torch.bfloat16 and loaded.check['passed']
    assert loaded.reference.dtype == torch.float32 and fp8_kernel_of(loaded.reference) is None
    reason = loaded.fallbacks[QUANTIZATION_FALLBACK]
    assert reason.startswith('fp8 runs the weight-only reference path (cpu: no FP8 tensor '
                             'cores')
    assert reason in caplog.text


def test_the_config_refuses_fp8_where_it_cannot_run():
    with pytest.raises(ValueError, match='quantization must be one of none, fp8'):
        EngineConfig(quantization='int4')
    with pytest.raises(ValueError, match="runs on the torch backend only; backend 'tensorrt'"):
        EngineConfig.create(quantization='fp8', backend=BackendKind.TENSORRT)
    with pytest.raises(ValueError, match="on CUDA needs dtype 'bfloat16', got 'float32'"):
        EngineConfig.create(quantization='fp8', device='cuda')
    config = EngineConfig.create(quantization='fp8', device='cuda', dtype='bfloat16')
    assert config.quantization is Quantization.FP8


def test_fp8_weights_have_no_float32_copy_and_no_folding(models):
    with pytest.raises(ValueError, match='float32 reference is a copy of the unquantized'):
        float32_copy(models[Fp8Kernel.SCALED_MM])
    with pytest.raises(ValueError, match='not Fp8Linear'):
        FoldedGemmaLayer(models[Fp8Kernel.SCALED_MM].vlm.layers[0])


def test_a_shared_model_must_be_quantized_as_the_config_says(models, tokenizer):
    with pytest.raises(ValueError, match='FP8 weights but the config asks for quantization .none'):
        Engine(replace(FP8, quantization='none'), model=models[Fp8Kernel.DEQUANT],
               tokenizer=tokenizer)
    with pytest.raises(ValueError, match='the model given has no FP8 weights'):
        Engine(FP8, model=models['fp32'], tokenizer=tokenizer)


def test_the_fast_path_without_the_unquantized_reference_runs_eagerly_loudly(models, caplog):
    limits = EngineLimits.for_model(FP8.model_config(), num_slots=2048, max_batch=2,
                                    max_decode_tokens=8, max_cameras=2)
    fast = FastPathModel(models[Fp8Kernel.SCALED_MM], CompileMode.DEFAULT, limits,
                         backend='aot_eager')
    assert not fast.fold_norms
    fast.warmup(KVCache(FP8.model_config().vlm, 2048), progress=False)
    assert set(fast.fallbacks) == {s.value for s in fast.steps()}
    assert 'float32 reference is a copy of the unquantized weights' in fast.fallbacks['denoise']


def test_an_fp8_engine_on_the_fast_path_passes_the_gate_and_reports_the_fallback(
        tokenizer, monkeypatch):
    """The engine hands the unquantized float32 copy to the gate; acts as its eager twin."""
    monkeypatch.setattr(fp8_gate, 'FACTOR', 8.0)
    monkeypatch.setattr(fast_backend, 'DEFAULT_COMPILE_BACKEND', 'aot_eager')
    loaded = load_model(FP8, FP8.model_config())
    assert loaded.reference is not None and fp8_kernel_of(loaded.model) is Fp8Kernel.DEQUANT
    fast = Engine(FP8.with_settings(compile_mode=CompileMode.DEFAULT), model=loaded,
                  tokenizer=tokenizer)
    eager = Engine(FP8, model=loaded.model, tokenizer=tokenizer)
    backend = fast.backend
    assert isinstance(backend, FastPathBackend) and backend.model.fallbacks == {}
    assert set(backend.model.parity) >= {'vision', 'prefill', 'denoise', 'decode'}
    assert set(fast.fallbacks) == {QUANTIZATION_FALLBACK}
    assert fast.describe_quantization() == 'fp8 e4m3, per-channel scales, dequant: 25 linears'
    for i in range(2):
        obs = make_observation(i, CAMS, fast.robot.state_dim)
        a, b = fast.step(obs).action.actions, eager.step(obs).action.actions
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
