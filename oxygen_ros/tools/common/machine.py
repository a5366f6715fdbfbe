"""The machine a figure was measured on, named next to every absolute figure the tools print."""

from __future__ import annotations

from pathlib import Path
import platform


def cpu_name() -> str:
    """Return the CPU model from ``/proc/cpuinfo`` (or ``platform.processor()``)."""
    try:
        for line in Path('/proc/cpuinfo').read_text().splitlines():
            if line.startswith('model name'):
                return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
