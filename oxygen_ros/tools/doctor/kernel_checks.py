"""
``oxygen_doctor``'s kernel checks: Triton for this device, FP8 ``_scaled_mm``, TensorRT.

The Triton and FP8 checks are the ones the engine itself runs (one home each): the fast path's
warm-up builds the project's Triton kernels for the device with
``backends.fast_path.kernels.device_check.check_device`` (for the configured preset and dtype) and
the FP8 weights ask ``model.fp8.probe_scaled_mm`` at load whether row-wise scaled
``torch._scaled_mm`` runs there. Around them: which Triton torch's wheel requires (its
``Requires-Dist``) against the installed one, and the ptxas overrides Triton reads
(``TRITON_PTXAS_PATH``, and for compute capability >= 10, Jetson Thor's 11.0 included,
``TRITON_PTXAS_BLACKWELL_PATH``: docs/gpu.md#jetson-agx-thor).
"""

from __future__ import annotations

import importlib.metadata
import os
from typing import Mapping

from oxygen_ros.engine.config import BackendKind, EngineConfig, Quantization
from oxygen_ros.tools.doctor.findings import Finding, Level

PTXAS_VARS = ('TRITON_PTXAS_PATH', 'TRITON_PTXAS_BLACKWELL_PATH')


def torch_requires_triton() -> str | None:
    """Return the Triton requirement of the installed torch (``==3.7.1``), or None."""
    from packaging.requirements import Requirement
    try:
        requires = importlib.metadata.requires('torch') or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for text in requires:
        req = Requirement(text)
        if req.name == 'triton' and (req.marker is None or req.marker.evaluate()):
            return str(req.specifier)
    return None


def check_triton_pin(environ: Mapping[str, str] = os.environ) -> Finding:
    """Return the installed Triton against what torch requires, and any ptxas override."""
    try:
        installed = importlib.metadata.version('triton')
    except importlib.metadata.PackageNotFoundError:
        installed = None
    wanted = torch_requires_triton()
    overrides = ', '.join(f'{v}={environ[v]}' for v in PTXAS_VARS if environ.get(v))
    tail = f'; {overrides}' if overrides else ''
    if wanted is None:
        return Finding('triton', Level.INFO, f'{installed or "not installed"}; torch requires '
                       f'none (a CPU build){tail}')
    from packaging.specifiers import SpecifierSet
    if installed is None or installed not in SpecifierSet(wanted):
        return Finding('triton', Level.WARN, f'{installed or "not installed"}, torch requires '
                       f'triton{wanted}: the fast path runs a Triton nobody tested with it{tail}',
                       f'pip install "triton{wanted}" (requirements/robot.txt pins it)')
    return Finding('triton', Level.OK, f'{installed}, as torch requires (triton{wanted}){tail}')


def check_triton_build(config: EngineConfig) -> Finding:
    """Return whether the project's Triton kernels build for the configured device and model."""
    from oxygen_ros.backends.fast_path.kernels.device_check import check_device
    from oxygen_ros.engine.loading import torch_dtype
    device = config.backend.device
    result = check_device(device, config.model_config(), torch_dtype(config.dtype))
    if result.ok:
        return Finding('triton build', Level.OK, f'{result.target}: {len(result.lines)} '
                       f'kernels of {config.preset} in {config.dtype} build')
    if not device.startswith('cuda'):
        return Finding('triton build', Level.INFO, f'{result.reason}')
    failed = [line for line in result.lines if ': FAILED: ' in line]
    return Finding('triton build', Level.WARN, f'{result.target}: {result.reason}' +
                   (f' ({"; ".join(failed[:2])})' if failed else '') + ': the warm-up leaves '
                   'the paged attention out, the steps stay compiled with the gathered context',
                   "Triton >= 3.7 (its ptxas-blackwell is CUDA 13.1's: Jetson Thor's sm_110a), "
                   'or TRITON_PTXAS_BLACKWELL_PATH=/usr/local/cuda/bin/ptxas with Triton 3.6 '
                   '(docs/gpu.md#kernels-built-as-inductor-builds-them)')


def check_fp8(config: EngineConfig) -> Finding:
    """Return whether row-wise scaled ``torch._scaled_mm`` runs on the configured device."""
    from oxygen_ros.model.fp8 import probe_scaled_mm
    device = config.backend.device
    reason = probe_scaled_mm(device)
    asked = config.quantization is Quantization.FP8
    if reason is None:
        return Finding('fp8', Level.OK, f'row-wise scaled torch._scaled_mm runs on '
                       f'{device}' + ('' if asked else ' (quantization none: unused)'))
    if asked and not device.startswith('cuda'):
        return Finding('fp8', Level.WARN, f'quantization fp8 on {device}: {reason}; the '
                       'weight-only reference path runs (a reported fallback)',
                       'quantization:=none, or FP8 weights on a CUDA GPU')
    if asked:
        return Finding('fp8', Level.ERROR, f'quantization fp8, but row-wise scaled '
                       f'torch._scaled_mm does not run on {device}: {reason}; the load '
                       'runs the unquantized bf16 weights instead',
                       'quantization:=none (bf16 weights), or a torch whose build has the '
                       'row-wise FP8 kernel for this GPU')
    return Finding('fp8', Level.INFO, f'row-wise scaled torch._scaled_mm does not run here: '
                   f'{reason} (quantization none: unused)')


def check_tensorrt(config: EngineConfig, jetson: bool) -> Finding:
    """Return TensorRT's version where importable, and whether the configured backend needs it."""
    try:
        import tensorrt
    except ImportError as exc:
        if config.backend.kind is BackendKind.TENSORRT:
            return Finding('tensorrt', Level.ERROR, f'backend tensorrt, but TensorRT is not '
                           f'importable ({exc})', 'JetPack 7 installs TensorRT 10.13 for the '
                           'system Python 3.12 (python3-libnvinfer): a venv made with '
                           '--system-site-packages sees it; or backend:=torch')
        return Finding('tensorrt', Level.INFO, f'not importable ({exc}); backend '
                       f'{config.backend.kind.value} needs none')
    version = getattr(tensorrt, '__version__', '?')
    summary = f'{version} ({os.path.dirname(tensorrt.__file__)})'
    if jetson and version.startswith('10.13') and \
            config.backend.kind is BackendKind.TENSORRT:
        return Finding('tensorrt', Level.WARN, f'{summary}: on Jetson Thor 10.13 builds FP32 '
                       'engines silently when FP8/FP4 flags are set (NVIDIA/TensorRT#4590)',
                       "check the engine's precision after a build; trt_precision graph or "
                       'bf16')
    return Finding('tensorrt', Level.OK, summary)


__all__ = ['PTXAS_VARS', 'check_fp8', 'check_tensorrt', 'check_triton_build',
           'check_triton_pin', 'torch_requires_triton']
