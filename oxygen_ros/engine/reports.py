"""
What an engine tells about itself: its text contexts, adapter, fallbacks, request counts.

``EngineReports`` is ``engine.Engine``'s share that only reads (the node's logs and
``/diagnostics``, the benchmarks' JSON): a base class of the engine, on the engine's parts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oxygen_ros.transforms.prompt import TextTask

if TYPE_CHECKING:
    from oxygen_ros.backends.interface import Backend
    from oxygen_ros.engine.config import EngineConfig
    from oxygen_ros.model.lora import SuffixLoRA
    from oxygen_ros.model.pi05 import Pi05Model
    from oxygen_ros.sched.scheduler import Scheduler


class EngineReports:
    """The reading share of ``engine.Engine`` (its attributes are the engine's)."""

    config: EngineConfig
    model: Pi05Model
    adapter: SuffixLoRA | None
    backend: Backend
    scheduler: Scheduler
    load_fallbacks: dict[str, str]

    def describe_contexts(self) -> str:
        """Return what each text task reads, e.g. ``subtask: own_prompt, answer: ...``."""
        return ', '.join(f'{task.value}: {self.config.text_context(task).value}'
                         for task in TextTask)

    def describe_adapter(self) -> str:
        """Return the memory adapter as logs and diagnostics name it (``none`` if absent)."""
        if self.adapter is None:
            return 'none'
        return (f'{self.config.memory_adapter} (rank {self.adapter.rank}, alpha '
                f'{self.adapter.alpha:g})')

    def describe_text(self) -> str:
        """Return :meth:`describe_contexts` and :meth:`describe_adapter` in one line."""
        return f'text contexts {self.describe_contexts()}; memory adapter ' \
            f'{self.describe_adapter()}'

    @property
    def num_running(self) -> int:
        """Return the text requests decoding."""
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        """Return the text requests waiting for admission (the scheduler's queue)."""
        return self.scheduler.num_waiting

    @property
    def fallbacks(self) -> dict[str, str]:
        """
        Return what does not run as configured: compiled step -> reason, and ``quantization``.

        The compiled steps that fell back to eager execution (none when nothing was compiled
        or everything compiled passed its parity gate), and ``config.QUANTIZATION_FALLBACK``
        when the weights are not quantized as asked (``loading.load_model``). The node
        reports each on ``/diagnostics`` (WARN); ``oxygen_bench gpu`` fails on any.
        """
        return {**self.load_fallbacks, **self.backend.warmup_report.fallbacks}

    @property
    def dropped_features(self) -> dict[str, str]:
        """
        Return the fast path's features left out (``fast_path/features.py``): name -> reason.

        The steps stay compiled without them; the node reports each on ``/diagnostics``.
        """
        return dict(self.backend.warmup_report.dropped)

    def describe_quantization(self) -> str:
        """Return the weights' quantization as it runs (``model/fp8.py``), e.g. ``none``."""
        from oxygen_ros.model.fp8 import describe_quantization
        return describe_quantization(self.model)


__all__ = ['EngineReports']
