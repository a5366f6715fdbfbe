"""
Choosing the backend that executes plans: PyTorch (CPU/CUDA, optionally compiled) or TensorRT.

Every backend implements ``interface.Backend``. The fast path and the experimental TensorRT
backend (``experimental/``, never run on TensorRT) are imported only when selected: this is
the one module of the core backends that names the experimental package.
"""

from __future__ import annotations

from typing import Any

from oxygen_ros.backends.config import BackendConfig, BackendKind, CompileMode
from oxygen_ros.backends.errors import BackendUnavailableError
from oxygen_ros.backends.interface import Backend
from oxygen_ros.backends.torch_backend import TorchBackend
from oxygen_ros.model.lora import SuffixLoRA
from oxygen_ros.model.pi05 import Pi05Model
from oxygen_ros.sched.scheduler import SchedulerConfig


def make_backend(config: BackendConfig, model: Pi05Model, num_blocks: int, *,
                 scheduler: SchedulerConfig, max_decode_tokens: int, max_cameras: int,
                 adapter: SuffixLoRA | None = None, **fast_path: Any) -> Backend:
    """
    Build the backend ``config.kind`` for ``model`` with a pool of ``num_blocks`` blocks.

    ``config.compile_mode`` (AUTO resolved for the device) other than NONE puts every
    per-cycle model call of the torch backend on the fast path (``compiled.py``: static
    shapes, CUDA graphs, parity-gated, warm-up included, loud eager fallback); TensorRT
    ignores it (its engines are compiled already).

    :param scheduler: the scheduler's settings the backend reads: the block size, the largest
        decode batch (``max_running_requests``) and k (``tokens_per_cycle``).
    :param max_decode_tokens: the most tokens a text request decodes (the decode budget).
    :param max_cameras: the most valid cameras of a frame (the robot's).
    :param adapter: the memory adapter (OxyGen's suffix LoRA, ``model/lora.py``); the torch
        backend only.
    :param fast_path: options of ``CompiledTorchBackend.create`` (``only``,
        ``camera_counts``, ``backend``, ``progress``, ``reference``, ``precompile``,
        ``extra_jacobian_steps``), used
        when the fast path is on (the benchmarks narrow it to their workload).
    :raises BackendUnavailableError: TensorRT selected where it cannot be imported or run
        (the message says what to install).
    :raises ValueError: an adapter with TensorRT (its graphs have no LoRA).
    """
    if config.kind is BackendKind.TORCH:
        if config.compile_mode.resolve(config.device) is CompileMode.NONE:
            return TorchBackend(model, num_blocks, scheduler.block_size,
                                attention=config.attention, adapter=adapter)
        from oxygen_ros.backends.fast_backend import CompiledTorchBackend
        return CompiledTorchBackend.create(config, model, num_blocks, scheduler=scheduler,
                                           max_decode_tokens=max_decode_tokens,
                                           max_cameras=max_cameras, adapter=adapter,
                                           **fast_path)
    if adapter is not None:
        raise ValueError(f'the memory adapter (suffix LoRA) runs on the torch backend only; '
                         f'backend {config.kind.value!r} has no LoRA in its graphs: use '
                         f'backend torch, or no memory_adapter')
    if config.kind is BackendKind.TENSORRT:
        from oxygen_ros.backends.experimental.tensorrt_backend import TensorRTBackend
        from oxygen_ros.backends.experimental.trt_profiles import TrtPrecision
        return TensorRTBackend.create(config, model, num_blocks, scheduler=scheduler,
                                      max_decode_tokens=max_decode_tokens,
                                      max_cameras=max_cameras,
                                      precision=TrtPrecision(config.trt_precision),
                                      cache_dir=config.engine_cache_dir)
    raise ValueError(f'unknown backend {config.kind!r}')


__all__ = ['BackendUnavailableError', 'make_backend']
