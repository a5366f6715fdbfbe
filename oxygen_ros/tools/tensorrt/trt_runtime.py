"""
TensorRT engines from the exported graphs: build, cache on disk, execute on torch's buffers.

``tensorrt`` is imported by the functions here, never at module import. Build: the ONNX
parser fills a strongly typed network (``TrtPrecision.GRAPH``) or, on TensorRT 10, a weakly
typed one with FP16/BF16 flags; one optimization profile per shape regime
(``trt_profiles.py``); a tqdm bar per builder phase (``IProgressMonitor``). Serialized
engines are cached under a key of weights hash, graph, profiles, precision, TensorRT version
and GPU (``engine_cache_key``), written atomically.

Execution (:class:`TrtExecutor`): torch owns every buffer and the stream. Each call sets
input shapes, binds inputs and outputs by ``data_ptr`` (``set_tensor_address``) and enqueues
on ``torch.cuda.current_stream()`` (``execute_async_v3``): no copies, no pycuda, and the
caller's ``index_copy_`` into the KV pool is ordered after the engine on the same stream.
The denoise loop (fixed shapes) is captured once in a CUDA graph: 10 engine launches and
10 Euler updates replay as one graph.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
import threading
import time
from typing import Any, Mapping

from oxygen_ros.tools.tensorrt.onnx_graphs import GraphName
from oxygen_ros.tools.tensorrt.onnx_manifest import ExportManifest
from oxygen_ros.tools.tensorrt.trt_profiles import (
    engine_cache_key, input_shapes, Profile, profile_index, TrtPrecision)
import torch

_LOG = logging.getLogger(__name__)

OPTIMIZATION_LEVEL = 3
"""TensorRT's default builder optimization level (0..5)."""


def _progress_monitor(trt: Any, desc: str) -> Any:
    """Return an ``IProgressMonitor`` drawing one tqdm bar per builder phase."""
    from tqdm import tqdm

    class _Monitor(trt.IProgressMonitor):

        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self._bars: dict[str, Any] = {}
            self._lock = threading.Lock()  # TensorRT may call from several threads

        def phase_start(self, phase_name: str, parent_phase: str | None,
                        num_steps: int) -> None:
            with self._lock:
                self._bars[phase_name] = tqdm(total=num_steps, desc=f'{desc}: {phase_name}',
                                              position=len(self._bars),
                                              leave=parent_phase is None, unit='step')

        def step_complete(self, phase_name: str, step: int) -> bool:
            with self._lock:
                bar = self._bars.get(phase_name)
                if bar is not None:
                    bar.update(step + 1 - bar.n)
            return True  # False would cancel the build

        def phase_finish(self, phase_name: str) -> None:
            with self._lock:
                bar = self._bars.pop(phase_name, None)
                if bar is not None:
                    bar.close()
    return _Monitor()


def build_engine(trt: Any, onnx_path: Path, manifest: ExportManifest, name: GraphName,
                 profiles: tuple[Profile, ...], precision: TrtPrecision, *,
                 workspace_bytes: int | None = None) -> bytes:
    """
    Build and serialize one engine.

    :raises ValueError: FP8 (not built yet), or weak typing on a TensorRT without it.
    :raises RuntimeError: the ONNX parser or the builder failed (their errors included).
    """
    if precision is TrtPrecision.FP8:
        raise ValueError('FP8 engines need explicit quantization (Q/DQ nodes from a '
                         'calibration, e.g. NVIDIA ModelOpt): not implemented yet')
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if precision is TrtPrecision.GRAPH and hasattr(trt.NetworkDefinitionCreationFlag,
                                                   'STRONGLY_TYPED'):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # resolves weights.bin beside it
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise RuntimeError(f'TensorRT could not parse {onnx_path}:\n  ' + '\n  '.join(errors))
    config = builder.create_builder_config()
    config.builder_optimization_level = OPTIMIZATION_LEVEL
    if workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if precision in (TrtPrecision.FP16, TrtPrecision.BF16):
        flag = getattr(trt.BuilderFlag, precision.name, None)
        if flag is None:
            raise ValueError(f'TensorRT {trt.__version__} has no weak typing '
                             f'(BuilderFlag.{precision.name}); export the graphs in '
                             f'{"float16" if precision is TrtPrecision.FP16 else "bfloat16"} '
                             f'and use TrtPrecision.GRAPH')
        config.set_flag(flag)
    elif manifest.dtype == 'float32' and hasattr(trt.BuilderFlag, 'TF32'):
        config.clear_flag(trt.BuilderFlag.TF32)  # float32 engines are the reference: exact
    spec = manifest.graphs[name].spec
    for profile in profiles:
        opt_profile = builder.create_optimization_profile()
        for tensor, (lo, opt, hi) in input_shapes(spec, profile).items():
            opt_profile.set_shape(tensor, lo, opt, hi)
        config.add_optimization_profile(opt_profile)
    monitor = _progress_monitor(trt, f'TensorRT {name.value}')
    config.progress_monitor = monitor
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError(f'TensorRT failed to build the {name.value} engine (see the log)')
    return bytes(plan)


