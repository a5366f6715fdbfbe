"""``oxygen_bench engine`` run inside a GPU session phase: its JSON read back, or the error."""

from __future__ import annotations

import json
from typing import Callable


def run_engine_bench(ctx, argv: list[str], *,
                     on_warm: Callable[[dict], None] | None = None) -> dict | None:
    """
    Run ``oxygen_bench engine`` with ``argv`` in this process; return its JSON result.

    The options are saved under ``argv`` first; the bench writes its JSON beside the phase's
    file, which is read and removed.

    :param ctx: the phase's ``gpu_phases.PhaseContext``.
    :param on_warm: called with the warm-up's summary the moment the engines are warm.
    :returns: the result, or None (then ``error`` is saved: the exit code).
    """
    from oxygen_ros.tools.bench.engine import main as bench_main

    out = ctx.path.with_name(ctx.path.stem + '_run.json.tmp')
    argv = [*argv, '--no-progress', '--json', str(out)]
    ctx.save('argv', argv)
    rc = bench_main(argv, on_warm=on_warm)
    if rc != 0 or not out.is_file():
        ctx.save('error', f'oxygen_bench engine exit code {rc}')
        return None
    result = json.loads(out.read_text())
    out.unlink()
    return result


__all__ = ['run_engine_bench']
