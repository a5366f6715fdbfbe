"""
The fast path and the TensorRT backend as the GPU runs them, the bodies checked on the CPU too.

``cuda`` cases (``pytest -m gpu``; skipped without CUDA), what CPU CI cannot see: Inductor's
Triton kernels and our CUDA graphs (every per-cycle call captured) equal eager on CUDA and
pass the parity gate in float32 and bfloat16 with no fallback; the graphs replay (not re-run)
and see new inputs. ``cpu`` cases (``make test``, ``test/devices.py``): the same engines and
calls with ``aot_eager`` for Inductor and nothing captured (the engine of each compile mode
runs there as ``cuda-graphs``: eager kernels in the static calls; ``default`` with
``aot_eager``, which ``reduce-overhead`` is on the CPU, is the engine test of
``test/backends/fast_path/test_fast_path.py``); the steps gated, the graphs' buffers and the
fallbacks are the GPU's. CUDA only, each saying why (``devices.cuda_only``): the calls never
wait for the host (``torch.cuda.set_sync_debug_mode``), capture survives another thread using
CUDA, TensorRT parses and builds our graphs, executes on torch's buffers and stream, equals
the torch backend and comes from the disk cache the second time (its graphs run in
onnxruntime on the CPU: ``test/tools/tensorrt``). Timings on full size: ``oxygen_bench gpu
--session N`` (docs/gpu.md, "The GPU session", whose second command runs this file).
"""

import importlib.util
import threading
import time

from devices import compiler, cuda_only, DEVICES
import numpy as np
from oxygen_ros.backends.fast_path import backend as fast_backend
from oxygen_ros.backends.fast_path.graph_builder import Step
from oxygen_ros.backends.fast_path.paged_attention import decode_attention
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine.config import BackendKind, CompileMode, EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.loading import build_model, load_tokenizer
from oxygen_ros.tools.common.workload import make_observation
from oxygen_ros.transforms.prompt import TextTask
import pytest
import torch

TENSORRT = importlib.util.find_spec('tensorrt') is not None
needs_trt = pytest.mark.skipif(not TENSORRT, reason="needs NVIDIA TensorRT 10.x ('tensorrt')")


def _run(cfg, model, tokenizer, frames=4):
    engine = Engine(cfg, model=model, tokenizer=tokenizer)
    actions, texts = [], {}
    for f in range(frames):
        engine.submit_text(TextTask.SUBTASK, max_tokens=3 + 2 * f, req_id=f'r{f}')
        out = engine.step(make_observation(f, cfg.robot().cameras, 8))
        actions.append(out.action.actions)
        texts.update({t.req_id: t.token_ids for t in out.finished})
    while engine.num_running:
        texts.update({t.req_id: t.token_ids for t in engine.step(None).finished})
    return actions, texts, engine


def _config(mode, dtype='float32', device='cuda', **kw):
    kw.setdefault('compile_mode', CompileMode.NONE)
    return EngineConfig.create(preset='tiny', prefix_attention=mode, cameras=CAMERA_SLOTS[:2],
                               device=device, dtype=dtype, tokens_per_cycle=2, stop_on_eos=False,
                               max_running_requests=8, seed=5, **kw)


@pytest.fixture(scope='module')
def tokenizer():
    return load_tokenizer(EngineConfig(preset='tiny'))


@pytest.fixture
def on(monkeypatch):
    """Return a function that sets the fast path's compiler for ``device``; returns it."""
    def use(device):
        monkeypatch.setattr(fast_backend, 'DEFAULT_COMPILE_BACKEND', compiler(device))
        return device
    return use


FAST = [CompileMode.DEFAULT, CompileMode.REDUCE_OVERHEAD, CompileMode.CUDA_GRAPHS]
CUDA_CASE = DEVICES[1].marks
ENGINE_CASES = [
    *(pytest.param('cuda', c, m, id=f'cuda-{c.value}-{m.value}', marks=CUDA_CASE)
      for c in FAST for m in PrefixAttention),
    # the CPU: cuda-graphs (eager kernels in the static calls); default with aot_eager (and
    # reduce-overhead, which is default there) is test/backends/fast_path/test_fast_path.py's
    *(pytest.param('cpu', CompileMode.CUDA_GRAPHS, m, id=f'cpu-cuda-graphs-{m.value}')
      for m in PrefixAttention),
]


