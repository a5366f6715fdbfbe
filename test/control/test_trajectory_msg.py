"""JointTrajectory messages to chunks (real trajectory_msgs messages, no node)."""

from builtin_interfaces.msg import Duration, Time
import numpy as np
from oxygen_ros.control.chunk_executor import ChunkExecutor, ChunkRefused
from oxygen_ros.control.trajectory_msg import trajectory_from_msg
import pytest
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint


def trajectory(rows, velocities=None, stamp=(12, 500_000_000), dt_ns=100_000_000):
    msg = JointTrajectory()
    msg.header.stamp = Time(sec=stamp[0], nanosec=stamp[1])
    msg.joint_names = ['a', 'b']
    for i, row in enumerate(rows):
        point = JointTrajectoryPoint(positions=row)
        if velocities is not None and velocities[i] is not None:
            point.velocities = velocities[i]
        t = i * dt_ns
        point.time_from_start = Duration(sec=t // 10**9, nanosec=t % 10**9)
        msg.points.append(point)
    return msg


def test_positions_times_and_stamp():
    c = trajectory_from_msg(trajectory([[0.0, 1.0], [0.5, 1.5], [1.0, 2.0]],
                                       dt_ns=700_000_000))
    assert c.joint_names == ('a', 'b') and c.stamp_ns == 12_500_000_000
    assert c.times_from_start_ns == (0, 700_000_000, 1_400_000_000)
    assert c.positions.tolist() == [[0.0, 1.0], [0.5, 1.5], [1.0, 2.0]]
    assert c.velocities is None
    assert c.times_ns.tolist() == [12_500_000_000, 13_200_000_000, 13_900_000_000]


def test_velocities_on_every_point_are_used():
    c = trajectory_from_msg(trajectory([[0.0, 0.0], [0.1, 0.0]],
                                       velocities=[[1.0, 0.0], [1.0, 0.0]]))
    assert c.velocities.tolist() == [[1.0, 0.0], [1.0, 0.0]]


@pytest.mark.parametrize('rows, velocities, reason', [
    ([[0.0], [0.0, 0.0]], None, 'point 0 has 1 positions for 2 joint names'),
    ([[0.0, 0.0], [0.0, 0.0]], [[1.0], None], 'point 0 has 1 velocities for 2 joint names'),
    ([[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], None], 'velocities on 1 of 2 points'),
])
def test_malformed_messages_are_refused(rows, velocities, reason):
    with pytest.raises(ChunkRefused, match=reason):
        trajectory_from_msg(trajectory(rows, velocities))


def test_executor_runs_a_message():
    executor = ChunkExecutor(('a', 'b'), (0.0, 0.0))
    msg = trajectory([[0.0, 1.0], [0.2, 1.0]])
    assert executor.submit(trajectory_from_msg(msg), 12_500_000_000)
    cmd = executor.command(12_550_000_000)
    assert np.allclose(cmd.positions, [0.1, 1.0]) and np.allclose(cmd.velocities, [2.0, 0.0])
