"""Stamps and durations <-> integer nanoseconds (oxygen_ros.ros.stamps); pure, no DDS."""

from builtin_interfaces.msg import Time
import numpy as np
from oxygen_ros.ros.stamps import duration_to_ns, ns_to_duration, ns_to_stamp, stamp_to_ns
import pytest

STAMP_NS = 1_700_000_123_456_789_012


def test_stamp_round_trip_is_exact():
    stamp = ns_to_stamp(STAMP_NS)
    assert (stamp.sec, stamp.nanosec) == (1_700_000_123, 456_789_012)
    assert stamp_to_ns(stamp) == STAMP_NS
    assert stamp_to_ns(ns_to_stamp(0)) == 0
    assert stamp_to_ns(ns_to_stamp(np.int64(5))) == 5


@pytest.mark.parametrize('bad', [-1, 2**31 * 10**9, 1.5, True, '3'])
def test_ns_to_stamp_rejects(bad):
    with pytest.raises(ValueError, match='stamp'):
        ns_to_stamp(bad)


def test_stamp_to_ns_rejects_bad_nanosec():
    with pytest.raises(ValueError, match='nanosec 1000000000 not in'):
        stamp_to_ns(Time(sec=1, nanosec=10**9))


def test_duration_round_trip():
    assert duration_to_ns(ns_to_duration(2_500_000_001)) == 2_500_000_001
    assert (ns_to_duration(2_500_000_001).sec, ns_to_duration(2_500_000_001).nanosec) == (
        2, 500_000_001)
    with pytest.raises(ValueError, match='duration -1 ns out of range'):
        ns_to_duration(-1)
