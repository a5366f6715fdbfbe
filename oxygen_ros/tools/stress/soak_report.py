"""
The verdict and the plot of an ``oxygen_stress soak`` run (``soak.py`` measures, this judges).

Input is the result dict ``soak.run_soak`` builds: ``samples`` (one per ``sample_every``:
``t_s`` seconds since the load started, ``rss``/``uss`` bytes, ``num_fds``, ``num_threads``,
``kv_used`` blocks, ``chunk_rate_hz``), the KV baseline and drain figures, the thresholds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
import statistics

import numpy as np

_MIB = float(1 << 20)
_WINDOW_S = 60.0
"""Window of the memory medians and of the action-rate check."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What an ``oxygen_stress soak`` run showed; ``failures`` lists every failed check."""

    passed: bool
    failures: tuple[str, ...]
    rss_warm_mib: float
    """Median RSS of the first minute after warm-up."""
    rss_end_mib: float
    """Median RSS of the last minute."""
    rss_growth: float
    """``rss_end / rss_warm - 1``."""
    rss_slope_mib_per_h: float
    """Least-squares slope of RSS over the post-warm-up samples."""
    uss_slope_mib_per_h: float
    rate_hz: float
    """Action chunks per second over the whole post-warm-up span."""
    min_minute_rate_hz: float
    """The slowest full minute after warm-up."""
    fds: tuple[int, int]
    """Min and max open file descriptors after warm-up."""
    threads: tuple[int, int]
    kv_ok: bool

    def as_dict(self) -> dict:
        return asdict(self)

    def summary(self, result: dict) -> str:
        """Return the printed report of a run."""
        lines = [
            f"oxygen_stress soak {result['date']}, {result['host']}, {result['cpu']}, preset "
            f"{result['preset']}, {result['minutes']:g} min, warm-up {result['warmup_s']:g} s, "
            f"{result['questions_per_s']:g} questions/s",
            f'RSS {self.rss_warm_mib:.1f} -> {self.rss_end_mib:.1f} MiB '
            f'({100 * self.rss_growth:+.2f} %, limit {100 * result["max_rss_growth"]:g} %); '
            f'slope RSS {self.rss_slope_mib_per_h:+.2f} MiB/h, USS '
            f'{self.uss_slope_mib_per_h:+.2f} MiB/h',
            f'action rate {self.rate_hz:.3f} Hz, slowest minute {self.min_minute_rate_hz:.3f} Hz '
            f'(target {result["target_hz"]:g} Hz, limit '
            f'{100 * result["min_rate_fraction"]:g} %)',
            f"KV blocks: baseline {result['kv_baseline']}, after drain "
            f"{result['kv_after_drain']} of {result['kv_capacity']} ({result['drain_s']:.1f} s)"
            f"; questions {result['asked']} asked, {result['answered']} answered "
            f"({result['refused']} refused)",
            f'fds {self.fds[0]}..{self.fds[1]}, threads {self.threads[0]}..{self.threads[1]} '
            f'after warm-up',
            'PASSED' if self.passed else 'FAILED: ' + '; '.join(self.failures)]
        return '\n'.join(lines)


def _slope_per_h(t_s: np.ndarray, values_mib: np.ndarray) -> float:
    if t_s.size < 2 or np.ptp(t_s) == 0:
        return 0.0
    return float(np.polyfit(t_s / 3600.0, values_mib, 1)[0])


