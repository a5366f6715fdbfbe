"""
``oxygen_stress soak --minutes 3 --bursts 1`` (CI's soak): steady questions, one burst, all checks.

Exit 0 means: RSS grew <= 5 % after the 60 s warm-up, the KV blocks in use returned to the
actions-only baseline after the questions drained, and every minute after warm-up had >= 95 %
of the 10 Hz action rate, the camera's stall left out. The burst must have happened as asked
(10 questions/s for 10 s, the camera stalled 2 s: the node refused its stale frames and
published no chunk for most of it, the decode batch full) and be judged on the samples around
it: ``flat`` within 1 %, else ``grew`` (one burst cannot tell a high-water mark from a leak;
the 60-minute soak's two bursts can: docs/robustness.md#soak).
"""

import json
import statistics
import subprocess
import sys

from oxygen_ros.tools.stress.soak_report import SETTLE_S
import pytest

pytestmark = [pytest.mark.ros, pytest.mark.slow]
MINUTES = 3
MAX_RUNNING = 8
"""``max_running_requests`` of config/test.yaml."""


def test_three_minute_soak_with_a_burst_passes_its_thresholds(ros_env, ros_domain_id, tmp_path):
    out = tmp_path / 'soak'
    proc = subprocess.run(
        [sys.executable, '-m', 'oxygen_ros.tools.stress.soak', '--minutes', str(MINUTES),
         '--preset', 'tiny', '--bursts', '1', '--domain-id', str(ros_domain_id),
         '--out', str(out)],
        env=ros_env, capture_output=True, text=True, timeout=MINUTES * 60 + 240)
    report = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    result = json.loads((out / 'soak.json').read_text())
    verdict = result['verdict']
    assert verdict['passed'] and verdict['failures'] == [], report
    assert verdict['rss_growth'] <= 0.05 and verdict['kv_ok'], report
    assert verdict['min_minute_rate_hz'] >= 0.95 * 10.0, report
    assert len(result['samples']) >= MINUTES * 60 / 5 - 2  # every 5 s
    assert result['asked'] >= MINUTES * 60 * 2 + 80 and result['answered'] == result['asked']
    assert result['kv_after_drain'] <= result['kv_baseline']
    assert max(s['kv_used'] for s in result['samples']) > result['kv_baseline'], \
        'the questions never held KV blocks: the load did not reach the KV cache'
    # the node's own memory figures, every sample (/diagnostics)
    assert all(s['node_rss'] > 100 and s['malloc_in_use'] > 10 and s['malloc_free'] is not None
               for s in result['samples']), report

    (burst,) = verdict['bursts']
    assert burst['start_s'] == MINUTES * 60 / 2 and burst['end_s'] - burst['start_s'] == 10.0
    assert burst['asked'] >= 95, 'the burst asked fewer questions than 10/s for 10 s'
    assert burst['stale_rejections'] > 0, 'the camera never stalled: no stale input refused'
    assert 2.0 - 0.5 - 0.4 < burst['longest_chunk_gap_s'] < 4.0, \
        'a 2 s stall with max_observation_age 0.5 s leaves a chunk gap of about 1.5 s'
    assert burst['peak_decode_batch'] == MAX_RUNNING, 'the burst never filled the batch'
    before = median_rss(result, 60.0, 90.0)  # the minute before it, after warm-up
    after = median_rss(result, 100.0 + SETTLE_S, MINUTES * 60.0)
    assert (burst['rss_before_mib'], burst['rss_after_mib']) == (before, after)
    assert burst['growth'] == pytest.approx(after / before - 1) and burst['growth'] <= 0.05
    assert verdict['memory_kind'] == ('flat' if burst['growth'] <= 0.01 else 'grew'), report
    assert f"memory after the bursts: {verdict['memory_kind']}" in proc.stdout
    assert (out / 'soak.png').stat().st_size > 10_000 and 'PASSED' in proc.stdout


def median_rss(result, lo, hi):
    return statistics.median(s['rss'] / (1 << 20) for s in result['samples']
                             if lo <= s['t_s'] < hi)
