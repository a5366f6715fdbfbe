"""The sim summary's figures on a crafted run (no bag, no ROS)."""

from dataclasses import replace
import math

import numpy as np
from oxygen_ros.tools.demo.sim_bag import SimRun, trim
from oxygen_ros.tools.demo.sim_report import compare_table, compute_metrics, node_values, summary
import pytest

MS = 1_000_000
NAMES = tuple(f'joint{i}' for i in range(1, 8)) + ('gripper',)


def crafted_run():
    t = np.arange(0, 1000, 10) * MS  # 100 Hz for 1 s
    command = np.zeros((t.size, 8))
    command[50:, 0] = 0.02  # one switch at 500 ms with a 0.02 rad jump on joint1
    state = command.copy()
    state[:, 1] = 0.001 * np.arange(t.size)  # joint2 drifts 0.099 rad; tracking error on it
    events = [
        {'message': 'accepted', 'stamp_ns': str(0), 'arrival_ns': str(80 * MS),
         'points skipped': '1'},
        {'message': 'executed', 'stamp_ns': '0', 'arrival_ns': str(80 * MS),
         'switch_ns': str(100 * MS), 'points skipped': '1',
         **{f'jump {n}': '0.0' for n in NAMES}},
        {'message': 'accepted', 'stamp_ns': str(400 * MS), 'arrival_ns': str(520 * MS),
         'points skipped': '2'},
        {'message': 'executed', 'stamp_ns': str(400 * MS), 'arrival_ns': str(520 * MS),
         'switch_ns': str(500 * MS), 'points skipped': '2',
         **{f'jump {n}': ('-0.02' if n == 'joint1' else '0.0') for n in NAMES}},
        {'message': 'refused: NaN', 'stamp_ns': '0', 'arrival_ns': str(700 * MS)},
    ]
    return SimRun(joint_names=NAMES, state_t=t, state_q=state, command_t=t, command_q=command,
                  events=events,
                  node_status=[{'message': 'ok', 'limit clips': '3', 'action space':
                                'joint_velocity', 'chunk smoothing': 'rtc'}],
                  sim_status={'oxygen_sim: chunk executor': [{'hold time (s)': '0.250',
                                                              'chunks superseded': '1',
                                                              'chunks resumed after a hold':
                                                              '1'}]})


def test_metrics_of_a_crafted_run():
    m = compute_metrics(crafted_run(), 'rtc', wall_s=2.0)
    assert (m.chunks_received, m.chunks_executed, m.chunks_refused) == (3, 2, 1)
    assert m.latency_p50_ms == pytest.approx(100.0)  # 80 and 120 ms
    assert m.points_skipped == 3 and m.hold_s == 0.25 and m.chunks_superseded == 1
    assert m.chunks_resumed == 1
    assert m.jump_p50 == pytest.approx(0.02) and m.jump_max == pytest.approx(0.02)
    assert m.jerk_boundary_p50 == pytest.approx(2 * 0.02 / 0.01 ** 3)
    assert m.jerk_interior_p99 == pytest.approx(0.0, abs=1e-6)
    assert m.tracking_p99 == pytest.approx(np.percentile(0.001 * np.arange(100), 99))
    assert m.arm_motion == pytest.approx(0.099)
    assert m.real_time_factor == pytest.approx(0.99 / 2.0)
    assert m.limit_clips == 'limit clips 3' and m.node_smoothing == 'chunk smoothing rtc'
    text = summary(m)
    assert 'p50 100.0 ms' in text and '1 superseded, 1 resumed after a hold' in text
    assert ('node /diagnostics: limit clips 3; action space joint_velocity; chunk smoothing '
            'rtc') in text
    assert 'rtc' in compare_table([m]).splitlines()[1]


def test_absent_node_counters_read_n_a():
    assert node_values([], 'clip') == 'n/a'
    assert node_values([{'message': 'ok', 'rate (Hz)': '10'}], 'clip') == 'n/a'
    run = crafted_run()
    run.node_status = []
    assert compute_metrics(run, 'none', 1.0).limit_clips == 'n/a'


def test_trim_keeps_the_window():
    part = trim(crafted_run(), 450 * MS, 1000 * MS)
    assert part.state_t[0] == 450 * MS and len(part.executed()) == 1
    assert math.isnan(compute_metrics(SimRun(joint_names=NAMES), 'none', 0.0).jump_p50)


def test_each_robot_is_reported_by_name():
    one = compute_metrics(crafted_run(), 'none', wall_s=1.0)
    left = compute_metrics(crafted_run(), 'none', wall_s=1.0, robot='left')
    assert summary(left).startswith('robot: left; smoothing: none;')
    assert summary(one).startswith('smoothing: none;')
    assert '2 executed (2.0 per sim second)' in summary(left)  # 0.99 s of joint states
    header, *rows = compare_table([left, replace(left, robot='right')]).split('\n')
    assert header.split()[:2] == ['smoothing', 'robot']
    assert [r.split()[:2] for r in rows] == [['none', 'left'], ['none', 'right']]
    assert 'robot' not in compare_table([one]).splitlines()[0]
