"""
``oxygen_doctor``'s torch checks: the build, the CUDA device, and the build's kernels for it.

A CUDA build of torch carries compiled kernels (SASS) for the architectures in
``torch.cuda.get_arch_list()`` and PTX for its ``compute_XY`` entries. A device runs SASS built
for its own major architecture and a minor at most its own (``sm_80`` on ``sm_86``; an ``a``
variant, ``sm_90a``, only on that exact device), or JIT-compiles PTX of a capability at most its
own (CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility"). Without
either, every CUDA op raises "no kernel image is available for execution on the device":
Jetson AGX Thor (compute capability 11.0, ``sm_110``) under PyTorch's cu128 wheels, whose list
stops at ``sm_100`` and ``sm_120`` (docs/gpu.md#jetson-agx-thor).
"""

from __future__ import annotations

import platform
import re
import sys
from typing import Sequence

from oxygen_ros.tools.doctor.findings import Finding, Level

MIN_PYTHON = (3, 11)
"""setup.py's ``python_requires``."""
ROBOT_INSTALL = ('in the venv beside ROS 2: pip install -r requirements/robot.txt (torch '
                 '2.13.0+cu130 from https://download.pytorch.org/whl/cu130; docs/running.md'
                 '#on-a-robot-with-ros-2)')
_ARCH = re.compile(r'(sm|compute)_(\d+)(\d)([af]?)')


def kernel_arch(arch_list: Sequence[str], capability: tuple[int, int]) -> str | None:
    """
    Return the entry of ``arch_list`` whose kernels a device of ``capability`` runs, or None.

    SASS of the device's major architecture and a minor at most its own first (``sm_XYa`` only
    on exactly ``XY``), else the newest PTX (``compute_XY``) at most the device's capability.

    :param arch_list: ``torch.cuda.get_arch_list()``, e.g. ``['sm_80', 'sm_90', 'sm_100']``.
    :param capability: ``torch.cuda.get_device_capability()``, e.g. ``(11, 0)``.
    """
    major, minor = capability
    ptx = None
    for arch in arch_list:
        m = _ARCH.fullmatch(arch)
        if m is None:
            continue
        kind, a_major, a_minor, variant = m[1], int(m[2]), int(m[3]), m[4]
        if kind == 'sm' and a_major == major and (a_minor == minor or
                                                  (a_minor < minor and variant != 'a')):
            return arch
        if kind == 'compute' and not variant and (a_major, a_minor) <= (major, minor):
            ptx = arch
    return ptx


def check_python() -> Finding:
    """Return the interpreter's version against ``MIN_PYTHON``."""
    version = '.'.join(map(str, sys.version_info[:3]))
    where = f'{platform.python_implementation()} {version} at {sys.executable}'
    if sys.version_info[:2] < MIN_PYTHON:
        return Finding('python', Level.ERROR, f'{where}: oxygen_ros needs Python >= '
                       f'{".".join(map(str, MIN_PYTHON))}',
                       'use the system Python 3.12 of Ubuntu 24.04 (JetPack 7), as ROS 2 '
                       'Jazzy does')
    return Finding('python', Level.OK, f'{where} (>= {".".join(map(str, MIN_PYTHON))})')


def _no_cuda_reason(torch) -> str:
    try:
        torch.cuda.init()
    except Exception as exc:  # noqa: B902 - torch says why in whatever it raises
        return f'{type(exc).__name__}: {exc}'
    return 'torch.cuda.is_available() is False'


def check_torch(device: str) -> Finding:
    """Return torch's version and build (CPU or CUDA) against the configured ``device``."""
    try:
        import torch
    except ImportError as exc:
        return Finding('torch', Level.ERROR, f'not importable ({exc})',
                       f'{ROBOT_INSTALL}; in the venv of make: make setup')
    arch = ' '.join(torch.cuda.get_arch_list()) or 'none'
    if torch.version.cuda is None:
        summary = f'{torch.__version__}: a CPU build (no CUDA kernels)'
        if device.startswith('cuda'):
            return Finding('torch', Level.ERROR, f'{summary}; device {device} cannot run',
                           f'install the CUDA build: {ROBOT_INSTALL}')
        return Finding('torch', Level.OK, f'{summary}; device {device}')
    return Finding('torch', Level.OK, f'{torch.__version__}: a CUDA {torch.version.cuda} '
                   f'build, kernels for {arch}')


def check_cuda(device: str) -> Finding:
    """Return the CUDA devices torch sees (name, capability, memory, SMs) or why none."""
    try:
        import torch
    except ImportError:
        return Finding('cuda', Level.INFO, 'not checked: torch is not importable')
    if not torch.cuda.is_available():
        summary = f'no CUDA device ({_no_cuda_reason(torch)})'
        if device.startswith('cuda'):
            fix = ('the CUDA build of torch (see torch)' if torch.version.cuda is None
                   else 'check the driver (nvidia-smi; on Jetson: JetPack 7, CUDA 13.0) and '
                        'CUDA_VISIBLE_DEVICES')
            return Finding('cuda', Level.ERROR, f'{summary}; device {device} cannot run', fix)
        return Finding('cuda', Level.INFO, summary)
    driver = getattr(torch._C, '_cuda_getDriverVersion', lambda: 0)()
    parts = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        parts.append(f'cuda:{i} {p.name} sm_{p.major}{p.minor}, {p.total_memory / 2**30:.1f} '
                     f'GiB, {p.multi_processor_count} SMs')
    summary = '; '.join(parts) + (f'; driver CUDA {driver // 1000}.{driver % 1000 // 10}'
                                  if driver else '')
    index = int(device.split(':')[1]) if ':' in device else 0
    if device.startswith('cuda') and index >= torch.cuda.device_count():
        return Finding('cuda', Level.ERROR, f'{summary}; device {device} does not exist',
                       f'set device to one of cuda:0..cuda:{torch.cuda.device_count() - 1}')
    return Finding('cuda', Level.OK, summary)


def check_arch(device: str) -> Finding:
    """Return whether torch's build has kernels for the configured CUDA device (or cuda:0)."""
    try:
        import torch
    except ImportError:
        return Finding('kernel arch', Level.INFO, 'not checked: torch is not importable')
    arch_list = torch.cuda.get_arch_list()
    if not torch.cuda.is_available():
        return Finding('kernel arch', Level.INFO, "no CUDA device to match torch's kernel "
                       f'architectures ({" ".join(arch_list) or "none: a CPU build"}) against')
    index = int(device.split(':')[1]) if device.startswith('cuda:') else 0
    if index >= torch.cuda.device_count():
        return Finding('kernel arch', Level.INFO, f'not checked: no device {device}')
    capability = torch.cuda.get_device_capability(index)
    sm = f'sm_{capability[0]}{capability[1]}'
    match = kernel_arch(arch_list, capability)
    if match is not None:
        how = 'PTX, compiled at first use' if match.startswith('compute') else 'SASS'
        return Finding('kernel arch', Level.OK, f'cuda:{index} is {sm}: torch runs its '
                       f'{match} kernels ({how})')
    level = Level.ERROR if device.startswith('cuda') else Level.WARN
    return Finding('kernel arch', level, f'cuda:{index} is {sm}, torch {torch.__version__} has '
                   f'kernels for {" ".join(arch_list)} only: every CUDA op raises "no kernel '
                   'image is available"', f'a build with {sm}: {ROBOT_INSTALL}')


__all__ = ['MIN_PYTHON', 'ROBOT_INSTALL', 'check_arch', 'check_cuda', 'check_python',
           'check_torch', 'kernel_arch']
