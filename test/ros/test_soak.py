"""
``oxygen_stress soak --minutes 3`` (CI's soak): the node under steady questions, every check on.

Exit 0 means: RSS grew <= 5 % after the 60 s warm-up, the KV blocks in use returned to the
actions-only baseline after the questions drained, and every minute after warm-up had >= 95 %
of the 10 Hz action rate.
"""

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.ros, pytest.mark.slow]
MINUTES = 3


def test_three_minute_soak_passes_its_thresholds(ros_env, ros_domain_id, tmp_path):
    out = tmp_path / 'soak'
    proc = subprocess.run(
        [sys.executable, '-m', 'oxygen_ros.tools.stress.soak', '--minutes', str(MINUTES),
         '--preset', 'tiny', '--domain-id', str(ros_domain_id), '--out', str(out)],
        env=ros_env, capture_output=True, text=True, timeout=MINUTES * 60 + 240)
    report = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, report
    result = json.loads((out / 'soak.json').read_text())
    verdict = result['verdict']
    assert verdict['passed'] and verdict['failures'] == [], report
    assert verdict['rss_growth'] <= 0.05 and verdict['kv_ok'], report
    assert verdict['min_minute_rate_hz'] >= 0.95 * 10.0, report
    assert len(result['samples']) >= MINUTES * 60 / 5 - 2  # every 5 s
    assert result['asked'] >= MINUTES * 60 * 2 - 2 and result['answered'] == result['asked']
    assert result['kv_after_drain'] <= result['kv_baseline']
    assert max(s['kv_used'] for s in result['samples']) > result['kv_baseline'], \
        'the questions never held KV blocks: the load did not reach the KV cache'
    assert (out / 'soak.png').stat().st_size > 10_000
    assert 'PASSED' in proc.stdout
