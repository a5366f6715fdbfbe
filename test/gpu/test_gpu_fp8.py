"""
FP8 weights as the GPU runs them, their body checked on the CPU too.

``cuda`` cases (``pytest -m gpu``; skipped without CUDA or FP8 tensor cores), what CPU CI
cannot see: ``torch._scaled_mm`` with row-wise scales on CUDA equals the float64 reference of
its arithmetic, Inductor compiles the FP8 linear and a CUDA graph captures it, and an engine
with FP8 weights on the fast path passes the parity gate with no compiled step falling back.
``cpu`` cases (``make test``, ``test/devices.py``): torch's CPU ``_scaled_mm`` against the
same reference, the linear traced by Dynamo with ``aot_eager`` (no capture), and the engine
on the fast path with the CPU's kernel, the weight-only reference path (``dequant``, a loud
``quantization`` fallback there by design). Its figures on the full model: session 4 of
``oxygen_bench gpu`` (docs/gpu.md).
"""


from devices import compiler, CUDA
import numpy as np
from oxygen_ros.backends import fp8_gate
from oxygen_ros.backends.fast_path import backend as fast_backend
from oxygen_ros.config import CAMERA_SLOTS
from oxygen_ros.engine.config import CompileMode, EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.loading import load_model, load_tokenizer
from oxygen_ros.model.fp8 import (
    fp8_kernel, fp8_kernel_of, Fp8Kernel, Fp8Linear, MIN_CAPABILITY, quantize_rows)
from oxygen_ros.tools.common.workload import make_observation
import pytest
import torch

FP8_CORES = CUDA and torch.cuda.get_device_capability() >= MIN_CAPABILITY
DEVICES = (pytest.param('cpu', id='cpu'),
           pytest.param('cuda', id='cuda', marks=(pytest.mark.gpu, pytest.mark.skipif(
               not FP8_CORES, reason='needs a CUDA GPU of compute capability >= 8.9'))))
"""``test/devices.py``'s, the CUDA case needing FP8 tensor cores."""


def _linear(device: str, out: int = 2560, inp: int = 2048) -> Fp8Linear:
    torch.manual_seed(0)
    layer = torch.nn.Linear(inp, out).to(device, torch.bfloat16)
    return Fp8Linear.from_linear(layer, Fp8Kernel.SCALED_MM)


@pytest.mark.parametrize('device', DEVICES)
def test_scaled_mm_equals_the_float64_reference_in_bf16(device):
    if device == 'cuda':
        assert fp8_kernel('cuda') == (Fp8Kernel.SCALED_MM, None)
    else:                       # the engine runs the reference path there; the kernel runs
        assert fp8_kernel('cpu')[0] is Fp8Kernel.DEQUANT
    fp8 = _linear(device)
    x = torch.randn(37, 2048, device=device, dtype=torch.bfloat16) * 3
    got = fp8(x)
    assert got.dtype == torch.bfloat16
    xq, xs = quantize_rows(x)
    want = (xq.double() * xs.double()) @ (fp8.weight.double()
                                          * fp8.weight_scale.double()[:, None]).T
    want = want + fp8.bias.double()
    torch.testing.assert_close(got.double(), want, rtol=2 ** -7, atol=2e-2)


@pytest.mark.parametrize('device', DEVICES)
def test_inductor_compiles_and_a_cuda_graph_captures_the_fp8_linear(device):
    fp8 = _linear(device)
    compiled = torch.compile(fp8, backend=compiler(device), fullgraph=True)
    x = torch.randn(64, 2048, device=device, dtype=torch.bfloat16)
    torch.testing.assert_close(compiled(x), fp8(x), rtol=2 ** -7, atol=2e-2)
    if device != 'cuda':
        return                                   # no CUDA graph to capture on the CPU
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


@pytest.mark.parametrize('device', DEVICES)
def test_an_fp8_engine_on_the_fast_path_passes_the_gate(monkeypatch, device):
    """The tiny model's random weights fail the action check; a loose factor admits them."""
    monkeypatch.setattr(fp8_gate, 'FACTOR', 1e3)
    monkeypatch.setattr(fast_backend, 'DEFAULT_COMPILE_BACKEND', compiler(device))
    cfg = EngineConfig.create(preset='tiny', cameras=CAMERA_SLOTS[:2], device=device,
                              dtype='bfloat16', quantization='fp8', tokens_per_cycle=2,
                              max_running_requests=4, seed=5,
                              compile_mode=CompileMode.REDUCE_OVERHEAD)
    loaded = load_model(cfg, cfg.model_config())
    kernel = Fp8Kernel.SCALED_MM if device == 'cuda' else Fp8Kernel.DEQUANT
    assert fp8_kernel_of(loaded.model) is kernel
    assert list(loaded.fallbacks) == ([] if device == 'cuda' else ['quantization'])
    tokenizer = load_tokenizer(cfg)
    fast = Engine(cfg, model=loaded, tokenizer=tokenizer)
    eager = Engine(cfg.with_settings(compile_mode=CompileMode.NONE), model=loaded.model,
                   tokenizer=tokenizer)
    assert {k: v for k, v in fast.fallbacks.items() if k != 'quantization'} == {}, \
        fast.fallbacks
    assert fast.describe_quantization().endswith(f'{kernel.value}: 25 linears')
    gate = fast.backend.model.parity['denoise']
    for f in range(2):
        obs = make_observation(f, cfg.robot().cameras, 8)
        a, b = fast.step(obs).action.actions, eager.step(obs).action.actions
        assert np.abs(a - b).max() <= max(1e-3, 3 * gate.tolerance)
