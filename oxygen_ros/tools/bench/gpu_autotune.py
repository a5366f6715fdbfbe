"""
GPU session 5: vision and prefill with Inductor's ``max_autotune``, against its defaults.

Autotuning (``backends/config.py`` ``max_autotune_steps``; ``$OXYGEN_ROS_MAX_AUTOTUNE``)
benchmarks, at compile time, Triton GEMM templates with their epilogues fused (bias, GELU,
residual) against cuBLAS for every GEMM shape, and FlexAttention's tile configurations; what
it gives and what it costs at start are measured here (docs/gpu.md, "Prefill and vision").
"""

from __future__ import annotations

import os
from typing import Any


def autotune_components(ctx: Any) -> bool:
    """
    Vision and prefill warmed up and timed twice: Inductor's defaults, then ``max_autotune``.

    ``ctx`` is the phase's ``gpu_phases.PhaseContext``.

    Each run builds its own fast path (vision and prefill only, the workload's cameras) with
    ``$OXYGEN_ROS_MAX_AUTOTUNE`` unset, then ``vision,prefill``, and saves under ``autotune``
    its warm-up seconds (what autotuning costs at start), fallbacks, features dropped, gate
    and the median ms of each call. Returns True where a run fell back or dropped a feature.
    """
    import torch

    from oxygen_ros.backends.config import (
        AttentionBackend, BackendConfig, CompileMode, MAX_AUTOTUNE_ENV, Step)
    from oxygen_ros.backends.fast_path.backend import FastPathBackend
    from oxygen_ros.backends.parity import float32_copy
    from oxygen_ros.config import get_preset
    from oxygen_ros.parameters import declared_config
    from oxygen_ros.sched.scheduler import SchedulerConfig
    from oxygen_ros.tools.bench.warmup_summary import dropped_features

    a, work = ctx.args, ctx.workload()
    model = work.build_model()
    reference = float32_copy(model)
    config = declared_config(BackendConfig, 'backend', compile_mode=CompileMode(a.compile_mode),
                             device=a.device, attention=AttentionBackend.AUTO)
    scheduler = declared_config(SchedulerConfig, 'scheduler', tokens_per_cycle=1)
    runs: dict = {}
    for name, steps in (('default', ''), ('max_autotune', 'vision,prefill')):
        os.environ[MAX_AUTOTUNE_ENV] = steps
        torch._dynamo.reset()
        backend = FastPathBackend.create(
            config, model, work.num_blocks(), scheduler=scheduler,
            max_decode_tokens=get_preset(work.preset).decode_budget, max_cameras=work.cameras,
            backend=a.compile_backend, progress=False, only=(Step.VISION, Step.PREFILL),
            camera_counts=(work.cameras,),
            reference=reference)
        report = backend.warmup_report
        runs[name] = {'warmup_s': report.seconds, 'fallbacks': dict(report.fallbacks),
                      'dropped': dropped_features(backend),
                      'gate': {s: r.describe() for s, r in backend.fast_path.parity.items()},
                      'ms': _time_vision_prefill(backend, work)}
        ctx.save('autotune', runs)
        del backend
    return any(run['fallbacks'] or run['dropped'] for run in runs.values())


def _time_vision_prefill(backend, work) -> dict:
    """Return the median ms of the fast path's vision call and whole-prefix prefill."""
    import torch

    from oxygen_ros.tools.bench.gpu_components import timed_ms

    fast, cfg, dev = backend.fast_path, backend.fast_path.cfg, work.device
    gen = torch.Generator().manual_seed(work.seed)
    size = cfg.vision.image_size
    images = (torch.rand(1, work.cameras, 3, size, size, generator=gen) * 2 - 1).to(
        dev, fast.dtype)
    tokens = torch.randint(3, 1000, (1, work.prompt_tokens), generator=gen).to(dev)
    slots = torch.arange(16, 16 + work.prefix_tokens, device=dev)[None]
    with torch.inference_mode():
        embeds = fast.encode_images(images)
        return {'vision': timed_ms(lambda: fast.encode_images(images), work.repeats,
                                   work.sync()),
                'prefill': timed_ms(lambda: fast.prefill(tokens, None, image_embeds=embeds,
                                                         cache=backend.cache, slots=slots),
                                    work.repeats, work.sync())}


__all__ = ['autotune_components']
