"""
``ros/heap.py`` on the real glibc malloc of a fresh interpreter: what a burst leaves, the trim.

The scenario of ``docs/robustness.md#soak`` in small: an 8 MiB block is mmapped on its own and
freed (glibc raises its mmap threshold to 8 MiB), so the next six 8 MiB blocks come from the
arena; freed below a live block they stay there, free and resident. ``HeapTrimmer``
must give them back, not while its margin is 0 or within its interval (twice as long once its
pages came back), and not for memory that is in use.
"""

import json
import subprocess
import sys

from oxygen_ros.ros.heap import heap_figures, TRIM_INTERVAL_S
import pytest

SCENARIO = r"""
import ctypes, json
from dataclasses import asdict
from oxygen_ros.ros.heap import HeapTrimmer, TRIM_INTERVAL_S

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
MIB = 1 << 20

def burst():
    blocks = [libc.malloc(8 * MIB) for _ in range(6)]
    for b in blocks:
        ctypes.memset(b, 1, 8 * MIB)  # touched: resident
    above = libc.malloc(MIB)  # from the top, above them: they cannot merge into it
    for b in blocks:
        libc.free(b)
    return above

trimmer = HeapTrimmer()
out = {'start': asdict(trimmer.poll(4.0, now_s=0.0))}
first = libc.malloc(8 * MIB)
ctypes.memset(first, 1, 8 * MIB)
libc.free(first)  # mmapped on its own, then unmapped: the threshold rises to 8 MiB
keep = [burst()]
out['margin_0'] = asdict(trimmer.poll(0.0, now_s=10.0))
out['trims_margin_0'] = trimmer.trims
out['trimmed'] = asdict(trimmer.poll(4.0, now_s=11.0))
out['trims'], out['released'] = trimmer.trims, trimmer.released
keep.append(burst())  # the pages come back within the interval: a load that goes on
out['within_interval'] = asdict(trimmer.poll(4.0, now_s=11.0 + TRIM_INTERVAL_S / 2))
out['trims_within_interval'] = trimmer.trims
out['after_interval'] = asdict(trimmer.poll(4.0, now_s=11.0 + TRIM_INTERVAL_S))
out['trims_after_interval'], out['backed_off_s'] = trimmer.trims, trimmer.interval_s
quiet = 11.0 + TRIM_INTERVAL_S + 1.0
trimmer.poll(4.0, now_s=quiet)  # the release holds through the doubled interval
keep.append(burst())
later = asdict(trimmer.poll(4.0, now_s=quiet + 2 * TRIM_INTERVAL_S))
out['trims_later'], out['reset_s'] = trimmer.trims, trimmer.interval_s
live = [libc.malloc(8 * MIB) for _ in range(6)]  # in use: not the trimmer's business
for b in live:
    ctypes.memset(b, 1, 8 * MIB)
out['later'], out['live'] = later, asdict(trimmer.poll(16.0, now_s=quiet + 60.0))
out['trims_live'] = trimmer.trims
print(json.dumps(out))
"""

pytestmark = pytest.mark.skipif(heap_figures() is None, reason='needs glibc >= 2.33 and /proc')
MIB = 1 << 20


@pytest.fixture(scope='module')
def scenario():
    proc = subprocess.run([sys.executable, '-c', SCENARIO], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_a_burst_freed_in_the_arena_stays_resident_until_trimmed(scenario):
    start, held, trimmed = scenario['start'], scenario['margin_0'], scenario['trimmed']
    assert held['rss'] - start['rss'] > 40 * MIB and held['free'] >= 48 * MIB
    assert scenario['trims_margin_0'] == 0  # margin 0: figures only
    assert scenario['trims'] == 1
    assert held['rss'] - trimmed['rss'] > 40 * MIB
    assert scenario['released'] == held['rss'] - trimmed['rss']
    assert trimmed['free'] >= 48 * MIB  # the trimmed pages stay free chunks of the arena


def test_trims_wait_for_the_interval_and_back_off_while_they_are_undone(scenario):
    assert scenario['within_interval']['rss'] - scenario['trimmed']['rss'] > 40 * MIB
    assert scenario['trims_within_interval'] == 1
    assert scenario['trims_after_interval'] == 2
    assert scenario['within_interval']['rss'] - scenario['after_interval']['rss'] > 40 * MIB
    assert scenario['backed_off_s'] == 2 * TRIM_INTERVAL_S  # its pages had come back
    assert scenario['trims_later'] == 3 and scenario['reset_s'] == TRIM_INTERVAL_S  # held


def test_memory_in_use_is_not_trimmed(scenario):
    live = scenario['live']
    assert live['rss'] - scenario['later']['rss'] > 40 * MIB
    assert live['free'] < 16 * MIB and scenario['trims_live'] == 3
