"""
The chunk executor: action chunks in, one joint command per control tick out.

A chunk is a short trajectory: point ``i`` is due at the absolute time
``stamp + time_from_start[i]`` (``stamp`` is the ``header.stamp`` of the chunk, the stamp of
the camera frame it was computed from). The executor, like ros2_control's
``joint_trajectory_controller``, samples the active chunk at the controller's clock:

- **skip**: points due before the chunk *arrived* are never targets; they are counted
  (``ExecutorStats.num_points_skipped``). Only points the robot *consumed* are skipped,
  though: a chunk that arrives while the robot holds (before the first chunk, or after the
  active one ran out) starts at its point for the time the hold began (the first point when
  the robot never moved), and its times are shifted so that this point is due at arrival
  (``ExecutorStats.num_resumed``). Skipping by the clock alone would start it where the
  robot would have been, had it moved meanwhile: a jump away from the held pose. LeRobot
  clamps its skip to the actions consumed the same way (``ActionQueue.merge``, PRs 4223 and
  4454).
- **switch**: a newer chunk replaces the active one at its first not-yet-passed point ``k``
  (due at ``t_k``): until ``t_k`` the active chunk goes on, from ``t_k`` on the new one. So a
  switch is always at a point of the new chunk, and the jump ``p_k - previous(t_k)`` is
  reported (``Switch.jump``). A chunk that arrives with every point passed is refused as late.
- **interpolate** between consecutive points: linear in positions, or cubic Hermite when the
  chunk gives velocities at every point (positions and velocities both continuous inside a
  chunk).
- **hold**: past the last point of the active chunk, or before the first chunk, the last
  commanded position is held with zero velocity; never extrapolated. Hold time after the first
  chunk is counted (``hold_ns``).
- **refuse**: a malformed chunk (NaN/Inf, unknown or repeated joint names, wrong lengths, no
  points, times not strictly increasing, positions, velocities or segment velocities
  ``|p_{i+1} - p_i| / dt`` outside the configured limits) or one older than the newest accepted
  one is refused with one log line naming the reason; the current command is not disturbed.

Joints the chunk does not name hold their last command. Nothing here knows ROS or a simulator:
call ``submit(chunk, now_ns)`` when a chunk arrives and ``command(now_ns)`` every control tick,
with the same clock (sim time in the simulator, the robot's clock on a robot).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from oxygen_ros.control.limits import JointLimits
from oxygen_ros.control.trajectory import ChunkRefused, Trajectory
from oxygen_ros.units import NS_PER_S

LATENCY_WINDOW = 10_000
_REL_TOL = 1e-6
"""Relative slack on limit checks: float32 round-off of values clipped exactly to a limit."""
_NEVER_MOVED = int(np.iinfo(np.int64).min)
"""The hold start before any chunk moved the robot (earlier than every point)."""


@dataclass(frozen=True, slots=True)
class Command:
    """
    The joint command of one control tick, in the executor's joint order.

    :ivar positions: ``float64 [N]``.
    :ivar velocities: ``float64 [N]`` (0 while holding).
    :ivar holding: no chunk point is ahead (hold) on any joint.
    """

    time_ns: int
    positions: np.ndarray
    velocities: np.ndarray
    holding: bool


@dataclass(frozen=True, slots=True)
class Switch:
    """
    A chunk took over the command.

    :ivar time_ns: when (the due time of its first executed point).
    :ivar stamp_ns: the chunk's ``header.stamp``.
    :ivar arrival_ns: when it was submitted.
    :ivar num_skipped: points due before its arrival.
    :ivar jump: ``float64 [N]`` new command minus the command the previous chunk (or hold)
        gave at ``time_ns``, executor joint order (0 for joints the chunk does not name).
    """

    time_ns: int
    stamp_ns: int
    arrival_ns: int
    num_skipped: int
    jump: np.ndarray


@dataclass(slots=True)
class ExecutorStats:
    """
    Counters since construction.

    ``latencies_ns`` holds ``arrival - stamp`` of the newest ``LATENCY_WINDOW`` accepted chunks.
    """

    num_received: int = 0
    num_accepted: int = 0
    num_refused: int = 0
    num_late: int = 0
    """Refused because every point was due before arrival (included in ``num_refused``)."""
    num_executed: int = 0
    """Accepted chunks that took over the command."""
    num_superseded: int = 0
    """Accepted chunks replaced by a newer one before their first point was due."""
    num_points_skipped: int = 0
    num_resumed: int = 0
    """Accepted chunks that arrived during a hold and start where it began, shifted in time."""
    hold_ns: int = 0
    latencies_ns: deque[int] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))


@dataclass(slots=True)
class _Active:
    chunk: Trajectory
    columns: np.ndarray
    """Executor index of each chunk joint."""
    times_ns: np.ndarray
    first: int
    """Index of the first point to execute (the first not-yet-passed one at arrival)."""
    arrival_ns: int


class ChunkExecutor:
    """
    Sample action chunks at the control clock (see the module docstring for the rules).

    :param joint_names: ``[N]`` the joints it commands, in command order.
    :param initial_positions: ``[N]`` the command before the first chunk (e.g. the measured
        joint positions at start).
    :param limits: position / velocity limits; None = no limits.
    :param log: called with one line per refused chunk (e.g. a ROS logger's ``warning``).
    :raises ValueError: repeated names, lengths that do not match, non-finite initial
        positions, or bad limits.
    """

    def __init__(self, joint_names: Sequence[str], initial_positions: Sequence[float],
                 limits: JointLimits | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.joint_names = tuple(joint_names)
        if len(set(self.joint_names)) != len(self.joint_names) or not all(self.joint_names):
            raise ValueError(f'joint names must be distinct and non-empty: {joint_names}')
        self._index = {name: i for i, name in enumerate(self.joint_names)}
        held = np.array(initial_positions, dtype=np.float64)
        if held.shape != (len(self.joint_names),) or not np.isfinite(held).all():
            raise ValueError(f'initial positions must be {len(self.joint_names)} finite '
                             f'numbers, got {initial_positions}')
        self.limits = limits or JointLimits.unlimited(len(self.joint_names))
        self.limits.check(len(self.joint_names))
        self._log = log or (lambda line: None)
        self._held = held
        self._active: _Active | None = None
        self._pending: _Active | None = None
        self._newest_stamp_ns: int | None = None
        self._last_tick_ns: int | None = None
        self._was_holding = True
        self._switches: list[Switch] = []
        self.stats = ExecutorStats()

    # -- chunks in --------------------------------------------------------------------------
    def submit(self, chunk: Trajectory, now_ns: int) -> bool:
        """
        Take a chunk that arrived at ``now_ns``.

        It replaces the current one from its first not-yet-passed point.

        :returns: True if accepted; False if refused (one log line with the reason; the
            current command and the chunk waiting to take over are kept).
        """
        self.stats.num_received += 1
        self._advance(now_ns)  # a waiting chunk whose time came took over, called or not
        try:
            entry = self._accept(chunk, now_ns)
        except ChunkRefused as exc:
            self.stats.num_refused += 1
            self._log(f'chunk stamped {chunk.stamp_ns / NS_PER_S:.3f} s refused: {exc}')
            return False
        self.stats.num_accepted += 1
        self.stats.num_points_skipped += entry.first
        self.stats.latencies_ns.append(now_ns - chunk.stamp_ns)
        self._newest_stamp_ns = chunk.stamp_ns
        if self._pending is not None:
            self.stats.num_superseded += 1
        self._pending = entry
        return True

    def reject(self, reason: str) -> None:
        """Count and log a chunk refused before it could be read (e.g. a malformed message)."""
        self.stats.num_received += 1
        self.stats.num_refused += 1
        self._log(f'chunk refused: {reason}')

    def _accept(self, chunk: Trajectory, now_ns: int) -> _Active:
        columns = self.validate(chunk)
        if self._newest_stamp_ns is not None and chunk.stamp_ns < self._newest_stamp_ns:
            raise ChunkRefused(f'older than the newest accepted chunk (stamped '
                               f'{self._newest_stamp_ns / NS_PER_S:.3f} s)')
        times = chunk.times_ns
        first = int(np.searchsorted(times, now_ns, side='left'))  # times[first] >= now
        hold_since = self._hold_since(now_ns)
        if hold_since is not None and first > 0:
            # the robot held meanwhile: only points due before the hold began were consumed
            consumed = int(np.searchsorted(times, hold_since, side='left'))
            if consumed < first:
                times = times + (now_ns - int(times[consumed]))
                first = consumed
                self.stats.num_resumed += 1
        if first == len(times):
            self.stats.num_late += 1
            self.stats.num_points_skipped += len(times)
            raise ChunkRefused(f'late: all {len(times)} points were due before it arrived '
                               f'({(now_ns - int(times[-1])) / 1e6:.1f} ms after the last)')
        vel = chunk.velocities
        chunk = replace(chunk, positions=np.asarray(chunk.positions, dtype=np.float64),
                        velocities=None if vel is None else np.asarray(vel, dtype=np.float64))
        return _Active(chunk, columns, times, first, now_ns)

    def _hold_since(self, now_ns: int) -> int | None:
        """
        Return since when the command holds at ``now_ns``; None while a chunk moves the robot.

        ``_NEVER_MOVED`` before the first chunk: every point of a new chunk is still ahead.
        """
        act = self._active
        if act is None:
            return _NEVER_MOVED
        last = int(act.times_ns[-1])
        return last if now_ns >= last else None

    def validate(self, chunk: Trajectory) -> np.ndarray:
        """
        Check a chunk against the joint names and limits.

        :returns: ``int [J]`` executor index of each chunk joint.
        :raises ChunkRefused: the first problem found.
        """
        names = chunk.joint_names
        unknown = [n for n in names if n not in self._index]
        if unknown:
            raise ChunkRefused(f'unknown joint names {unknown}; known {list(self.joint_names)}')
        if len(set(names)) != len(names) or not names:
            raise ChunkRefused(f'joint names must be distinct and non-empty: {list(names)}')
        pos = np.asarray(chunk.positions, dtype=np.float64)
        num_points = len(chunk.times_from_start_ns)
        if num_points == 0:
            raise ChunkRefused('no points')
        if pos.shape != (num_points, len(names)):
            raise ChunkRefused(f'positions have shape {pos.shape}, expected '
                               f'({num_points} points, {len(names)} joints)')
        vel = chunk.velocities
        if vel is not None:
            vel = np.asarray(vel, dtype=np.float64)
            if vel.shape != pos.shape:
                raise ChunkRefused(f'velocities have shape {vel.shape}, positions {pos.shape}')
        for what, arr in (('positions', pos), ('velocities', vel)):
            if arr is not None and not np.isfinite(arr).all():
                point, joint = np.argwhere(~np.isfinite(arr))[0]
                raise ChunkRefused(f'{what} hold NaN/Inf (point {point}, joint {names[joint]!r})')
        tfs = np.asarray(chunk.times_from_start_ns, dtype=np.int64)
        if tfs[0] < 0 or (np.diff(tfs) <= 0).any():
            raise ChunkRefused(f'time_from_start must be >= 0 and strictly increasing, got '
                               f'{(tfs / 1e6).round(3).tolist()} ms')
        columns = np.array([self._index[n] for n in names], dtype=np.intp)
        self._check_limits(pos, vel, tfs, columns)
        return columns

    def _check_limits(self, pos: np.ndarray, vel: np.ndarray | None, tfs: np.ndarray,
                      columns: np.ndarray) -> None:
        lim = self.limits
        names = [self.joint_names[c] for c in columns]
        lower, upper, velocity = lim.arrays()  # +-inf: no limit, never crossed
        for bound, sign in ((lower, -1.0), (upper, 1.0)):
            b = bound[columns]
            over = sign * (pos - b) > _REL_TOL * np.maximum(np.abs(b), 1.0)
            if over.any():
                point, joint = np.argwhere(over)[0]
                word = 'below the lower' if sign < 0 else 'above the upper'
                raise ChunkRefused(f'position {pos[point, joint]:.4f} of {names[joint]!r} '
                                   f'(point {point}) is {word} limit {b[joint]:.4f}')
        vmax = velocity[columns] * (1.0 + _REL_TOL)
        if vel is not None and (np.abs(vel) > vmax).any():
            point, joint = np.argwhere(np.abs(vel) > vmax)[0]
            raise ChunkRefused(f'velocity {vel[point, joint]:.4f} of {names[joint]!r} '
                               f'(point {point}) exceeds the limit {vmax[joint]:.4f}')
        if len(tfs) > 1:
            dt = np.diff(tfs)[:, None] / NS_PER_S
            seg = np.abs(np.diff(pos, axis=0)) / dt
            # positions may each be off by their own round-off
            slack = 2 * _REL_TOL * np.maximum(np.abs(pos[1:]), 1.0) / dt
            if (seg > vmax + slack).any():
                point, joint = np.argwhere(seg > vmax + slack)[0]
                raise ChunkRefused(f'segment {point}->{point + 1} of {names[joint]!r} moves at '
                                   f'{seg[point, joint]:.4f}/s, over the limit '
                                   f'{vmax[joint]:.4f}')

    # -- command out --------------------------------------------------------------------------
    def command(self, now_ns: int) -> Command:
        """
        Return the command at ``now_ns`` (call once per control tick, time non-decreasing).

        :returns: positions and velocities of every executor joint.
        """
        executing = self.stats.num_executed > 0  # idle before the first chunk is not hold
        self._advance(now_ns)
        pos, vel, holding = self._sample(now_ns)
        if self._last_tick_ns is not None and self._was_holding and executing:
            # the time since the last tick was held if that tick was holding
            self.stats.hold_ns += max(now_ns - self._last_tick_ns, 0)
        self._last_tick_ns, self._was_holding = now_ns, holding
        return Command(now_ns, pos, vel, holding)

    def _advance(self, now_ns: int) -> None:
        # The waiting chunk takes over once its first point is due, so that the command
        # depends on time only, not on when ``command`` happens to be called.
        if self._pending is not None and now_ns >= self._pending.times_ns[self._pending.first]:
            self._switch(self._pending)

    def _switch(self, entry: _Active) -> None:
        t_k = int(entry.times_ns[entry.first])
        before, _, _ = self._sample(t_k)
        self._held = before  # the joints the new chunk does not name keep this
        self._active, self._pending = entry, None
        after, _, _ = self._sample(t_k)
        self.stats.num_executed += 1
        self._switches.append(Switch(t_k, entry.chunk.stamp_ns, entry.arrival_ns, entry.first,
                                     after - before))

    def _sample(self, now_ns: int) -> tuple[np.ndarray, np.ndarray, bool]:
        pos, vel = self._held.copy(), np.zeros_like(self._held)
        act = self._active
        if act is None:
            return pos, vel, True
        times, chunk, cols = act.times_ns, act.chunk, act.columns
        if now_ns >= times[-1]:
            pos[cols] = chunk.positions[-1]
            return pos, vel, True
        i = max(int(np.searchsorted(times, now_ns, side='right')) - 1, act.first)
        dt = (times[i + 1] - times[i]) / NS_PER_S
        s = (now_ns - times[i]) / NS_PER_S / dt
        p0, p1 = chunk.positions[i], chunk.positions[i + 1]
        if chunk.velocities is None:
            pos[cols] = p0 + s * (p1 - p0)
            vel[cols] = (p1 - p0) / dt
        else:
            v0, v1 = chunk.velocities[i] * dt, chunk.velocities[i + 1] * dt
            pos[cols], vel[cols] = _hermite(p0, v0, p1, v1, s)
            vel[cols] /= dt
        return pos, vel, False

    def take_switches(self) -> list[Switch]:
        """Return the switches since the last call (oldest first) and forget them."""
        out, self._switches = self._switches, []
        return out


def _hermite(p0: np.ndarray, m0: np.ndarray, p1: np.ndarray, m1: np.ndarray,
             s: float) -> tuple[np.ndarray, np.ndarray]:
    """
    Cubic Hermite spline on ``s`` in [0, 1] with tangents ``m = v * dt``.

    :returns: position and its derivative in ``s`` (divide by ``dt`` for a velocity).
    """
    s2, s3 = s * s, s * s * s
    pos = ((2 * s3 - 3 * s2 + 1) * p0 + (s3 - 2 * s2 + s) * m0 + (-2 * s3 + 3 * s2) * p1
           + (s3 - s2) * m1)
    der = ((6 * s2 - 6 * s) * p0 + (3 * s2 - 4 * s + 1) * m0 + (-6 * s2 + 6 * s) * p1
           + (3 * s2 - 2 * s) * m1)
    return pos, der


__all__ = ['ChunkExecutor', 'ChunkRefused', 'Command', 'ExecutorStats', 'JointLimits',
           'LATENCY_WINDOW', 'Switch']
