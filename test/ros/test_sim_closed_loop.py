"""
Closed loop over real DDS: ``oxygen_sim`` + ``oxygen_node`` (demo preset, ``config/sim.yaml``).

The sim and the node run as subprocesses on the test's fresh ROS domain for a few seconds of
sim time; this process collects the topics. It checks that chunks are received and executed
(none refused: the node's chunks are joint positions within the limits), that the arm moves by
far more than it drifts while holding, and that the commanded positions are exactly what the
chunks say: an offline ``ChunkExecutor`` fed the collected chunks at their recorded arrival
times reproduces the simulator's ``~/joint_command``.
"""

from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
from oxygen_ros.ros.topics import INSTRUCTION_TOPIC, qos_profile, QosRole
from oxygen_ros.tools.demo.sim import node_args
from oxygen_ros.units import NS_PER_S
import pytest
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from sim_loop import chunk_events, replay, stamp_ns
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

SIM_SECONDS = 4.0
NODE_MODULE = 'oxygen_ros.ros.node'
INSTRUCTION = 'pick up the red cup'  # config/sim.yaml's


@pytest.mark.ros
@pytest.mark.slow
def test_sim_and_node_close_the_loop(ros_node, ros_processes):
    clock = ros_node.collect('/clock', Clock, QoSProfile(
        depth=10, reliability=ReliabilityPolicy.BEST_EFFORT))
    chunks = ros_node.collect('/oxygen/action_chunk', JointTrajectory, 100)
    commands = ros_node.collect('/oxygen_sim/joint_command', JointState, 1000)
    states = ros_node.collect('/joint_states', JointState, 1000)
    events = ros_node.collect('/oxygen_sim/chunk_events', DiagnosticArray, 1000)
    # The node refuses to act until it has an instruction: give it one only once this process
    # has discovered every publisher it collects from and the sim takes the node's chunks, so
    # that no chunk, event or command of the loop is sent before its collector matched (DDS
    # discovery takes seconds on a loaded machine; a message sent before it is lost).
    node = ros_processes.start(NODE_MODULE, *node_args('none', 1, ['-p', "instruction:=''"])[1:])
    sim = ros_processes.start('oxygen_ros.sim.app')
    for topic in ('/oxygen/action_chunk', '/oxygen_sim/chunk_events', '/oxygen_sim/joint_command',
                  '/joint_states', '/clock'):
        assert ros_node.wait_for_publishers(topic, timeout_s=120), \
            (topic, node.output()[-3000:], sim.output()[-2000:])
    assert ros_node.spin_until(
        lambda: ros_node.node.count_subscribers('/oxygen/action_chunk') >= 2, timeout_s=60)
    instruction = ros_node.node.create_publisher(String, INSTRUCTION_TOPIC,
                                                 qos_profile(QosRole.LATCHED))
    instruction.publish(String(data=INSTRUCTION))

    def sim_now():
        if not clock.msgs:
            return 0
        return clock.msgs[-1].clock.sec * NS_PER_S + clock.msgs[-1].clock.nanosec

    assert ros_node.spin_until(lambda: len(chunks) > 0, timeout_s=120), \
        f'no chunk:\n{node.output()[-3000:]}\n{sim.output()[-2000:]}'
    first_ns = stamp_ns(chunks.msgs[0].header)
    end_ns = first_ns + round(SIM_SECONDS * NS_PER_S)
    assert ros_node.spin_until(lambda: sim_now() >= end_ns, timeout_s=60), sim.output()[-2000:]
    assert sim.stop() == 0, sim.output()
    assert node.stop() == 0, node.output()
    ros_node.spin_for(0.5)

    refused, accepted, executed = chunk_events(events.msgs)
    assert not refused, refused[:3]
    assert len(accepted) >= 10 and len(executed) >= 10, (len(accepted), len(executed))

    # The arm moves: far more during the closed loop than while holding before the first chunk.
    t = np.array([stamp_ns(m.header) for m in states.msgs])
    q = np.array([m.position[:7] for m in states.msgs])
    before, during = q[t < first_ns], q[(t >= first_ns) & (t <= end_ns)]
    drift = np.ptp(before[-50:], axis=0).max() if len(before) > 2 else 0.0
    moved = np.ptp(during, axis=0).max()
    assert moved > 0.02 and moved > 10 * drift, (moved, drift)

    # Commanded positions follow the chunks: replay them offline at their arrival times.
    assert [int(a['stamp_ns']) for a in accepted] == \
        [stamp_ns(m.header) for m in chunks.msgs[:len(accepted)]]
    matched, compared, mismatches, executor = replay(accepted, chunks.msgs, commands.msgs,
                                                     first_ns, end_ns)
    assert compared >= 100 and matched == compared, (matched, compared, mismatches[:5])
    assert executor.stats.num_executed >= 10
