"""The sim tool's harder conditions: late cycles by stopping a real process, their options."""

import argparse
from pathlib import Path
import subprocess
import sys
import time

from oxygen_ros.tools.demo.sim import _parser, conditions, late_cycles, LateCycles
from oxygen_ros.units import NS_PER_S
import pytest


def process_state(pid):
    """Return the one-letter state of ``pid`` from /proc (``T``: stopped)."""
    stat = Path(f'/proc/{pid}/stat').read_text()
    return stat[stat.rindex(')') + 2]


def wait_state(pid, want, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while process_state(pid) != want and time.monotonic() < deadline:
        time.sleep(0.01)
    return process_state(pid)


def test_late_cycles_stop_and_resume_a_process_on_the_sim_clock():
    proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
    try:
        late = LateCycles(proc.pid, every_s=5.0, pause_s=0.8, start_ns=10 * NS_PER_S)
        late.tick(14 * NS_PER_S)                       # before the first pause
        assert wait_state(proc.pid, 'S') == 'S' and late.num_pauses == 0
        late.tick(15 * NS_PER_S)                       # 5 s after the first chunk: stopped
        assert wait_state(proc.pid, 'T') == 'T' and late.num_pauses == 1
        late.tick(15 * NS_PER_S + 700_000_000)         # still within its 0.8 s
        assert process_state(proc.pid) == 'T'
        late.tick(15 * NS_PER_S + 800_000_000)         # resumed
        assert wait_state(proc.pid, 'S') == 'S'
        late.tick(20 * NS_PER_S)                       # the next pause, 5 s after the first
        assert wait_state(proc.pid, 'T') == 'T' and late.num_pauses == 2
        late.resume()                            # the run ends while it is stopped
        assert wait_state(proc.pid, 'S') == 'S'
    finally:
        proc.kill()
        proc.wait()


def test_condition_options_are_checked_and_named_in_the_summary():
    assert late_cycles('5:0.8') == (5.0, 0.8)
    for bad in ('5', '0.8:5', 'a:b', '5:0'):
        with pytest.raises(argparse.ArgumentTypeError):
            late_cycles(bad)
    args = _parser().parse_args(['--camera-rate', '5', '--late-cycles', '6:0.8'])
    assert conditions(args, 4) == ('conditions: camera 5 Hz; node stopped 4 times for 0.8 s '
                                   'every 6 s (late cycles)\n')
    assert conditions(_parser().parse_args([])) == ''
