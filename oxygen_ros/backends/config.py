"""
Backend choices and the part of the engine configuration a backend needs (no torch).

``engine.config.EngineConfig`` holds these fields too and hands a ``BackendConfig`` to
``factory.make_backend`` (``EngineConfig.backend_config()``), so that backends never import
the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
import enum


class BackendKind(enum.Enum):
    TORCH = 'torch'
    TENSORRT = 'tensorrt'


class CompileMode(enum.Enum):
    """``torch.compile`` of the torch backend's denoise and decode steps (GPU)."""

    NONE = 'none'
    """Eager PyTorch."""
    DEFAULT = 'default'
    """Inductor kernels, no CUDA graphs."""
    REDUCE_OVERHEAD = 'reduce-overhead'
    """Inductor kernels captured in CUDA graphs (static shapes)."""


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """
    What ``factory.make_backend`` needs (see ``EngineConfig`` for each field).

    :ivar decode_budget: default max tokens of a text request (None: the preset's).
    :ivar engine_cache_dir: exported graphs and TensorRT engines (None: the default cache).
    """

    backend: BackendKind = BackendKind.TORCH
    compile_mode: CompileMode = CompileMode.NONE
    device: str = 'cpu'
    block_size: int = 16
    max_running_requests: int = 32
    decode_budget: int | None = None
    trt_precision: str = 'graph'
    engine_cache_dir: str | None = None


__all__ = ['BackendConfig', 'BackendKind', 'CompileMode']
