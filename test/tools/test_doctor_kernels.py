"""
``oxygen_doctor``'s Triton-build and FP8 checks: the engine's own checks, one home each.

The doctor asks ``backends.fast_path.kernels.device_check.check_device`` (what the fast path's
warm-up runs, for the configured preset and dtype) and ``model.fp8.probe_scaled_mm`` (what FP8
weights ask at load); these tests hold the findings to what those return on this CPU.
"""

from oxygen_ros.backends.fast_path.kernels.device_check import check_device
from oxygen_ros.engine.config import EngineConfig, Quantization
from oxygen_ros.model import fp8
from oxygen_ros.tools.doctor import kernel_checks
from oxygen_ros.tools.doctor.findings import Level


def test_the_triton_build_finding_is_the_fast_paths_check_on_this_cpu():
    result = check_device('cpu')
    assert not result.ok and result.target == 'cpu'
    found = kernel_checks.check_triton_build(EngineConfig(preset='tiny'))
    assert (found.level, found.summary, found.fix) == (Level.INFO, result.reason, '')
    assert found.summary.startswith('cpu: no CUDA device')


def test_the_fp8_finding_is_the_load_probe_on_this_cpu():
    reason = fp8.probe_scaled_mm('cpu')
    assert reason.startswith('cpu: no FP8 tensor cores')
    unused = kernel_checks.check_fp8(EngineConfig(preset='tiny'))
    assert (unused.level, unused.summary) == (
        Level.INFO, f'row-wise scaled torch._scaled_mm does not run here: {reason} '
        '(quantization none: unused)')
    asked = kernel_checks.check_fp8(EngineConfig(preset='tiny', quantization=Quantization.FP8))
    assert asked.level is Level.WARN and 'weight-only reference path' in asked.summary


def test_fp8_asked_on_cuda_without_cuda_is_an_error():
    config = EngineConfig.create(preset='tiny', quantization=Quantization.FP8, device='cuda',
                                 dtype='bfloat16')
    found = kernel_checks.check_fp8(config)
    assert found.level is Level.ERROR
    assert found.summary.startswith('quantization fp8, but row-wise scaled torch._scaled_mm '
                                    'does not run on cuda: ')
    assert 'quantization:=none' in found.fix
