"""
``oxygen_bag make_demo``: write a rosbag2 of real photographs and a smooth arm motion.

Usage::

    oxygen_bag make_demo OUT_BAG [--duration 20] [--rate 15] [--joint-rate 50]
                         [--storage mcap|sqlite3] [--instruction "pick up the coffee cup"]
                         [--start-time SECONDS] [--compressed jpeg|png]

Topics (the node's defaults, ``docs/topics.md#topics``), all stamps increasing, bag time = stamp:

- ``/camera/base/image_raw``: ``skimage.data.coffee()`` (400x600 rgb8), panned a little every
  frame (a sliding window over a mirror-padded copy; frame 0 is the photograph itself).
- ``/camera/left_wrist/image_raw``, ``/camera/right_wrist/image_raw``: 240x320 rgb8 crops of the
  left and right views of ``skimage.data.stereo_motorcycle()``, the crop window drifting.
- the three cameras share one stamp per frame (a synchronised rig) at ``--rate`` Hz.
- ``--compressed jpeg|png``: the cameras are written as ``sensor_msgs/CompressedImage`` on
  ``<topic>/compressed`` instead (image_transport's ``compressed`` transport: format
  ``"rgb8; jpeg compressed bgr8"``, JPEG quality 90 or PNG level 3), as camera drivers and most
  recorded bags carry them.
- ``/joint_states``: ``joint_1..joint_7`` (rad) and ``gripper`` (rad), sinusoids with their
  velocities, at ``--joint-rate`` Hz.
- ``/oxygen/instruction`` (``std_msgs/String``): the instruction, once, at the start.

Messages are serialized to CDR by rosbags' ``ROS2_JAZZY`` typestore: deterministic bytes (zero
padding) that both rclpy and rosbags decode. (rclpy's ``serialize_message`` would do for rclpy,
but Fast CDR pads the end of e.g. a ``JointState`` with 4 uninitialised bytes, which rosbags
0.11 rejects as "CDR message size mismatch".) Metadata (message counts, QoS, type hashes) is
written by rosbags the way rosbag2 writes it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
import functools
import heapq
import math
import os
from pathlib import Path
import shutil
import sys
import time
from typing import Iterator, Sequence

import numpy as np
from oxygen_ros.resources import cache_dir
from oxygen_ros.ros.images.compressed import Codec, encode_rgb
from oxygen_ros.ros.images.transport import compressed_topic
from oxygen_ros.tools.bag.topics import (
    bag_qos, CAMERA_TOPICS, COMPRESSED_IMAGE_TYPE, IMAGE_TYPE, INSTRUCTION_TOPIC, JOINT_STATE_TYPE,
    JOINT_STATES_TOPIC, qos_profile, qos_role, Storage, STRING_TYPE, typestore)
from oxygen_ros.units import NS_PER_S
from rosbags.rosbag2 import Writer
from tqdm import tqdm

JOINT_NAMES: tuple[str, ...] = tuple(f'joint_{i}' for i in range(1, 8)) + ('gripper',)
WRIST_SIZE = (240, 320)
"""Height, width of the wrist camera crops."""
FRAME_IDS = {slot: f'{slot.removesuffix("_0_rgb")}_camera_optical_frame'
             for slot in CAMERA_TOPICS}
_BASE_PAN = 40
"""Pixels of mirror padding each side of the coffee photograph (pan range)."""
# Sinusoid per joint: centre (rad), amplitude (rad), frequency (Hz), phase (rad).
_CENTRE = np.array([0.0, -0.4, 0.0, -2.0, 0.0, 1.6, 0.8, 0.4])
_AMPLITUDE = np.array([0.5, 0.3, 0.4, 0.35, 0.5, 0.3, 0.6, 0.4])
_FREQUENCY = np.array([0.10, 0.15, 0.12, 0.20, 0.25, 0.18, 0.30, 0.20])
_PHASE = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, -math.pi / 2])


@dataclass(frozen=True, slots=True)
class DemoBagConfig:
    """What ``write_demo_bag`` writes (units: seconds, hertz, nanoseconds)."""

    duration_s: float = 20.0
    camera_rate_hz: float = 15.0
    joint_rate_hz: float = 50.0
    storage: Storage = Storage.MCAP
    instruction: str = 'pick up the coffee cup'
    start_ns: int = 0
    """Stamp of the first messages; 0 means the wall clock when writing starts."""
    compressed: Codec | None = None
    """Write the cameras as ``CompressedImage`` on ``<topic>/compressed`` (None: raw)."""

    def __post_init__(self) -> None:
        for name in ('duration_s', 'camera_rate_hz', 'joint_rate_hz'):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f'{name} must be a positive number, got {value!r}')
        if self.num_frames < 1:
            raise ValueError(f'duration {self.duration_s} s at {self.camera_rate_hz} Hz holds '
                             f'no camera frame')
        if self.start_ns < 0:
            raise ValueError(f'start_ns must be >= 0, got {self.start_ns}')

    @property
    def num_frames(self) -> int:
        """Return the number of frames per camera."""
        return math.floor(self.duration_s * self.camera_rate_hz + 1e-9)

    @property
    def camera_topics(self) -> dict[str, str]:
        """Return camera slot -> topic written (``<topic>/compressed`` when compressed)."""
        if self.compressed is None:
            return dict(CAMERA_TOPICS)
        return {slot: compressed_topic(topic) for slot, topic in CAMERA_TOPICS.items()}

    @property
    def camera_type(self) -> str:
        """Return the ROS 2 type of the camera topics."""
        return IMAGE_TYPE if self.compressed is None else COMPRESSED_IMAGE_TYPE

    @property
    def num_joint_states(self) -> int:
        """Return the number of joint state messages."""
        return math.floor(self.duration_s * self.joint_rate_hz + 1e-9)


@functools.cache
def _sources() -> dict[str, np.ndarray]:
    from skimage import data  # ~0.5 s, only when images are made
    coffee = data.coffee()
    left, right, _ = data.stereo_motorcycle()
    padded = np.pad(coffee, ((0, 0), (_BASE_PAN, _BASE_PAN), (0, 0)), mode='reflect')
    return {'base_0_rgb': padded, 'left_wrist_0_rgb': left, 'right_wrist_0_rgb': right}


def _triangle(k: int, span: int, step: int) -> int:
    """Return position ``k`` of a wave bouncing over ``[0, span]`` in ``step`` px moves."""
    pos = (k * step) % (2 * span)
    return pos if pos <= span else 2 * span - pos


def camera_frame(slot: str, k: int) -> np.ndarray:
    """
    Return frame ``k`` of a camera as written to the bag.

    :param slot: a key of ``CAMERA_TOPICS``.
    :param k: frame index ``>= 0``.
    :returns: ``uint8 [h, w, 3]`` RGB: 400x600 for the base camera (frame 0 is exactly
        ``skimage.data.coffee()``), ``WRIST_SIZE`` for the wrists. Consecutive frames differ.
    """
    src = _sources()[slot]
    if slot == 'base_0_rgb':
        x = _triangle(k + _BASE_PAN // 2, 2 * _BASE_PAN, 2)
        return src[:, x:x + src.shape[1] - 2 * _BASE_PAN]
    height, width = WRIST_SIZE
    y0 = (src.shape[0] - height) // 2 - 12 + _triangle(k, 24, 1)
    x0 = (src.shape[1] - width) // 2 - 30 + _triangle(k, 60, 3)
    return src[y0:y0 + height, x0:x0 + width]


def joint_positions(t_s: float) -> tuple[np.ndarray, np.ndarray]:
    """
    Return the demo arm state at ``t_s`` seconds after the start.

    :returns: ``float64 [8]`` positions (rad) and ``float64 [8]`` velocities (rad/s), in
        ``JOINT_NAMES`` order.
    """
    angle = 2 * math.pi * _FREQUENCY * t_s + _PHASE
    return (_CENTRE + _AMPLITUDE * np.sin(angle),
            _AMPLITUDE * 2 * math.pi * _FREQUENCY * np.cos(angle))


def _events(cfg: DemoBagConfig, start_ns: int) -> Iterator[tuple[int, int, str, int]]:
    """Yield ``(stamp_ns, order, topic, index)`` of every message, in bag order."""
    cams = [(start_ns + round(k * NS_PER_S / cfg.camera_rate_hz), 2 + c, topic, k)
            for k in range(cfg.num_frames) for c, topic in enumerate(cfg.camera_topics.values())]
    joints = [(start_ns + round(j * NS_PER_S / cfg.joint_rate_hz), 1, JOINT_STATES_TOPIC, j)
              for j in range(cfg.num_joint_states)]
    yield (start_ns, 0, INSTRUCTION_TOPIC, 0)
    yield from heapq.merge(joints, cams)


def _serialized(cfg: DemoBagConfig, start_ns: int, stamp_ns: int, topic: str,
                index: int) -> bytes:
    """Return the CDR bytes of one message (rosbags types of the Jazzy typestore)."""
    store = typestore()
    types = store.types
    if topic == INSTRUCTION_TOPIC:
        return bytes(store.serialize_cdr(types[STRING_TYPE](data=cfg.instruction), STRING_TYPE))
    stamp = types['builtin_interfaces/msg/Time'](sec=stamp_ns // NS_PER_S,
                                                 nanosec=stamp_ns % NS_PER_S)
    if topic == JOINT_STATES_TOPIC:
        position, velocity = joint_positions((stamp_ns - start_ns) / NS_PER_S)
        msg = types[JOINT_STATE_TYPE](
            header=types['std_msgs/msg/Header'](stamp=stamp, frame_id=''),
            name=list(JOINT_NAMES), position=position, velocity=velocity,
            effort=np.zeros(0, dtype=np.float64))
        return bytes(store.serialize_cdr(msg, JOINT_STATE_TYPE))
    slot = next(s for s, t in cfg.camera_topics.items() if t == topic)
    frame = np.ascontiguousarray(camera_frame(slot, index))
    header = types['std_msgs/msg/Header'](stamp=stamp, frame_id=FRAME_IDS[slot])
    if cfg.compressed is not None:
        fmt, data = encode_rgb(frame, cfg.compressed)
        msg = types[COMPRESSED_IMAGE_TYPE](header=header, format=fmt,
                                           data=np.frombuffer(data, dtype=np.uint8))
        return bytes(store.serialize_cdr(msg, COMPRESSED_IMAGE_TYPE))
    height, width = frame.shape[:2]
    msg = types[IMAGE_TYPE](
        header=header, height=height, width=width, encoding='rgb8', is_bigendian=0, step=width * 3,
        data=frame.reshape(-1))
    return bytes(store.serialize_cdr(msg, IMAGE_TYPE))


def write_demo_bag(path: Path, cfg: DemoBagConfig, *, progress: bool = False) -> dict[str, int]:
    """
    Write the demo bag.

    :param path: the bag directory to create (must not exist).
    :param cfg: what to write.
    :param progress: show a tqdm progress bar on stderr.
    :returns: topic -> number of messages written.
    :raises FileExistsError: if ``path`` exists.
    """
    path = Path(path)
    if path.exists():
        raise FileExistsError(f'{path} exists; rosbag2 bags are never overwritten')
    start_ns = cfg.start_ns or time.time_ns()
    types = {topic: cfg.camera_type for topic in cfg.camera_topics.values()}
    types[JOINT_STATES_TOPIC] = JOINT_STATE_TYPE
    types[INSTRUCTION_TOPIC] = STRING_TYPE
    total = 1 + cfg.num_joint_states + len(cfg.camera_topics) * cfg.num_frames
    counts = dict.fromkeys(types, 0)
    writer = Writer(path, version=Writer.VERSION_LATEST, storage_plugin=cfg.storage.plugin)
    writer.set_custom_data('oxygen_ros.generator', 'oxygen_bag make_demo')
    writer.open()
    try:
        connections = {
            topic: writer.add_connection(
                topic, msgtype, typestore=typestore(),
                offered_qos_profiles=[bag_qos(qos_profile(qos_role(topic, msgtype)))])
            for topic, msgtype in types.items()}
        events = tqdm(_events(cfg, start_ns), total=total, unit='msg', disable=not progress,
                      desc=path.name)
        for stamp_ns, _, topic, index in events:
            writer.write(connections[topic], stamp_ns,
                         _serialized(cfg, start_ns, stamp_ns, topic, index))
            counts[topic] += 1
    except BaseException:
        writer.close()
        raise
    writer.close()
    return counts


DEMO_BAG_CONFIG = DemoBagConfig(duration_s=5.0, camera_rate_hz=15.0, joint_rate_hz=50.0)
"""The bag ``oxygen_demo``, the soak and the jitter bench replay in a loop."""


def demo_bag(config: DemoBagConfig = DEMO_BAG_CONFIG) -> Path:
    """Return the cached demo bag, writing it first if missing (atomically)."""
    path = cache_dir() / f'demo_bag_{config.duration_s:g}s_{config.camera_rate_hz:g}hz'
    if (path / 'metadata.yaml').is_file():
        return path
    tmp = path.with_name(path.name + f'.tmp{os.getpid()}')
    shutil.rmtree(tmp, ignore_errors=True)
    print(f'writing the demo bag {path} (once) ...', flush=True)
    write_demo_bag(tmp, config)
    tmp.rename(path)
    return path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='oxygen_bag make_demo',
        description='Write a rosbag2 of real photographs (scikit-image) and joint states.')
    parser.add_argument('out_bag', type=Path, help='bag directory to create')
    parser.add_argument('--duration', type=float, default=20.0, help='seconds (default 20)')
    parser.add_argument('--rate', type=float, default=15.0, help='camera Hz (default 15)')
    parser.add_argument('--joint-rate', type=float, default=50.0,
                        help='joint state Hz (default 50)')
    parser.add_argument('--storage', choices=[s.value for s in Storage],
                        default=Storage.MCAP.value, help='rosbag2 storage (default mcap)')
    parser.add_argument('--instruction', default='pick up the coffee cup',
                        help='text published once on /oxygen/instruction')
    parser.add_argument('--start-time', type=float, default=0.0,
                        help='stamp of the first message in seconds since the epoch '
                             '(default: now)')
    parser.add_argument('--compressed', choices=[c.value for c in Codec], default=None,
                        help='write the cameras as sensor_msgs/CompressedImage on '
                             '<topic>/compressed (default: raw sensor_msgs/Image)')
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_bag make_demo``; return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        cfg = DemoBagConfig(duration_s=args.duration, camera_rate_hz=args.rate,
                            joint_rate_hz=args.joint_rate, storage=Storage(args.storage),
                            instruction=args.instruction,
                            start_ns=round(args.start_time * NS_PER_S),
                            compressed=Codec(args.compressed) if args.compressed else None)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        counts = write_demo_bag(args.out_bag, cfg, progress=sys.stderr.isatty())
    except FileExistsError as exc:
        parser.error(str(exc))
    for topic, count in counts.items():
        print(f'{topic}: {count} messages')
    print(f'wrote {args.out_bag} ({cfg.storage.value})')
    return 0


if __name__ == '__main__':
    sys.exit(main())
