"""
``oxygen_demo`` (``make demo``) end to end on a short run, and its period statistics.

The demo runs as a subprocess on the test's ROS domain with the session's 2 s demo bag.
"""

import re

import numpy as np
from oxygen_ros.tools.demo.node_demo import period_stats
import pytest
from rosbags.rosbag2 import Reader


def test_period_stats():
    times_ns = np.cumsum([0, 100, 100, 150, 50, 100]) * 1_000_000
    stats = period_stats(times_ns, target_hz=10.0)
    assert stats['rate_hz'] == pytest.approx(10.0)
    assert stats['period_p50_ms'] == pytest.approx(100.0)
    assert stats['jitter_p50_ms'] == pytest.approx(0.0)
    assert stats['jitter_p99_ms'] == pytest.approx(50.0)
    assert period_stats(times_ns[:2], 10.0) == {}


@pytest.mark.ros
def test_demo_runs_and_records(ros_processes, ros_domain_id, demo_bag, tmp_path):
    proc = ros_processes.start('oxygen_ros.tools.demo.node_demo', '--duration', '4', '--out',
                               str(tmp_path / 'out'), '--bag', str(demo_bag.path), '--domain-id',
                               str(ros_domain_id))
    assert proc.wait(timeout_s=120) == 0, proc.output()
    output = proc.output()
    chunks = int(re.search(r'action chunks: (\d+) in', output).group(1))
    assert chunks >= 20, output
    assert 'cycle time (node): p50' in output and 'chunk period: p50' in output
    # both questions through the ~/ask action, answered, with the streamed pieces' timing
    assert re.search(r'asked \(~/ask action\): 2 question\(s\), 2 answered; time to first '
                     r'piece p50 \d+\.\d\d s, max \d+\.\d\d s; \d+\.\d pieces per answer',
                     output), output
    assert re.search(r'streamed \(~/<task>/stream; .*answer 2 text\(s\), first piece p50 ',
                     output), output
    [run_dir] = (tmp_path / 'out').iterdir()
    assert (run_dir / 'summary.txt').read_text() in output
    with Reader(run_dir / 'bag') as reader:
        counts = {c.topic: c.msgcount for c in reader.connections}
    assert counts['/oxygen/action_chunk'] >= chunks - 5 and counts['/diagnostics'] >= 2
    assert counts['/oxygen/answer/stream'] >= 2  # pieces of both answers