def load_engines(trt: Any, export_dir: Path, manifest: ExportManifest,
                 profiles: dict[GraphName, tuple[Profile, ...]], precision: TrtPrecision,
                 cache_dir: Path, device: torch.device) -> tuple[Any, dict[GraphName, Any]]:
    """
    Deserialize the cached engine of every graph, building (and caching) missing ones.

    :returns: the ``IRuntime`` (keep it alive as long as its engines) and an
        ``ICudaEngine`` per graph.
    """
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    props = torch.cuda.get_device_properties(device)
    cache_dir.mkdir(parents=True, exist_ok=True)
    engines = {}
    for name, entry in manifest.graphs.items():
        key = engine_cache_key(manifest, name, profiles[name], precision,
                               trt_version=trt.__version__, device_name=props.name,
                               compute_capability=(props.major, props.minor),
                               optimization_level=OPTIMIZATION_LEVEL)
        path = cache_dir / f'{name.value}-{key[:24]}.plan'
        if path.is_file():
            _LOG.info('TensorRT %s engine from cache %s', name.value, path)
            plan = path.read_bytes()
        else:
            t0 = time.perf_counter()
            plan = build_engine(trt, export_dir / entry.file, manifest, name, profiles[name],
                                precision)
            tmp = path.with_suffix(f'.tmp{os.getpid()}')
            tmp.write_bytes(plan)
            tmp.replace(path)
            _LOG.info('built TensorRT %s engine in %.1f s -> %s', name.value,
                      time.perf_counter() - t0, path)
        engine = runtime.deserialize_cuda_engine(plan)
        if engine is None:
            raise RuntimeError(f'TensorRT could not load {path} (delete it to rebuild)')
        engines[name] = engine
    return runtime, engines


