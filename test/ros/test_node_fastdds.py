"""
config/fastdds_large_shm.xml: the Fast DDS profile for publishers of large images.

A 640x480 rgb8 publisher in a subprocess loads the profile through
``FASTRTPS_DEFAULT_PROFILES_FILE`` (the variable Jazzy reads) and sends 45 frames at 15 Hz,
best effort, to a subscriber in this process.
"""

import subprocess
import sys

from lxml import etree
from oxygen_ros.resources import share_dir
import pytest
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image

PROFILE = share_dir() / 'config' / 'fastdds_large_shm.xml'
NS = {'dds': 'http://www.eprosima.com/XMLSchemas/fastRTPS_Profiles'}
VGA_RGB8_BYTES = 640 * 480 * 3
NUM_FRAMES = 45
PUBLISHER = f"""
import time
import numpy as np
import rclpy
from oxygen_ros.ros.images.raw import rgb_to_image
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image
rclpy.init()
node = rclpy.create_node('vga_camera')
pub = node.create_publisher(Image, '/camera/base/image_raw', qos_profile_sensor_data)
deadline = time.monotonic() + 20
while pub.get_subscription_count() == 0 and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(0.3)
rgb = np.zeros((480, 640, 3), np.uint8)
for i in range({NUM_FRAMES}):
    pub.publish(rgb_to_image(rgb, node.get_clock().now().nanoseconds, 'base'))
    time.sleep(1 / 15)
time.sleep(0.5)
node.destroy_node()
rclpy.shutdown()
"""


def test_profile_sizes():
    root = etree.parse(str(PROFILE)).getroot()
    [transport] = root.findall('.//dds:transport_descriptor', NS)
    assert transport.findtext('dds:type', namespaces=NS) == 'SHM'
    segment = int(transport.findtext('dds:segment_size', namespaces=NS))
    max_message = int(transport.findtext('dds:maxMessageSize', namespaces=NS))
    assert max_message >= 4 * VGA_RGB8_BYTES  # 1280x1024 rgb8 fits
    assert segment >= 3 * 5 * max_message // 2  # three cameras' sensor-data history
    [participant] = root.findall('.//dds:participant', NS)
    assert participant.get('is_default_profile') == 'true'
    assert participant.findtext('.//dds:userTransports/dds:transport_id', namespaces=NS) == \
        transport.findtext('dds:transport_id', namespaces=NS)
    assert participant.findtext('.//dds:useBuiltinTransports', namespaces=NS) == 'true'


@pytest.mark.ros
def test_vga_images_arrive_best_effort_with_the_profile(ros_node, ros_env):
    images = ros_node.collect('/camera/base/image_raw', Image, QoSProfile(
        depth=NUM_FRAMES, reliability=ReliabilityPolicy.BEST_EFFORT))
    env = dict(ros_env, FASTRTPS_DEFAULT_PROFILES_FILE=str(PROFILE))
    proc = subprocess.Popen([sys.executable, '-c', PUBLISHER], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        ros_node.spin_until(lambda: len(images) >= NUM_FRAMES or proc.poll() is not None, 40)
        ros_node.spin_for(0.3)
        output = proc.communicate(timeout=20)[0].decode(errors='replace')
    finally:
        proc.kill()
    assert proc.returncode == 0, output
    assert 'XMLPARSER' not in output and 'Error' not in output, output
    assert len(images) >= NUM_FRAMES - 2, (len(images), output)
    assert images.msgs[0].width == 640 and len(images.msgs[0].data) == VGA_RGB8_BYTES
