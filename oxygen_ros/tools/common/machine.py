"""The machine a figure was measured on, named next to every absolute figure the tools print."""

from __future__ import annotations

from pathlib import Path
import platform
import sys


def cpu_name() -> str:
    """Return the CPU model from ``/proc/cpuinfo`` (or ``platform.processor()``)."""
    try:
        for line in Path('/proc/cpuinfo').read_text().splitlines():
            if line.startswith('model name'):
                return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_summary(torch) -> dict:
    """Return the machine of a benchmark's JSON: platform, CPU, torch, its threads, Python."""
    return {'platform': platform.platform(), 'processor': cpu_name(),
            'torch': torch.__version__, 'threads': torch.get_num_threads(),
            'python': sys.version.split()[0]}
