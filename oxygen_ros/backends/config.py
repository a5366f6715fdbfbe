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
    """
    How the torch backend runs its per-cycle model calls (``compiled.py``).

    The fast path pads every call to a few static shapes and (on CUDA) captures each in a
    CUDA graph; the kernels inside come from Inductor or are PyTorch's own.
    """

    NONE = 'none'
    """Eager PyTorch: one kernel launch per op, shapes as they come."""
    AUTO = 'auto'
    """``reduce-overhead`` on a CUDA device, ``none`` on the CPU (the node's default)."""
    DEFAULT = 'default'
    """Inductor kernels on static shapes, no CUDA graphs (also runs on the CPU)."""
    REDUCE_OVERHEAD = 'reduce-overhead'
    """Inductor kernels captured in CUDA graphs: the fast path (CUDA; on the CPU = default)."""
    CUDA_GRAPHS = 'cuda-graphs'
    """PyTorch's eager kernels in CUDA graphs: no compiler (where Triton cannot build)."""

    def resolve(self, device: str) -> CompileMode:
        """Return the mode to run on ``device`` (``cpu``, ``cuda``, ``cuda:N``): AUTO resolved."""
        if self is CompileMode.AUTO:
            return CompileMode.REDUCE_OVERHEAD if device.startswith('cuda') else CompileMode.NONE
        return self


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """
    What ``factory.make_backend`` needs (see ``EngineConfig`` for each field).

    :ivar decode_budget: default max tokens of a text request (None: the preset's).
    :ivar engine_cache_dir: exported graphs and TensorRT engines (None: the default cache).
    """

    backend: BackendKind = BackendKind.TORCH
    compile_mode: CompileMode = CompileMode.AUTO
    device: str = 'cpu'
    block_size: int = 16
    max_running_requests: int = 32
    decode_budget: int | None = None
    trt_precision: str = 'graph'
    engine_cache_dir: str | None = None


__all__ = ['BackendConfig', 'BackendKind', 'CompileMode']
