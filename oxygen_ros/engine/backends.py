"""
Choosing the backend that executes plans: PyTorch (CPU/CUDA) or TensorRT.

Every backend has the ``TorchBackend`` interface: ``execute(plan, frame) -> BackendOutput``,
``cache`` (the KV pool), ``device``. TensorRT is imported only when it is selected.
"""

from __future__ import annotations

from oxygen_ros.engine.config import BackendKind, EngineConfig
from oxygen_ros.engine.torch_backend import TorchBackend
from oxygen_ros.model.pi05 import Pi05Model


class BackendUnavailableError(RuntimeError):
    """The selected backend cannot run here (its package or device is missing)."""


def make_backend(config: EngineConfig, model: Pi05Model, num_blocks: int) -> TorchBackend:
    """
    Build the backend ``config.backend`` for ``model`` with a pool of ``num_blocks`` blocks.

    :raises BackendUnavailableError: TensorRT selected where it cannot be imported or run.
    """
    if config.backend is BackendKind.TORCH:
        return TorchBackend(model, num_blocks, config.block_size)
    if config.backend is BackendKind.TENSORRT:
        from oxygen_ros.engine.tensorrt_backend import TensorRTBackend
        return TensorRTBackend.create(config, model, num_blocks)
    raise ValueError(f'unknown backend {config.backend!r}')
