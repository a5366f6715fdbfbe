"""
``builtin_interfaces/Time`` and ``Duration`` to and from integer nanoseconds.

Pure functions: no node, no DDS, no I/O. Stamps are integer nanoseconds everywhere
(``oxygen_ros.units``), so header stamps survive a round trip bit for bit.
"""

from __future__ import annotations

from builtin_interfaces.msg import Duration, Time
import numpy as np
from oxygen_ros.units import NS_PER_S

_INT32_MAX = 2**31 - 1


def stamp_to_ns(stamp: Time) -> int:
    """
    Return a ``builtin_interfaces/Time`` as integer nanoseconds.

    :param stamp: the message stamp (``sec`` int32, ``nanosec`` uint32).
    :returns: ``sec * 1e9 + nanosec``, exact.
    :raises ValueError: if ``nanosec`` is not in ``[0, 1e9)``.
    """
    if not 0 <= stamp.nanosec < NS_PER_S:
        raise ValueError(f'stamp nanosec {stamp.nanosec} not in [0, {NS_PER_S})')
    return stamp.sec * NS_PER_S + stamp.nanosec


def ns_to_stamp(ns: int) -> Time:
    """
    Return integer nanoseconds as a ``builtin_interfaces/Time``.

    :param ns: nanoseconds since the epoch of the clock (ROS time), ``>= 0``.
    :returns: the stamp, ``nanosec`` in ``[0, 1e9)``.
    :raises ValueError: if ``ns`` is negative, not an integer, or beyond int32 seconds.
    """
    sec, nanosec = _split_ns(ns, 'stamp')
    return Time(sec=sec, nanosec=nanosec)


def as_stamp(stamp: Time | int) -> Time:
    """
    Return a ``header.stamp`` given as a ``Time`` message or as integer nanoseconds.

    :raises ValueError: see ``ns_to_stamp``.
    """
    return stamp if isinstance(stamp, Time) else ns_to_stamp(stamp)


def duration_to_ns(duration: Duration) -> int:
    """Return a ``builtin_interfaces/Duration`` as integer nanoseconds."""
    return duration.sec * NS_PER_S + duration.nanosec


def ns_to_duration(ns: int) -> Duration:
    """
    Return non-negative integer nanoseconds as a ``builtin_interfaces/Duration``.

    :raises ValueError: if ``ns`` is negative, not an integer, or beyond int32 seconds.
    """
    sec, nanosec = _split_ns(ns, 'duration')
    return Duration(sec=sec, nanosec=nanosec)


def _split_ns(ns: int, what: str) -> tuple[int, int]:
    if isinstance(ns, bool) or not isinstance(ns, (int, np.integer)):
        raise ValueError(f'{what} must be integer nanoseconds, got {ns!r}')
    ns = int(ns)
    if ns < 0 or ns // NS_PER_S > _INT32_MAX:
        raise ValueError(f'{what} {ns} ns out of range [0, {_INT32_MAX}] s')
    return ns // NS_PER_S, ns % NS_PER_S


__all__ = ['as_stamp', 'duration_to_ns', 'ns_to_duration', 'ns_to_stamp', 'stamp_to_ns']
