"""
GPU checks of FP8 weights (``pytest -m gpu``; skipped without CUDA or FP8 tensor cores).

What CPU CI cannot see: ``torch._scaled_mm`` with row-wise scales on CUDA equals the float64
reference of its arithmetic, Inductor compiles the FP8 linear and a CUDA graph captures it,
and an engine with FP8 weights on the fast path passes the parity gate with no compiled step
falling back. Its figures on the full model: session 4 of ``oxygen_bench gpu`` (docs/gpu.md).
"""

from dataclasses import replace

import numpy as np
from oxygen_ros.backends import fp8_gate
from oxygen_ros.config import CAMERA_SLOTS
from oxygen_ros.engine.config import CompileMode, EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.loading import load_model, load_tokenizer
from oxygen_ros.model.fp8 import (
    fp8_kernel, fp8_kernel_of, Fp8Kernel, Fp8Linear, MIN_CAPABILITY, quantize_rows)
from oxygen_ros.tools.common.workload import make_observation
import pytest
import torch

CUDA = torch.cuda.is_available()
FP8_CORES = CUDA and torch.cuda.get_device_capability() >= MIN_CAPABILITY
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not FP8_CORES, reason='needs a CUDA GPU of compute capability >= 8.9'),
]


def _linear(out: int = 2560, inp: int = 2048) -> Fp8Linear:
    torch.manual_seed(0)
    layer = torch.nn.Linear(inp, out).to('cuda', torch.bfloat16)
    return Fp8Linear.from_linear(layer, Fp8Kernel.SCALED_MM)


def test_scaled_mm_on_cuda_equals_the_float64_reference_in_bf16():
    assert fp8_kernel('cuda') == (Fp8Kernel.SCALED_MM, None)
    fp8 = _linear()
    x = torch.randn(37, 2048, device='cuda', dtype=torch.bfloat16) * 3
    got = fp8(x)
    assert got.dtype == torch.bfloat16
    xq, xs = quantize_rows(x)
    want = (xq.double() * xs.double()) @ (fp8.weight.double()
                                          * fp8.weight_scale.double()[:, None]).T
    want = want + fp8.bias.double()
    torch.testing.assert_close(got.double(), want, rtol=2 ** -7, atol=2e-2)


def test_inductor_compiles_and_a_cuda_graph_captures_the_fp8_linear():
    fp8 = _linear()
    compiled = torch.compile(fp8, backend='inductor', fullgraph=True)
    x = torch.randn(64, 2048, device='cuda', dtype=torch.bfloat16)
    torch.testing.assert_close(compiled(x), fp8(x), rtol=2 ** -7, atol=2e-2)
    static = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        compiled(static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(static)
    static.copy_(x * 0.5)
    graph.replay()
    torch.testing.assert_close(out, fp8(x * 0.5), rtol=2 ** -7, atol=2e-2)


def test_an_fp8_engine_on_the_fast_path_passes_the_gate(monkeypatch):
    """The tiny model's random weights fail the action check; a loose factor admits them."""
    monkeypatch.setattr(fp8_gate, 'FACTOR', 1e3)
    cfg = EngineConfig(preset='tiny', cameras=CAMERA_SLOTS[:2], device='cuda',
                       dtype='bfloat16', quantization='fp8', tokens_per_cycle=2,
                       max_running_requests=4, seed=5, compile_mode=CompileMode.REDUCE_OVERHEAD)
    loaded = load_model(cfg, cfg.model_config())
    assert fp8_kernel_of(loaded.model) is Fp8Kernel.SCALED_MM and loaded.fallbacks == {}
    tokenizer = load_tokenizer(cfg)
    fast = Engine(cfg, model=loaded, tokenizer=tokenizer)
    eager = Engine(replace(cfg, compile_mode=CompileMode.NONE), model=loaded.model,
                   tokenizer=tokenizer)
    assert fast.fallbacks == {}, fast.fallbacks
    assert fast.describe_quantization().endswith('scaled_mm: 25 linears')
    gate = fast.backend.model.parity['denoise']
    for f in range(2):
        obs = make_observation(f, cfg.model_config().cameras, 8)
        a, b = fast.step(obs).action.actions, eager.step(obs).action.actions
        assert np.abs(a - b).max() <= max(1e-3, 3 * gate.tolerance)
