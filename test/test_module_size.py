"""Small single-purpose modules: no module of the runtime package over MAX_LINES lines."""

from pathlib import Path

import oxygen_ros

MAX_LINES = 450
"""Longest runtime module, in lines (``docs/design.md#how-it-works``: one concept each)."""

PACKAGE = Path(oxygen_ros.__file__).parent
EXEMPT = PACKAGE / 'tools'
"""Command-line tools (benchmarks, GPU sessions, fetchers) are outside the runtime."""


def runtime_modules() -> list[Path]:
    """Return every .py file of the package outside tools/."""
    return sorted(p for p in PACKAGE.rglob('*.py') if EXEMPT not in p.parents)


def test_runtime_modules_stay_small():
    sizes = {p.relative_to(PACKAGE.parent): len(p.read_text().splitlines())
             for p in runtime_modules()}
    assert len(sizes) > 100     # the walk found the package, not an empty folder
    over = {str(p): n for p, n in sizes.items() if n > MAX_LINES}
    assert over == {}, f'modules over {MAX_LINES} lines (split them by concept): {over}'
