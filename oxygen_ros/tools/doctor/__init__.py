"""
``oxygen_doctor``: what this machine can run, for the node as configured, and what to fix.

Usage (``ros2 run oxygen_ros oxygen_doctor``, in the spirit of ``ros2 doctor``)::

    oxygen_doctor [--preset P] [--camera-size 640x480[:rgb8]] [--load] [--json]
                  [--ros-args --params-file FILE -p name:=value ...]

The node is described as it is started (``--preset`` loads the launch file's
``config/<P>.yaml`` first, then the node's own ``--ros-args``), and each check prints one
finding with its fix: Python; which rclpy and how the venv sits beside a ROS 2 install; the
torch build and ``get_arch_list()`` against the device's compute capability; the CUDA devices;
Triton against torch's requirement and a build of the project's kernels for the device (the
fast path's own check); FP8 row-wise ``torch._scaled_mm`` on the device; TensorRT; the DDS
security plugins; Fast DDS's shared-memory segment against the cameras' image size; the
tokenizer and the checkpoint (keys, shapes and norm stats; ``--load``: every tensor); and on a
Jetson the power mode and clocks (docs/running.md#oxygen_doctor).

Exits 1 when the node cannot run as configured (any ERROR: e.g. ``device: cuda`` on a machine
without CUDA, a checkpoint that does not fit the preset), 2 on a usage error, else 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence

NAME = 'oxygen_doctor'


def _parser() -> argparse.ArgumentParser:
    from oxygen_ros.tools.doctor.shared_memory import CameraSize
    parser = argparse.ArgumentParser(
        prog=NAME, description=__doc__.split('\n\n')[0].split(': ', 1)[1],
        epilog="the node's own arguments follow --ros-args (--params-file, -p name:=value)")
    parser.add_argument('--preset', default=None,
                        help="load the launch file's params file config/<PRESET>.yaml before "
                             'the --ros-args ones (launch: preset:=PRESET)')
    parser.add_argument('--camera-size', type=CameraSize.parse, default=CameraSize(640, 480),
                        metavar='WxH[:ENCODING]',
                        help="the raw cameras' image size for the shared-memory check "
                             '(default 640x480:rgb8)')
    parser.add_argument('--load', action='store_true',
                        help='load every tensor of the checkpoint (default: its header only)')
    parser.add_argument('--json', action='store_true',
                        help='print the findings as a JSON list instead of the report')
    return parser


def describe(engine, node) -> str:
    """Return the configuration line: preset, device, dtype, backend, compile mode, steps."""
    from oxygen_ros.backends.config import ALL_STEPS
    backend = engine.backend
    mode = backend.compile_mode.resolve(backend.device)
    steps = ALL_STEPS if backend.compile_steps is None else \
        ','.join(sorted(s.value for s in backend.compile_steps))
    return (f'preset {node.preset}, device {backend.device}, dtype {engine.dtype}, backend '
            f'{backend.kind.value}, compile_mode {backend.compile_mode.value} ({mode.value} '
            f'here), compile_steps {steps}, quantization {engine.quantization.value}, cameras '
            f'{",".join(node.cameras)}')


def read_config(preset: str | None, ros_args: Sequence[str]):
    """
    Return ``(EngineConfig, NodeConfig, Finding)`` of the node's arguments, as it builds them.

    The configs are None when the node would refuse its parameters (the finding says why).
    """
    from oxygen_ros.tools.doctor.findings import Finding, Level
    from oxygen_ros.tools.keystore.node_policy import PolicyError, policy_for
    from oxygen_ros.ros.node_config import build_configs
    from oxygen_ros.ros.params import SPECS
    try:
        policy = policy_for(preset, ros_args)
        values = policy.node_args.parameters()
        engine, node = build_configs({k: v for k, v in values.items() if k in SPECS})
    except (PolicyError, ValueError) as exc:
        return None, None, Finding('params', Level.ERROR, f'the node refuses its parameters: '
                                   f'{exc}', 'see docs/parameters.md')
    files = [str(p) for p in policy.node_args.params_files]
    source = ', '.join(files + [f'-p {k}:={v}' for k, v in policy.node_args.overrides]) or \
        'none given: the defaults'
    return engine, node, Finding('params', Level.OK, f'{describe(engine, node)}; parameters: '
                                 f'{source}')


def run_checks(args: argparse.Namespace, ros_args: Sequence[str]) -> list:
    """Return every finding, in report order; a check that raises is a WARN naming it."""
    from oxygen_ros.engine.config import EngineConfig
    from oxygen_ros.tools.doctor import (
        jetson, kernel_checks as kernels, model_files, ros_checks as ros, shared_memory as shm,
        torch_checks as tch)
    from oxygen_ros.tools.doctor.findings import Finding, Level
    engine, node, params = read_config(args.preset, ros_args)
    config = engine or EngineConfig(preset='demo')
    device = config.backend.device
    on_jetson = jetson.jetson_model() is not None
    checks: list[tuple[str, Callable[[], Finding]]] = [
        ('python', tch.check_python), ('ros 2', ros.check_ros), ('venv', ros.check_venv),
        ('torch', lambda: tch.check_torch(device)), ('cuda', lambda: tch.check_cuda(device)),
        ('kernel arch', lambda: tch.check_arch(device)), ('triton', kernels.check_triton_pin),
        ('triton build', lambda: kernels.check_triton_build(config)),
        ('fp8', lambda: kernels.check_fp8(config)),
        ('tensorrt', lambda: kernels.check_tensorrt(config, on_jetson)),
        ('dds security', ros.check_dds_security)]
    if node is not None:
        checks += [('shared memory', lambda: shm.check_shared_memory(
            node.cameras, node.compressed_cameras, args.camera_size))]
    if engine is not None:
        checks += [('tokenizer', lambda: model_files.check_tokenizer(engine)),
                   ('checkpoint', lambda: model_files.check_checkpoint(engine, args.load))]
    checks += [('jetson power', jetson.check_jetson_power)]
    findings = [params]
    for name, check in checks:
        try:
            findings.append(check())
        except Exception as exc:  # noqa: B902 - one broken check must not hide the others
            findings.append(Finding(name, Level.WARN, f'could not check: {type(exc).__name__}: '
                                    f'{exc}'))
    return findings


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_doctor``; print the report; return 1 when the node cannot run as set."""
    from oxygen_ros.tools.keystore.node_policy import split_ros_args
    own, ros_args = split_ros_args(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(own)
    from oxygen_ros.tools.doctor.findings import exit_status, render
    findings = run_checks(args, ros_args)
    if args.json:
        print(json.dumps([f.as_dict() for f in findings], indent=1))
    else:
        print(f'{NAME}: this machine, for the oxygen node as configured\n{render(findings)}')
    return exit_status(findings)


__all__ = ['describe', 'main', 'read_config', 'run_checks']