def verdict(result: dict, chunk_times_s: list[float]) -> Verdict:
    """
    Judge a run.

    :param result: see the module docstring.
    :param chunk_times_s: receive time of every action chunk, seconds since the load started.
    """
    warm = result['warmup_s']
    span = result['minutes'] * 60.0
    post = [s for s in result['samples'] if s['t_s'] >= warm]
    failures = []
    if len(post) < 2:
        failures.append(f'only {len(post)} samples after the {warm:g} s warm-up: run longer')
        post = result['samples'][-2:] or [{'t_s': 0.0, 'rss': 0, 'uss': 0, 'num_fds': 0,
                                          'num_threads': 0}]
    t = np.array([s['t_s'] for s in post])
    rss = np.array([s['rss'] for s in post]) / _MIB
    uss = np.array([s['uss'] for s in post]) / _MIB
    end_t = float(t[-1])
    first = rss[t < t[0] + _WINDOW_S]
    last = rss[t >= end_t - _WINDOW_S]
    rss_warm, rss_end = statistics.median(first), statistics.median(last)
    growth = rss_end / rss_warm - 1.0 if rss_warm else 0.0
    if growth > result['max_rss_growth']:
        failures.append(f'RSS grew {100 * growth:.2f} % after warm-up '
                        f'(limit {100 * result["max_rss_growth"]:g} %)')
    chunks = np.asarray(chunk_times_s, dtype=np.float64)
    rate = np.count_nonzero((chunks >= warm) & (chunks < span)) / max(span - warm, 1e-9)
    minutes = []
    start = warm
    while start + _WINDOW_S <= span + 1e-6:
        minutes.append(np.count_nonzero((chunks >= start) & (chunks < start + _WINDOW_S))
                       / _WINDOW_S)
        start += _WINDOW_S
    minutes = minutes or [rate]  # shorter than warm-up + 1 minute: the whole post-warm-up span
    floor = result['min_rate_fraction'] * result['target_hz']
    if min(minutes) < floor:
        failures.append(f'action rate {min(minutes):.2f} Hz in a minute after warm-up, below '
                        f'{100 * result["min_rate_fraction"]:g} % of {result["target_hz"]:g} Hz')
    kv_ok = bool(result['drained']) and result['kv_after_drain'] is not None and \
        result['kv_after_drain'] <= result['kv_baseline']
    if not kv_ok:
        failures.append(f'KV blocks in use {result["kv_after_drain"]} did not return to the '
                        f'baseline {result["kv_baseline"]} within the drain time '
                        f'({result["answered"]}/{result["asked"]} questions answered)')
    fds = [s['num_fds'] for s in post]
    threads = [s['num_threads'] for s in post]
    return Verdict(
        passed=not failures, failures=tuple(failures), rss_warm_mib=float(rss_warm),
        rss_end_mib=float(rss_end), rss_growth=float(growth),
        rss_slope_mib_per_h=_slope_per_h(t, rss), uss_slope_mib_per_h=_slope_per_h(t, uss),
        rate_hz=float(rate), min_minute_rate_hz=float(min(minutes)),
        fds=(min(fds), max(fds)), threads=(min(threads), max(threads)), kv_ok=kv_ok)


def plot(result: dict, path: Path) -> None:
    """Write the four-panel figure of a run: memory, action rate, KV blocks, fds/threads."""
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt
    samples = result['samples']
    t = np.array([s['t_s'] for s in samples]) / 60.0
    fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    warm = result['warmup_s'] / 60.0
    for ax in axes:
        ax.axvspan(0, warm, color='0.9', label='warm-up' if ax is axes[0] else None)
        ax.grid(alpha=0.3)
    axes[0].plot(t, [s['rss'] / _MIB for s in samples], label='RSS')
    axes[0].plot(t, [s['uss'] / _MIB for s in samples], label='USS')
    v = result['verdict']
    axes[0].set_ylabel('MiB')
    axes[0].set_title(f"oxygen_stress soak {result['date']} ({result['preset']}): RSS "
                      f"{100 * v['rss_growth']:+.2f} % after warm-up, slope "
                      f"{v['rss_slope_mib_per_h']:+.1f} MiB/h; "
                      f"{'PASSED' if v['passed'] else 'FAILED'}", fontsize=9)
    axes[0].legend(fontsize=8)
    axes[1].plot(t, [s['chunk_rate_hz'] for s in samples], label='action chunks/s')
    axes[1].axhline(result['target_hz'], color='k', lw=0.8, label='target')
    axes[1].axhline(result['min_rate_fraction'] * result['target_hz'], color='r', lw=0.8,
                    ls='--', label=f'{100 * result["min_rate_fraction"]:g} %')
    axes[1].set_ylabel('Hz')
    axes[1].legend(fontsize=8)
    axes[2].plot(t, [s['kv_used'] or 0 for s in samples], label='KV blocks used')
    axes[2].axhline(result['kv_baseline'], color='k', lw=0.8, label='baseline')
    axes[2].set_ylabel('blocks')
    axes[2].legend(fontsize=8)
    axes[3].plot(t, [s['num_fds'] for s in samples], label='open fds')
    axes[3].plot(t, [s['num_threads'] for s in samples], label='threads')
    axes[3].set_xlabel('minutes since the load started')
    axes[3].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


__all__ = ['Verdict', 'plot', 'verdict']
