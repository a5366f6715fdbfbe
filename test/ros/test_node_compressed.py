"""
The node with compressed cameras over real DDS (``image_transport.<slot>:=compressed``).

The base camera sends JPEG, the left wrist PNG, as ``sensor_msgs/CompressedImage`` on
``<topic>/compressed``; a truncated JPEG is refused as a bad image and the node recovers; a demo
bag written with ``--compressed jpeg`` replays into the node.
"""

from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.msg import State
from lxml import etree
import numpy as np
from oxygen_ros.control.trajectory_msg import trajectory_from_msg
from oxygen_ros.resources import share_dir
from oxygen_ros.ros.diagnostics import status_values
from oxygen_ros.ros.images.compressed import Codec, rgb_to_compressed
from oxygen_ros.ros.images.transport import compressed_topic
from oxygen_ros.ros.stamps import duration_to_ns, ns_to_stamp, stamp_to_ns
from oxygen_ros.tools.bag.make_demo import DemoBagConfig, JOINT_NAMES, write_demo_bag
from oxygen_ros.tools.bag.topics import (
    CAMERA_TOPICS, INSTRUCTION_TOPIC, JOINT_STATES_TOPIC, qos_profile, QosRole)
from oxygen_ros.tools.common.node_client import LifecycleClient
import pytest
from ros_load import start_node
from sensor_msgs.msg import CompressedImage, JointState
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

pytestmark = pytest.mark.ros

CODECS = {'base_0_rgb': Codec.JPEG, 'left_wrist_0_rgb': Codec.PNG}
PARAMS = [f'image_transport.{slot}:=compressed' for slot in CODECS]


def test_compressed_cameras_act_refuse_a_truncated_frame_and_replay(
        ros_node, ros_processes, tmp_path):
    proc = start_node(ros_processes, *PARAMS)
    chunks = ros_node.collect('/oxygen/action_chunk', JointTrajectory, 100)
    diagnostics = ros_node.collect('/diagnostics', DiagnosticArray, 100)
    life = LifecycleClient(ros_node.node, ros_node.spin_until)
    assert life.wait_for(State.PRIMARY_STATE_ACTIVE, 60, lambda: proc.popen.poll() is None), \
        proc.output()
    node = ros_node.node
    pubs = {slot: node.create_publisher(CompressedImage, compressed_topic(CAMERA_TOPICS[slot]),
                                        qos_profile(QosRole.SENSOR_DATA)) for slot in CODECS}
    joints = node.create_publisher(JointState, JOINT_STATES_TOPIC, qos_profile(QosRole.RELIABLE))
    instruction = node.create_publisher(String, INSTRUCTION_TOPIC, qos_profile(QosRole.LATCHED))
    for pub in [*pubs.values(), joints, instruction]:
        assert ros_node.wait_for_subscribers(pub), pub.topic_name
    # The raw topics are not subscribed when a camera is compressed.
    assert node.count_subscribers(CAMERA_TOPICS['base_0_rgb']) == 0
    instruction.publish(String(data='pick up the coffee cup'))
    rgb = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    frames = {slot: rgb_to_compressed(rgb, 0, slot, codec) for slot, codec in CODECS.items()}
    good_stamps, bad_stamps = set(), set()

    def run(seconds, truncate=False):
        end = ros_node.node.get_clock().now().nanoseconds + round(seconds * 1e9)
        while (now := ros_node.node.get_clock().now().nanoseconds) < end:
            for slot, pub in pubs.items():
                msg = frames[slot]
                msg.header.stamp = ns_to_stamp(now)
                if truncate and slot == 'base_0_rgb':
                    msg = CompressedImage(header=msg.header, format=msg.format,
                                          data=bytes(msg.data[:len(msg.data) - 40]))
                pub.publish(msg)
            (bad_stamps if truncate else good_stamps).add(now)
            state = JointState(name=list(JOINT_NAMES), position=[0.1] * 8)
            state.header.stamp = frames['base_0_rgb'].header.stamp
            joints.publish(state)
            ros_node.spin_for(0.05)

    run(2.0)
    acted = [stamp_to_ns(m.header.stamp) for m in chunks.msgs]
    assert len(acted) >= 8, proc.output()
    assert set(acted) <= good_stamps
    n_before = len(chunks)
    run(1.5, truncate=True)
    ros_node.spin_for(0.3)
    assert not {stamp_to_ns(m.header.stamp) for m in chunks.msgs} & bad_stamps, proc.output()
    last = status_values(diagnostics.msgs[-1].status[0])
    assert int(last['rejected: bad image']) > 0
    assert last['last rejection'].startswith(
        'bad image: camera base_0_rgb: jpeg of '), last['last rejection']
    assert 'has no end-of-image marker: truncated' in last['last rejection']
    assert len(chunks) - n_before <= 3  # cycles that ran before the first bad frame arrived
    run(1.5)
    assert len(chunks) - n_before >= 8, proc.output()

    # A demo bag written with --compressed jpeg, replayed into the node.
    bag = tmp_path / 'demo_jpeg'
    write_demo_bag(bag, DemoBagConfig(duration_s=1.0, compressed=Codec.JPEG))
    n_before = len(chunks)
    replay = ros_processes.start(
        'oxygen_ros.tools.bag.replay', str(bag), '--loop', '--wait-for-subscribers', '20',
        '--topics', *(compressed_topic(CAMERA_TOPICS[s]) for s in CODECS), JOINT_STATES_TOPIC)
    assert ros_node.spin_until(lambda: len(chunks) >= n_before + 10, 30), \
        (proc.output(), replay.output())
    assert replay.stop() == 0, replay.output()
    for msg in chunks.msgs:
        assert [duration_to_ns(p.time_from_start) for p in msg.points] == \
            [i * 50_000_000 for i in range(4)]
        assert np.isfinite(trajectory_from_msg(msg).positions).all()
    assert proc.popen.poll() is None
    assert proc.stop() == 0, proc.output()


def test_udp_only_profile_turns_shared_memory_off():
    ns = {'dds': 'http://www.eprosima.com/XMLSchemas/fastRTPS_Profiles'}
    root = etree.parse(str(share_dir() / 'config' / 'fastdds_udp_only.xml')).getroot()
    assert root.xpath('//dds:transport_descriptor/dds:type/text()', namespaces=ns) == ['UDPv4']
    participant = root.xpath('//dds:participant', namespaces=ns)[0]
    assert participant.get('is_default_profile') == 'true'
    assert participant.xpath('.//dds:useBuiltinTransports/text()', namespaces=ns) == ['false']
