"""Compressed camera images (JPEG/PNG ``sensor_msgs/CompressedImage``), without DDS traffic."""

import io
import struct
import zlib

import numpy as np
from oxygen_ros.observation import ObservationError, RefusalReason
from oxygen_ros.ros.images.compressed import (
    Codec, codec_of_format, compressed_to_rgb, CompressedImageError, encode_rgb, rgb_to_compressed)
from oxygen_ros.ros.images.raw import ImageConversionError
from oxygen_ros.ros.images.transport import camera_image_to_rgb, camera_input, ImageTransport
from oxygen_ros.ros.node_config import build_configs
from oxygen_ros.ros.observation_cache import ObservationCache
from oxygen_ros.ros.param_spec import ParameterError
from oxygen_ros.ros.stamps import stamp_to_ns
from oxygen_ros.tools.bag import make_demo
from oxygen_ros.tools.bag.topics import CAMERA_TOPICS, Storage
from oxygen_ros.units import NS_PER_S
from PIL import Image as PilImage
import pytest
import rclpy
from rclpy.context import Context
from rclpy.node import Node
from rclpy.serialization import deserialize_message
from ros_inputs import image, joint_state, JOINTS
from rosbags.rosbag2 import Reader
from sensor_msgs.msg import CompressedImage, Image

NOW = 1_700_000_000 * NS_PER_S
RNG = np.random.default_rng(0)
# A smooth image (JPEG keeps it within a few grey levels) with some texture.
_Y, _X = np.mgrid[0:48, 0:64]
SMOOTH = np.stack([_X * 4, _Y * 5, (_X + _Y) * 2], axis=2).astype(np.uint8)


JPEG = encode_rgb(SMOOTH, Codec.JPEG)[1]
PNG = encode_rgb(SMOOTH, Codec.PNG)[1]
NOISY_JPEG = encode_rgb(RNG.integers(0, 256, (120, 160, 3), dtype=np.uint8), Codec.JPEG)[1]


def message(data, fmt, stamp_ns=0):
    msg = CompressedImage(format=fmt, data=bytes(data))
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, NS_PER_S)
    return msg


def pil_bytes(arr, fmt, **kwargs):
    out = io.BytesIO()
    PilImage.fromarray(arr).save(out, format=fmt, **kwargs)
    return out.getvalue()


def png_chunk(kind, payload):
    return struct.pack('>I', len(payload)) + kind + payload + \
        struct.pack('>I', zlib.crc32(kind + payload))


# ------------------------------------------------------------------------------- decoding

@pytest.mark.parametrize('codec', list(Codec))
def test_round_trip_in_image_transport_format(codec):
    msg = rgb_to_compressed(SMOOTH, NOW + 5, 'cam', codec)
    assert msg.format == f'rgb8; {codec.value} compressed bgr8'
    assert (stamp_to_ns(msg.header.stamp), msg.header.frame_id) == (NOW + 5, 'cam')
    rgb = compressed_to_rgb(msg)
    assert rgb.shape == (48, 64, 3) and rgb.dtype == np.uint8 and not rgb.flags.writeable
    if codec is Codec.PNG:
        np.testing.assert_array_equal(rgb, SMOOTH)  # lossless
    else:
        assert np.abs(rgb.astype(int) - SMOOTH).mean() < 3.0


@pytest.mark.parametrize('fmt', ['rgb8; jpeg compressed bgr8', 'bgr8; jpeg compressed bgr8',
                                 'jpeg', 'JPG', ' jpeg ', ''])
def test_jpeg_format_spellings(fmt):
    _, data = encode_rgb(SMOOTH, Codec.JPEG)
    np.testing.assert_array_equal(compressed_to_rgb(message(data, fmt)),
                                  compressed_to_rgb(message(data, 'jpeg')))


def test_jpeg_padded_after_its_end_marker_decodes():
    np.testing.assert_array_equal(compressed_to_rgb(message(JPEG + bytes(100), 'jpeg')),
                                  compressed_to_rgb(message(JPEG, 'jpeg')))


def test_grey_palette_and_alpha_pngs_become_rgb():
    grey = RNG.integers(0, 256, (20, 30), dtype=np.uint8)
    rgb = compressed_to_rgb(message(pil_bytes(grey, 'PNG'), 'mono8; png compressed '))
    np.testing.assert_array_equal(rgb, np.repeat(grey[:, :, None], 3, axis=2))
    rgba = np.concatenate([SMOOTH, np.full((48, 64, 1), 7, np.uint8)], axis=2)
    np.testing.assert_array_equal(
        compressed_to_rgb(message(pil_bytes(rgba, 'PNG'), 'rgba8; png compressed bgra8')),
        SMOOTH)
    palette = PilImage.fromarray(SMOOTH).quantize(16)
    out = io.BytesIO()
    palette.save(out, format='PNG')
    np.testing.assert_array_equal(compressed_to_rgb(message(out.getvalue(), 'png')),
                                  np.asarray(palette.convert('RGB')))


