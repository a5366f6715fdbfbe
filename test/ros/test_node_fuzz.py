"""
Fuzzed input over real DDS: hypothesis-drawn messages on every topic the node subscribes to.

One node (tiny preset; base camera raw, left wrist compressed; ``max_observation_age`` 0.3 s)
takes every example. Each example is a window:

1. wait until the previous valid inputs are older than ``max_observation_age`` (so a fuzzed
   message lost by best-effort DDS cannot leave a fresh valid one in the node's cache);
2. publish the fuzzed message and, on the other topics, valid inputs stamped ``g`` (a stamp
   used once); for an out-of-order camera stamp, a valid image stamped ``g`` goes first;
3. for 0.35 s (3-4 control cycles) collect action chunks: after a case that must be refused,
   no chunk may carry ``g`` or the fuzzed message's own stamp;
4. recover: publish valid inputs with fresh stamps until a chunk carrying one of them arrives
   (the node is alive and acting again).

At the end: every chunk's stamp is one the test published as valid (never a fuzzed one), every
question got exactly one answer, the node process is still running and exits 0 on SIGINT.
"""

from dataclasses import dataclass, field
import time

from diagnostic_msgs.msg import DiagnosticArray
from fuzz_inputs import build, cases, DEFECTS, JOINTS, MAX_AGE_S, StampKind, Topic, WRIST
from hypothesis import given, HealthCheck, Phase, settings
from lifecycle_msgs.msg import State
import numpy as np
from oxygen_ros.ros.diagnostics import status_values
from oxygen_ros.ros.images.compressed import Codec, rgb_to_compressed
from oxygen_ros.ros.images.raw import rgb_to_image
from oxygen_ros.ros.images.transport import compressed_topic
from oxygen_ros.ros.stamps import ns_to_stamp, stamp_to_ns
from oxygen_ros.tools.bag.topics import (
    CAMERA_TOPICS, INSTRUCTION_TOPIC, JOINT_STATES_TOPIC, qos_profile, QosRole)
from oxygen_ros.tools.common.node_client import LifecycleClient
import pytest
from ros_load import start_node
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

pytestmark = [pytest.mark.ros, pytest.mark.slow]

EXAMPLES_PER_DEFECT = 4
"""Examples per (topic, defect) of ``DEFECTS``: 28 of them, 112 examples in all."""
WINDOW_S = 0.35
RECOVER_TIMEOUT_S = 20.0
INSTRUCTION = 'pick up the coffee cup'
BASE = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
WRIST_JPEG = rgb_to_compressed(WRIST, 0, 'wrist', Codec.JPEG)


@dataclass
class Ledger:
    """What the test published and saw."""

    valid_stamps: set = field(default_factory=set)
    fuzz_stamps: set = field(default_factory=set)
    last_valid_ns: int = 0
    asks: int = 0
    counts: dict = field(default_factory=dict)
    refused_windows: int = 0