class TrtExecutor:
    """
    ``GraphExecutor`` on TensorRT engines; one execution context per optimization profile.

    :param engines: ``ICudaEngine`` per graph (from :func:`load_engines`).
    :param manifest: the export they were built from (graph signatures).
    :param profiles: the profiles they were built with (to pick a context per call).
    :param device: the CUDA device of every buffer.
    :param cuda_graphs: capture the denoise loop in a CUDA graph.
    :param runtime: the ``IRuntime`` of the engines (held).
    """

    def __init__(self, engines: Mapping[GraphName, Any], manifest: ExportManifest,
                 profiles: Mapping[GraphName, tuple[Profile, ...]], device: torch.device, *,
                 cuda_graphs: bool = True, runtime: Any = None) -> None:
        self.runtime = runtime  # outlives the engines it deserialized
        self.engines = dict(engines)
        self.specs = {name: entry.spec for name, entry in manifest.graphs.items()}
        self.profiles = dict(profiles)
        self.device = device
        self._contexts: dict[GraphName, list[Any]] = {}
        stream = torch.cuda.current_stream(device)
        for name, engine in self.engines.items():
            contexts = []
            for i in range(engine.num_optimization_profiles):
                ctx = engine.create_execution_context()
                ctx.set_optimization_profile_async(i, stream.cuda_stream)
                contexts.append(ctx)
            self._contexts[name] = contexts
        stream.synchronize()
        # the denoise engine has one profile; its context also runs the captured loop (one
        # stream, so replays and plain runs never overlap on its activation memory)
        self._graph_ctx = (self._contexts[GraphName.DENOISE][0]
                           if cuda_graphs and GraphName.DENOISE in self.engines else None)
        self._denoise_graphs: dict[tuple, _DenoiseGraph] = {}

    def _context(self, name: GraphName, inputs: Mapping[str, torch.Tensor]) -> Any:
        spec_inputs = {t.name: t for t in self.specs[name].inputs}
        dims = {}
        for key, t in inputs.items():
            for d, size in zip(spec_inputs[key].shape, t.shape):
                if isinstance(d, str):
                    dims[d] = size
        return self._contexts[name][profile_index(self.profiles[name], dims)]

    def run(self, name: GraphName, inputs: Mapping[str, torch.Tensor],
            outputs: Mapping[str, torch.Tensor], context: Any = None) -> None:
        """
        Enqueue graph ``name`` on the current stream with caller-owned CUDA buffers.

        :raises ValueError: shapes outside every profile.
        :raises RuntimeError: TensorRT refused a shape or the enqueue.
        """
        ctx = context if context is not None else self._context(name, inputs)
        for key, t in inputs.items():
            if not ctx.set_input_shape(key, tuple(t.shape)):
                raise RuntimeError(f'TensorRT {name.value}: bad shape {tuple(t.shape)} '
                                   f'for {key}')
            ctx.set_tensor_address(key, t.data_ptr())
        for key, t in outputs.items():
            assert tuple(ctx.get_tensor_shape(key)) == tuple(t.shape), (name, key)
            ctx.set_tensor_address(key, t.data_ptr())
        if not ctx.execute_async_v3(torch.cuda.current_stream(self.device).cuda_stream):
            raise RuntimeError(f'TensorRT {name.value}: execute_async_v3 failed')

    def run_denoise(self, inputs: Mapping[str, torch.Tensor], noise: torch.Tensor,
                    times: torch.Tensor, dt: float) -> torch.Tensor:
        """Run the Euler loop of ``GraphRunner.denoise`` (as a CUDA graph when enabled)."""
        if self._graph_ctx is None:
            return _euler(self, None, inputs, noise, times, dt)
        key = tuple((k, tuple(v.shape), v.data_ptr() if k.endswith('_pool') else 0)
                    for k, v in sorted(inputs.items())) + (tuple(noise.shape), times.shape)
        graph = self._denoise_graphs.get(key)
        if graph is None:
            graph = self._denoise_graphs[key] = _DenoiseGraph(self, inputs, noise, times, dt)
        return graph.replay(inputs, noise)


def _euler(executor: TrtExecutor, context: Any, inputs: Mapping[str, torch.Tensor],
           x: torch.Tensor, times: torch.Tensor, dt: float) -> torch.Tensor:
    velocity = torch.empty_like(x)
    for step in range(times.shape[0]):
        executor.run(GraphName.DENOISE, {**inputs, 'x_t': x, 't': times[step]},
                     {'velocity': velocity}, context)
        x = x + dt * velocity
    return x


class _DenoiseGraph:
    """The 10-step Euler loop on static buffers, captured once in a ``torch.cuda.CUDAGraph``."""

    def __init__(self, executor: TrtExecutor, inputs: Mapping[str, torch.Tensor],
                 noise: torch.Tensor, times: torch.Tensor, dt: float) -> None:
        self.static = {k: (v if k.endswith('_pool') else v.clone()) for k, v in inputs.items()}
        self.noise = noise.clone()
        self.times = times.clone()
        ctx = executor._graph_ctx
        side = torch.cuda.Stream(executor.device)
        side.wait_stream(torch.cuda.current_stream(executor.device))
        with torch.cuda.stream(side):  # TensorRT finishes lazy set-up on a first enqueue
            _euler(executor, ctx, self.static, self.noise, self.times, dt)
        torch.cuda.current_stream(executor.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = _euler(executor, ctx, self.static, self.noise, self.times, dt)

    def replay(self, inputs: Mapping[str, torch.Tensor], noise: torch.Tensor) -> torch.Tensor:
        for k, v in inputs.items():
            if not k.endswith('_pool'):
                self.static[k].copy_(v)
        self.noise.copy_(noise)
        self.graph.replay()
        return self.out.clone()


__all__ = ['OPTIMIZATION_LEVEL', 'TrtExecutor', 'build_engine', 'load_engines']
