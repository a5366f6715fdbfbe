"""
Warming one fast-path step up: build, capture and gate its graphs, kernel source by source.

``CompiledModel.warmup`` calls :func:`warm_step` per step with the kernel sources to try in
order (Inductor, then PyTorch's eager kernels in graphs where graphs are captured): the first
source whose every graph builds, captures and passes the parity gate wins; a source that
fails is logged (ERROR) with its reason and the next is tried; none left: the step runs
eagerly (the caller records the fallback).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import logging
import time
from typing import Any, Callable

from oxygen_ros.backends.config import Step
from oxygen_ros.backends.graph_builder import Kernels
from oxygen_ros.backends.parity import ParityResult
from oxygen_ros.backends.static_graph import StaticCall

_LOG = logging.getLogger('oxygen_ros.backends.compiled')


@dataclass
class StepOutcome:
    """
    How a step's warm-up ended.

    :ivar kernels: the kernel source its graphs use, or None (the step runs eagerly).
    :ivar worst: the gate's closest call (largest error / tolerance) of those graphs.
    :ivar compiles: Dynamo graphs compiled meanwhile (recompiles included).
    :ivar reasons: why each kernel source tried before (or instead of) it failed.
    """

    kernels: Kernels | None = None
    worst: ParityResult | None = None
    compiles: int = 0
    reasons: list[str] = field(default_factory=list)


def graphs_compiled() -> int:
    """Return Dynamo's count of graphs compiled in this process (torch's own counter)."""
    from torch._dynamo.utils import counters
    return int(counters['stats']['unique_graphs'])


def warm_step(step: Step, keys: list[tuple[int, ...]], attempts: list[Kernels], *,
              build: Callable[[tuple[int, ...], Kernels], StaticCall], probe: Any,
              graphs: dict[Step, dict[tuple[int, ...], StaticCall]], bar: Any,
              name: Callable[[Kernels], str]) -> StepOutcome:
    """
    Build and gate ``step`` at every shape of ``keys`` with the first kernels that work.

    :param build: makes the graph of a shape with the given kernels.
    :param probe: ``ParityProbe``: ``getattr(probe, step.value)(*key)`` gates a shape.
    :param graphs: the model's graphs by step; the step's are registered there while probed
        (the probes call through the fast path) and removed when its kernels fail.
    :param bar: progress bar, one tick per graph gated.
    :param name: the name of a kernel source in logs and reasons.
    """
    out, before = StepOutcome(), graphs_compiled()
    for kernels in attempts:
        t0 = time.perf_counter()
        try:
            graphs[step] = built = {}
            worst = None
            for key in keys:
                built[key] = build(key, kernels)
                result = getattr(probe, step.value)(*key)
                if not result.passed:
                    raise RuntimeError(f'parity gate failed: {result.describe()}')
                if worst is None or result.error / max(result.tolerance, 1e-30) > \
                        worst.error / max(worst.tolerance, 1e-30):
                    worst = result
                bar.update()
        except Exception as exc:  # noqa: B902 - any compile/capture/gate failure
            graphs.pop(step, None)
            out.reasons.append(f'{name(kernels)} kernels: {type(exc).__name__}: {exc}')
            _LOG.error('fast path: %s with %s kernels failed: %s: %s', step.value,
                       name(kernels), type(exc).__name__, exc)
            continue
        out.kernels, out.worst, out.compiles = kernels, worst, graphs_compiled() - before
        _LOG.info('fast path: %s, %d graph(s) with %s kernels in %.1f s (%d compile(s)); '
                  'worst %s', step.value, len(keys), name(kernels), time.perf_counter() - t0,
                  out.compiles, worst.describe() if worst else '-')
        return out
    out.compiles = graphs_compiled() - before
    return out


__all__ = ['StepOutcome', 'graphs_compiled', 'warm_step']
