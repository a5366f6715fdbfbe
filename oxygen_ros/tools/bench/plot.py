"""Plots of ``oxygen_bench engine`` (matplotlib, headless): per-cycle timeline, several robots."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from oxygen_ros.engine import CycleStats

_PHASES = (('prefill', ('vision', 'prefill'), '#4c72b0'), ('denoise', ('denoise',), '#dd8452'),
           ('decode', ('seed', 'decode'), '#55a868'), ('idle / bookkeeping', (), '#c7c7c7'))


def plot_timeline(path: Path, cycles: Mapping[str, Sequence[CycleStats]],
                  all_cycles: Mapping[str, Sequence[CycleStats]],
                  result: Mapping[str, object]) -> None:
    """
    Draw each policy's measured cycles end to end on one time axis, split into phases.

    Each cycle is drawn as prefill (vision + prefill), denoise, decode (seed + decode) and the
    rest of its wall time (bookkeeping outside forward passes). A second panel shows the KV
    memory in use at the end of every cycle (warm-up and drain included) against the live
    text requests.
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, (ax, kv_ax) = plt.subplots(1, 2, figsize=(15, 1.6 + 0.9 * len(cycles)),
                                    gridspec_kw={'width_ratios': [4, 1]})
    for row, (name, stats) in enumerate(cycles.items()):
        t = 0.0
        spans: dict[str, list[tuple[float, float]]] = {p[0]: [] for p in _PHASES}
        for c in stats:
            used = 0.0
            for label, kinds, _ in _PHASES[:-1]:
                dt = sum(c.seconds_by_job.get(k, 0.0) for k in kinds)
                if dt > 0:
                    spans[label].append((t + used, dt))
                used += dt
            spans[_PHASES[-1][0]].append((t + used, max(c.total_s - used, 0.0)))
            t += c.total_s
        for label, _, color in _PHASES:
            ax.broken_barh(spans[label], (row - 0.4, 0.8), facecolors=color,
                           label=label if row == 0 else None, linewidth=0)
    ax.set_yticks(range(len(cycles)), list(cycles))
    ax.set_xlabel('time (s): measured frames, one after another')
    ax.set_title(f"{result['preset']}, {result['cameras']} cam, budget "
                 f"{result['decode_budget']}, k={result['tokens_per_cycle']}: speedup "
                 f"{result['speedup']:.2f} (ideal {result['ideal_speedup']:.2f})")
    ax.legend(loc='upper right', ncol=4, fontsize='small')
    for name, stats in all_cycles.items():
        kv_ax.scatter([c.num_running for c in stats], [c.kv_used_bytes / 2**20 for c in stats],
                      s=12, label=name)
    kv_ax.set_xlabel('live text requests')
    kv_ax.set_ylabel('KV in use (MiB)')
    kv_ax.set_title('KV memory', fontsize='medium')
    kv_ax.legend(fontsize='small')
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_robots(path: Path, result: Mapping[str, object]) -> None:
    """
    Draw ``oxygen_bench engine --robots``: chunk rate and action latency against N robots.

    Left: the aggregate chunks/s of the batched engine and of the robots served one after
    another, measured (solid) and the ideal from the run's component times (dashed). Right:
    each robot's action latency from its tick, p50 (markers) up to p99 (bars).
    """
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    runs = result['runs']
    counts = [run['robots'] for run in runs]
    fig, (rate_ax, lat_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for mode, color in (('batched', '#4c72b0'), ('one_after_another', '#dd8452')):
        label = mode.replace('_', ' ')
        rate_ax.plot(counts, [run[mode]['chunks_per_s'] for run in runs], 'o-', color=color,
                     label=f'{label}, measured')
        rate_ax.plot(counts, [run['ideal']['chunks_per_s'][mode] for run in runs], 's--',
                     color=color, alpha=0.6, label=f'{label}, ideal')
        p50 = [run[mode]['action_latency_ms_p50'] for run in runs]
        p99 = [run[mode]['action_latency_ms_p99'] for run in runs]
        shift = -0.06 if mode == 'batched' else 0.06
        lat_ax.errorbar([c + shift for c in counts], p50,
                        yerr=[[0] * len(p50), [b - a for a, b in zip(p50, p99)]], fmt='o-',
                        color=color, capsize=4, label=label)
    rate_ax.set_xlabel('robots served by one engine')
    rate_ax.set_ylabel('action chunks / s, all robots')
    rate_ax.set_xticks(counts)
    rate_ax.set_ylim(bottom=0)
    rate_ax.legend(fontsize='small')
    lat_ax.set_xlabel('robots served by one engine')
    lat_ax.set_ylabel('action latency from the tick (ms), p50 to p99')
    lat_ax.set_xticks(counts)
    lat_ax.set_ylim(bottom=0)
    lat_ax.legend(fontsize='small')
    machine = result['machine']['processor']
    fig.suptitle(f"{result['preset']}, {result['cameras']} cam, budget "
                 f"{result['decode_budget']}, k={result['tokens_per_cycle']}, "
                 f"{result['dtype']} on {result['device']} ({machine})", fontsize='medium')
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