@pytest.mark.parametrize('device, compile_mode, mode', ENGINE_CASES)
def test_fast_path_engine_equals_eager(device, compile_mode, mode, tokenizer, on):
    on(device)
    model = build_model(_config(mode, device=device), _config(mode).model_config())
    want = _run(_config(mode, device=device), model, tokenizer)
    got = _run(_config(mode, device=device, compile_mode=compile_mode), model, tokenizer)
    backend = got[2].backend
    assert backend.warmup_report.seconds > 0
    assert got[2].fallbacks == {}, got[2].fallbacks
    graphs = [g for gs in backend.model._graphs.values() for g in gs.values()]
    captured = device == 'cuda' and compile_mode is not CompileMode.DEFAULT
    assert graphs and all(g.captured == captured for g in graphs)
    assert sum(g.num_calls for g in graphs) > len(graphs)          # the engine used them
    for a, b in zip(want[0], got[0]):
        np.testing.assert_allclose(b, a, atol=1e-3, rtol=0)
    assert got[1] == want[1]


@pytest.mark.parametrize('device', DEVICES)
def test_fast_path_in_bfloat16_passes_the_gate_without_fallback(device, tokenizer, on):
    """The H100 run of 2026-11-22 fell back here (the gate took a float32 tolerance)."""
    mode = PrefixAttention.BIDIRECTIONAL
    cfg = _config(mode, dtype='bfloat16', device=on(device),
                  compile_mode=CompileMode.REDUCE_OVERHEAD)
    model = build_model(cfg, cfg.model_config())
    actions, texts, engine = _run(cfg, model, tokenizer)
    assert engine.fallbacks == {}, engine.fallbacks
    parity = engine.backend.model.parity
    # text on the action prefix (the default text context) runs as suffixes: no text
    # prefill; k = 2 tokens per cycle: the decode job's 2 steps are one graph, gated too
    assert set(parity) == {'vision', 'prefill', 'suffix', 'denoise', 'decode', 'decode_steps',
                           'seed'}
    assert all(r.passed and r.reference_error > 0 for r in parity.values())
    assert all(np.all(np.isfinite(a)) for a in actions) and texts
    # on CUDA decode and suffixes read the KV pool in place (the paged Triton kernel) by
    # default; AUTO on the CPU gathers their context
    want = 'paged' if device == 'cuda' else 'gathered'
    assert decode_attention(engine.backend.device, compiled=True) == want


@cuda_only('torch.cuda.set_sync_debug_mode counts the host syncs of CUDA calls')
def test_fast_path_calls_never_wait_for_the_host(tokenizer):
    """Every graph-backed call runs with CUDA's sync debug mode set to error."""
    mode = PrefixAttention.CAUSAL_TEXT
    cfg = _config(mode, compile_mode=CompileMode.REDUCE_OVERHEAD)
    model = build_model(cfg, cfg.model_config())
    engine = Engine(cfg, model=model, tokenizer=tokenizer)
    fast, pool = engine.backend.model, engine.backend.cache
    ti, dev = model.cfg.image_tokens_per_camera, 'cuda'
    images = torch.rand(1, 2, 3, 224, 224, device=dev) * 2 - 1
    tokens = torch.randint(3, 1000, (1, 9), device=dev)
    noise = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim, device=dev)
    calls_before = sum(g.num_calls for gs in fast._graphs.values() for g in gs.values())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        embeds = fast.encode_images(images)
        image = fast.prefill(tokens[:, :0], None, image_embeds=embeds, cache=pool,
                             slots=torch.arange(16, 16 + 2 * ti, device=dev)[None])
        prefix = fast.prefill(tokens, None, context=image, cache=pool,
                              slots=torch.arange(16 + 2 * ti, 25 + 2 * ti, device=dev)[None])
        fast.denoise(prefix, noise)
        ids = fast.lm_greedy(prefix.last_hidden.expand(3, -1))
        ctx = prefix.slots.expand(3, -1)
        fast.decode_greedy(ids, prefix.num_tokens.expand(3), pool,
                           torch.arange(400, 403, device=dev), ctx,
                           torch.ones(ctx.shape, dtype=torch.bool, device=dev))
    finally:
        torch.cuda.set_sync_debug_mode('default')
    calls = sum(g.num_calls for gs in fast._graphs.values() for g in gs.values())
    assert calls - calls_before == 6                                 # all six were replays


