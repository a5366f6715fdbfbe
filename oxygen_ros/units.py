"""
The package's unit of time: integer nanoseconds, as ``builtin_interfaces/Time`` counts them.

Stamps, durations and periods are integer nanoseconds everywhere (no float seconds), so that
``time_from_start`` of an action chunk is exactly ``i * action_dt`` and header stamps survive a
round trip bit for bit; seconds appear only at the edges (parameters, logs, reports). Pure:
every layer may import it.
"""

NS_PER_S = 1_000_000_000
"""Nanoseconds per second (rclpy's ``constants.S_TO_NS``)."""

__all__ = ['NS_PER_S']
