"""Raw images <-> RGB arrays (oxygen_ros.ros.images.raw); pure, no DDS."""

from builtin_interfaces.msg import Time
import numpy as np
from oxygen_ros.ros.images.raw import (
    Encoding, image_to_rgb, ImageConversionError, MAX_IMAGE_SIDE, rgb_to_image,
    SUPPORTED_ENCODINGS)
from oxygen_ros.ros.stamps import stamp_to_ns
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import Image

RNG = np.random.default_rng(0)
RGB = RNG.integers(0, 256, size=(5, 7, 3), dtype=np.uint8)
STAMP_NS = 1_700_000_123_456_789_012


def _raw_image(encoding, height, width, step, data):
    msg = Image()
    msg.encoding, msg.height, msg.width, msg.step = encoding, height, width, step
    msg.data = bytes(data)
    return msg


@pytest.mark.parametrize('encoding', SUPPORTED_ENCODINGS)
@pytest.mark.parametrize('padding', [0, 3])
def test_image_round_trip_each_encoding(encoding, padding):
    src = RGB[:, :, 0] if encoding == 'mono8' else RGB
    msg = rgb_to_image(src, STAMP_NS, 'cam', encoding, row_padding=padding)
    channels = Encoding(encoding).channels
    assert (msg.height, msg.width, msg.encoding) == (5, 7, encoding)
    assert msg.step == 7 * channels + padding
    assert len(msg.data) == msg.step * 5
    assert stamp_to_ns(msg.header.stamp) == STAMP_NS and msg.header.frame_id == 'cam'
    # Survives CDR serialization (what goes over DDS and into bags).
    msg = deserialize_message(serialize_message(msg), Image)
    out = image_to_rgb(msg)
    assert out.dtype == np.uint8 and out.shape == (5, 7, 3)
    expected = np.repeat(src[:, :, None], 3, axis=2) if encoding == 'mono8' else RGB
    np.testing.assert_array_equal(out, expected)
    assert not out.flags.writeable


def test_bytes_layout_per_encoding():
    pixel = np.array([[[10, 20, 30]]], dtype=np.uint8)
    layouts = {'rgb8': [10, 20, 30], 'bgr8': [30, 20, 10], 'rgba8': [10, 20, 30, 255],
               'bgra8': [30, 20, 10, 255]}
    for encoding, expected in layouts.items():
        assert list(rgb_to_image(pixel, 0, '', encoding).data) == expected, encoding
    assert list(rgb_to_image(np.array([[7]], np.uint8), 0, '', 'mono8').data) == [7]


def test_decode_handwritten_padded_bgra():
    # 2x2 bgra8, step 10 (2 bytes of padding per row filled with junk).
    data = [1, 2, 3, 4, 5, 6, 7, 8, 99, 99,
            9, 10, 11, 12, 13, 14, 15, 16, 99, 99]
    out = image_to_rgb(_raw_image('bgra8', 2, 2, 10, data))
    np.testing.assert_array_equal(
        out, [[[3, 2, 1], [7, 6, 5]], [[11, 10, 9], [15, 14, 13]]])


def test_decode_mono_replicates_and_skips_padding():
    out = image_to_rgb(_raw_image('mono8', 2, 3, 4, [1, 2, 3, 0, 4, 5, 6, 0]))
    np.testing.assert_array_equal(out[:, :, 0], [[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(out[:, :, 0], out[:, :, 2])


def test_rgb8_is_zero_copy_view():
    msg = rgb_to_image(RGB, 0, '')
    out = image_to_rgb(msg)
    assert np.shares_memory(out, np.frombuffer(msg.data, np.uint8))


def test_extra_trailing_data_is_ignored():
    msg = _raw_image('mono8', 1, 2, 2, [5, 6, 7, 8])
    np.testing.assert_array_equal(image_to_rgb(msg)[:, :, 1], [[5, 6]])


@pytest.mark.parametrize(('msg', 'pattern'), [
    (_raw_image('16UC1', 1, 1, 2, [0, 0]),
     r"unsupported image encoding '16UC1'; supported: rgb8, bgr8, mono8, rgba8, bgra8"),
    (_raw_image('RGB8', 1, 1, 3, [0, 0, 0]), "unsupported image encoding 'RGB8'"),
    (_raw_image('rgb8', 2, 2, 6, [0] * 11),
     r'rgb8 image 2x2 with step 6 needs 12 bytes, data has 11'),
    (_raw_image('rgb8', 2, 2, 5, [0] * 12), r'step 5 < width 2 \* 3 channels \(rgb8\) = 6'),
    (_raw_image('rgb8', 0, 2, 6, []), r'empty rgb8 image: 2x0'),
    (_raw_image('mono8', 3, 0, 0, []), r'empty mono8 image: 0x3'),
    (_raw_image('mono8', 1, MAX_IMAGE_SIDE + 1, MAX_IMAGE_SIDE + 1, []),
     r'image 8193x1 \(width x height\) exceeds the 8192 px limit'),
])
def test_image_to_rgb_rejects(msg, pattern):
    with pytest.raises(ImageConversionError, match=pattern):
        image_to_rgb(msg)


def test_image_errors_are_value_errors():
    assert issubclass(ImageConversionError, ValueError)


@pytest.mark.parametrize(('arr', 'encoding', 'pattern'), [
    (RGB.astype(np.float32), 'rgb8', 'must be uint8, got float32'),
    (RGB[:, :, :2], 'rgb8', r'rgb8 needs an RGB \[h, w, 3\] array, got shape \(5, 7, 2\)'),
    (RGB, 'mono8', r'mono8 needs a \[h, w\] array, got shape \(5, 7, 3\)'),
    (RGB, 'yuv422', "unsupported image encoding 'yuv422'"),
    (np.zeros((0, 4, 3), np.uint8), 'rgb8', r'image 4x0 \(width x height\) not within'),
])
def test_rgb_to_image_rejects(arr, encoding, pattern):
    with pytest.raises(ImageConversionError, match=pattern):
        rgb_to_image(arr, 0, '', encoding)


def test_rgb_to_image_accepts_time_message_and_enum():
    msg = rgb_to_image(RGB, Time(sec=3, nanosec=4), 'f', Encoding.BGR8)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec, msg.encoding) == (3, 4, 'bgr8')