class Harness:
    """Publishers of every input topic, the node's outputs, and the example windows."""

    def __init__(self, ros_node, proc):
        self.ros_node, self.proc = ros_node, proc
        node = ros_node.node
        sensor, reliable = qos_profile(QosRole.SENSOR_DATA), qos_profile(QosRole.RELIABLE)
        self.pubs = {
            Topic.BASE: node.create_publisher(Image, CAMERA_TOPICS['base_0_rgb'], sensor),
            Topic.WRIST: node.create_publisher(
                CompressedImage, compressed_topic(CAMERA_TOPICS['left_wrist_0_rgb']), sensor),
            Topic.JOINTS: node.create_publisher(JointState, JOINT_STATES_TOPIC, reliable),
            Topic.INSTRUCTION: node.create_publisher(String, INSTRUCTION_TOPIC,
                                                     qos_profile(QosRole.LATCHED)),
            Topic.ASK: node.create_publisher(String, '/oxygen/ask', reliable)}
        self.chunks = ros_node.collect('/oxygen/action_chunk', JointTrajectory, 100)
        self.answers = ros_node.collect('/oxygen/answer', String, reliable)
        self.diagnostics = ros_node.collect('/diagnostics', DiagnosticArray, 100)
        self.ledger = Ledger()

    def now_ns(self):
        return self.ros_node.node.get_clock().now().nanoseconds

    def publish_valid(self, skip=(), stamp_ns=None):
        """Publish valid inputs on every topic but ``skip``; return their stamp."""
        stamp = stamp_ns or self.now_ns()
        if Topic.BASE not in skip:
            self.pubs[Topic.BASE].publish(rgb_to_image(BASE, stamp, 'base'))
        if Topic.WRIST not in skip:
            WRIST_JPEG.header.stamp = ns_to_stamp(stamp)
            self.pubs[Topic.WRIST].publish(WRIST_JPEG)
        if Topic.JOINTS not in skip:
            state = JointState(name=list(JOINTS), position=[0.1] * len(JOINTS))
            state.header.stamp = ns_to_stamp(stamp)
            self.pubs[Topic.JOINTS].publish(state)
        self.ledger.valid_stamps.add(stamp)
        self.ledger.last_valid_ns = stamp
        return stamp

    def alive(self):
        assert self.proc.popen.poll() is None, self.proc.output()

    def recover(self):
        """Publish valid inputs every 50 ms until a chunk carries one of their stamps."""
        sent, first = set(), len(self.chunks)
        deadline = time.monotonic() + RECOVER_TIMEOUT_S
        while time.monotonic() < deadline:
            sent.add(self.publish_valid())
            self.ros_node.spin_for(0.05)
            if any(stamp_to_ns(m.header.stamp) in sent for m in self.chunks.msgs[first:]):
                return
            self.alive()
        pytest.fail(f'no action chunk from valid inputs within {RECOVER_TIMEOUT_S} s:\n'
                    f'{self.proc.output()[-3000:]}')

    def window(self, case):
        ledger = self.ledger
        ledger.counts[(case.topic.value, case.defect)] = \
            ledger.counts.get((case.topic.value, case.defect), 0) + 1
        wait_s = MAX_AGE_S + 0.05 - (self.now_ns() - ledger.last_valid_ns) / 1e9
        if wait_s > 0:
            self.ros_node.spin_for(wait_s)
        first = len(self.chunks)
        forbidden = set()
        if case.topic is Topic.INSTRUCTION:
            self.pubs[Topic.INSTRUCTION].publish(build(case, 0, 0))
            # reliable, and stored before the images below arrive (the previous valid images
            # are stale by now, so nothing can be acted on with the old instruction meanwhile)
            self.ros_node.spin_for(0.25)
            forbidden.add(self.publish_valid())
        elif case.topic is Topic.ASK:
            self.pubs[Topic.ASK].publish(build(case, 0, 0))
            ledger.asks += 1
            self.publish_valid()
        else:
            g = self.now_ns()
            previous = g
            if case.stamp.kind is StampKind.OUT_OF_ORDER:
                self.publish_valid(stamp_ns=g)  # a valid image, then the older one
                self.ros_node.spin_for(0.02)
            else:
                forbidden.add(self.publish_valid(skip=(case.topic,), stamp_ns=g))
            msg = build(case, self.now_ns(), previous)
            if hasattr(msg, 'header'):
                sec, nanosec = msg.header.stamp.sec, msg.header.stamp.nanosec
                ledger.fuzz_stamps.add(sec * 10**9 + nanosec)
                if case.topic is Topic.BASE or case.stamp.kind is not StampKind.OUT_OF_ORDER:
                    forbidden.add(sec * 10**9 + nanosec)
            self.pubs[case.topic].publish(msg)
        self.ros_node.spin_for(WINDOW_S)
        self.alive()
        if case.must_refuse:
            ledger.refused_windows += 1
            acted = {stamp_to_ns(m.header.stamp) for m in self.chunks.msgs[first:]}
            assert not acted & forbidden, (case, acted & forbidden, self.proc.output()[-3000:])
        if case.topic is Topic.INSTRUCTION:
            self.pubs[Topic.INSTRUCTION].publish(String(data=INSTRUCTION))
            self.ros_node.spin_for(0.05)
        self.recover()


def test_fuzzed_messages_never_crash_the_node_nor_make_it_act(ros_node, ros_processes):
    proc = start_node(ros_processes, 'image_transport.left_wrist_0_rgb:=compressed',
                      f'max_observation_age:={MAX_AGE_S}', 'memory_period:=0.0')
    harness = Harness(ros_node, proc)
    assert LifecycleClient(ros_node.node, ros_node.spin_until).wait_for(
        State.PRIMARY_STATE_ACTIVE, 60, lambda: proc.popen.poll() is None), proc.output()
    for pub in harness.pubs.values():
        assert ros_node.wait_for_subscribers(pub), pub.topic_name
    harness.pubs[Topic.INSTRUCTION].publish(String(data=INSTRUCTION))
    harness.recover()

    for topic, defects in DEFECTS.items():
        for defect in defects:
            @settings(max_examples=EXAMPLES_PER_DEFECT, deadline=None, database=None,
                      phases=[Phase.generate, Phase.shrink],
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
            @given(case=cases(topic, defect))
            def one_window(case):
                harness.window(case)

            one_window()
    ledger = harness.ledger
    print(f'fuzz: {sum(ledger.counts.values())} examples, {ledger.refused_windows} must-refuse '
          f'windows, {ledger.asks} questions; by topic/defect: {sorted(ledger.counts.items())}')
    # Every chunk carries a valid stamp, never a fuzzed one.
    acted = [stamp_to_ns(m.header.stamp) for m in harness.chunks.msgs]
    assert set(acted) <= ledger.valid_stamps
    assert not set(acted) & (ledger.fuzz_stamps - ledger.valid_stamps)
    # One answer per question.
    assert ros_node.spin_until(lambda: len(harness.answers) >= ledger.asks, 60), \
        (len(harness.answers), ledger.asks)
    ros_node.spin_for(1.0)
    assert len(harness.answers) == ledger.asks
    last = status_values(harness.diagnostics.msgs[-1].status[0])
    assert int(last['rejected: bad image']) > 0 and int(last['rejected: stale']) > 0
    assert int(last['rejected: bad joints']) > 0
    assert proc.stop() == 0, proc.output()
    assert 'Traceback' not in proc.output()
