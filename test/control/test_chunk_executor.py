"""The chunk executor on crafted chunks: interpolate, skip, hold, refuse, replace."""

import math

import numpy as np
from oxygen_ros.control.chunk_executor import ChunkExecutor, ChunkRefused, JointLimits
from oxygen_ros.control.trajectory import Trajectory
from oxygen_ros.units import NS_PER_S
import pytest

MS = 1_000_000
T0 = 100 * NS_PER_S
"""An arbitrary clock origin (sim time 100 s)."""


def chunk(positions, stamp_ns=T0, dt_ms=100, names=('a', 'b'), velocities=None, tfs=None):
    positions = np.asarray(positions, dtype=np.float64)
    if tfs is None:
        tfs = tuple(i * dt_ms * MS for i in range(positions.shape[0]))
    return Trajectory(tuple(names), stamp_ns, tuple(tfs), positions,
                      None if velocities is None else np.asarray(velocities, dtype=np.float64))


def ramp(start, num_points=5, step=(0.1, -0.2)):
    """Positions start + i * step, i = 0 .. num_points - 1, for joints a and b."""
    return np.asarray(start) + np.arange(num_points)[:, None] * np.asarray(step)


@pytest.fixture
def logged():
    return []


@pytest.fixture
def executor(logged):
    return ChunkExecutor(('a', 'b'), (0.0, 0.0),
                         JointLimits(lower=(-1.0, -1.0), upper=(1.0, 1.0), velocity=(2.0, 2.0)),
                         log=logged.append)


def test_holds_the_initial_position_before_any_chunk(executor):
    cmd = executor.command(T0)
    assert cmd.holding and cmd.positions.tolist() == [0.0, 0.0]
    assert cmd.velocities.tolist() == [0.0, 0.0]
    assert executor.command(T0 + 500 * MS).positions.tolist() == [0.0, 0.0]
    assert executor.stats.hold_ns == 0  # idle before the first chunk is not hold time


def test_interpolates_linearly_between_points(executor):
    assert executor.submit(chunk(ramp((0.0, 0.0))), T0)
    cmd = executor.command(T0 + 150 * MS)  # between points 1 (100 ms) and 2 (200 ms)
    assert cmd.positions == pytest.approx([0.15, -0.3])
    assert cmd.velocities == pytest.approx([1.0, -2.0])  # 0.1 / 0.1 s, -0.2 / 0.1 s
    assert not cmd.holding
    assert executor.command(T0 + 200 * MS).positions == pytest.approx([0.2, -0.4])  # a point


def test_cubic_hermite_when_velocities_are_given(executor):
    # One joint a: p = t^2 on [0, 0.2] s has v = 2t; Hermite reproduces a quadratic exactly.
    times = np.array([0.0, 0.1, 0.2])
    c = chunk(np.stack([times ** 2, np.zeros(3)], axis=1),
              velocities=np.stack([2 * times, np.zeros(3)], axis=1))
    assert executor.submit(c, T0)
    for t in (0.03, 0.1, 0.17):
        cmd = executor.command(T0 + round(t * NS_PER_S))
        assert cmd.positions[0] == pytest.approx(t ** 2)
        assert cmd.velocities[0] == pytest.approx(2 * t)


def still(num_points=10, stamp_ns=T0 - 100 * MS):
    """Return a chunk keeping both joints at 0 for a while (the robot executes, not holds)."""
    return chunk(np.zeros((num_points, 2)), stamp_ns=stamp_ns)


def test_skips_points_due_before_arrival_and_switches_at_the_first_future_point(executor):
    executor.submit(still(), T0 - 100 * MS)
    executor.command(T0 - 100 * MS)
    assert executor.submit(chunk(ramp((0.0, 0.0))), T0 + 150 * MS)  # arrives 150 ms late
    assert executor.stats.num_points_skipped == 2  # points at 0 and 100 ms passed
    # Until the first not-yet-passed point (200 ms) the previous chunk goes on ...
    assert executor.command(T0 + 150 * MS).positions.tolist() == [0.0, 0.0]
    assert len(executor.take_switches()) == 1
    # ... then the chunk takes over at its point 2, with the jump from the previous command.
    cmd = executor.command(T0 + 250 * MS)
    assert cmd.positions == pytest.approx([0.25, -0.5])
    [switch] = executor.take_switches()
    assert switch.time_ns == T0 + 200 * MS and switch.num_skipped == 2
    assert switch.arrival_ns == T0 + 150 * MS and switch.stamp_ns == T0
    assert switch.jump == pytest.approx([0.2, -0.4])
    assert list(executor.stats.latencies_ns) == [0, 150 * MS]
    assert executor.stats.num_executed == 2 and executor.stats.hold_ns == 0
    assert executor.stats.num_resumed == 0


