"""
The TensorRT backend, verified on a CPU up to (not including) the TensorRT runtime.

``TensorRTBackend`` runs the torch backend's job program on a ``GraphRunner``; here the
runner's executor is onnxruntime (same graphs, same binding by address, same KV pool logic)
wrapped in a check that every call fits the TensorRT optimization profiles the engines
would be built with. The real TensorRT / CUDA checks are in ``test/gpu`` (gpu-marked).
"""

import importlib.util
import subprocess
import sys
import types

import numpy as np
from oxygen_ros.backends.errors import BackendUnavailableError
from oxygen_ros.backends.fast_path.buckets import EngineLimits
from oxygen_ros.backends.interface import Backend, WarmupReport
from oxygen_ros.backends.torch_backend import TorchBackend
from oxygen_ros.config import CAMERA_SLOTS, get_preset, PrefixAttention
from oxygen_ros.control.rtc import RtcRequest
from oxygen_ros.engine.config import BackendKind, EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.tools.common.workload import make_observation
from oxygen_ros.tools.tensorrt import tensorrt_backend, trt_runtime
from oxygen_ros.tools.tensorrt.graph_runner import GraphRunner
from oxygen_ros.tools.tensorrt.onnx_export import export_graphs
from oxygen_ros.tools.tensorrt.onnx_graphs import GraphName
from oxygen_ros.tools.tensorrt.onnx_manifest import load_manifest
from oxygen_ros.tools.tensorrt.ort_runtime import OrtExecutor
from oxygen_ros.tools.tensorrt.tensorrt_backend import TensorRTBackend
from oxygen_ros.tools.tensorrt.trt_profiles import (
    denoise_ctx_len, DimRange, engine_cache_key, engine_profiles, input_shapes, profile_index,
    TrtPrecision)
from oxygen_ros.transforms.prompt import TextTask
import pytest
import torch

HAVE_TENSORRT = importlib.util.find_spec('tensorrt') is not None
BLOCK_SIZE = 16


