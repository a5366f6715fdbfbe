"""
Two arms, one node over real DDS: ``oxygen_sim robots:=[left, right]`` and ``oxygen_node``.

The node serves both arms as its ``robots`` (``config/sim.yaml`` with ``sim.arms``'s
parameters, as ``oxygen_demo sim --robots 2`` runs it), on sim time. Each arm gets chunks on
its own topic naming its own joints (``left_joint1`` ..), stamped in sim time; its executor
accepts and executes them, none refused (a chunk of the other arm's joints would be), and its
commanded positions are exactly what its own chunks say.
"""

from diagnostic_msgs.msg import DiagnosticArray
from oxygen_ros.ros.topics import qos_profile, QosRole
from oxygen_ros.sim.arms import arm_joints, arm_names, COMMAND_JOINTS
from oxygen_ros.tools.demo.sim import node_args
from oxygen_ros.tools.demo.sim_bag import ArmTopics
from oxygen_ros.units import NS_PER_S
import pytest
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from sim_loop import chunk_events, replay, stamp_ns
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

SIM_SECONDS = 2.0
ARMS = arm_names(2)
INSTRUCTIONS = {'left': 'pick up the red cup', 'right': 'push the red cup'}


@pytest.mark.ros
@pytest.mark.slow
def test_two_arms_each_execute_their_own_chunks(ros_node, ros_processes):
    best_effort = QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT)
    clock = ros_node.collect('/clock', Clock, best_effort)
    topics = {arm: ArmTopics.of(arm) for arm in ARMS}
    chunks = {a: ros_node.collect(t.chunks, JointTrajectory, 100) for a, t in topics.items()}
    commands = {a: ros_node.collect(t.command, JointState, 1000) for a, t in topics.items()}
    events = {a: ros_node.collect(t.events, DiagnosticArray, 1000) for a, t in topics.items()}
    node = ros_processes.start(*node_args('none', 1, ['-p', "instruction:=''"], ARMS))
    sim = ros_processes.start('oxygen_ros.sim.app', '--ros-args', '-p', 'robots:=[left,right]')
    for t in topics.values():  # every collector matched before the loop starts (see the
        for topic in (t.chunks, t.events, t.command):  # one-arm test)
            assert ros_node.wait_for_publishers(topic, timeout_s=120), \
                (topic, node.output()[-3000:], sim.output()[-2000:])
        assert ros_node.spin_until(
            lambda: ros_node.node.count_subscribers(t.chunks) >= 2, timeout_s=60)
    latched = qos_profile(QosRole.LATCHED)
    for arm, text in INSTRUCTIONS.items():
        pub = ros_node.node.create_publisher(String, f'/{arm}/oxygen/instruction', latched)
        pub.publish(String(data=text))

    def sim_now():
        return 0 if not clock.msgs else \
            clock.msgs[-1].clock.sec * NS_PER_S + clock.msgs[-1].clock.nanosec

    assert ros_node.spin_until(lambda: all(len(c) > 0 for c in chunks.values()),
                               timeout_s=120), \
        f'{[len(c) for c in chunks.values()]}:\n{node.output()[-3000:]}\n{sim.output()[-2000:]}'
    first_ns = max(stamp_ns(c.msgs[0].header) for c in chunks.values())
    end_ns = first_ns + round(SIM_SECONDS * NS_PER_S)
    assert ros_node.spin_until(lambda: sim_now() >= end_ns, timeout_s=60), sim.output()[-2000:]
    assert sim.stop() == 0, sim.output()
    assert node.stop() == 0, node.output()
    ros_node.spin_for(0.5)

    for arm in ARMS:
        own = arm_joints(COMMAND_JOINTS, arm)
        assert {tuple(m.joint_names) for m in chunks[arm].msgs} == {own}, arm
        assert all(0 < stamp_ns(m.header) <= sim_now() for m in chunks[arm].msgs), arm
        refused, accepted, executed = chunk_events(events[arm].msgs)
        assert not refused, (arm, refused[:3])
        assert len(accepted) >= 5 and len(executed) >= 5, (arm, len(accepted), len(executed))
        assert [int(a['stamp_ns']) for a in accepted] == \
            [stamp_ns(m.header) for m in chunks[arm].msgs[:len(accepted)]], arm
        assert tuple(commands[arm].msgs[0].name) == own
        matched, compared, mismatches, _ = replay(accepted, chunks[arm].msgs,
                                                  commands[arm].msgs, first_ns, end_ns)
        assert compared >= 50 and matched == compared, (arm, matched, compared, mismatches[:5])
