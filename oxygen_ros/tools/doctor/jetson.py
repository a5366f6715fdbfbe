"""
``oxygen_doctor``'s Jetson check: the power mode (``nvpmodel``) and the clocks (``jetson_clocks``).

A Jetson runs at the power mode ``nvpmodel -q`` reports (``NV Power Mode: <name>`` and its
number); the published Thor timings are taken at MAXN, mode 0 on Jetson AGX Thor, with the
clocks locked at their maximum by ``jetson_clocks`` (FlashRT's Thor guide: ``sudo nvpmodel -m 0
&& sudo jetson_clocks``). ``jetson_clocks --show`` prints each engine's ``MinFreq``,
``MaxFreq`` and ``CurrentFreq``: locked clocks have the GPU's minimum at its maximum.
"""

from __future__ import annotations

from pathlib import Path
import re
import subprocess
from typing import Callable

from oxygen_ros.tools.doctor.findings import Finding, Level

MAXN_FIX = 'sudo nvpmodel -m 0 (MAXN on Jetson AGX Thor) && sudo jetson_clocks'
Runner = Callable[[list[str]], str]


def jetson_model(root: Path = Path('/')) -> str | None:
    """Return the board's model (``/proc/device-tree/model``) on a Jetson (L4T), else None."""
    model = root / 'proc' / 'device-tree' / 'model'
    l4t = (root / 'etc' / 'nv_tegra_release').is_file()
    try:
        name = model.read_bytes().rstrip(b'\0').decode(errors='replace').strip()
    except OSError:
        name = ''
    if l4t or 'jetson' in name.lower():
        return name or 'a Jetson (L4T)'
    return None


def parse_nvpmodel(text: str) -> tuple[str, int | None] | None:
    """Return ``(mode name, mode number)`` from ``nvpmodel -q``'s output, or None."""
    m = re.search(r'NV Power Mode:[ \t]*(\S+)[ \t]*(?:\r?\n[ \t]*(\d+))?', text)
    if m is None:
        return None
    return m[1], int(m[2]) if m[2] else None


def parse_gpu_clocks(text: str) -> tuple[int, int, int] | None:
    """Return the GPU's ``(MinFreq, MaxFreq, CurrentFreq)`` from ``jetson_clocks --show``."""
    m = re.search(r'^GPU\b.*?MinFreq=(\d+)\s+MaxFreq=(\d+)\s+CurrentFreq=(\d+)', text, re.M)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    if proc.returncode:
        raise OSError(proc.stderr.strip() or f'{cmd[0]} exited {proc.returncode}')
    return proc.stdout


def check_jetson_power(root: Path = Path('/'), run: Runner = _run) -> Finding:
    """Return the Jetson's power mode and whether its GPU clock is locked at its maximum."""
    model = jetson_model(root)
    if model is None:
        return Finding('jetson power', Level.INFO, 'not a Jetson (no /etc/nv_tegra_release): '
                       'nvpmodel and jetson_clocks do not apply')
    try:
        mode = parse_nvpmodel(run(['nvpmodel', '-q']))
    except (OSError, subprocess.SubprocessError) as exc:
        return Finding('jetson power', Level.WARN, f'{model}: nvpmodel -q failed ({exc})',
                       MAXN_FIX)
    try:
        clocks = parse_gpu_clocks(run(['jetson_clocks', '--show']))
    except (OSError, subprocess.SubprocessError) as exc:
        clocks, why = None, f'jetson_clocks --show failed ({exc}; it may need sudo)'
    else:
        why = 'jetson_clocks --show has no GPU line'
    name = f'power mode {mode[0]}' + (f' ({mode[1]})' if mode and mode[1] is not None else '') \
        if mode else 'power mode unknown'
    state = (f'GPU clock {clocks[2] / 1e6:.0f} MHz, range {clocks[0] / 1e6:.0f}-'
             f'{clocks[1] / 1e6:.0f} MHz' if clocks else why)
    locked = clocks is not None and clocks[0] == clocks[1]
    if mode is None or 'MAXN' not in mode[0].upper() or not locked:
        return Finding('jetson power', Level.WARN, f'{model}: {name}; {state}'
                       + ('' if locked else ' (clocks not locked)'), MAXN_FIX)
    return Finding('jetson power', Level.OK, f'{model}: {name}; {state} (locked)')


__all__ = ['MAXN_FIX', 'check_jetson_power', 'jetson_model', 'parse_gpu_clocks',
           'parse_nvpmodel']