@cuda_only('torch.cuda.set_sync_debug_mode counts the host syncs of CUDA calls')
def test_a_whole_cycle_waits_for_the_gpu_at_most_once(tokenizer):
    """Count the host syncs of Engine.step on the fast path: the token readback, no other."""
    import warnings

    cfg = _config(PrefixAttention.BIDIRECTIONAL, compile_mode=CompileMode.REDUCE_OVERHEAD)
    model = build_model(cfg, cfg.model_config())
    engine = Engine(cfg, model=model, tokenizer=tokenizer)
    observations = [make_observation(f, cfg.robot().cameras, 8) for f in range(3)]
    engine.warmup(observations[0])
    counts = []
    for f, obs in enumerate(observations):
        engine.submit_text(TextTask.MEMORY, max_tokens=4, req_id=f'm{f}')
        prepared = engine.prepare(obs)            # the node does this when images arrive
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            torch.cuda.set_sync_debug_mode('warn')
            try:
                engine.step(prepared)
            finally:
                torch.cuda.set_sync_debug_mode('default')
        syncs = [str(w.message) for w in caught if 'synchroniz' in str(w.message).lower()]
        counts.append(len(syncs))
        assert len(syncs) <= 1, syncs
    assert engine.fallbacks == {}, engine.fallbacks
    print(f'host syncs per cycle: {counts}')      # docs/gpu.md


@cuda_only("a CUDA graph's capture and another thread's CUDA stream")
def test_capture_survives_another_thread_using_cuda(tokenizer):
    """``capture_error_mode='thread_local'``: a node's other threads may use CUDA meanwhile."""
    stop, errors = threading.Event(), []

    def busy():
        # Its own generator: the default CUDA generator belongs to the capture while one runs
        # (a draw from it on another stream raises 'Offset increment outside graph capture').
        stream, gen = torch.cuda.Stream(), torch.Generator(device='cuda').manual_seed(0)
        try:
            with torch.cuda.stream(stream):
                while not stop.is_set():       # fresh allocations and kernels, no sync
                    x = torch.randn(64 + len(errors), 257, device='cuda', generator=gen)
                    (x @ x.T).sum()
        except Exception as exc:  # noqa: B902 - reported by the assertion below
            errors.append(exc)
    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    try:
        cfg = _config(PrefixAttention.CAUSAL_TEXT, compile_mode=CompileMode.CUDA_GRAPHS)
        engine = Engine(cfg, model=build_model(cfg, cfg.model_config()), tokenizer=tokenizer)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors, errors
    assert engine.fallbacks == {}, engine.fallbacks
    assert all(g.captured for gs in engine.backend.model._graphs.values() for g in gs.values())


@pytest.mark.parametrize('device', DEVICES)
def test_graph_replays_see_new_inputs(device, tokenizer):
    """On the CPU the same static buffers are called, not replayed: they see new inputs too."""
    mode = PrefixAttention.BIDIRECTIONAL
    cfg = _config(mode, device=device, compile_mode=CompileMode.CUDA_GRAPHS)
    model = build_model(cfg, cfg.model_config())
    engine = Engine(cfg, model=model, tokenizer=tokenizer)
    fast, pool = engine.backend.model, engine.backend.cache
    images = torch.rand(1, 2, 3, 224, 224, device=device) * 2 - 1
    tokens = torch.randint(3, 1000, (1, 12), device=device)
    slots = torch.arange(16, 16 + 140, device=device)[None]
    with torch.inference_mode():
        prefix = fast.prefill(tokens, None, image_embeds=fast.encode_images(images),
                              cache=pool, slots=slots)
        noise = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim, device=device)
        calls = sum(g.num_calls for g in fast._graphs[Step.DENOISE].values())
        got = [fast.denoise(prefix, noise * s) for s in (1.0, -1.0)]
        want = [model.denoise(prefix, noise * s) for s in (1.0, -1.0)]
    assert sum(g.num_calls for g in fast._graphs[Step.DENOISE].values()) == calls + 2
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=0)
    assert (got[0] - got[1]).abs().max() > 1e-3


@cuda_only('TensorRT (onnxruntime runs the same graphs on the CPU)')
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


@cuda_only('TensorRT (onnxruntime runs the same graphs on the CPU)')
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


@cuda_only("TensorRT's engines in a CUDA graph")
@needs_trt
def test_denoise_cuda_graph_equals_plain_loop(tokenizer, tmp_path, monkeypatch):
    from oxygen_ros.tools.tensorrt.tensorrt_backend import TensorRTBackend

    monkeypatch.setenv('OXYGEN_ROS_CACHE', str(tmp_path))
    mode = PrefixAttention.CAUSAL_TEXT
    cfg = _config(mode, backend=BackendKind.TENSORRT)
    model = build_model(cfg, cfg.model_config())
    graphed = TensorRTBackend.create(cfg.backend, model, 64, scheduler=cfg.scheduler,
                                     max_decode_tokens=8, max_cameras=2, cuda_graphs=True)
    plain = TensorRTBackend.create(cfg.backend, model, 64, scheduler=cfg.scheduler,
                                   max_decode_tokens=8, max_cameras=2, cuda_graphs=False)
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