def test_holds_the_last_point_and_never_extrapolates(executor):
    assert executor.submit(chunk(ramp((0.0, 0.0))), T0)
    executor.command(T0)
    last = executor.command(T0 + 400 * MS)  # the last point
    assert last.positions == pytest.approx([0.4, -0.8]) and last.holding
    later = executor.command(T0 + 900 * MS)
    assert later.positions == pytest.approx([0.4, -0.8])  # not 0.9 / -1.8
    assert later.velocities.tolist() == [0.0, 0.0] and later.holding
    assert executor.stats.hold_ns == 500 * MS


def test_a_newer_chunk_replaces_the_current_one_from_its_first_future_point(executor):
    assert executor.submit(chunk(ramp((0.0, 0.0))), T0)
    executor.command(T0)
    newer = chunk(ramp((0.5, 0.0), step=(0.0, 0.0)), stamp_ns=T0 + 100 * MS)
    assert executor.submit(newer, T0 + 130 * MS)  # its points: 100 (passed), 200, ... ms
    # The first chunk goes on until 200 ms.
    assert executor.command(T0 + 150 * MS).positions == pytest.approx([0.15, -0.3])
    assert executor.command(T0 + 200 * MS).positions == pytest.approx([0.5, 0.0])
    [first, second] = executor.take_switches()
    assert first.time_ns == T0 and second.time_ns == T0 + 200 * MS
    assert second.jump == pytest.approx([0.5 - 0.2, 0.0 + 0.4])
    assert executor.stats.num_points_skipped == 1


def test_a_chunk_waiting_to_take_over_is_superseded_by_a_newer_one(executor):
    executor.submit(chunk(ramp((0.0, 0.0))), T0)
    executor.command(T0)
    executor.submit(chunk(ramp((0.3, 0.0), step=(0, 0)), stamp_ns=T0 + 100 * MS), T0 + 150 * MS)
    executor.submit(chunk(ramp((0.6, 0.0), step=(0, 0)), stamp_ns=T0 + 120 * MS), T0 + 160 * MS)
    assert executor.command(T0 + 250 * MS).positions == pytest.approx([0.6, 0.0])
    assert executor.stats.num_superseded == 1 and executor.stats.num_executed == 2


def test_a_due_waiting_chunk_takes_over_even_if_no_tick_came_in_between(executor):
    executor.submit(chunk(ramp((0.0, 0.0))), T0)
    executor.command(T0)
    executor.submit(chunk(ramp((0.3, 0.0), step=(0, 0)), stamp_ns=T0 + 100 * MS), T0 + 150 * MS)
    # no command() at its switch time (200 ms); the next chunk comes at 250 ms
    executor.submit(chunk(ramp((0.6, 0.0), step=(0, 0)), stamp_ns=T0 + 120 * MS), T0 + 250 * MS)
    assert executor.command(T0 + 260 * MS).positions == pytest.approx([0.3, 0.0])
    assert executor.command(T0 + 320 * MS).positions == pytest.approx([0.6, 0.0])
    assert [s.time_ns for s in executor.take_switches()] == [T0, T0 + 200 * MS, T0 + 320 * MS]
    assert executor.stats.num_superseded == 0 and executor.stats.num_executed == 3


def test_positions_given_as_lists_are_read_as_arrays(executor):
    assert executor.submit(Trajectory(('a',), T0, (0, 100 * MS), [[0.0], [0.1]]), T0)
    assert executor.command(T0 + 50 * MS).positions == pytest.approx([0.05, 0.0])


