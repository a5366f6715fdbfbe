"""
Choosing the backend that executes plans: PyTorch (CPU/CUDA, eager or the fast path), or a plugin.

Every backend implements ``interface.Backend``. The torch backend is the core's own; its fast
path (``fast_path/``) is imported only when ``compile_mode`` asks for it. Any other backend
is a plugin: a setuptools entry point of the group :data:`BACKEND_PLUGINS` whose name is the
``backend`` parameter's value, as ros2cli finds its commands (``ros2cli.command``) and vLLM
its platforms (``vllm.platform_plugins``). The package registers one, ``tensorrt``: the
experimental ONNX / TensorRT chain, which lives with the ``oxygen_export`` tool
(``tools/tensorrt/``, never run on TensorRT), so the runtime layers never import it
(``test/test_import_boundaries.py``; docs/gpu.md#onnx-and-tensorrt).
"""

from __future__ import annotations

from importlib import metadata
from typing import Any, Callable

from oxygen_ros.backends.config import BackendConfig, BackendKind, CompileMode
from oxygen_ros.backends.errors import BackendUnavailableError
from oxygen_ros.backends.interface import Backend
from oxygen_ros.backends.torch_backend import TorchBackend
from oxygen_ros.model.lora import SuffixLoRA
from oxygen_ros.model.pi05 import Pi05Model
from oxygen_ros.sched.scheduler import SchedulerConfig

BACKEND_PLUGINS = 'oxygen_ros.backends'
"""Entry point group of the backends beyond torch: ``name = module:function`` where
``function(config: BackendConfig, model: Pi05Model, num_blocks: int, *, scheduler:
SchedulerConfig, max_decode_tokens: int, max_cameras: int) -> Backend`` (as
:func:`make_backend`'s)."""

PluginFactory = Callable[..., Backend]


def make_backend(config: BackendConfig, model: Pi05Model, num_blocks: int, *,
                 scheduler: SchedulerConfig, max_decode_tokens: int, max_cameras: int,
                 adapter: SuffixLoRA | None = None, **fast_path: Any) -> Backend:
    """
    Build the backend ``config.kind`` for ``model`` with a pool of ``num_blocks`` blocks.

    ``config.compile_mode`` (AUTO resolved for the device) other than NONE puts every
    per-cycle model call of the torch backend on the fast path (``fast_path/model.py``:
    static shapes, CUDA graphs, parity-gated, warm-up included, loud eager fallback); a
    plugin backend ignores it (TensorRT's engines are compiled already).

    :param scheduler: the scheduler's settings the backend reads: the block size, the largest
        decode batch (``max_running_requests``) and k (``tokens_per_cycle``).
    :param max_decode_tokens: the most tokens a text request decodes (the decode budget).
    :param max_cameras: the most valid cameras of a frame (the robot's).
    :param adapter: the memory adapter (OxyGen's suffix LoRA, ``model/lora.py``); the torch
        backend only.
    :param fast_path: options of ``FastPathBackend.create`` (``only``,
        ``camera_counts``, ``backend``, ``progress``, ``reference``, ``precompile``,
        ``extra_jacobian_steps``), used
        when the fast path is on (the benchmarks narrow it to their workload).
    :raises BackendUnavailableError: a plugin that is not installed, or cannot be imported
        or run here (TensorRT: the message says what to install).
    :raises ValueError: an adapter with a plugin backend (TensorRT's graphs have no LoRA).
    """
    if config.kind is BackendKind.TORCH:
        if config.compile_mode.resolve(config.device) is CompileMode.NONE:
            return TorchBackend(model, num_blocks, scheduler.block_size,
                                attention=config.attention, adapter=adapter)
        from oxygen_ros.backends.fast_path.backend import FastPathBackend
        return FastPathBackend.create(config, model, num_blocks, scheduler=scheduler,
                                      max_decode_tokens=max_decode_tokens,
                                      max_cameras=max_cameras, adapter=adapter, **fast_path)
    if adapter is not None:
        raise ValueError(f'the memory adapter (suffix LoRA) runs on the torch backend only; '
                         f'backend {config.kind.value!r} has no LoRA in its graphs: use '
                         f'backend torch, or no memory_adapter')
    return plugin(config.kind.value)(config, model, num_blocks, scheduler=scheduler,
                                     max_decode_tokens=max_decode_tokens,
                                     max_cameras=max_cameras)


def plugin(name: str) -> PluginFactory:
    """
    Return the factory that the entry point ``name`` of :data:`BACKEND_PLUGINS` names.

    :raises BackendUnavailableError: no such entry point in the installed packages' metadata
        (the package installed before it registered one: reinstall it).
    """
    found = metadata.entry_points(group=BACKEND_PLUGINS, name=name)
    if not found:
        raise BackendUnavailableError(
            f'backend {name!r} is not installed: no entry point {name!r} in group '
            f'{BACKEND_PLUGINS!r} (the oxygen_ros package registers it in setup.py; reinstall '
            f"it: 'make setup' or 'colcon build'), or use backend 'torch'")
    return next(iter(found)).load()


__all__ = ['BACKEND_PLUGINS', 'BackendUnavailableError', 'make_backend', 'plugin']
