"""
The ``oxygen`` node over real DDS: the node runs in a subprocess (tiny preset, config/test.yaml).

Each test has its own ROS domain. The test process publishes inputs (or replays the demo bag
with ``oxygen_bag replay``), collects the node's outputs, and drives the lifecycle and parameter
services with rclpy clients. Windows and rates have margins for a shared 2-core machine; every
wait is on a condition (matched endpoints, a state, a message), not on a blind sleep.
"""

import math
import re
import signal
import time

from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.msg import State, Transition
from lifecycle_msgs.srv import ChangeState, GetState
import numpy as np
from oxygen_ros.control.trajectory_msg import trajectory_from_msg
from oxygen_ros.resources import config_file
from oxygen_ros.ros.diagnostics import Level, status_values
from oxygen_ros.ros.images.raw import rgb_to_image
from oxygen_ros.ros.stamps import duration_to_ns, ns_to_stamp, stamp_to_ns
from oxygen_ros.tools.bag.make_demo import JOINT_NAMES
from oxygen_ros.tools.bag.topics import (
    CAMERA_TOPICS, INSTRUCTION_TOPIC, JOINT_STATES_TOPIC, qos_profile, QosRole)
from oxygen_ros.units import NS_PER_S
import pytest
from rcl_interfaces.msg import Parameter as ParameterMsg
from rcl_interfaces.srv import SetParameters
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from rosbags.rosbag2 import Reader
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

pytestmark = pytest.mark.ros

NODE = 'oxygen_ros.ros.node'
RATE_HZ = 10.0  # config/test.yaml
ACTION_DT_NS = 50_000_000
HORIZON, ACTION_JOINTS = 4, list(JOINT_NAMES[:7])  # the tiny preset
CAMERAS = ('base_0_rgb', 'left_wrist_0_rgb')
START_TIMEOUT_S = 60.0
RELIABLE = qos_profile(QosRole.RELIABLE)


def start_node(ros_processes, *params):
    args = ['--ros-args', '--params-file', str(config_file('test'))]
    for p in params:
        args += ['-p', p]
    return ros_processes.start(NODE, *args)


def call(ros_node, client, request, timeout_s=20.0):
    """Call a service; resend if the reply is lost (a request sent right after discovery)."""
    assert client.wait_for_service(timeout_sec=timeout_s), client.srv_name
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        future = client.call_async(request)
        if ros_node.spin_until(future.done, 3.0):
            return future.result()
        client.remove_pending_request(future)
    pytest.fail(f'{client.srv_name} did not answer in {timeout_s} s')


class Lifecycle:
    """Clients of the node's lifecycle and parameter services."""

    def __init__(self, ros_node, proc):
        self.ros_node, self.proc = ros_node, proc
        node = ros_node.node
        self.get = node.create_client(GetState, '/oxygen/get_state')
        self.change = node.create_client(ChangeState, '/oxygen/change_state')
        self.params = node.create_client(SetParameters, '/oxygen/set_parameters')

    def state(self):
        return call(self.ros_node, self.get, GetState.Request()).current_state.id

    def wait_for(self, state_id, timeout_s=START_TIMEOUT_S):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.popen.poll() is None, self.proc.output()
            if self.get.service_is_ready() and self.state() == state_id:
                return
            self.ros_node.spin_for(0.1)
        pytest.fail(f'node not in state {state_id} after {timeout_s} s:\n{self.proc.output()}')

    def transition(self, transition_id):
        request = ChangeState.Request(transition=Transition(id=transition_id))
        return call(self.ros_node, self.change, request).success

    def set_parameter(self, name, value):
        msg = ParameterMsg(name=name, value=Parameter(name, value=value).get_parameter_value())
        request = SetParameters.Request(parameters=[msg])
        [result] = call(self.ros_node, self.params, request).results
        return result


