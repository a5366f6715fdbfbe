"""The node under test and its inputs from the test process (images, joint states, questions)."""

import time

import numpy as np
from oxygen_ros.resources import config_file
from oxygen_ros.ros.images.raw import rgb_to_image
from oxygen_ros.tools.bag.topics import (
    CAMERA_TOPICS, INSTRUCTION_TOPIC, JOINT_STATES_TOPIC, qos_profile, QosRole)
from rclpy.duration import Duration
from ros_inputs import JOINTS
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String


def start_node(ros_processes, *params):
    """Start ``oxygen_node`` with config/test.yaml and ``name:=value`` overrides."""
    args = ['--ros-args', '--params-file', str(config_file('test'))]
    for p in params:
        args += ['-p', p]
    return ros_processes.start('oxygen_ros.ros.node', *args)


class Load:
    """Valid inputs at 20 Hz and questions at 5/s from the test process."""

    def __init__(self, ros_node):
        self.ros_node = ros_node
        node = ros_node.node
        self.images = {slot: node.create_publisher(Image, CAMERA_TOPICS[slot],
                                                   qos_profile(QosRole.SENSOR_DATA))
                       for slot in ('base_0_rgb', 'left_wrist_0_rgb')}
        self.joints = node.create_publisher(JointState, JOINT_STATES_TOPIC,
                                            qos_profile(QosRole.RELIABLE))
        self.instruction = node.create_publisher(String, INSTRUCTION_TOPIC,
                                                 qos_profile(QosRole.LATCHED))
        self.ask = node.create_publisher(String, '/oxygen/ask', qos_profile(QosRole.RELIABLE))
        self.rgb = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
        self.asked = 0
        self._next_ask = 0.0

    def wait_for_node(self):
        for pub in [*self.images.values(), self.joints, self.instruction, self.ask]:
            assert self.ros_node.wait_for_subscribers(pub), pub.topic_name

    def run(self, seconds, ask=True):
        end = time.monotonic() + seconds
        while (now := time.monotonic()) < end:
            stamp = self.ros_node.node.get_clock().now().nanoseconds
            for slot, pub in self.images.items():
                pub.publish(rgb_to_image(self.rgb, stamp, slot))
            self.joints.publish(JointState(header=rgb_to_image(self.rgb, stamp, '').header,
                                           name=list(JOINTS), position=[0.1] * 8))
            if ask and now >= self._next_ask:
                self.ask.publish(String(data=f'What is on the table? ({self.asked})'))
                self.asked += 1
                self._next_ask = now + 0.2
            self.ros_node.spin_for(0.05)

    def flush_questions(self):
        """Wait until the node acknowledged every question (reliable QoS)."""
        assert self.ask.wait_for_all_acked(Duration(seconds=10))
