"""``oxygen_stress soak``'s verdict on made-up runs: each burst judged on its own, named."""

from oxygen_ros.tools.stress.soak import burst_starts
from oxygen_ros.tools.stress.soak_report import (
    FLAT, GREW, HIGH_WATER, judge_bursts, LEAK, SETTLE_S, verdict)
import pytest

MIB = 1 << 20
MINUTES = 12.0
"""Warm-up 144 s; bursts at 240 and 480 s."""


def run(steps_mib, bursts=2, noise_mib=0.0):
    """
    Return a result dict: RSS 500 MiB, ``steps_mib[i]`` more from the end of burst ``i`` on.

    Every 5 s a sample; chunks at 10 Hz except while the camera stalls (2 s of each burst).
    """
    starts = burst_starts(MINUTES, bursts)
    log = [{'start_s': t, 'end_s': t + 10.0, 'stall_end_s': t + 2.0, 'asked': 100,
            'longest_chunk_gap_s': 1.7, 'peak_kv_used': 112, 'peak_decode_batch': 8}
           for t in starts]
    samples = []
    for i in range(1, int(MINUTES * 12) + 1):
        t = 5.0 * i
        rss = 500 + sum(s for b, s in zip(log, steps_mib) if t >= b['end_s']) + \
            noise_mib * (-1) ** i
        samples.append({'t_s': t, 'rss': rss * MIB, 'uss': rss * MIB, 'num_fds': 18,
                        'num_threads': 22, 'kv_used': 10})
    stalled = [(b['start_s'], b['stall_end_s']) for b in log]
    chunks = [k / 10 for k in range(int(MINUTES * 600))
              if not any(a <= k / 10 < e for a, e in stalled)]
    result = {'samples': samples, 'warmup_s': 144.0, 'minutes': MINUTES, 'bursts': log,
              'max_rss_growth': 0.05, 'max_burst_growth': 0.01, 'min_rate_fraction': 0.95,
              'target_hz': 10.0, 'drained': True, 'kv_after_drain': 0, 'kv_baseline': 0,
              'asked': 1, 'answered': 1}
    return result, chunks


@pytest.mark.parametrize('steps, kind, passed', [
    ((0.0, 0.0), FLAT, True),
    ((2.0, 2.0), FLAT, True),             # +0.4 % each: within the 1 % a burst may leave
    ((40.0, 0.0), HIGH_WATER, True),      # +8 % once, then held: bounded
    ((40.0, 40.0), LEAK, False),          # every burst adds
    ((0.0, 20.0), LEAK, False),           # the last burst grew: that is what counts
])
def test_two_bursts_tell_a_high_water_mark_from_a_leak(steps, kind, passed):
    result, chunks = run(steps)
    v = verdict(result, chunks)
    assert v.memory_kind == kind and v.passed is passed, v.failures
    assert [round(b['growth'], 4) for b in v.bursts] == \
        [round(s / (500 + sum(steps[:i])), 4) for i, s in enumerate(steps)]
    if kind == HIGH_WATER:
        assert v.rss_growth > 0.05 and v.rss_growth_since_first_burst == 0.0
    if kind == LEAK:
        assert any('after burst 2' in f and 'leak' in f for f in v.failures)


def test_one_burst_that_grew_cannot_tell_and_the_limit_after_warm_up_decides():
    result, chunks = run((20.0,), bursts=1)
    v = verdict(result, chunks)
    assert v.memory_kind == GREW and v.passed and v.bursts[0]['growth'] == pytest.approx(0.04)
    result, chunks = run((30.0,), bursts=1)
    v = verdict(result, chunks)
    assert v.memory_kind == GREW and not v.passed
    assert v.failures == ('RSS grew 6.00 % after warm-up (limit 5 %)',)


def test_the_windows_around_a_burst():
    result, _ = run((10.0, 0.0), noise_mib=1.0)
    bursts, kind = judge_bursts(result)
    first = bursts[0]
    assert kind == HIGH_WATER
    assert first['rss_before_mib'] == 500.0 and first['rss_after_mib'] == 510.0  # medians
    assert SETTLE_S >= 10.0  # after-windows start once the burst's requests are done


def test_the_stalls_do_not_count_against_the_action_rate():
    result, chunks = run((0.0, 0.0))
    v = verdict(result, chunks)
    assert v.passed and v.min_minute_rate_hz == pytest.approx(10.0, abs=0.02)
    worse = [t for t in chunks if not 300.0 <= t < 304.0]  # a 4 s gap outside any stall
    v = verdict(result, worse)
    assert not v.passed and 'action rate 9.33 Hz' in v.failures[0]
