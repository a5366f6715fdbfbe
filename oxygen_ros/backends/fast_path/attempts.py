"""
One step's warm-up: attempts, each a kernel source and the features left out, until one works.

``warmup.FastPathWarmup`` calls :func:`warm_step` per step: every graph of the step is built
(compiled, captured) and gated with an :class:`Attempt`; the first attempt whose graphs all
pass wins; a failed one is logged with its reason and the warm-up's policy names the next.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import logging
from typing import Any, Callable

from oxygen_ros.backends.config import Step
from oxygen_ros.backends.fast_path.features import Feature
from oxygen_ros.backends.fast_path.graph_builder import Kernels
from oxygen_ros.backends.fast_path.static_graph import StaticCall
from oxygen_ros.backends.parity import ParityResult

_LOG = logging.getLogger('oxygen_ros.backends.fast_path.model')


@dataclass(frozen=True)
class Attempt:
    """
    One way to build a step: where its kernels come from, and the features it goes without.

    :ivar kernels: the compiler ahead of time or just in time, or PyTorch's eager kernels.
    :ivar off: the optional features (``features.py``) its functions are traced without.
    """

    kernels: Kernels
    off: frozenset[Feature] = frozenset()


class GateFailure(RuntimeError):
    """A graph built and ran but its outputs missed the parity gate's tolerance."""


@dataclass
class StepOutcome:
    """
    How a step's warm-up ended.

    :ivar kernels: the kernel source its graphs use, or None (the step runs eagerly).
    :ivar off: the features its graphs run without.
    :ivar worst: the gate's closest call (largest error / tolerance) of those graphs.
    :ivar compiles: Dynamo graphs traced meanwhile (just in time or ahead of time).
    :ivar reasons: why each attempt before (or instead of) it failed.
    """

    kernels: Kernels | None = None
    off: frozenset[Feature] = frozenset()
    worst: ParityResult | None = None
    compiles: int = 0
    reasons: list[str] = field(default_factory=list)


def graphs_compiled() -> int:
    """Return Dynamo's count of graphs traced in this process (``aot_compile`` included)."""
    from torch._dynamo.utils import counters
    return int(counters['stats']['unique_graphs'])


def short(exc: BaseException, limit: int = 300) -> str:
    """
    Return ``Class: first line of the message``, and its root cause's.

    An Inductor error can be pages long; Dynamo's errors wrap the error of the code they traced.
    """
    def line(e: BaseException) -> str:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        return f'{type(e).__name__}: {lines[0][:limit] if lines else ""}'
    root, seen = exc, {id(exc)}
    while (root.__cause__ or root.__context__) is not None and \
            id(root.__cause__ or root.__context__) not in seen:
        root = root.__cause__ or root.__context__
        seen.add(id(root))
    return line(exc) if root is exc else f'{line(exc)} ({line(root)})'


def warm_step(step: Step, keys: list[tuple[int, ...]], first: Attempt, *,
              build: Callable[[tuple[int, ...], Attempt], StaticCall], probe: Any,
              graphs: dict[Step, dict[tuple[int, ...], StaticCall]], bar: Any,
              name: Callable[[Attempt], str],
              next_attempt: Callable[[Attempt, BaseException], Attempt | None] | None = None
              ) -> StepOutcome:
    """
    Build and gate ``step`` at every shape of ``keys``, from ``first`` on until one works.

    :param build: makes the graph of a shape with an attempt's kernels and features.
    :param probe: ``ParityProbe``: ``probe.run(step.value, key)`` gates a shape.
    :param graphs: the model's graphs by step; the step's are registered there while probed
        (the probes call through the fast path) and removed when an attempt fails.
    :param bar: progress bar, one tick per graph gated.
    :param name: an attempt's name in logs and reasons.
    :param next_attempt: told of each failed attempt and its error (a ``GateFailure`` for a
        missed gate); returns the next attempt, or None: the step runs eagerly. Default: none.
    """
    out, before = StepOutcome(), graphs_compiled()
    attempt: Attempt | None = first
    while attempt is not None:
        try:
            graphs[step] = built = {}
            worst = None
            for key in keys:
                built[key] = build(key, attempt)
                result = probe.run(step.value, key)
                if not result.passed:
                    raise GateFailure(f'parity gate failed: {result.describe()}')
                if worst is None or result.error / max(result.tolerance, 1e-30) > \
                        worst.error / max(worst.tolerance, 1e-30):
                    worst = result
                bar.update()
        except Exception as exc:  # noqa: B902 - any compile/capture/gate failure
            graphs.pop(step, None)
            reason = f'{name(attempt)}: {short(exc)}'
            out.reasons.append(reason)
            _LOG.error('fast path: %s with %s', step.value, reason)
            _LOG.debug('fast path: %s with %s', step.value, name(attempt), exc_info=exc)
            attempt = next_attempt(attempt, exc) if next_attempt is not None else None
            continue
        out.kernels, out.off, out.worst = attempt.kernels, attempt.off, worst
        break
    out.compiles = graphs_compiled() - before
    return out


__all__ = ['Attempt', 'GateFailure', 'StepOutcome', 'graphs_compiled', 'short', 'warm_step']
