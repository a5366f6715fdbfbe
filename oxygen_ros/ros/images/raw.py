"""
Raw camera images: ``sensor_msgs/Image`` to and from RGB arrays.

Pure functions: no node, no DDS, no I/O. There is no ROS 2 ``cv_bridge`` on PyPI
(``docs/running.md#ros-2-from-pypi-the-venv``), so images are decoded here with numpy, honouring
the ``step`` row padding of ``sensor_msgs/Image`` (REP-118 layout: ``height`` rows of ``step``
bytes each, the first ``width * channels`` bytes of a row are pixels).
"""

from __future__ import annotations

import enum

from builtin_interfaces.msg import Time
import numpy as np
from oxygen_ros.ros.stamps import as_stamp
from sensor_msgs.msg import Image
from std_msgs.msg import Header

MAX_IMAGE_SIDE = 8192
"""Largest accepted image width or height in pixels; larger ones are rejected as corrupt."""


class ImageConversionError(ValueError):
    """A ``sensor_msgs/Image`` that cannot be turned into an RGB array (the message says why)."""


class Encoding(str, enum.Enum):
    """The 8-bit ``sensor_msgs/Image`` encodings we read and write (``image_encodings.hpp``)."""

    RGB8 = 'rgb8'
    BGR8 = 'bgr8'
    MONO8 = 'mono8'
    RGBA8 = 'rgba8'
    BGRA8 = 'bgra8'

    @property
    def channels(self) -> int:
        """Bytes per pixel."""
        return _CHANNELS[self]


_CHANNELS = {Encoding.RGB8: 3, Encoding.BGR8: 3, Encoding.MONO8: 1, Encoding.RGBA8: 4,
             Encoding.BGRA8: 4}
SUPPORTED_ENCODINGS: tuple[str, ...] = tuple(e.value for e in Encoding)


def _encoding(name: str) -> Encoding:
    try:
        return Encoding(name)
    except ValueError:
        raise ImageConversionError(
            f'unsupported image encoding {name!r}; supported: '
            f'{", ".join(SUPPORTED_ENCODINGS)}') from None


def image_to_rgb(msg: Image) -> np.ndarray:
    """
    Decode an 8-bit ``sensor_msgs/Image`` into an RGB array.

    ``mono8`` is replicated into three channels; the alpha of ``rgba8``/``bgra8`` is dropped.
    Rows may be padded (``step > width * channels``); the padding is skipped.

    The result is read-only. For ``rgb8`` it is a zero-copy view of ``msg.data`` (strided when
    rows are padded, so call ``np.ascontiguousarray`` if you need contiguous memory); for the
    other encodings it is a new contiguous array.

    :param msg: the image message.
    :returns: ``uint8 [height, width, 3]`` RGB.
    :raises ImageConversionError: unsupported encoding (the supported ones are listed), zero or
        more than ``MAX_IMAGE_SIDE`` width/height, ``step < width * channels``, or fewer than
        ``step * height`` bytes of data.
    """
    enc = _encoding(msg.encoding)
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if height == 0 or width == 0:
        raise ImageConversionError(f'empty {enc.value} image: {width}x{height} (width x height)')
    if height > MAX_IMAGE_SIDE or width > MAX_IMAGE_SIDE:
        raise ImageConversionError(
            f'image {width}x{height} (width x height) exceeds the {MAX_IMAGE_SIDE} px limit')
    row_bytes = width * enc.channels
    if step < row_bytes:
        raise ImageConversionError(
            f'step {step} < width {width} * {enc.channels} channels ({enc.value}) = {row_bytes}')
    data = np.frombuffer(msg.data, dtype=np.uint8)
    if data.size < step * height:
        raise ImageConversionError(
            f'{enc.value} image {width}x{height} with step {step} needs {step * height} bytes, '
            f'data has {data.size}')
    pixels = data[:step * height].reshape(height, step)[:, :row_bytes]
    pixels = pixels.reshape(height, width, enc.channels)
    if enc is Encoding.RGB8:
        rgb = pixels
    elif enc is Encoding.MONO8:
        rgb = np.repeat(pixels, 3, axis=2)
    elif enc is Encoding.RGBA8:
        rgb = np.ascontiguousarray(pixels[:, :, :3])
    else:  # BGR8, BGRA8
        rgb = np.ascontiguousarray(pixels[:, :, 2::-1])
    rgb.flags.writeable = False
    return rgb


def rgb_to_image(arr: np.ndarray, stamp: Time | int, frame_id: str,
                 encoding: Encoding | str = Encoding.RGB8, *, row_padding: int = 0) -> Image:
    """
    Encode an RGB (or, for ``mono8``, grayscale) array as a ``sensor_msgs/Image``.

    :param arr: ``uint8 [h, w, 3]`` RGB; for ``mono8`` ``uint8 [h, w]`` (or ``[h, w, 1]``).
        Alpha, when the encoding has one, is written as 255.
    :param stamp: ``header.stamp``, a ``Time`` message or integer nanoseconds.
    :param frame_id: ``header.frame_id``.
    :param encoding: one of ``SUPPORTED_ENCODINGS``.
    :param row_padding: extra zero bytes at the end of every row (``step = w * ch + padding``).
    :returns: the message, ``is_bigendian = 0``.
    :raises ImageConversionError: unsupported encoding, wrong dtype or shape, size out of range.
    """
    enc = _encoding(encoding.value if isinstance(encoding, Encoding) else encoding)
    arr = np.asarray(arr)
    if arr.dtype != np.uint8:
        raise ImageConversionError(f'image array must be uint8, got {arr.dtype}')
    if enc is Encoding.MONO8:
        if arr.ndim == 3 and arr.shape[2] == 1:
            arr = arr[:, :, 0]
        if arr.ndim != 2:
            raise ImageConversionError(f'mono8 needs a [h, w] array, got shape {arr.shape}')
        pixels = arr[:, :, None]
    else:
        if arr.ndim != 3 or arr.shape[2] != 3:
            raise ImageConversionError(
                f'{enc.value} needs an RGB [h, w, 3] array, got shape {arr.shape}')
        channels = arr[:, :, ::-1] if enc in (Encoding.BGR8, Encoding.BGRA8) else arr
        if enc in (Encoding.RGBA8, Encoding.BGRA8):
            alpha = np.full(arr.shape[:2] + (1,), 255, dtype=np.uint8)
            channels = np.concatenate([channels, alpha], axis=2)
        pixels = channels
    height, width = pixels.shape[:2]
    if not (0 < height <= MAX_IMAGE_SIDE and 0 < width <= MAX_IMAGE_SIDE):
        raise ImageConversionError(
            f'image {width}x{height} (width x height) not within 1..{MAX_IMAGE_SIDE} px')
    if row_padding < 0:
        raise ImageConversionError(f'row_padding must be >= 0, got {row_padding}')
    row_bytes = width * enc.channels
    rows = np.zeros((height, row_bytes + row_padding), dtype=np.uint8)
    rows[:, :row_bytes] = pixels.reshape(height, row_bytes)
    msg = Image()
    msg.header = Header(stamp=as_stamp(stamp), frame_id=frame_id)
    msg.height, msg.width = height, width
    msg.encoding = enc.value
    msg.is_bigendian = 0
    msg.step = row_bytes + row_padding
    msg.data = rows.tobytes()
    return msg


__all__ = ['Encoding', 'ImageConversionError', 'MAX_IMAGE_SIDE', 'SUPPORTED_ENCODINGS',
           'image_to_rgb', 'rgb_to_image']