def test_joints_the_chunk_does_not_name_hold(executor):
    executor.submit(chunk([[0.5], [0.7]], names=('b',)), T0)
    cmd = executor.command(T0 + 50 * MS)
    assert cmd.positions == pytest.approx([0.0, 0.6])
    assert cmd.velocities == pytest.approx([0.0, 2.0])


BAD = {
    'NaN': (chunk([[0.0, math.nan], [0.0, 0.0]]), "positions hold NaN/Inf (point 0, joint 'b')"),
    'Inf velocity': (chunk([[0.0, 0.0], [0.0, 0.0]], velocities=[[0, 0], [math.inf, 0]]),
                     "velocities hold NaN/Inf (point 1, joint 'a')"),
    'unknown joint': (chunk([[0.0, 0.0]], names=('a', 'c')), "unknown joint names ['c']"),
    'repeated joint': (chunk([[0.0, 0.0]], names=('a', 'a')), 'joint names must be distinct'),
    'wrong width': (chunk([[0.0], [0.0]]), 'positions have shape (2, 1), expected (2 points, 2'),
    'no points': (chunk(np.zeros((0, 2))), 'no points'),
    'velocity shape': (chunk([[0.0, 0.0], [0.0, 0.0]], velocities=[[0.0, 0.0]]),
                       'velocities have shape (1, 2), positions (2, 2)'),
    'time order': (chunk([[0.0, 0.0], [0.0, 0.0]], tfs=(100 * MS, 100 * MS)),
                   'strictly increasing'),
    'negative time': (chunk([[0.0, 0.0]], tfs=(-1,)), 'time_from_start must be >= 0'),
    'above limit': (chunk([[0.0, 0.0], [0.0, 1.01]]),
                    "position 1.0100 of 'b' (point 1) is above the upper limit 1.0000"),
    'below limit': (chunk([[-1.2, 0.0]]), 'is below the lower limit -1.0000'),
    'velocity limit': (chunk([[0.0, 0.0], [0.0, 0.0]], velocities=[[0, 0], [0, -2.5]]),
                       "velocity -2.5000 of 'b' (point 1) exceeds the limit"),
    'segment velocity': (chunk([[0.0, 0.0], [0.3, 0.0]]),
                         "segment 0->1 of 'a' moves at 3.0000/s, over the limit"),
}


@pytest.mark.parametrize('case', sorted(BAD))
def test_refuses_a_malformed_chunk_with_one_log_line_and_keeps_the_command(
        executor, logged, case):
    good = chunk(ramp((0.0, 0.0)))
    assert executor.submit(good, T0)
    before = executor.command(T0 + 150 * MS)
    bad, reason = BAD[case]
    with pytest.raises(ChunkRefused) as info:
        executor.validate(bad)
    assert reason in str(info.value)
    assert not executor.submit(bad, T0 + 150 * MS)
    assert len(logged) == 1 and reason in logged[0] and 'refused' in logged[0]
    after = executor.command(T0 + 150 * MS)
    assert after.positions.tolist() == before.positions.tolist()
    assert executor.command(T0 + 250 * MS).positions == pytest.approx([0.25, -0.5])
    assert executor.stats.num_refused == 1 and executor.stats.num_accepted == 1


def test_refuses_a_chunk_older_than_the_newest_accepted(executor, logged):
    assert executor.submit(chunk(ramp((0.0, 0.0)), stamp_ns=T0 + 100 * MS), T0 + 110 * MS)
    assert not executor.submit(chunk(ramp((0.0, 0.0)), stamp_ns=T0), T0 + 120 * MS)
    assert 'older than the newest accepted chunk' in logged[0]


def test_refuses_a_chunk_whose_every_point_has_passed(executor, logged):
    executor.submit(still(), T0 - 100 * MS)          # executing until 800 ms
    executor.command(T0 - 100 * MS)
    assert not executor.submit(chunk(ramp((0.0, 0.0))), T0 + 401 * MS)  # last point at 400
    assert executor.stats.num_late == 1 and executor.stats.num_points_skipped == 5
    assert 'late: all 5 points were due before it arrived (1.0 ms after the last)' in logged[0]
    assert executor.command(T0 + 500 * MS).positions.tolist() == [0.0, 0.0]


