"""Jump and jerk at chunk boundaries on crafted command streams."""

import numpy as np
from oxygen_ros.tools.demo.boundary_metrics import boundary_jerk, third_differences
import pytest

H_NS = 10_000_000  # 100 Hz
H = H_NS / 1e9


def test_third_differences_of_a_cubic_are_its_constant_jerk():
    t = np.arange(10) * H
    q = (t ** 3)[:, None]  # jerk 6
    assert third_differences(q, H)[:, 0] == pytest.approx(np.full(7, 6.0))


def test_a_jump_at_a_switch_shows_in_the_boundary_jerk_only():
    times = np.arange(20) * H_NS
    q = np.zeros((20, 2))
    q[:, 0] = 0.5 * times / 1e9  # constant velocity: no jerk
    q[12:, 1] = 0.01  # a 0.01 rad jump at sample 12
    switch = times[12] - H_NS // 2  # the switch falls between samples 11 and 12
    boundary, interior = boundary_jerk(times, q, [switch], H_NS)
    assert boundary[0, 1] == pytest.approx(2 * 0.01 / H ** 3)  # stencil weights 1, 3, 3, 1
    assert boundary[0, 0] == pytest.approx(0.0, abs=1e-6)
    assert interior.shape == (17 - 3, 2) and np.abs(interior).max() < 1e-6


def test_a_kink_gives_dv_over_h_squared():
    times = np.arange(12) * H_NS
    q = np.zeros((12, 1))
    q[6:, 0] = 0.3 * (times[6:] - times[6]) / 1e9  # velocity 0 -> 0.3 rad/s at sample 6
    boundary, _ = boundary_jerk(times, q, [times[6]], H_NS)
    assert boundary[0, 0] == pytest.approx(0.3 / H ** 2)


def test_stencils_across_a_dropped_sample_are_left_out():
    times = np.delete(np.arange(12) * H_NS, 6)
    q = np.zeros((11, 1))
    boundary, interior = boundary_jerk(times, q, [times[5] + 1], H_NS)
    assert np.isnan(boundary[0, 0])  # every stencil around the switch spans the gap
    assert interior.shape[0] == 5  # 8 stencils; the 3 that span the gap hold the switch


def test_shapes_are_checked():
    with pytest.raises(ValueError, match='do not match 3 sample times'):
        boundary_jerk([0, 1, 2], np.zeros((4, 1)), [], H_NS)
