"""
What ``oxygen_doctor`` found: one :class:`Finding` per fact, its level and the fix, rendered.

Levels, as ``ros2 doctor`` reports warnings and errors: ``OK`` and ``INFO`` are facts, ``WARN``
is a fact that costs the robot something while the node still runs as configured (a step falls
back to eager kernels, camera frames are lost, the clocks are not locked), ``ERROR`` is one the
configured node cannot run with (no CUDA device for ``device: cuda``, a missing checkpoint).
The exit status is 1 when any finding is an ERROR.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
import enum
from typing import Sequence


class Level(enum.IntEnum):
    """How much a finding matters (ordered)."""

    OK = 0
    INFO = 1
    WARN = 2
    ERROR = 3
    """The node cannot run as configured."""


@dataclass(frozen=True, slots=True)
class Finding:
    """
    One fact of the machine or the configuration.

    :ivar check: the check's name (``torch``, ``cuda``, ``dds security``, ...).
    :ivar level: see :class:`Level`.
    :ivar summary: what was found, with the numbers.
    :ivar fix: what to do about it ('' when nothing is to be done).
    """

    check: str
    level: Level
    summary: str
    fix: str = ''

    def as_dict(self) -> dict[str, str]:
        """Return the finding as JSON-ready strings (``level`` by name)."""
        out = asdict(self)
        out['level'] = self.level.name
        return out


def exit_status(findings: Sequence[Finding]) -> int:
    """Return 1 when any finding is an ERROR (the node cannot run as configured), else 0."""
    return int(any(f.level is Level.ERROR for f in findings))


def verdict(findings: Sequence[Finding]) -> str:
    """Return the closing line: counts per level and whether the node can run as configured."""
    counts = ', '.join(f'{sum(f.level is level for f in findings)} {level.name}'
                       for level in Level)
    errors = [f.check for f in findings if f.level is Level.ERROR]
    if errors:
        return (f'{len(findings)} findings ({counts}): the node CANNOT run as configured '
                f'({", ".join(dict.fromkeys(errors))})')
    return f'{len(findings)} findings ({counts}): the node can run as configured'


def render(findings: Sequence[Finding], width: int = 14) -> str:
    """Return the report: one line per finding (``LEVEL check  summary``), its fix below."""
    lines = []
    for f in findings:
        lines.append(f'{f.level.name:<5} {f.check:<{width}} {f.summary}')
        if f.fix:
            lines.append(f'{"":<5} {"":<{width}} fix: {f.fix}')
    lines.append(verdict(findings))
    return '\n'.join(lines)


__all__ = ['Finding', 'Level', 'exit_status', 'render', 'verdict']
