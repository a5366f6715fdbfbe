"""
The fast path's warm-up as the benchmarks record it (``oxygen_bench engine``, ``gpu``, ``start``).

One dict per warm-up, the same keys wherever it is recorded: seconds in all and per step,
Dynamo graphs traced and files loaded per step, graphs captured per step, the steps that fell
back to eager kernels (``fallbacks``) and the features the fast path dropped to keep a step
compiled (``dropped``: feature -> reason, e.g. ``paged_attention`` -> the build error), the
gate, the compile caches' use. ``oxygen_bench gpu`` fails a session on any fallback or
dropped feature (docs/gpu.md#targets).
"""

from __future__ import annotations

from typing import Any


def dropped_features(backend: Any) -> dict[str, str]:
    """
    Return the features the backend's fast path dropped at its warm-up: name -> reason.

    ``WarmupReport.dropped`` (``backends/interface.py``); empty for backends without a fast
    path (eager, TensorRT).
    """
    return dict(backend.warmup_report.dropped)


def warmup_summary(backend: Any) -> dict:
    """
    Return what ``backend``'s warm-up did, JSON-ready.

    :returns: ``warmup_s``, ``phases`` (seconds per step, and of the gate's float32 copy or
        the weights' fingerprint), ``compiles``, ``loaded``, ``graphs`` (per step),
        ``fallbacks`` (step -> reason), ``dropped`` (feature -> reason), ``without`` (step ->
        the features its graphs run without), ``gate`` (per step,
        what the parity gate measured), ``gate_used`` (against what), ``compile_cache``
        (hits, misses, the configuration's artifact file loaded; None: no Inductor).
    """
    report = backend.warmup_report
    fast = getattr(backend, 'fast_path', None)
    cache = report.compile_cache
    return {
        'warmup_s': report.seconds,
        'phases': {k: round(v, 3) for k, v in report.phases.items()},
        'compiles': dict(report.compiles), 'loaded': dict(report.loaded),
        'graphs': dict(report.graphs), 'fallbacks': dict(report.fallbacks),
        'dropped': dropped_features(backend), 'without': dict(report.without),
        'gate': {} if fast is None else {s: r.describe() for s, r in fast.parity.items()},
        'gate_used': report.gate,
        'compile_cache': None if cache is None else {
            'hits': cache.hits, 'misses': cache.misses, 'loaded': cache.loaded}}


__all__ = ['dropped_features', 'warmup_summary']
