"""
``FastPathBackend``: the torch backend on the fast path (``model.FastPathModel``).

The job program is ``TorchBackend``'s; every model call it makes goes through the compiled
model, which replays a CUDA graph where one fits. ``create`` warms up (compiles, captures and
gates every graph) before the first cycle, and reports it apart (``warmup_report``).
"""

from __future__ import annotations

import logging
from typing import Callable, Collection

from oxygen_ros.backends.attention import sdpa_context
from oxygen_ros.backends.config import AttentionBackend, BackendConfig, Step
from oxygen_ros.backends.fast_path.buckets import EngineLimits
from oxygen_ros.backends.fast_path.model import FastPathModel
from oxygen_ros.backends.interface import CompileCacheUse, WarmupReport
from oxygen_ros.backends.torch_backend import TorchBackend
from oxygen_ros.model.lora import SuffixLoRA
from oxygen_ros.model.pi05 import Pi05Model
from oxygen_ros.sched.scheduler import SchedulerConfig

DEFAULT_COMPILE_BACKEND = 'inductor'
"""``torch.compile`` backend of ``FastPathBackend.create`` (tests swap in aot_eager)."""
_LOG = logging.getLogger('oxygen_ros.backends.fast_path.model')


class FastPathBackend(TorchBackend):
    """
    ``TorchBackend`` on a :class:`FastPathModel` (``create`` builds and warms one up).

    Several robots' frames in one plan run batched (``frame_batch.py``) in the fast path's
    robot-batch graphs of vision, prefill and denoise (up to the scheduler's ``max_robots``;
    ``buckets.robot_buckets``).

    :param fast_path: the fast path's model calls (warmed up on this backend's pool).
    :param warmup_seconds: what its warm-up took (reported apart from the cycles).
    """

    def __init__(self, fast_path: FastPathModel, num_blocks: int, block_size: int, *,
                 attention: AttentionBackend = AttentionBackend.AUTO,
                 adapter: SuffixLoRA | None = None, warmup_seconds: float = 0.0) -> None:
        super().__init__(fast_path, num_blocks, block_size,  # type: ignore[arg-type]
                         attention=attention, adapter=adapter)
        self.fast_path = fast_path
        self.warmup_seconds = warmup_seconds

    @property
    def source_model(self) -> Pi05Model:
        """Return the eager model the fast path compiled (its weights)."""
        return self.fast_path.model

    @property
    def warmup_report(self) -> WarmupReport:
        """Return the warm-up's time, graphs, traces and loads, fallbacks, caches, gate, drops."""
        fast = self.fast_path
        cache = None
        if fast.cache is not None:
            counts = fast.cache.counts()
            cache = CompileCacheUse(counts.hits, counts.misses, fast.cache.loaded)
        return WarmupReport(self.warmup_seconds, fast.graph_counts(), dict(fast.compiles),
                            dict(fast.fallbacks), cache, dict(fast.loaded), fast.gate,
                            dict(fast.seconds), dict(fast.dropped), dict(fast.without))

    @classmethod
    def create(cls, config: BackendConfig, model: Pi05Model, num_blocks: int, *,
               scheduler: SchedulerConfig, max_decode_tokens: int, max_cameras: int,
               backend: str | Callable | None = None, progress: bool = True,
               only: Collection[Step] | None = None,
               camera_counts: tuple[int, ...] | None = None,
               reference: Pi05Model | None = None,
               adapter: SuffixLoRA | None = None,
               precompile: bool | None = None,
               extra_jacobian_steps: tuple[int | None, ...] = ()) -> FastPathBackend:
        """
        Build the backend and warm it up (compile, capture and gate every static shape).

        The warm-up runs with ``config.attention``'s kernel (chosen while tracing); a
        ``scheduler.tokens_per_cycle`` k > 1 gets decode graphs of k steps.

        :param scheduler: the block size, the largest decode batch, k and the robot batch
            (``max_robots``).
        :param max_decode_tokens: the most tokens a text request decodes.
        :param max_cameras: the most valid cameras of a frame (the robot's).
        :param backend: ``torch.compile`` backend (default ``DEFAULT_COMPILE_BACKEND``).
        :param only: steps to put on the fast path (default all; ``FastPathModel``), within
            ``config.compile_steps``.
        :param camera_counts: valid-camera counts to compile (default 1 to all).
        :param reference: the gate's float32 copy, where the caller holds one.
        :param adapter: the memory adapter (suffix LoRA), compiled into the suffix and decode
            graphs.
        :param precompile: keep the steps compiled ahead of time on disk (``FastPathModel``;
            default: with Inductor).
        :param extra_jacobian_steps: RTC's ``jacobian_steps`` to compile guided denoise graphs
            for beside ``config.rtc_jacobian_steps`` (the bench times exact RTC beside them).
        :raises ValueError: ``config.compile_mode`` resolves to NONE.
        """
        cfg = model.cfg
        if config.compile_steps is not None:
            only = config.compile_steps if only is None else \
                frozenset(only) & config.compile_steps
        limits = EngineLimits.for_model(
            cfg, num_slots=num_blocks * scheduler.block_size,
            max_batch=scheduler.max_running_requests, max_decode_tokens=max_decode_tokens,
            max_cameras=max_cameras, max_robots=scheduler.max_robots)
        fast = FastPathModel(model, config.compile_mode, limits,
                             backend=backend or DEFAULT_COMPILE_BACKEND,
                             block_size=scheduler.block_size, only=only,
                             camera_counts=camera_counts, adapter=adapter, guided=config.rtc,
                             jacobian_steps=(config.rtc_jacobian_steps, *extra_jacobian_steps),
                             precompile=precompile, attention=config.attention,
                             tokens_per_cycle=(scheduler.tokens_per_cycle,))
        if config.compile_steps is not None:
            _LOG.info('fast path: compile_steps: %s compiled, every other step eager',
                      ', '.join(step.value for step in fast.steps()) or 'none')
        out = cls(fast, num_blocks, scheduler.block_size, attention=config.attention,
                  adapter=adapter)
        with sdpa_context(config.attention):
            out.warmup_seconds = fast.warmup(out.cache, progress=progress, reference=reference)
        return out


__all__ = ['FastPathBackend', 'DEFAULT_COMPILE_BACKEND']
