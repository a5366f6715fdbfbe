"""Sensor messages for the node's unit tests: a random rgb image and a DROID-like joint state."""

import numpy as np
from oxygen_ros.ros.images.raw import rgb_to_image
from oxygen_ros.units import NS_PER_S
from sensor_msgs.msg import Image, JointState

JOINTS = [f'joint_{i}' for i in range(1, 8)] + ['gripper']
"""Seven arm joints and the gripper: the order of the pi05_droid state."""


def image(stamp_ns: int, h: int = 24, w: int = 32, seed: int = 0,
          encoding: str = 'rgb8') -> tuple[np.ndarray, Image]:
    """Return a random ``uint8 [h, w, 3]`` rgb array and its Image message in ``encoding``."""
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    return rgb, rgb_to_image(rgb, stamp_ns, 'cam', encoding)


def joint_state(stamp_ns: int, positions=None, names=JOINTS) -> JointState:
    """Return a JointState stamped ``stamp_ns`` (positions default to 0.0, 0.1, ...)."""
    msg = JointState()
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, NS_PER_S)
    msg.name = list(names)
    msg.position = [float(x) for x in (np.arange(len(names)) * 0.1
                                       if positions is None else positions)]
    return msg
