"""
GPU checks of the compiled and TensorRT backends (``pytest -m gpu``; skipped without CUDA).

What CPU CI cannot see: Inductor kernels and CUDA graphs (``reduce-overhead``) equal eager
on CUDA; TensorRT parses and builds our graphs (float32 and strongly typed bfloat16),
executes on torch's buffers and stream, and the whole engine on it equals the torch
backend; the denoise CUDA graph equals the plain loop; engines come from the disk cache the
second time. Timings on full size: ``python -m oxygen_ros.tools.gpu_check --bench``.
"""

import importlib.util
import time

import numpy as np
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine.config import BackendKind, CompileMode, EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.loading import build_model, load_tokenizer
from oxygen_ros.model.prompt import TextTask
from oxygen_ros.tools.workload import make_observation
import pytest
import torch

CUDA = torch.cuda.is_available()
TENSORRT = importlib.util.find_spec('tensorrt') is not None
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not CUDA, reason='needs a CUDA GPU (torch.cuda.is_available() is False)'),
]
needs_trt = pytest.mark.skipif(not TENSORRT, reason="needs NVIDIA TensorRT 10.x ('tensorrt')")


def _run(cfg, model, tokenizer, frames=4):
    engine = Engine(cfg, model=model, tokenizer=tokenizer)
    actions, texts = [], {}
    for f in range(frames):
        engine.submit_text(TextTask.SUBTASK, max_tokens=3 + 2 * f, req_id=f'r{f}')
        out = engine.step(make_observation(f, cfg.model_config().cameras, 8))
        actions.append(out.action.actions)
        texts.update({t.req_id: t.token_ids for t in out.texts})
    while engine.num_running:
        texts.update({t.req_id: t.token_ids for t in engine.step(None).texts})
    return actions, texts, engine


def _config(mode, dtype='float32', **kw):
    return EngineConfig(preset='tiny', prefix_attention=mode, cameras=CAMERA_SLOTS[:2],
                        device='cuda', dtype=dtype, tokens_per_cycle=2, stop_on_eos=False,
                        max_running_requests=8, seed=5, **kw)


@pytest.fixture(scope='module')
def tokenizer():
    return load_tokenizer(EngineConfig(preset='tiny'))


@pytest.mark.parametrize('compile_mode', [CompileMode.DEFAULT, CompileMode.REDUCE_OVERHEAD])
def test_compiled_engine_equals_eager_on_cuda(compile_mode, tokenizer):
    mode = PrefixAttention.CAUSAL_TEXT
    model = build_model(_config(mode), _config(mode).model_config())
    want = _run(_config(mode), model, tokenizer)
    got = _run(_config(mode, compile_mode=compile_mode), model, tokenizer)
    assert got[2].backend.compile_seconds > 0
    assert got[2].backend.model._decode is not None, 'compiled decode fell back to eager'
    assert got[2].backend.model._denoise is not None, 'compiled denoise fell back to eager'
    for a, b in zip(want[0], got[0]):
        np.testing.assert_allclose(b, a, atol=1e-3, rtol=0)
    assert got[1] == want[1]


@needs_trt
@pytest.mark.parametrize('mode', list(PrefixAttention))
def test_tensorrt_engine_equals_torch_engine_float32(mode, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv('OXYGEN_ROS_CACHE', str(tmp_path))
    model = build_model(_config(mode), _config(mode).model_config())
    want = _run(_config(mode), model, tokenizer)
    t0 = time.perf_counter()
    got = _run(_config(mode, backend=BackendKind.TENSORRT), model, tokenizer)
    first = time.perf_counter() - t0
    assert type(got[2].backend).__name__ == 'TensorRTBackend'
    for a, b in zip(want[0], got[0]):
        np.testing.assert_allclose(b, a, atol=1e-3, rtol=0)
    assert got[1] == want[1]
    assert len(list((tmp_path / 'tensorrt').glob('*.plan'))) == 5
    t0 = time.perf_counter()            # second engine: ONNX export and plans from the cache
    again = _run(_config(mode, backend=BackendKind.TENSORRT), model, tokenizer)
    assert time.perf_counter() - t0 < first
    assert again[1] == got[1]


@needs_trt
def test_tensorrt_bfloat16_engine_is_close_to_torch_bfloat16(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv('OXYGEN_ROS_CACHE', str(tmp_path))
    mode = PrefixAttention.BIDIRECTIONAL
    cfg = _config(mode, dtype='bfloat16')
    model = build_model(cfg, cfg.model_config())
    want = _run(cfg, model, tokenizer)
    got = _run(_config(mode, dtype='bfloat16', backend=BackendKind.TENSORRT), model, tokenizer)
    for a, b in zip(want[0], got[0]):
        np.testing.assert_allclose(b, a, atol=5e-2, rtol=0)
        assert np.all(np.isfinite(b))


@needs_trt
def test_denoise_cuda_graph_equals_plain_loop(tokenizer, tmp_path, monkeypatch):
    from oxygen_ros.backends.tensorrt_backend import TensorRTBackend

    monkeypatch.setenv('OXYGEN_ROS_CACHE', str(tmp_path))
    mode = PrefixAttention.CAUSAL_TEXT
    cfg = _config(mode, backend=BackendKind.TENSORRT)
    model = build_model(cfg, cfg.model_config())
    graphed = TensorRTBackend.create(cfg.backend_config(), model, 64, cuda_graphs=True)
    plain = TensorRTBackend.create(cfg.backend_config(), model, 64, cuda_graphs=False)
    size = model.cfg.vision.image_size
    images = torch.rand(1, 2, 3, size, size, device='cuda') * 2 - 1
    tokens = torch.randint(3, 1000, (1, 12), device='cuda')
    noise = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim, device='cuda')
    out = []
    with torch.inference_mode():
        for backend in (graphed, plain):
            r = backend.runner
            prefix = r.prefill(tokens, torch.ones_like(tokens, dtype=torch.bool),
                               image_embeds=r.encode_images(images), cache=backend.cache,
                               slots=torch.arange(16, 16 + 140, device='cuda')[None])
            out.append([r.denoise(prefix, noise * s) for s in (1.0, -1.0, 0.5)])
    assert graphed.runner.executor._denoise_graphs                 # captured once, replayed
    for a, b in zip(*out):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert (out[0][0] - out[0][1]).abs().max() > 1e-3               # replays see new noise