class Feeder:
    """Publishes the node's inputs from the test process (small images, 20 Hz)."""

    def __init__(self, ros_node):
        self.ros_node = ros_node
        node = ros_node.node
        self.images = {slot: node.create_publisher(Image, CAMERA_TOPICS[slot],
                                                   qos_profile(QosRole.SENSOR_DATA))
                       for slot in CAMERAS}
        self.joints = node.create_publisher(JointState, JOINT_STATES_TOPIC, RELIABLE)
        self.instruction = node.create_publisher(
            String, INSTRUCTION_TOPIC, qos_profile(QosRole.LATCHED))
        self.rgb = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
        self.published_stamps = []

    def wait_for_node(self):
        for pub in [*self.images.values(), self.joints, self.instruction]:
            assert self.ros_node.wait_for_subscribers(pub), pub.topic_name

    def now_ns(self):
        return self.ros_node.node.get_clock().now().nanoseconds

    def run(self, seconds, cameras=CAMERAS, image_age_s=0.0, broken=None, joints=None):
        """Publish for ``seconds``; ``broken(msg)`` spoils the base image, ``joints`` = values."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            now = self.now_ns()
            stamp = now - round(image_age_s * NS_PER_S)
            for slot in cameras:
                msg = rgb_to_image(self.rgb, stamp, slot)
                if broken is not None and slot == 'base_0_rgb':
                    broken(msg)
                self.images[slot].publish(msg)
            self.published_stamps.append(stamp)
            state = JointState(name=list(JOINT_NAMES),
                               position=[0.1] * 8 if joints is None else joints)
            state.header.stamp = rgb_to_image(self.rgb, now, '').header.stamp
            self.joints.publish(state)
            self.ros_node.spin_for(0.05)


def outputs(ros_node):
    return {
        'chunks': ros_node.collect('/oxygen/action_chunk', JointTrajectory, 100),
        'answers': ros_node.collect('/oxygen/answer', String, RELIABLE),
        'memory': ros_node.collect('/oxygen/memory', String, RELIABLE),
        'diagnostics': ros_node.collect('/diagnostics', DiagnosticArray, 100),
    }


def received_between(collector, t0_ns, t1_ns):
    return [r.msg for r in collector.messages if t0_ns < r.received_ns <= t1_ns]


def check_chunk(msg):
    assert list(msg.joint_names) == ACTION_JOINTS and msg.header.frame_id == 'base_link'
    assert [duration_to_ns(p.time_from_start) for p in msg.points] == \
        [i * ACTION_DT_NS for i in range(HORIZON)]
    actions = trajectory_from_msg(msg).positions
    assert actions.shape == (HORIZON, 7) and np.isfinite(actions).all()


# ------------------------------------------------------------------------ replayed demo bag

def test_replay_gives_chunks_answers_memory_and_a_recorded_bag(ros_node, ros_processes,
                                                               demo_bag, tmp_path):
    proc = start_node(ros_processes)
    out = outputs(ros_node)
    base = ros_node.collect(CAMERA_TOPICS['base_0_rgb'], Image,
                            QoSProfile(depth=50, reliability=ReliabilityPolicy.BEST_EFFORT))
    Lifecycle(ros_node, proc).wait_for(State.PRIMARY_STATE_ACTIVE)
    recorded = tmp_path / 'out'
    record = ros_processes.start('oxygen_ros.tools.bag.record', str(recorded),
                                 '/oxygen/action_chunk', '/oxygen/answer', '/oxygen/memory')
    assert ros_node.spin_until(
        lambda: ros_node.node.count_subscribers('/oxygen/memory') >= 2), record.output()
    replay = ros_processes.start(
        'oxygen_ros.tools.bag.replay', str(demo_bag.path), '--loop', '--wait-for-subscribers',
        '20', '--topics', *(CAMERA_TOPICS[s] for s in CAMERAS), JOINT_STATES_TOPIC,
        INSTRUCTION_TOPIC)
    chunks = out['chunks']
    assert ros_node.spin_until(lambda: len(chunks) >= 5, 30), proc.output()
    ask = ros_node.node.create_publisher(String, '/oxygen/ask', RELIABLE)
    assert ros_node.wait_for_subscribers(ask)
    ask.publish(String(data='what is on the table?'))
    start = len(chunks)
    ros_node.spin_until(lambda: len(out['memory']) >= 4 and len(chunks) >= start + 50, 15)
    ros_node.spin_for(1.0)  # a second answer would have arrived by now
    assert replay.stop(signal.SIGINT) == 0, replay.output()
    assert record.stop(signal.SIGINT) == 0, record.output()
    ros_node.spin_for(0.3)

    # Rate after warm-up: 10 Hz +- 10 %.
    times = [r.received_ns for r in chunks.messages[start:]]
    rate = (len(times) - 1) * NS_PER_S / (times[-1] - times[0])
    assert abs(rate - RATE_HZ) <= 0.1 * RATE_HZ, (rate, proc.output())
    # Each chunk: H points of A finite values at i * action_dt, stamped with an input image.
    image_stamps = {stamp_to_ns(m.header.stamp) for m in base.msgs}
    stamps = [stamp_to_ns(m.header.stamp) for m in chunks.msgs]
    for msg in chunks.msgs:
        check_chunk(msg)
    # (The test's own image subscription matches the replay 1-2 s later than the node's.)
    checked = [s for s in stamps if s >= min(image_stamps)]
    assert len(checked) >= 40 and set(checked) <= image_stamps
    assert stamps == sorted(stamps)
    # One question, one answer.
    assert len(out['answers']) == 1
    assert not out['answers'].msgs[0].data.startswith('no answer'), out['answers'].msgs
    # Memory notes every memory_period (1 s) once decoded.
    note_times = np.array([r.received_ns for r in out['memory'].messages]) / NS_PER_S
    assert len(note_times) >= 4
    assert 0.8 <= np.median(np.diff(note_times)) <= 1.6, np.diff(note_times)
    # The recorded bag holds what the subscriber got (from the recorder's first message on).
    bag = {}
    with Reader(recorded) as reader:
        for conn, _, raw in reader.messages():
            cls = JointTrajectory if conn.topic.endswith('chunk') else String
            bag.setdefault(conn.topic, []).append(deserialize_message(bytes(raw), cls))

    def key(msg):
        return stamp_to_ns(msg.header.stamp), trajectory_from_msg(msg).positions.tobytes()

    recorded_keys, live_keys = [key(m) for m in bag['/oxygen/action_chunk']], \
        [key(m) for m in chunks.msgs]
    first = live_keys.index(recorded_keys[0])
    assert len(recorded_keys) >= 50
    assert recorded_keys == live_keys[first:first + len(recorded_keys)]
    assert [m.data for m in bag['/oxygen/answer']] == [m.data for m in out['answers'].msgs]
    # Memory notes: the recorder starts after and stops before the test's subscriber, and the
    # node keeps writing notes meanwhile, so the bag holds a contiguous run of the live notes.
    recorded_notes, live_notes = [m.data for m in bag['/oxygen/memory']], \
        [m.data for m in out['memory'].msgs]
    assert recorded_notes and any(
        live_notes[i:i + len(recorded_notes)] == recorded_notes
        for i in range(len(live_notes) - len(recorded_notes) + 1)), (recorded_notes, live_notes)
    assert proc.popen.poll() is None


# ------------------------------------------------------------------------------- bad input

def spoil_encoding(msg):
    msg.encoding, msg.step = '16UC1', msg.width * 2


def truncate(msg):
    msg.data = msg.data[:len(msg.data) // 2]


PHASES = [
    # name, feeder arguments, the diagnostics counter (None: valid input), the reason
    ('missing camera', {'cameras': CAMERAS[:1]}, 'missing camera',
     "no image received yet from camera(s) ['left_wrist_0_rgb']"),
    ('no instruction', {}, 'no instruction', 'no instruction yet'),
    ('valid', {}, None, None),
    ('nan joints', {'joints': [0.1, math.nan] + [0.1] * 6}, 'bad joints',
     "non-finite positions for joints ['joint_2']"),
    ('valid', {}, None, None),
    ('stale', {'image_age_s': 2.0}, 'stale', 'base_0_rgb is 2.0'),
    ('valid', {}, None, None),
    ('16UC1', {'broken': spoil_encoding}, 'bad image', "unsupported image encoding '16UC1'"),
    ('valid', {}, None, None),
    ('truncated', {'broken': truncate}, 'bad image', 'data has 4608'),
    ('valid', {}, None, None),
]


def test_bad_inputs_are_refused_counted_and_recovered(ros_node, ros_processes):
    proc = start_node(ros_processes)
    out = outputs(ros_node)
    feeder = Feeder(ros_node)
    Lifecycle(ros_node, proc).wait_for(State.PRIMARY_STATE_ACTIVE)
    feeder.wait_for_node()
    chunks, diagnostics = out['chunks'], out['diagnostics']
    margin_ns = 300_000_000
    for name, kwargs, counter, reason in PHASES:
        if name == 'valid':
            feeder.instruction.publish(String(data='pick up the coffee cup'))
        t0 = feeder.now_ns()
        feeder.run(1.5 if counter else 2.0, **kwargs)
        t1 = feeder.now_ns()
        assert proc.popen.poll() is None, proc.output()
        got = received_between(chunks, t0 + margin_ns, t1)
        if counter is None:
            assert len(got) >= 8, (name, len(got), proc.output())
            continue
        assert got == [], (name, proc.output())
        statuses = [d.status[0] for d in received_between(diagnostics, t0 + margin_ns, t1)]
        assert statuses and all(s.level in (Level.WARN.octet, Level.ERROR.octet)
                                for s in statuses), (name, [s.message for s in statuses])
        last = status_values(statuses[-1])
        assert last['last rejection'].startswith(f'{counter}: '), (name, last)
        assert reason in last['last rejection'], (name, last)
        assert int(last[f'rejected: {counter}']) > 0
    # Back to OK once a whole diagnostics period passed without rejections.
    feeder.run(1.5)
    assert diagnostics.msgs[-1].status[0].level == Level.OK.octet, \
        [d.status[0].message for d in diagnostics.msgs[-4:]]
    for msg in chunks.msgs:
        check_chunk(msg)
    assert {stamp_to_ns(m.header.stamp) for m in chunks.msgs} <= set(feeder.published_stamps)


# ------------------------------------------------------------------ lifecycle and parameters

def test_lifecycle_and_parameter_services(ros_node, ros_processes):
    proc = start_node(ros_processes)
    out = outputs(ros_node)
    feeder = Feeder(ros_node)
    life = Lifecycle(ros_node, proc)
    life.wait_for(State.PRIMARY_STATE_ACTIVE)
    feeder.wait_for_node()
    feeder.instruction.publish(String(data='pick up the coffee cup'))
    chunks = out['chunks']
    feeder.run(1.5)
    assert len(chunks) >= 5, proc.output()

    assert life.transition(Transition.TRANSITION_DEACTIVATE)
    assert life.state() == State.PRIMARY_STATE_INACTIVE
    t0 = feeder.now_ns()
    feeder.run(1.5)
    assert received_between(chunks, t0 + 200_000_000, feeder.now_ns()) == []
    assert life.transition(Transition.TRANSITION_ACTIVATE)
    t0 = feeder.now_ns()
    feeder.run(1.5)
    assert len(received_between(chunks, t0, feeder.now_ns())) >= 8

    result = life.set_parameter('control_rate_hz', 5000.0)
    assert not result.successful and 'out of range' in result.reason
    result = life.set_parameter('preset', 'demo')
    assert not result.successful and 'read-only' in result.reason
    result = life.set_parameter('action_dt', 'fast')
    assert not result.successful and 'type' in result.reason
    assert life.set_parameter('control_rate_hz', 5.0).successful
    assert life.set_parameter('frame_id', 'table').successful
    feeder.run(0.5)
    t0 = feeder.now_ns()
    feeder.run(2.5)
    slow = received_between(chunks, t0, feeder.now_ns())
    assert 10 <= len(slow) <= 14, len(slow)  # 5 Hz for 2.5 s
    assert {m.header.frame_id for m in slow} == {'table'}

    assert life.transition(Transition.TRANSITION_ACTIVE_SHUTDOWN)
    assert proc.wait(timeout_s=20) == 0, proc.output()
    assert 'terminate called' not in proc.output()


@pytest.mark.parametrize('sig', [signal.SIGINT, signal.SIGTERM], ids=['SIGINT', 'SIGTERM'])
def test_signals_exit_cleanly(ros_node, ros_processes, sig):
    proc = start_node(ros_processes)
    out = outputs(ros_node)
    feeder = Feeder(ros_node)
    Lifecycle(ros_node, proc).wait_for(State.PRIMARY_STATE_ACTIVE)
    feeder.wait_for_node()
    feeder.instruction.publish(String(data='pick up the coffee cup'))
    feeder.run(1.0)
    assert len(out['chunks']) >= 3, proc.output()
    assert proc.stop(sig, timeout_s=20) == 0, proc.output()
    assert 'terminate called' not in proc.output() and 'Traceback' not in proc.output()


def test_configure_failure_keeps_the_node_up(ros_node, ros_processes, tmp_path):
    proc = start_node(ros_processes, f'checkpoint:={tmp_path / "missing"}')
    diagnostics = ros_node.collect('/diagnostics', DiagnosticArray, 10)

    def failed():
        return any(d.status[0].message.startswith('engine failed: configure failed')
                   for d in diagnostics.msgs)

    assert ros_node.spin_until(failed, START_TIMEOUT_S), proc.output()
    status = diagnostics.msgs[-1].status[0]
    assert status.level == Level.ERROR.octet and str(tmp_path / 'missing') in status.message
    assert Lifecycle(ros_node, proc).state() == State.PRIMARY_STATE_UNCONFIGURED
    assert proc.stop(signal.SIGINT) == 0, proc.output()


# ------------------------------------------------------------------- simulated time (/clock)
# Stamps, the stale check and rates follow the node clock: fresh frames on the sim clock are
# acted on (chunks carry their sim stamps), stale ones refused whatever the wall clock says;
# a bag replayed with its original stamps plus --clock is accepted.

SIM_T0_NS = 5_000 * NS_PER_S
"""A sim time far from the wall clock (1970 + 83 min): wall-clock stamps would be stale."""


class SimFeeder(Feeder):
    """Publishes ``/clock`` (sim time advancing with the wall clock) and stamps inputs with it."""

    def __init__(self, ros_node):
        super().__init__(ros_node)
        self.clock = ros_node.node.create_publisher(
            Clock, '/clock', QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT))
        self.t0 = time.monotonic()

    def now_ns(self):
        sim = SIM_T0_NS + round((time.monotonic() - self.t0) * NS_PER_S)
        self.clock.publish(Clock(clock=ns_to_stamp(sim)))
        return sim


def test_sim_time_accepts_fresh_frames_and_refuses_stale_ones(ros_node, ros_processes):
    proc = start_node(ros_processes, 'use_sim_time:=true', 'memory_period:=0.0')
    out = outputs(ros_node)
    feeder = SimFeeder(ros_node)
    life = Lifecycle(ros_node, proc)
    feeder.wait_for_node()
    feeder.instruction.publish(String(data='pick up the cup'))
    feeder.run(1.0)  # the clock runs before the node is active: the timer needs it
    life.wait_for(State.PRIMARY_STATE_ACTIVE)
    feeder.run(4.0)
    fresh = set(feeder.published_stamps)
    chunks = out['chunks'].msgs
    assert len(chunks) >= 5, proc.output()
    for msg in chunks:
        check_chunk(msg)
        assert stamp_to_ns(msg.header.stamp) in fresh  # sim stamps, carried through
    n_fresh = len(chunks)
    feeder.run(3.0, image_age_s=2.0)  # 2 s old on the sim clock, > max_observation_age 0.5
    stale = set(feeder.published_stamps) - fresh
    ros_node.spin_for(0.5)
    later = out['chunks'].msgs[n_fresh:]
    assert not [m for m in later if stamp_to_ns(m.header.stamp) in stale]
    assert len(later) <= 2  # at most the cycles still acting on the last fresh frame
    values = status_values(out['diagnostics'].msgs[-1].status[0])
    assert int(values['rejected: stale']) > 0
    assert 'in the future' not in values['last rejection']
    assert re.match(r'stale: base_0_rgb is 2\.\d+ s old', values['last rejection'])


def test_bag_with_original_stamps_and_clock_is_accepted(ros_node, ros_processes, demo_bag):
    proc = start_node(ros_processes, 'use_sim_time:=true', 'memory_period:=0.0')
    out = outputs(ros_node)
    life = Lifecycle(ros_node, proc)
    life.wait_for(State.PRIMARY_STATE_ACTIVE, timeout_s=90.0)
    replay = ros_processes.start('oxygen_ros.tools.bag.replay', str(demo_bag.path), '--loop',
                                 '--keep-stamps', '--clock', '--wait-for-subscribers', '20')
    start, end = demo_bag.config.start_ns, demo_bag.config.start_ns + round(
        demo_bag.config.duration_s * NS_PER_S)
    assert ros_node.spin_until(lambda: len(out['chunks']) >= 5, timeout_s=60.0), \
        proc.output() + replay.output()
    assert replay.stop() == 0
    for msg in out['chunks'].msgs:
        check_chunk(msg)
        assert start <= stamp_to_ns(msg.header.stamp) <= end  # the bag's own stamps
