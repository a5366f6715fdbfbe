"""
How a camera's images arrive: image_transport's ``raw`` or ``compressed`` transport.

A camera publishing through image_transport sends ``sensor_msgs/Image`` on its image topic
(``raw``, decoded by ``raw.py``) or ``sensor_msgs/CompressedImage`` on ``<image
topic>/compressed`` (``compressed``, decoded by ``compressed.py``). The node subscribes each
camera on the transport its ``image_transport.<slot>`` parameter names (``camera_input``) and
decodes either kind to RGB (``camera_image_to_rgb``).
"""

from __future__ import annotations

import enum

import numpy as np
from oxygen_ros.ros.images.compressed import compressed_to_rgb
from oxygen_ros.ros.images.raw import image_to_rgb
from sensor_msgs.msg import CompressedImage, Image

COMPRESSED_SUFFIX = '/compressed'
"""image_transport's topic for the ``compressed`` transport: ``<image topic>/compressed``."""


class ImageTransport(str, enum.Enum):
    """How a camera's images arrive (image_transport's transport names)."""

    RAW = 'raw'
    """``sensor_msgs/Image`` on the camera topic."""
    COMPRESSED = 'compressed'
    """``sensor_msgs/CompressedImage`` (JPEG or PNG) on ``<camera topic>/compressed``."""


def compressed_topic(image_topic: str) -> str:
    """Return the ``compressed`` transport's topic of an image topic (``<topic>/compressed``)."""
    return image_topic.rstrip('/') + COMPRESSED_SUFFIX


def camera_image_to_rgb(msg: Image | CompressedImage) -> np.ndarray:
    """
    Return a raw or compressed camera message as ``uint8 [h, w, 3]`` RGB.

    :raises ImageConversionError: see ``raw.image_to_rgb`` and ``compressed.compressed_to_rgb``
        (``CompressedImageError`` is one).
    """
    if isinstance(msg, CompressedImage):
        return compressed_to_rgb(msg)
    return image_to_rgb(msg)


def camera_input(node: object, image_topic: str,
                 kind: ImageTransport = ImageTransport.RAW) -> tuple[type, str]:
    """
    Return the message type and topic of a camera subscription.

    For ``compressed`` the image topic is resolved first (remapping applies to it, as in
    image_transport), then ``/compressed`` is appended: remapping ``/camera/base/image_raw``
    also moves its compressed topic.

    :param node: the rclpy node (its ``resolve_topic_name``).
    :param image_topic: the camera's raw image topic.
    :param kind: the camera's transport.
    :returns: ``(Image, image_topic)`` or ``(CompressedImage, <resolved topic>/compressed)``.
    """
    if kind is ImageTransport.COMPRESSED:
        return CompressedImage, compressed_topic(node.resolve_topic_name(image_topic))
    return Image, image_topic


__all__ = ['COMPRESSED_SUFFIX', 'ImageTransport', 'camera_image_to_rgb', 'camera_input',
           'compressed_topic']