def test_limits_are_checked_at_construction():
    inf = math.inf
    with pytest.raises(ValueError, match=r'lower > upper position limit at dims \[0\]'):
        ChunkExecutor(('a',), (0.0,), JointLimits(lower=(1.0,), upper=(0.0,), velocity=(inf,)))
    with pytest.raises(ValueError, match='velocity limits must be > 0'):
        ChunkExecutor(('a',), (0.0,), JointLimits(lower=(-inf,), upper=(inf,), velocity=(0.0,)))
    with pytest.raises(ValueError, match='limits must be 2 numbers each, got 1'):
        ChunkExecutor(('a', 'b'), (0.0, 0.0), JointLimits.unlimited(1))
    with pytest.raises(ValueError, match='initial positions must be 1 finite'):
        ChunkExecutor(('a',), (math.nan,))


# -- a chunk arriving while the robot holds (LeRobot PRs 4223, 4454: skip what was consumed)

def test_a_late_first_chunk_starts_at_the_held_pose_not_where_the_clock_says(executor):
    """The robot held still: nothing was consumed, so the late ramp starts at its point 0."""
    late = T0 + 250 * MS                         # points 0, 100, 200 ms are due already
    assert executor.submit(chunk(ramp((0.0, 0.0))), late)
    assert executor.stats.num_points_skipped == 0 and executor.stats.num_resumed == 1
    assert executor.command(late).positions == pytest.approx([0.0, 0.0])   # no jump
    assert executor.command(late + 50 * MS).positions == pytest.approx([0.05, -0.1])
    assert executor.command(late + 400 * MS).positions == pytest.approx([0.4, -0.8])
    [switch] = executor.take_switches()
    assert switch.time_ns == late and switch.num_skipped == 0
    assert switch.jump == pytest.approx([0.0, 0.0])


def test_after_the_active_chunk_ran_out_a_late_chunk_resumes_where_the_hold_began(executor):
    executor.submit(chunk(ramp((0.0, 0.0), step=(0.05, 0.0))), T0)   # ends at 0.2 at 400 ms
    executor.command(T0)
    # planned from 200 ms on: reaches the held 0.2 at 400 ms, then goes on to 0.4 at 600 ms
    newer = chunk(ramp((0.1, 0.0), step=(0.05, 0.0)), stamp_ns=T0 + 200 * MS)
    arrival = T0 + 650 * MS                      # by the clock every point has passed
    assert executor.submit(newer, arrival)
    assert executor.stats.num_late == 0 and executor.stats.num_points_skipped == 2
    cmd = executor.command(arrival)
    assert cmd.positions == pytest.approx([0.2, 0.0])    # the point of 400 ms, at arrival
    assert executor.command(arrival + 100 * MS).positions == pytest.approx([0.25, 0.0])
    switch = executor.take_switches()[-1]
    assert switch.time_ns == arrival and switch.num_skipped == 2
    assert switch.jump == pytest.approx([0.0, 0.0])


def test_a_chunk_arriving_while_the_robot_moves_still_skips_by_the_clock(executor):
    executor.submit(chunk(ramp((0.0, 0.0))), T0)
    executor.command(T0)
    assert executor.submit(chunk(ramp((0.1, -0.2)), stamp_ns=T0 + 100 * MS), T0 + 250 * MS)
    assert executor.stats.num_points_skipped == 2 and executor.stats.num_resumed == 0
    assert executor.command(T0 + 300 * MS).positions == pytest.approx([0.3, -0.6])


def test_a_chunk_whose_points_all_passed_before_the_hold_began_is_still_late(executor, logged):
    executor.submit(chunk(ramp((0.0, 0.0))), T0)       # runs out at 400 ms
    executor.command(T0)
    old = chunk(ramp((0.0, 0.0), num_points=3), stamp_ns=T0 + 100 * MS)   # ends at 300 ms
    assert not executor.submit(old, T0 + 500 * MS)
    assert executor.stats.num_late == 1 and 'late: all 3 points' in logged[0]