class Recording:
    """A model-like proxy that records what the backend's model calls return."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _record(self, kind, out):
        self.calls.append((kind, out.detach().clone()))
        return out

    def decode_step(self, tokens, positions, cache, write_slots, *args):
        logits = self.inner.decode_step(tokens, positions, cache, write_slots, *args)
        # rows whose steps are done write to the null block and read garbage: not compared
        done = write_slots < BLOCK_SIZE
        self.calls.append(('decode', torch.where(done[:, None], 0.0, logits)))
        return logits

    def lm_logits(self, hidden):
        return self._record('seed', self.inner.lm_logits(hidden))

    def denoise(self, prefix, noise, **kwargs):
        return self._record('denoise', self.inner.denoise(prefix, noise, **kwargs))

    def prefill(self, *args, **kwargs):
        prefix = self.inner.prefill(*args, **kwargs)
        self._record('prefill_hidden', prefix.last_hidden)
        return prefix

    def prefill_suffix(self, *args, **kwargs):
        prefix = self.inner.prefill_suffix(*args, **kwargs)
        self._record('suffix_hidden', prefix.last_hidden)
        return prefix


class ProfileChecked:
    """An executor that asserts every call fits the TensorRT profiles, then delegates."""

    def __init__(self, inner, manifest, profiles):
        self.inner = inner
        self.specs = {n: e.spec for n, e in manifest.graphs.items()}
        self.profiles = profiles
        self.used = {}

    def run(self, name, inputs, outputs):
        dims = {}
        for t in self.specs[name].inputs:
            dims.update((d, s) for d, s in zip(t.shape, inputs[t.name].shape)
                        if isinstance(d, str))
        self.used.setdefault(name, set()).add(profile_index(self.profiles[name], dims))
        self.inner.run(name, inputs, outputs)


@pytest.fixture(scope='module')
def exports(tmp_path_factory):
    cache = {}

    def get(model):
        key = id(model)
        if key not in cache:
            out = tmp_path_factory.mktemp('export')
            export_graphs(model, out)
            cache[key] = out
        return cache[key]
    return get


def _run_engine(cfg, model, tokenizer, monkeypatch, factory):
    recorder = Recording(model)
    backends = []

    def make_backend(_config, _model, num_blocks, scheduler, adapter=None, **_options):
        assert adapter is None
        backends.append(factory(scheduler, recorder, num_blocks))
        return backends[-1]
    monkeypatch.setattr('oxygen_ros.engine.loading.make_backend', make_backend)
    engine = Engine(cfg, model=model, tokenizer=tokenizer)
    monkeypatch.undo()
    actions, texts = [], {}
    for f, budget in enumerate((5, 2, 7, 3)):
        engine.submit_text(TextTask.SUBTASK, max_tokens=budget, req_id=f'sub{f}')
        if f == 1:      # two suffixes of different lengths on the frame's action prefix
            engine.submit_text(TextTask.MEMORY, max_tokens=4, req_id='mem1')
            engine.submit_text(TextTask.ANSWER, question='where is the cup?', max_tokens=3,
                               req_id='ask1')
        out = engine.step(make_observation(f, cfg.robot().cameras, 8))
        actions.append(out.action.actions)
        texts.update({t.req_id: t.token_ids for t in out.finished})
    while engine.num_running:
        texts.update({t.req_id: t.token_ids for t in engine.step(None).finished})
    return actions, texts, recorder.calls, backends[0]


@pytest.mark.parametrize('mode', list(PrefixAttention))
def test_engine_on_graphs_equals_engine_on_torch(mode, tiny_models, tokenizer, exports,
                                                 monkeypatch):
    cameras = CAMERA_SLOTS[:2]
    model = tiny_models(mode, cameras)
    cfg = EngineConfig.create(preset='tiny', prefix_attention=mode, cameras=cameras, seed=4,
                              tokens_per_cycle=2, stop_on_eos=False, max_running_requests=8,
                              block_size=BLOCK_SIZE)
    export_dir = exports(model)
    manifest = load_manifest(export_dir)
    checked = {}

    def graph_backend(scheduler, recorder, num_blocks):
        limits = EngineLimits.for_model(model.cfg, num_slots=num_blocks * scheduler.block_size,
                                        max_batch=scheduler.max_running_requests,
                                        max_decode_tokens=8, max_cameras=2)
        checked['executor'] = ProfileChecked(OrtExecutor(export_dir), manifest,
                                             engine_profiles(limits, model.cfg))
        runner = Recording(GraphRunner(model.cfg, model.dtype, 'cpu', checked['executor'],
                                       denoise_ctx_len=denoise_ctx_len(limits)))
        recorder.calls = runner.calls          # record the runner's outputs instead
        return TensorRTBackend(runner, num_blocks, scheduler.block_size, source_model=model)

    want = _run_engine(cfg, model, tokenizer, monkeypatch,
                       lambda c, m, n: TorchBackend(m, n, c.block_size))
    got = _run_engine(cfg, model, tokenizer, monkeypatch, graph_backend)
    assert isinstance(got[3], TensorRTBackend) and isinstance(got[3], Backend)
    for a, b in zip(want[0], got[0]):
        np.testing.assert_allclose(b, a, atol=1e-4, rtol=0)
    assert got[1] == want[1] and len(want[1]) == 6
    kinds = [k for k, _ in want[2]]
    assert [k for k, _ in got[2]] == kinds
    assert kinds.count('denoise') == 4 and kinds.count('seed') >= 1
    assert kinds.count('suffix_hidden') == 1        # one batched suffix job of two rows
    decode_shapes = {tuple(o.shape) for k, o in want[2] if k == 'decode'}
    assert len({s[0] for s in decode_shapes}) > 1        # batches of several sizes
    for (kind, w), (_, g) in zip(want[2], got[2]):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=0, msg=kind)
    for pool in ('k', 'v'):        # every slot but the null block's garbage
        torch.testing.assert_close(getattr(got[3].cache, pool)[:, BLOCK_SIZE:],
                                   getattr(want[3].cache, pool)[:, BLOCK_SIZE:],
                                   atol=1e-4, rtol=0)
    used = checked['executor'].used
    assert set(used) == set(GraphName)
    # the memory suffix (and a causal-text prompt) used the 2nd decode profile: text prefill
    assert used[GraphName.DECODE] == {0, 1}


def _engine_on_graphs(cfg, model, tokenizer, exports, monkeypatch):
    """Return an engine on ``TensorRTBackend`` with onnxruntime running its graphs."""
    export_dir = exports(model)

    def graph_backend(_config, _model, num_blocks, scheduler, **_options):
        limits = EngineLimits.for_model(model.cfg, num_slots=num_blocks * scheduler.block_size,
                                        max_batch=scheduler.max_running_requests,
                                        max_decode_tokens=8, max_cameras=2)
        runner = GraphRunner(model.cfg, model.dtype, 'cpu', OrtExecutor(export_dir),
                             denoise_ctx_len=denoise_ctx_len(limits))
        return TensorRTBackend(runner, num_blocks, scheduler.block_size, source_model=model)
    monkeypatch.setattr('oxygen_ros.engine.loading.make_backend', graph_backend)
    try:
        return Engine(cfg, model=model, tokenizer=tokenizer)
    finally:
        monkeypatch.undo()


def test_rtc_on_the_tensorrt_backend_is_refused_with_the_reason(tiny_models, tokenizer,
                                                                exports, monkeypatch):
    """Its denoise engine has no gradient: refused up front, not an AttributeError later."""
    cameras = CAMERA_SLOTS[:2]
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, cameras)
    cfg = EngineConfig.create(preset='tiny', cameras=cameras, block_size=BLOCK_SIZE,
                              max_running_requests=8)
    engine = _engine_on_graphs(cfg, model, tokenizer, exports, monkeypatch)
    rtc = RtcRequest(1, 100_000_000)
    with pytest.raises(ValueError, match='the tensorrt backend cannot guide denoising') as info:
        for f in range(2):                 # the second cycle has a previous chunk to guide to
            engine.step(make_observation(f, cameras, 8), rtc=rtc)
    assert "backend 'torch'" in str(info.value)
    assert engine.step(make_observation(3, cameras, 8)).action is not None   # plain: fine
    with pytest.raises(ValueError, match=r'real-time chunking \(chunk_smoothing rtc\) is not '
                                         r'possible here: the tensorrt backend cannot guide'):
        _engine_on_graphs(cfg.with_settings(rtc=True), model, tokenizer, exports, monkeypatch)


def test_an_engine_takes_a_tensorrt_backend_built_from_its_model(tiny_models, tokenizer,
                                                                 exports):
    """Checked by ``source_model``: a runner of exported graphs has no eager model inside."""
    cameras = CAMERA_SLOTS[:2]
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, cameras)
    cfg = EngineConfig.create(preset='tiny', cameras=cameras, block_size=BLOCK_SIZE,
                              max_running_requests=8)
    blocks = cfg.pool_blocks()
    limits = EngineLimits.for_model(model.cfg, num_slots=blocks * BLOCK_SIZE, max_batch=8,
                                    max_decode_tokens=8, max_cameras=2)
    runner = GraphRunner(model.cfg, model.dtype, 'cpu', OrtExecutor(exports(model)),
                         denoise_ctx_len=denoise_ctx_len(limits))
    backend = TensorRTBackend(runner, blocks, BLOCK_SIZE, source_model=model,
                              warmup_seconds=1.5)
    assert backend.warmup_report == WarmupReport(1.5)
    engine = Engine(cfg, model=model, tokenizer=tokenizer, backend=backend)
    assert engine.step(make_observation(0, cameras, 8)).action is not None
    other = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERA_SLOTS[:1])
    with pytest.raises(ValueError, match='the shared backend does not fit: it needs this model'):
        Engine(cfg, model=model, tokenizer=tokenizer,
               backend=TensorRTBackend(runner, blocks, BLOCK_SIZE, source_model=other))


def test_without_tensorrt_the_engine_says_what_to_install(tokenizer):
    if HAVE_TENSORRT:
        pytest.skip('tensorrt is installed here')
    with pytest.raises(BackendUnavailableError) as info:
        Engine(EngineConfig.create(preset='tiny', backend=BackendKind.TENSORRT),
               tokenizer=tokenizer)
    msg = str(info.value)
    for part in ("'tensorrt'", 'TensorRT 10.x', 'No module named', 'Linux x86_64 and aarch64',
                 'CUDA GPU', 'Jetson AGX Thor', 'JetPack 7', 'pip install', "'--backend torch'"):
        assert part in msg, part


def test_bench_with_tensorrt_fails_on_stderr():
    if HAVE_TENSORRT:
        pytest.skip('tensorrt is installed here')
    proc = subprocess.run([sys.executable, '-m', 'oxygen_ros.tools.bench.engine', '--preset',
                           'tiny', '--backend', 'tensorrt', '--frames', '1', '--no-progress'],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "backend 'tensorrt' needs NVIDIA TensorRT 10.x" in proc.stderr
    assert 'speedup' not in proc.stdout


def test_cuda_and_version_are_checked_before_anything_is_built(monkeypatch):
    fake = types.SimpleNamespace(__version__='10.13.0')
    monkeypatch.setitem(sys.modules, 'tensorrt', fake)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    cfg = EngineConfig.create(preset='tiny', backend=BackendKind.TENSORRT)
    with pytest.raises(BackendUnavailableError, match=r"needs a CUDA GPU.*'--backend torch'"):
        TensorRTBackend.create(cfg.backend, None, 10, scheduler=cfg.scheduler,
                               max_decode_tokens=8, max_cameras=2)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    with pytest.raises(BackendUnavailableError, match="runs on device 'cuda', got 'cpu'"):
        TensorRTBackend.create(cfg.backend, None, 10, scheduler=cfg.scheduler,
                               max_decode_tokens=8, max_cameras=2)
    fake.__version__ = '8.6.1'
    with pytest.raises(BackendUnavailableError, match='found tensorrt 8.6.1, too old'):
        TensorRTBackend.create(cfg.backend, None, 10, scheduler=cfg.scheduler,
                               max_decode_tokens=8, max_cameras=2)


def test_profiles_and_limits():
    cfg = get_preset('pi05_droid').model
    limits = EngineLimits.for_model(cfg, num_slots=4096, max_batch=32, max_decode_tokens=30,
                                    max_cameras=2)
    assert limits.max_prefix == 1024 and limits.max_prefix >= 3 * 256 + 200
    assert limits.max_ctx == 1024 and denoise_ctx_len(limits) == 1024
    profiles = engine_profiles(limits, cfg)
    assert len(profiles[GraphName.DECODE]) == 2
    spec = {t.name: t for t in load_spec(GraphName.DECODE).inputs}
    assert spec['ctx_slots'].shape == ('batch', 'ctx_len')
    assert profile_index(profiles[GraphName.DECODE], {'batch': 32, 'num_new': 1,
                                                      'ctx_len': 1000}) == 0
    assert profile_index(profiles[GraphName.DECODE], {'batch': 1, 'num_new': 40,
                                                      'ctx_len': 512}) == 1
    with pytest.raises(ValueError, match=r'outside every TensorRT optimization profile.*'
                                         r'batch 1\.\.32.*max_running_requests'):
        profile_index(profiles[GraphName.DECODE], {'batch': 33, 'num_new': 1, 'ctx_len': 9})
    with pytest.raises(ValueError, match='need 1 <= min <= opt <= max'):
        DimRange(2, 1, 3)
    with pytest.raises(ValueError, match='max_batch must be >= 1, got 0'):
        EngineLimits.for_model(cfg, num_slots=1, max_batch=0, max_decode_tokens=1,
                               max_cameras=2)


def load_spec(name):
    from oxygen_ros.model.pi05 import Pi05Model
    from oxygen_ros.tools.tensorrt.onnx_graphs import graph_specs
    with torch.device('meta'):
        model = Pi05Model(get_preset('tiny').model)
    return graph_specs(model)[name]


def test_input_shapes_of_a_profile():
    spec = load_spec(GraphName.DENOISE)
    limits = EngineLimits.for_model(get_preset('tiny').model, num_slots=640, max_batch=4,
                                    max_decode_tokens=8, max_cameras=2)
    profiles = engine_profiles(limits, get_preset('tiny').model)
    shapes = input_shapes(spec, profiles[GraphName.DENOISE][0])
    ctx = denoise_ctx_len(limits)
    assert shapes['k_pool'] == ((2, 640, 1, 8),) * 3
    assert shapes['ctx_slots'] == ((1, ctx),) * 3
    assert shapes['x_t'] == ((1, 4, 32),) * 3
    with pytest.raises(ValueError, match="profile lacks dim 'ctx_len'"):
        input_shapes(spec, {'batch': DimRange(1, 1, 1), 'num_slots': DimRange(1, 1, 1)})


def test_engine_cache_key_covers_what_an_engine_depends_on(exports, tiny_models):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERA_SLOTS[:2])
    manifest = load_manifest(exports(model))
    limits = EngineLimits.for_model(model.cfg, num_slots=512, max_batch=8, max_decode_tokens=8,
                                    max_cameras=2)
    profiles = engine_profiles(limits, model.cfg)[GraphName.DECODE]
    base = {'trt_version': '10.13.0', 'device_name': 'NVIDIA Thor',
            'compute_capability': (11, 0), 'optimization_level': 3}
    key = engine_cache_key(manifest, GraphName.DECODE, profiles, TrtPrecision.GRAPH, **base)
    assert key == engine_cache_key(manifest, GraphName.DECODE, profiles, TrtPrecision.GRAPH,
                                   **base)
    other_limits = EngineLimits.for_model(model.cfg, num_slots=528, max_batch=8,
                                          max_decode_tokens=8, max_cameras=2)
    variants = [
        engine_cache_key(manifest, GraphName.LM_HEAD, engine_profiles(limits, model.cfg)[
            GraphName.LM_HEAD], TrtPrecision.GRAPH, **base),
        engine_cache_key(manifest, GraphName.DECODE, engine_profiles(other_limits, model.cfg)[
            GraphName.DECODE], TrtPrecision.GRAPH, **base),
        engine_cache_key(manifest, GraphName.DECODE, profiles, TrtPrecision.FP16, **base),
        engine_cache_key(manifest, GraphName.DECODE, profiles, TrtPrecision.GRAPH,
                         **{**base, 'trt_version': '10.14.1'}),
        engine_cache_key(manifest, GraphName.DECODE, profiles, TrtPrecision.GRAPH,
                         **{**base, 'device_name': 'NVIDIA H100'}),
        engine_cache_key(manifest.__class__(**{**_fields(manifest), 'weights_sha256': '0'}),
                         GraphName.DECODE, profiles, TrtPrecision.GRAPH, **base),
    ]
    assert len({key, *variants}) == len(variants) + 1


def _fields(manifest):
    return {f: getattr(manifest, f) for f in manifest.__dataclass_fields__}


class FakeTrt:
    """Just enough of the tensorrt module for ``build_engine`` (records what it was told)."""

    __version__ = '10.13.0'

    def __init__(self, parse_ok=True, weak_typing=True):
        self.log = []
        trt = self

        class Flags:
            STRONGLY_TYPED = 2
        self.NetworkDefinitionCreationFlag = Flags
        self.BuilderFlag = types.SimpleNamespace(TF32='TF32', **(
            {'FP16': 'FP16', 'BF16': 'BF16'} if weak_typing else {}))
        self.MemoryPoolType = types.SimpleNamespace(WORKSPACE='ws')
        self.Logger = type('Logger', (), {'WARNING': 2, '__init__': lambda s, lvl: None})
        self.IProgressMonitor = type('IProgressMonitor', (), {'__init__': lambda s: None})

        class Profile:

            def set_shape(self, name, lo, opt, hi):
                trt.log.append(('shape', name, lo, opt, hi))

        class Config:

            def set_flag(self, flag):
                trt.log.append(('flag', flag))

            def clear_flag(self, flag):
                trt.log.append(('clear', flag))

            def add_optimization_profile(self, profile):
                trt.log.append(('profile',))

        class Builder:

            def __init__(self, logger):
                pass

            def create_network(self, flags):
                trt.log.append(('network', flags))
                return object()

            def create_builder_config(self):
                return Config()

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                assert config.progress_monitor is not None
                return b'plan'
        self.Builder = Builder

        class Parser:

            num_errors = 0 if parse_ok else 1

            def __init__(self, network, logger):
                pass

            def parse_from_file(self, path):
                trt.log.append(('parse', path))
                return parse_ok

            def get_error(self, i):
                return 'In node 7 (Mod): unsupported'
        self.OnnxParser = Parser


def test_build_engine_with_a_fake_tensorrt(exports, tiny_models):
    model = tiny_models(PrefixAttention.CAUSAL_TEXT, CAMERA_SLOTS[:2])
    export_dir = exports(model)
    manifest = load_manifest(export_dir)
    limits = EngineLimits.for_model(model.cfg, num_slots=256, max_batch=4, max_decode_tokens=8,
                                    max_cameras=2)
    profiles = engine_profiles(limits, model.cfg)[GraphName.DECODE]
    trt = FakeTrt()
    plan = trt_runtime.build_engine(trt, export_dir / 'decode.onnx', manifest, GraphName.DECODE,
                                    profiles, TrtPrecision.GRAPH)
    assert plan == b'plan'
    assert ('network', 1 << 2) in trt.log and ('clear', 'TF32') in trt.log
    assert trt.log.count(('profile',)) == 2
    shapes = {(e[1], e[2], e[4]) for e in trt.log if e[0] == 'shape'}
    assert ('tokens', (1, 1), (4, 1)) in shapes                      # decode profile
    assert ('tokens', (1, 1), (1, model.cfg.max_token_len)) in shapes  # text prefill
    assert ('k_pool', (2, 256, 1, 8), (2, 256, 1, 8)) in shapes
    trt = FakeTrt()
    trt_runtime.build_engine(trt, export_dir / 'decode.onnx', manifest, GraphName.DECODE,
                             profiles, TrtPrecision.BF16)
    assert ('network', 0) in trt.log and ('flag', 'BF16') in trt.log
    with pytest.raises(ValueError, match=r'no weak typing.*export the graphs in float16'):
        trt_runtime.build_engine(FakeTrt(weak_typing=False), export_dir / 'decode.onnx',
                                 manifest, GraphName.DECODE, profiles, TrtPrecision.FP16)
    with pytest.raises(ValueError, match='FP8 engines need explicit quantization'):
        trt_runtime.build_engine(trt, export_dir / 'decode.onnx', manifest, GraphName.DECODE,
                                 profiles, TrtPrecision.FP8)
    with pytest.raises(RuntimeError, match=r'could not parse .*decode.onnx:\n  In node 7'):
        trt_runtime.build_engine(FakeTrt(parse_ok=False), export_dir / 'decode.onnx',
                                 manifest, GraphName.DECODE, profiles, TrtPrecision.GRAPH)


def test_ensure_export_reuses_a_matching_export(tiny_models, tmp_path, monkeypatch):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERA_SLOTS[:1])
    first = tensorrt_backend.ensure_export(model, tmp_path)
    assert load_manifest(first).weights_sha256[:16] in first.name
    monkeypatch.setattr(tensorrt_backend, 'export_graphs',
                        lambda *a, **k: pytest.fail('exported again'))
    assert tensorrt_backend.ensure_export(model, tmp_path) == first


def test_runner_refuses_what_the_model_refuses(tiny_models):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERA_SLOTS[:1])
    runner = GraphRunner(model.cfg, torch.float32, 'cpu', executor=None, denoise_ctx_len=8)
    cache = KVCache(model.cfg.vlm, 64)
    tokens = torch.ones(1, 3, dtype=torch.int64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match='pass cache'):
        runner.prefill(tokens, mask)
    with pytest.raises(ValueError, match='must both be'):
        runner.prefill(tokens, mask[:, :2], cache=cache, slots=tokens)
    prefix = model.prefill(tokens, mask, cache=cache, slots=torch.arange(3)[None])
    with pytest.raises(ValueError, match='cannot be extended with prefix_attention='
                                         'BIDIRECTIONAL'):
        runner.prefill(tokens, mask, context=prefix, slots=torch.arange(3, 6)[None])
    noise = torch.zeros(1, model.cfg.action_horizon, model.cfg.action_dim)
    long = prefix.__class__(cache, torch.arange(9)[None], torch.ones(1, 9, dtype=torch.bool),
                            prefix.num_tokens, prefix.last_hidden)
    with pytest.raises(ValueError, match='exceeds denoise_ctx_len 8'):
        runner.denoise(long, noise)
    with pytest.raises(ValueError, match='noise must be'):
        runner.denoise(prefix, noise[:, :2])