def test_codec_of_format():
    assert codec_of_format('rgb8; png compressed bgr8') is Codec.PNG
    assert codec_of_format('  ') is None
    with pytest.raises(CompressedImageError, match=r'compressedDepth \(a depth image\)'):
        codec_of_format('16UC1; compressedDepth png')
    with pytest.raises(CompressedImageError, match=r'unsupported compressed format '
                                                   r"'rgb8; tiff compressed bgr8'"):
        codec_of_format('rgb8; tiff compressed bgr8')


def huge_png_header():
    """Return a PNG whose header claims 20000 x 10 px (valid CRCs), with 1 byte of data."""
    ihdr = struct.pack('>IIBBBBB', 20000, 10, 8, 2, 0, 0, 0)
    return (Codec.PNG.signature + png_chunk(b'IHDR', ihdr) +
            png_chunk(b'IDAT', zlib.compress(b'\0')) + png_chunk(b'IEND', b''))


def flipped(data, at):
    out = bytearray(data)
    out[at] ^= 0xFF
    return bytes(out)


@pytest.mark.parametrize('data, fmt, match', [
    (b'', 'jpeg', r"empty compressed image \(format 'jpeg'\)"),
    (NOISY_JPEG[:len(NOISY_JPEG) // 2], 'rgb8; jpeg compressed bgr8',
     r'jpeg of \d+ bytes has no end-of-image marker: truncated'),
    (JPEG[:-2], 'jpeg', r'jpeg of \d+ bytes has no end-of-image marker: truncated'),
    (NOISY_JPEG[:len(NOISY_JPEG) // 2] + b'\xff\xd9', 'jpeg', r'corrupt or truncated jpeg'),
    (JPEG[:300] + b'\xff\xd9', 'jpeg', r'corrupt or truncated jpeg'),
    (PNG[:len(PNG) // 2], 'png', r'does not end with its IEND chunk: truncated'),
    (PNG[:-2], 'png', r'does not end with its IEND chunk: truncated'),
    (flipped(PNG, len(PNG) // 2), 'png', r'corrupt or truncated png'),
    (PNG, 'rgb8; jpeg compressed bgr8', r'says jpeg but the data is png'),
    (b'GIF89a' + bytes(50), 'jpeg', r'is neither JPEG nor PNG'),
    (bytes(1000), '', r'starting 00000000\) is neither JPEG nor PNG'),
    (huge_png_header(), 'png', r'png image 20000x10 \(width x height\) not within 1..8192 px'),
    (pil_bytes(np.full((4, 4), 40000, np.uint16), 'PNG'), 'mono16; png compressed mono16',
     r"mode 'I;16' \(16-bit or float\) is not an 8-bit camera image"),
    (JPEG, '16UC1; compressedDepth', r'compressedDepth'),
])
def test_bad_compressed_images_are_refused_with_a_reason(data, fmt, match):
    with pytest.raises(CompressedImageError, match=match) as err:
        compressed_to_rgb(message(data, fmt))
    assert isinstance(err.value, ImageConversionError)


def test_camera_image_to_rgb_takes_both_kinds():
    rgb, raw = image(NOW)
    np.testing.assert_array_equal(camera_image_to_rgb(raw), rgb)
    png = rgb_to_compressed(rgb, NOW, 'cam', Codec.PNG)
    np.testing.assert_array_equal(camera_image_to_rgb(png), rgb)


def test_encode_refuses_bad_arrays():
    with pytest.raises(ImageConversionError, match=r'uint8 \[h, w, 3\] RGB array, got float64'):
        encode_rgb(np.zeros((4, 4, 3)), Codec.JPEG)
    with pytest.raises(ImageConversionError, match='quality must be in 1..100, got 0'):
        encode_rgb(SMOOTH, Codec.JPEG, quality=0)


# ------------------------------------------------------------------- in the observation cache

def test_cache_decodes_compressed_cameras_and_refuses_corrupt_ones():
    cache = ObservationCache(['base_0_rgb', 'left_wrist_0_rgb'], JOINTS, 'pick up the cup')
    stamp = NOW - 10_000_000
    cache.put_image('base_0_rgb', rgb_to_compressed(SMOOTH, stamp, 'base', Codec.JPEG), NOW)
    wrist_rgb, wrist = image(stamp, h=48, w=64, seed=3)
    cache.put_image('left_wrist_0_rgb', rgb_to_compressed(wrist_rgb, stamp, 'w', Codec.PNG),
                    NOW)
    cache.put_joint_state(joint_state(stamp), NOW)
    obs = cache.assemble(NOW, 0.5)
    assert obs.stamp_ns == stamp
    assert np.abs(obs.images['base_0_rgb'].astype(int) - SMOOTH).mean() < 3.0
    np.testing.assert_array_equal(obs.images['left_wrist_0_rgb'], wrist_rgb)
    cache.put_image('left_wrist_0_rgb', message(PNG[:100], 'png', stamp), NOW)
    with pytest.raises(ObservationError, match=r'camera left_wrist_0_rgb: png of 100 bytes '
                                               r'does not end with its IEND chunk') as err:
        cache.assemble(NOW, 0.5)
    assert err.value.reason is RefusalReason.BAD_IMAGE
    cache.put_image('left_wrist_0_rgb', wrist, NOW)  # raw again: fine
    assert cache.assemble(NOW, 0.5).stamp_ns == stamp


# ---------------------------------------------------------------------- parameters, topics

def test_image_transport_parameters():
    _, node = build_configs({'preset': 'tiny'})
    assert node.compressed_cameras == ()
    assert node.transport('base_0_rgb') is ImageTransport.RAW
    _, node = build_configs({'preset': 'tiny', 'image_transport.left_wrist_0_rgb': 'compressed',
                             'image_transport.right_wrist_0_rgb': 'compressed'})
    assert node.compressed_cameras == ('left_wrist_0_rgb',)  # tiny has no right wrist
    assert node.transport('left_wrist_0_rgb') is ImageTransport.COMPRESSED
    with pytest.raises(ParameterError, match=r"image_transport.base_0_rgb must be one of 'raw', "
                                             r"'compressed', got 'theora'"):
        build_configs({'preset': 'tiny', 'image_transport.base_0_rgb': 'theora'})


def test_compressed_topic_follows_the_remapped_image_topic():
    context = Context()
    rclpy.init(context=context, domain_id=0)
    try:
        node = Node('oxygen', context=context, cli_args=[
            '--ros-args', '-r', '/camera/base/image_raw:=/zed/left/image_rect_color'])
        assert camera_input(node, '/camera/base/image_raw', ImageTransport.COMPRESSED) == \
            (CompressedImage, '/zed/left/image_rect_color/compressed')
        assert camera_input(node, '/camera/left_wrist/image_raw', ImageTransport.COMPRESSED) \
            == (CompressedImage, '/camera/left_wrist/image_raw/compressed')
        assert camera_input(node, '/camera/base/image_raw') == \
            (Image, '/camera/base/image_raw')
        node.destroy_node()
    finally:
        context.try_shutdown()


# ----------------------------------------------------------------------------- demo bag

@pytest.mark.parametrize('codec', list(Codec))
def test_demo_bag_with_compressed_cameras(tmp_path, codec, capsys):
    bag = tmp_path / 'demo'
    assert make_demo.main([str(bag), '--duration', '0.4', '--compressed', codec.value,
                          '--storage', Storage.SQLITE3.value, '--start-time', '1']) == 0
    with Reader(bag) as reader:
        conns = {c.topic: c for c in reader.connections}
        frames = {}
        for conn, bag_ns, raw in reader.messages():
            if conn.msgtype == 'sensor_msgs/msg/CompressedImage':
                msg = deserialize_message(bytes(raw), CompressedImage)
                assert stamp_to_ns(msg.header.stamp) == bag_ns
                frames.setdefault(conn.topic, []).append(msg)
    assert {t: c.msgtype for t, c in conns.items() if 'camera' in t} == {
        f'{t}/compressed': 'sensor_msgs/msg/CompressedImage' for t in CAMERA_TOPICS.values()}
    assert conns['/camera/base/image_raw/compressed'].ext.offered_qos_profiles[0] \
        .reliability.name == 'BEST_EFFORT'
    for slot, topic in CAMERA_TOPICS.items():
        msgs = frames[f'{topic}/compressed']
        assert len(msgs) == 6  # 0.4 s at 15 Hz
        for k, msg in enumerate(msgs):
            assert msg.format == f'rgb8; {codec.value} compressed bgr8'
            rgb, expected = compressed_to_rgb(msg), make_demo.camera_frame(slot, k)
            if codec is Codec.PNG:
                np.testing.assert_array_equal(rgb, expected)
            else:
                assert rgb.shape == expected.shape
                assert np.abs(rgb.astype(int) - expected).mean() < 4.0
