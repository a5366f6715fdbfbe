"""
The GPU session's ``robots`` phase: several robots on one fast path, against the GPU target.

``oxygen_bench engine --robots 1 2 4`` (``robots.py``) on the fast path warmed up with
``max_robots`` 4 (its robot-batch graphs: ``backends/fast_path/buckets.py``), the paper
workload per robot. Beside the bench's own figures (each N batched against one after another,
the ideal from the run's component times) it holds the GPU target of several robots:
at N = 4 the aggregate chunk rate is at least ``TARGET_AGGREGATE`` times one robot's and each
robot's action latency (p50) at most ``TARGET_LATENCY`` times one robot's
(``docs/benchmarks.md#several-robots-on-one-engine-oxygen_bench-engine---robots``). Failed on
a fallback, a dropped feature or outputs that differ; a target missed is a figure, not a
failure of the phase (``gpu_target.passed``).
"""

from __future__ import annotations


ROBOTS = (1, 2, 4)
"""The robot counts the phase serves."""
MAX_RUNNING = 32
"""Decode batch limit: the paper workload's ~6 rows per robot for 4 robots, with room."""
TARGET_AGGREGATE = 3.0
"""At N = 4: aggregate chunks/s at least this times one robot's."""
TARGET_LATENCY = 1.5
"""At N = 4: a robot's action latency (p50) at most this times one robot's."""


def gpu_target(runs: list[dict]) -> dict:
    """
    Return the GPU target of the largest N against N = 1, from the bench's batched runs.

    :param runs: ``oxygen_bench engine --robots``'s ``runs`` (one per N, N = 1 among them).
    :raises ValueError: no run of one robot.
    """
    by_n = {run['robots']: run['batched'] for run in runs}
    if 1 not in by_n:
        raise ValueError('the GPU target needs a run of one robot')
    n = max(by_n)
    one, many = by_n[1], by_n[n]
    aggregate = many['chunks_per_s'] / one['chunks_per_s']
    latency = many['action_latency_ms_p50'] / one['action_latency_ms_p50']
    return {'robots': n, 'aggregate_vs_one': aggregate, 'latency_p50_vs_one': latency,
            'latency_p99_vs_one': many['action_latency_ms_p99'] / one['action_latency_ms_p99'],
            'target_aggregate': TARGET_AGGREGATE, 'target_latency': TARGET_LATENCY,
            'passed': aggregate >= TARGET_AGGREGATE and latency <= TARGET_LATENCY}


def several_robots(ctx, engine_args: list[str]) -> bool:
    """
    Run ``oxygen_bench engine --robots 1 2 4`` on the fast path; save it and the target.

    :param ctx: the phase's ``gpu_phases.PhaseContext``.
    :param engine_args: the bench's options (preset, dtype, device, cameras, shapes).
    """
    from oxygen_ros.tools.bench.bench_run import run_engine_bench

    argv = engine_args + ['--tokens-per-cycle', '5', '--text-every', '1',
                          '--frames', str(ctx.args.frames), '--compile',
                          ctx.args.compile_mode, '--robots', *map(str, ROBOTS),
                          '--max-running', str(MAX_RUNNING)]
    result = run_engine_bench(ctx, argv)
    if result is None:
        return True
    ctx.save('result', result)
    target = gpu_target(result['runs'])
    ctx.save('gpu_target', target)
    print(f"several robots: N = {target['robots']}: {target['aggregate_vs_one']:.2f}x one "
          f"robot's chunks/s (target >= {TARGET_AGGREGATE}), latency p50 "
          f"{target['latency_p50_vs_one']:.2f}x (target <= {TARGET_LATENCY}): "
          f"{'met' if target['passed'] else 'MISSED'}")
    return bool(result.get('fallbacks') or result.get('dropped')) or \
        not all(run['outputs_equal'] for run in result['runs'])


__all__ = ['MAX_RUNNING', 'ROBOTS', 'TARGET_AGGREGATE', 'TARGET_LATENCY', 'gpu_target',
           'several_robots']
