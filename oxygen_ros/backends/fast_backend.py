"""
``CompiledTorchBackend``: the torch backend on the fast path (``compiled.CompiledModel``).

The job program is ``TorchBackend``'s; every model call it makes goes through the compiled
model, which replays a CUDA graph where one fits. ``create`` warms up (compiles, captures and
gates every graph) before the first cycle, and reports that time apart (``compile_seconds``).
"""

from __future__ import annotations

from typing import Callable

from oxygen_ros.backends.compiled import CompiledModel
from oxygen_ros.backends.config import BackendConfig
from oxygen_ros.backends.torch_backend import TorchBackend
from oxygen_ros.backends.trt_profiles import EngineLimits
from oxygen_ros.model.pi05 import Pi05Model

DEFAULT_COMPILE_BACKEND = 'inductor'
"""``torch.compile`` backend of ``CompiledTorchBackend.create`` (tests swap in aot_eager)."""


class CompiledTorchBackend(TorchBackend):
    """``TorchBackend`` on a :class:`CompiledModel`; ``compile_seconds`` = its warm-up."""

    compile_seconds: float

    @classmethod
    def create(cls, config: BackendConfig, model: Pi05Model, num_blocks: int, *,
               backend: str | Callable | None = None,
               progress: bool = True) -> CompiledTorchBackend:
        """
        Build the backend and warm it up (compile, capture and gate every static shape).

        :param backend: ``torch.compile`` backend (default ``DEFAULT_COMPILE_BACKEND``).
        :raises ValueError: ``config.compile_mode`` resolves to NONE.
        """
        cfg = model.cfg
        limits = EngineLimits.for_model(
            cfg, num_slots=num_blocks * config.block_size, max_batch=config.max_running_requests,
            max_decode_tokens=max(cfg.decode_budget, config.decode_budget or 0))
        compiled = CompiledModel(model, config.compile_mode, limits,
                                 backend=backend or DEFAULT_COMPILE_BACKEND,
                                 block_size=config.block_size)
        out = cls(compiled, num_blocks, config.block_size)  # type: ignore[arg-type]
        out.compile_seconds = compiled.warmup(out.cache, progress=progress)
        return out


__all__ = ['CompiledTorchBackend', 'DEFAULT_COMPILE_BACKEND']
