"""
The TensorRT backend: the torch backend's job program on TensorRT engines, one shared KV pool.

EXPERIMENTAL: no TensorRT engine has been built or run yet (see ``__init__.py``);
everything but the TensorRT calls is checked on the CPU with onnxruntime in their place.

On Jetson AGX Thor the π0.5 computation runs as TensorRT engines built from our ONNX graphs
(``onnx_graphs.py``): vision, prefill, decode (decode step and text prefill: one engine,
two profiles), denoise step and LM head. They all read and write THE SAME KV pool, a torch
tensor pair allocated once by ``TorchBackend``, bound by address on every call
(``graph_runner.py``), so the OxyGen engine schedules them exactly as it schedules the torch
backend: :class:`TensorRTBackend` is ``TorchBackend`` with a ``GraphRunner`` as its model.

``create`` imports ``tensorrt`` only when this backend is selected; without it (or without
CUDA) it raises ``BackendUnavailableError`` with one message saying what to install.
Artifacts go under the cache directory (``$OXYGEN_ROS_CACHE``, default
``~/.cache/oxygen_ros``): ``onnx/<preset>-<dtype>-<weights hash>/`` (the export) and
``tensorrt/`` (serialized engines keyed by weights, shapes, precision, TensorRT and GPU).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
import platform
import shutil
import time
from typing import Any, Callable
import weakref

from oxygen_ros.backends.config import BackendConfig
from oxygen_ros.backends.errors import BackendUnavailableError
from oxygen_ros.backends.fast_path.buckets import EngineLimits
from oxygen_ros.backends.interface import WarmupReport
from oxygen_ros.backends.torch_backend import TorchBackend
from oxygen_ros.model.pi05 import Pi05Model
from oxygen_ros.sched.scheduler import SchedulerConfig
from oxygen_ros.tools.tensorrt.graph_runner import GraphRunner
from oxygen_ros.tools.tensorrt.onnx_export import export_graphs
from oxygen_ros.tools.tensorrt.onnx_manifest import load_manifest, weights_sha256
from oxygen_ros.tools.tensorrt.trt_profiles import (
    denoise_ctx_len, engine_profiles, TrtPrecision)
import torch

_LOG = logging.getLogger(__name__)

CACHE_ENV = 'OXYGEN_ROS_CACHE'

_EXECUTORS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
"""Live executors by (export, precision, limits, device): two engines on one model (the
benchmark's isolated and OxyGen policies) share one set of TensorRT engines; each keeps its
own KV pool (the denoise CUDA graph is keyed by the pool's address)."""

TENSORRT_MISSING = (
    "backend 'tensorrt' needs NVIDIA TensorRT 10.x and its Python package 'tensorrt', "
    'which cannot be imported here ({error}; this is {system}). TensorRT runs on Linux x86_64 '
    'and aarch64 with a CUDA GPU. On Jetson AGX Thor it comes with JetPack 7 (apt install '
    'nvidia-jetpack, or python3-libnvinfer; use a venv with --system-site-packages to see '
    "it); on x86_64: pip install 'tensorrt-cu12>=10,<11' (matching your CUDA major "
    "version). '--backend torch' (parameter backend: torch) works everywhere, CPU or CUDA.")


def default_cache_dir() -> Path:
    """Return ``$OXYGEN_ROS_CACHE`` or ``~/.cache/oxygen_ros``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / '.cache' / 'oxygen_ros')


def import_tensorrt() -> Any:
    """
    Import and return the ``tensorrt`` module.

    :raises BackendUnavailableError: it is missing or older than 10.
    """
    try:
        import tensorrt as trt
    except (ImportError, OSError) as exc:  # OSError: the package without its libraries
        raise BackendUnavailableError(TENSORRT_MISSING.format(
            error=f'{type(exc).__name__}: {exc}',
            system=f'{platform.system()} {platform.machine()}')) from None
    if int(trt.__version__.split('.')[0]) < 10:
        raise BackendUnavailableError(TENSORRT_MISSING.format(
            error=f'found tensorrt {trt.__version__}, too old',
            system=f'{platform.system()} {platform.machine()}'))
    return trt


def require_cuda(device: str) -> torch.device:
    """
    Return ``device`` as a CUDA device that exists.

    :raises BackendUnavailableError: no CUDA in this torch / machine, or a non-CUDA device.
    """
    if not torch.cuda.is_available():
        raise BackendUnavailableError(
            f"backend 'tensorrt' needs a CUDA GPU, but torch {torch.__version__} sees none "
            f'(built with CUDA {torch.version.cuda}); install a CUDA build of torch on a '
            f"machine with an NVIDIA GPU, or use '--backend torch'")
    dev = torch.device(device)
    if dev.type != 'cuda':
        raise BackendUnavailableError(f"backend 'tensorrt' runs on device 'cuda', got "
                                      f'{device!r}; set device: cuda')
    return dev


def ensure_export(model: Pi05Model, cache_dir: Path) -> Path:
    """
    Return an export directory of ``model``'s graphs, exporting only if none matches.

    Keyed by preset, dtype and weights hash; a matching manifest is reused (its model
    config must equal the model's). The export is written beside and renamed into place.
    """
    digest = weights_sha256(model)
    out = cache_dir / 'onnx' / f'{model.cfg.name}-{str(model.dtype)[6:]}-{digest[:16]}'
    if (out / 'manifest.json').is_file():
        manifest = load_manifest(out)
        if manifest.weights_sha256 == digest and manifest.matches(model.cfg, model.dtype):
            return out
        _LOG.warning('stale ONNX export %s (config changed): exporting again', out)
    tmp = out.with_name(out.name + f'.tmp{os.getpid()}')
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    export_graphs(model, tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    _LOG.info('exported ONNX graphs in %.1f s -> %s', time.perf_counter() - t0, out)
    return out


class TensorRTBackend(TorchBackend):
    """
    ``TorchBackend`` whose model calls run on exported graphs (TensorRT engines).

    :param runner: the graphs behind the five model calls.
    :param source_model: the model the graphs were exported from.
    :param warmup_seconds: time spent exporting / building / loading engines (reported
        apart from the control cycles).
    """

    def __init__(self, runner: GraphRunner, num_blocks: int, block_size: int, *,
                 source_model: Pi05Model, sync: Callable[[], None] | None = None,
                 warmup_seconds: float = 0.0) -> None:
        super().__init__(runner, num_blocks, block_size, sync=sync)  # type: ignore[arg-type]
        self.runner = runner
        self._source_model = source_model
        self.warmup_seconds = warmup_seconds

    @property
    def source_model(self) -> Pi05Model:
        """Return the model the graphs were exported from."""
        return self._source_model

    @property
    def warmup_report(self) -> WarmupReport:
        """Return the export / build / load time (no fast-path graphs: engines instead)."""
        return WarmupReport(self.warmup_seconds)

    @property
    def guidance_unsupported(self) -> str | None:
        """Return why real-time chunking cannot run here (see ``TorchBackend``)."""
        return ('the tensorrt backend cannot guide denoising: its denoise engine computes '
                "the velocity only, and RTC's guidance needs its vector-Jacobian product at "
                "every Euler step; use backend 'torch' (its fast path runs the guided "
                "denoise in CUDA graphs) or chunk_smoothing 'none' or 'ensemble'")

    @classmethod
    def create(cls, config: BackendConfig, model: Pi05Model, num_blocks: int, *,
               scheduler: SchedulerConfig, max_decode_tokens: int, max_cameras: int,
               precision: TrtPrecision = TrtPrecision.GRAPH,
               cache_dir: str | Path | None = None,
               cuda_graphs: bool = True) -> TensorRTBackend:
        """
        Export (if needed), build or load the engines, and return the backend.

        :param config: the device.
        :param scheduler: the block size and ``max_running_requests`` (decode batch profile).
        :param max_decode_tokens: the decode budget (context profile).
        :param max_cameras: the robot's cameras (the vision and prefill profiles' optimum).
        :param model: the weights, in the dtype the engines run (GRAPH precision).
        :param num_blocks: KV pool blocks (part of the engine shapes).
        :param precision: see ``TrtPrecision``.
        :param cache_dir: default :func:`default_cache_dir`.
        :param cuda_graphs: capture the denoise loop in a CUDA graph.
        :raises BackendUnavailableError: no TensorRT 10+, no CUDA, or a non-CUDA device.
        """
        trt = import_tensorrt()
        device = require_cuda(config.device)
        from oxygen_ros.tools.tensorrt.trt_runtime import load_engines, TrtExecutor

        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        t0 = time.perf_counter()
        export_dir = ensure_export(model, cache)
        manifest = load_manifest(export_dir)
        cfg = model.cfg
        limits = EngineLimits.for_model(
            cfg, num_slots=num_blocks * scheduler.block_size,
            max_batch=scheduler.max_running_requests, max_decode_tokens=max_decode_tokens,
            max_cameras=max_cameras)
        profiles = engine_profiles(limits, cfg)
        key = (str(export_dir), precision, limits, str(device), cuda_graphs)
        executor = _EXECUTORS.get(key)
        if executor is None:  # engines of the same export and shapes are loaded once
            runtime, engines = load_engines(trt, export_dir, manifest, profiles, precision,
                                            cache / 'tensorrt', device)
            executor = TrtExecutor(engines, manifest, profiles, device, cuda_graphs=cuda_graphs,
                                   runtime=runtime)
            _EXECUTORS[key] = executor
        runner = GraphRunner(cfg, model.dtype, device, executor,
                             denoise_ctx_len=denoise_ctx_len(limits))
        seconds = time.perf_counter() - t0
        _LOG.info('TensorRT %s backend ready in %.1f s (engines under %s)', trt.__version__,
                  seconds, cache / 'tensorrt')
        return cls(runner, num_blocks, scheduler.block_size, source_model=model,
                   warmup_seconds=seconds)


def create_backend(config: BackendConfig, model: Pi05Model, num_blocks: int, *,
                   scheduler: SchedulerConfig, max_decode_tokens: int,
                   max_cameras: int) -> TensorRTBackend:
    """
    Return the TensorRT backend of ``config``: the ``tensorrt`` entry point of the backends.

    ``backend: tensorrt`` reaches it through ``backends.factory.make_backend`` (group
    ``oxygen_ros.backends``, ``setup.py``), with ``trt_precision`` and ``engine_cache_dir``;
    ``scheduler``, ``max_decode_tokens`` and ``max_cameras`` as :meth:`TensorRTBackend.create`.

    :raises BackendUnavailableError: as :meth:`TensorRTBackend.create`.
    """
    return TensorRTBackend.create(config, model, num_blocks, scheduler=scheduler,
                                  max_decode_tokens=max_decode_tokens, max_cameras=max_cameras,
                                  precision=TrtPrecision(config.trt_precision),
                                  cache_dir=config.engine_cache_dir)


__all__ = ['CACHE_ENV', 'TENSORRT_MISSING', 'TensorRTBackend', 'create_backend',
           'default_cache_dir', 'ensure_export', 'import_tensorrt', 'require_cuda']
