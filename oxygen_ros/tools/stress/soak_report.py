"""
The verdict and the plot of an ``oxygen_stress soak`` run (``soak.py`` measures, this judges).

Input is the result dict ``soak.run_soak`` builds: ``samples`` (one per ``sample_every``:
``t_s`` seconds since the load started, ``rss``/``uss`` bytes, ``num_fds``, ``num_threads``,
``kv_used`` blocks, ``chunk_rate_hz``, the node's memory section in MiB), ``bursts`` (each
one's ``start_s``, ``end_s``, ``stall_end_s``), the KV baseline and drain figures, the
thresholds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
import statistics

import numpy as np

_MIB = float(1 << 20)
_WINDOW_S = 60.0
"""Window of the memory medians and of the action-rate check."""
SETTLE_S = 40.0
"""Seconds after a burst's end before its after-window starts: its requests drain and the node
gives the free memory back (``ros/heap.py``: trims 5 to 30 s apart)."""
FLAT, HIGH_WATER, LEAK, GREW = 'flat', 'high-water mark', 'leak', 'grew'
"""What the bursts show (``memory_kind``): none grew RSS beyond ``max_burst_growth``; the
first did and the later ones did not (reached and held); the last did too (memory follows
every burst: a failure); the only one did (one burst cannot tell a high-water mark from a
leak: not a failure by itself, the limit after warm-up still holds)."""


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
    memory_kind: str = FLAT
    """What the bursts show: ``FLAT``, ``HIGH_WATER``, ``LEAK`` or ``GREW`` (none: ``FLAT``)."""
    bursts: tuple[dict, ...] = ()
    """Each burst as ``soak.run_soak`` logged it, with ``rss_before_mib`` (median of the
    minute before it), ``rss_after_mib`` (of the minute from ``SETTLE_S`` after its end on)
    and ``growth`` (None: no sample in a window)."""
    rss_growth_since_first_burst: float | None = None
    """Median of the last minute against ``rss_after_mib`` of the first burst."""

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
            *(f"burst {i} at {b['start_s']:.0f} s ({b['asked']} questions, camera stalled "
              f"{b['stall_end_s'] - b['start_s']:g} s, longest chunk gap "
              f"{b['longest_chunk_gap_s']:.2f} s, peak KV {b['peak_kv_used']}, decode batch "
              f"{b['peak_decode_batch']}): RSS {_mib(b['rss_before_mib'])} -> "
              f"{_mib(b['rss_after_mib'])} MiB ({_percent(b['growth'])}, limit "
              f"{100 * result['max_burst_growth']:g} % for the last)"
              for i, b in enumerate(self.bursts, 1)),
            *([f'memory after the bursts: {self.memory_kind}' + (
                ' (one burst cannot tell a high-water mark from a leak: --bursts 2 can)'
                if self.memory_kind == GREW else '')] if self.bursts else []),
            'PASSED' if self.passed else 'FAILED: ' + '; '.join(self.failures)]
        return '\n'.join(lines)


def _mib(value: float | None) -> str:
    return 'n/a' if value is None else f'{value:.1f}'


def _percent(value: float | None) -> str:
    return 'n/a' if value is None else f'{100 * value:+.2f} %'


def _median_mib(samples: list[dict], lo: float, hi: float) -> float | None:
    rss = [s['rss'] / _MIB for s in samples if lo <= s['t_s'] < hi]
    return statistics.median(rss) if rss else None


def judge_bursts(result: dict) -> tuple[list[dict], str]:
    """
    Return each burst with its RSS before and after (``Verdict.bursts``) and what they show.

    The minute before a burst (after warm-up where it can be), the minute from ``SETTLE_S``
    after its end on (cut at the next burst and at the run's end).
    """
    samples, warm, span = result['samples'], result['warmup_s'], result['minutes'] * 60.0
    bursts = result.get('bursts', [])
    judged = []
    for i, b in enumerate(bursts):
        start, after = b['start_s'], b['end_s'] + SETTLE_S
        stop = min(after + _WINDOW_S, bursts[i + 1]['start_s'] if i + 1 < len(bursts) else span)
        before = _median_mib(samples, max(warm, start - _WINDOW_S), start)
        if before is None:
            before = _median_mib(samples, start - _WINDOW_S, start)
        after_mib = _median_mib(samples, after, stop)
        growth = after_mib / before - 1.0 if before and after_mib else None
        judged.append({**b, 'rss_before_mib': before, 'rss_after_mib': after_mib,
                       'growth': growth})
    limit = result.get('max_burst_growth', 0.01)
    grew = [b['growth'] is None or b['growth'] > limit for b in judged]
    if not any(grew):
        kind = FLAT
    elif grew[-1]:
        kind = LEAK if len(grew) > 1 else GREW
    else:
        kind = HIGH_WATER
    return judged, kind


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
    bursts, kind = judge_bursts(result)
    held = float(rss_end / bursts[0]['rss_after_mib'] - 1.0) \
        if bursts and bursts[0]['rss_after_mib'] else None
    limit = result.get('max_burst_growth', 0.01)
    if kind == LEAK:
        b = bursts[-1]
        failures.append(f"RSS grew {_percent(b['growth'])} after burst {len(bursts)} (limit "
                        f'{100 * limit:g} %): {kind}')
    if growth > result['max_rss_growth'] and not (
            kind == HIGH_WATER and held is not None and held <= result['max_rss_growth']):
        failures.append(f'RSS grew {100 * growth:.2f} % after warm-up '
                        f'(limit {100 * result["max_rss_growth"]:g} %)')
    stalls = [(b['start_s'], b['stall_end_s']) for b in bursts]
    chunks = np.asarray(chunk_times_s, dtype=np.float64)

    def acting_rate(lo: float, hi: float) -> float:
        stalled = sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in stalls)
        return np.count_nonzero((chunks >= lo) & (chunks < hi)) / max(hi - lo - stalled, 1e-9)
    rate = acting_rate(warm, span)
    minutes = []
    start = warm
    while start + _WINDOW_S <= span + 1e-6:
        minutes.append(acting_rate(start, start + _WINDOW_S))
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
        fds=(min(fds), max(fds)), threads=(min(threads), max(threads)), kv_ok=kv_ok,
        memory_kind=kind, bursts=tuple(bursts), rss_growth_since_first_burst=held)


def plot(result: dict, path: Path) -> None:
    """
    Write the figure of a run: memory, malloc, action rate, KV blocks, fds/threads.

    The warm-up is shaded grey, each burst orange (its camera stall darker).
    """
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt
    samples = result['samples']
    t = np.array([s['t_s'] for s in samples]) / 60.0
    fig, axes = plt.subplots(5, 1, figsize=(9, 12), sharex=True)
    warm = result['warmup_s'] / 60.0
    for ax in axes:
        first = ax is axes[0]
        ax.axvspan(0, warm, color='0.9', label='warm-up' if first else None)
        for i, b in enumerate(result.get('bursts', [])):
            ax.axvspan(b['start_s'] / 60, b['end_s'] / 60, color='tab:orange', alpha=0.25,
                       label='burst' if first and not i else None)
            ax.axvspan(b['start_s'] / 60, b['stall_end_s'] / 60, color='tab:orange',
                       alpha=0.5, label='camera stalled' if first and not i else None)
        ax.grid(alpha=0.3)
    axes[0].plot(t, [s['rss'] / _MIB for s in samples], label='RSS')
    axes[0].plot(t, [s['uss'] / _MIB for s in samples], label='USS')
    v = result['verdict']
    axes[0].set_ylabel('MiB')
    axes[0].set_title(f"oxygen_stress soak {result['date']} ({result['preset']}): RSS "
                      f"{100 * v['rss_growth']:+.2f} % after warm-up, slope "
                      f"{v['rss_slope_mib_per_h']:+.1f} MiB/h"
                      + (f"; bursts: {v.get('memory_kind')}" if v.get('bursts') else '')
                      + f"; {'PASSED' if v['passed'] else 'FAILED'}", fontsize=9)
    axes[0].legend(fontsize=8)
    for key, label in (('malloc_in_use', 'malloc in use'), ('malloc_free', 'malloc free'),
                       ('malloc_mmapped', 'mmapped blocks')):
        axes[1].plot(t, [s.get(key) or np.nan for s in samples], label=label)
    trims = np.array([s.get('malloc_trims') or 0 for s in samples])
    for j, i in enumerate(np.flatnonzero(np.diff(trims) > 0) + 1):
        axes[1].axvline(t[i], color='k', lw=0.5, ls=':', label=None if j else 'malloc_trim')
    axes[1].set_ylabel('MiB (node)')
    axes[1].legend(fontsize=8)
    axes[2].plot(t, [s['chunk_rate_hz'] for s in samples], label='action chunks/s')
    axes[2].axhline(result['target_hz'], color='k', lw=0.8, label='target')
    axes[2].axhline(result['min_rate_fraction'] * result['target_hz'], color='r', lw=0.8,
                    ls='--', label=f'{100 * result["min_rate_fraction"]:g} %')
    axes[2].set_ylabel('Hz')
    axes[2].legend(fontsize=8)
    axes[3].plot(t, [s['kv_used'] or 0 for s in samples], label='KV blocks used')
    axes[3].axhline(result['kv_baseline'], color='k', lw=0.8, label='baseline')
    axes[3].set_ylabel('blocks')
    axes[3].legend(fontsize=8)
    axes[4].plot(t, [s['num_fds'] for s in samples], label='open fds')
    axes[4].plot(t, [s['num_threads'] for s in samples], label='threads')
    axes[4].set_xlabel('minutes since the load started')
    axes[4].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


__all__ = ['FLAT', 'GREW', 'HIGH_WATER', 'LEAK', 'SETTLE_S', 'Verdict', 'judge_bursts', 'plot',
           'verdict']
