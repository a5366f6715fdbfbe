"""
Hypothesis strategies for the node's inputs, and the messages they build (test_node_fuzz.py).

A case is pure data (drawn by hypothesis); ``build(case, now_ns)`` turns it into a message at
publish time, with its stamp relative to the node clock. Every case on a camera or on the joint
states has at least one defect that must make the node refuse to act (``must_refuse``); an
instruction is refused only when blank, and questions never stop actions, so those cases are
checked for "no crash, recovers" only.
"""

from __future__ import annotations

from dataclasses import dataclass
import enum
import math
import struct

from hypothesis import strategies as st
import numpy as np
from oxygen_ros.ros.images.compressed import Codec, encode_rgb
from oxygen_ros.ros.images.raw import MAX_IMAGE_SIDE, SUPPORTED_ENCODINGS
from oxygen_ros.units import NS_PER_S
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Header, String

MAX_AGE_S = 0.3
"""``max_observation_age`` of the fuzzed node."""
JOINTS = tuple(f'joint_{i}' for i in range(1, 8)) + ('gripper',)
WRIST = np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8)
WRIST_FILES = {codec: encode_rgb(WRIST, codec)[1] for codec in Codec}
_INT32 = 2**31 - 1


class Topic(str, enum.Enum):
    """The node's subscriptions in the fuzz test (base raw, left wrist compressed)."""

    BASE = 'base raw'
    WRIST = 'wrist compressed'
    JOINTS = 'joint states'
    INSTRUCTION = 'instruction'
    ASK = 'ask'


class StampKind(str, enum.Enum):
    FRESH = 'fresh'
    STALE = 'stale'
    FUTURE = 'future'
    ZERO = 'zero'
    BAD_NANOSEC = 'nanosec >= 1e9'
    NEGATIVE = 'negative sec'
    OUT_OF_ORDER = 'out of order'
    """Older than a valid image of the same camera sent just before it (still within age)."""


_FUTURE_MARGIN_S = 1.0
"""Extra seconds of a future stamp: it must stay in the future beyond ``MAX_AGE_S`` for the
whole example window (0.35 s) and a loaded control cycle, or the node rightly accepts it."""


@dataclass(frozen=True)
class Stamp:
    kind: StampKind
    amount: float
    """Seconds beyond ``MAX_AGE_S`` (stale; future: beyond it plus ``_FUTURE_MARGIN_S``) or
    behind the previous image (order)."""

    def ns(self, now_ns: int, previous_ns: int) -> tuple[int, int]:
        """Return ``(sec, nanosec)`` as sent (may be invalid on purpose)."""
        if self.kind is StampKind.ZERO:
            return 0, 0
        if self.kind is StampKind.BAD_NANOSEC:
            return now_ns // NS_PER_S, NS_PER_S + int(self.amount * 1e6) % (2**32 - NS_PER_S)
        if self.kind is StampKind.NEGATIVE:
            return -max(1, int(self.amount * 1e3) % _INT32), 0
        ns = {StampKind.FRESH: now_ns,
              StampKind.STALE: now_ns - round((MAX_AGE_S + self.amount) * NS_PER_S),
              StampKind.FUTURE: now_ns + round((MAX_AGE_S + _FUTURE_MARGIN_S + self.amount)
                                               * NS_PER_S),
              StampKind.OUT_OF_ORDER: previous_ns - round(self.amount * NS_PER_S)}[self.kind]
        sec, nanosec = divmod(max(ns, 1), NS_PER_S)
        return min(sec, _INT32), nanosec


@dataclass(frozen=True)
class Case:
    """One fuzzed message: where it goes, what is wrong with it, how to build it."""

    topic: Topic
    defect: str
    must_refuse: bool
    stamp: Stamp
    fields: tuple


def _header(stamp: Stamp, now_ns: int, previous_ns: int, frame_id: str) -> Header:
    header = Header(frame_id=frame_id)
    header.stamp.sec, header.stamp.nanosec = stamp.ns(now_ns, previous_ns)
    return header


# ------------------------------------------------------------------------------- strategies

_text = st.text(max_size=40)
_bad_stamps = st.builds(Stamp, st.sampled_from([StampKind.STALE, StampKind.FUTURE,
                                                StampKind.ZERO, StampKind.BAD_NANOSEC,
                                                StampKind.NEGATIVE]),
                        st.floats(0.05, 1e6))
_fresh = st.just(Stamp(StampKind.FRESH, 0.0))
_out_of_order = st.builds(Stamp, st.just(StampKind.OUT_OF_ORDER), st.floats(0.01, 0.2))


@st.composite
def raw_images(draw: st.DrawFn, defect: str) -> Case:
    """Return a base camera ``Image`` case with ``defect`` (size, step, encoding or stamp)."""
    enc = draw(st.sampled_from(SUPPORTED_ENCODINGS))
    h, w = draw(st.integers(1, 64)), draw(st.integers(1, 64))
    channels = {'mono8': 1, 'rgba8': 4, 'bgra8': 4}.get(enc, 3)
    step = w * channels + draw(st.integers(0, 8))
    size = step * h
    stamp = Stamp(StampKind.FRESH, 0.0)
    if defect == 'encoding':
        enc = draw(st.one_of(_text, st.sampled_from(['16UC1', '32FC1', 'yuv422', 'bayer_rggb8',
                                                     'RGB8', 'rgb16', ''])).filter(
            lambda e: e not in SUPPORTED_ENCODINGS))
    elif defect == 'short step':
        step = draw(st.integers(0, w * channels - 1))
    elif defect == 'short data':
        size = draw(st.integers(0, step * h - 1))
    elif defect == 'empty data':
        size = 0
    elif defect == 'zero size':
        h, w = draw(st.sampled_from([(0, w), (h, 0), (0, 0)]))
    elif defect == 'huge size':
        h, w = draw(st.sampled_from([(MAX_IMAGE_SIDE + 1, 1), (1, 2**32 - 1), (2**31, 2**31)]))
        step, size = draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 4096))
    elif defect == 'stamp':
        stamp = draw(_bad_stamps)
    else:
        stamp = draw(_out_of_order)
    fields = (h, w, enc, draw(st.integers(0, 255)), step, size, draw(_text))
    return Case(Topic.BASE, defect, True, stamp, fields)


def _patched_jpeg_size(data: bytes, height: int, width: int) -> bytes:
    """Return the JPEG with its SOF0 frame header claiming ``height`` x ``width``."""
    at = data.index(b'\xff\xc0') + 5
    return data[:at] + struct.pack('>HH', height, width) + data[at + 4:]


@st.composite
def compressed_images(draw: st.DrawFn, defect: str) -> Case:
    """Return a wrist ``CompressedImage`` case (bit flips may still decode: may act)."""
    codec = draw(st.sampled_from(list(Codec)))
    good = WRIST_FILES[codec]
    fmt = f'rgb8; {codec.value} compressed bgr8'
    stamp, must_refuse, data = Stamp(StampKind.FRESH, 0.0), True, good
    if defect == 'random bytes':
        data = draw(st.binary(max_size=2000))
        must_refuse = not data.startswith((Codec.JPEG.signature, Codec.PNG.signature))
    elif defect == 'huge random':
        data = bytes(np.random.default_rng(draw(st.integers(0, 2**32 - 1))).integers(
            0, 256, draw(st.integers(100_000, 300_000)), dtype=np.uint8))
    elif defect == 'truncated':
        data = good[:draw(st.integers(0, len(good) - 3))]
    elif defect == 'format mismatch':
        fmt = f'rgb8; {"png" if codec is Codec.JPEG else "jpeg"} compressed bgr8'
    elif defect == 'unknown format':
        fmt = draw(st.sampled_from(['rgb8; tiff compressed bgr8', 'theora', 'rgb8; qoi',
                                    'h264']))
    elif defect == 'empty':
        data = b''
    elif defect == 'huge header':
        data = _patched_jpeg_size(WRIST_FILES[Codec.JPEG],
                                  *draw(st.sampled_from([(60000, 60000), (8193, 8),
                                                         (48, 65535)])))
        fmt = 'jpeg'
    elif defect == 'depth':
        fmt = '16UC1; compressedDepth png'
    elif defect == 'stamp':
        stamp = draw(st.one_of(_bad_stamps, _out_of_order))
        must_refuse = stamp.kind is not StampKind.OUT_OF_ORDER  # its chunk carries base's g
    else:
        flips = draw(st.lists(st.integers(0, len(good) - 1), min_size=1, max_size=8))
        buf = bytearray(good)
        for at in flips:
            buf[at] ^= draw(st.integers(1, 255))
        data, must_refuse = bytes(buf), False  # JPEG has no checksum: may decode
    return Case(Topic.WRIST, defect, must_refuse, stamp, (fmt, data))


_bad_value = st.sampled_from([math.nan, math.inf, -math.inf])


@st.composite
def joint_states(draw: st.DrawFn, defect: str) -> Case:
    """Return a ``JointState`` case with ``defect`` (NaN/Inf, names, sizes, stamp)."""
    names = list(JOINTS) + draw(st.lists(_text.filter(lambda n: n not in JOINTS),
                                         max_size=5, unique=True))
    names = draw(st.permutations(names))
    positions = draw(st.lists(st.floats(-10, 10), min_size=len(names), max_size=len(names)))
    stamp = Stamp(StampKind.FRESH, 0.0)
    if defect == 'non-finite':
        positions[names.index(draw(st.sampled_from(JOINTS)))] = draw(_bad_value)
    elif defect == 'missing joint':
        gone = draw(st.sampled_from(JOINTS))
        positions.pop(names.index(gone))
        names.remove(gone)
    elif defect == 'duplicate name':
        names.append(draw(st.sampled_from(names)))
        positions.append(0.0)
    elif defect == 'length mismatch':
        positions = positions[:-1] if draw(st.booleans()) else positions + [0.0, 1.0]
    elif defect == 'empty':
        names, positions = [], []
    elif defect == 'huge':
        n = draw(st.integers(10_000, 20_000))
        names = [f'extra_{i}' for i in range(n)] + list(JOINTS)
        positions = [0.0] * n + [0.1] * (len(JOINTS) - 1) + [draw(_bad_value)]
    else:
        stamp = draw(_bad_stamps.filter(lambda s: s.kind is not StampKind.ZERO))
    velocity = draw(st.lists(st.floats(allow_nan=True), max_size=3))
    return Case(Topic.JOINTS, defect, True, stamp, (names, positions, velocity))


@st.composite
def instructions(draw: st.DrawFn, defect: str) -> Case:
    """Return an instruction: blank (must refuse) or any text (control chars, long)."""
    blank = defect == 'blank'
    text = draw(st.text(' \t\n\r\x0b\x0c', max_size=20) if blank else
                st.one_of(st.text(max_size=200), st.text(min_size=2000, max_size=5000)))
    must_refuse = not text.strip()
    return Case(Topic.INSTRUCTION, 'blank' if must_refuse else 'text', must_refuse,
                Stamp(StampKind.FRESH, 0.0), (text,))


def questions(defect: str) -> st.SearchStrategy[Case]:
    """Return questions: any text, short or long (they never stop actions)."""
    return st.builds(lambda text: Case(Topic.ASK, defect, False, Stamp(StampKind.FRESH, 0.0),
                                       (text,)),
                     st.one_of(st.text(max_size=300), st.text(min_size=3000, max_size=8000)))


DEFECTS: dict[Topic, tuple[str, ...]] = {
    Topic.BASE: ('encoding', 'short step', 'short data', 'empty data', 'zero size',
                 'huge size', 'stamp', 'out of order'),
    Topic.WRIST: ('random bytes', 'huge random', 'truncated', 'format mismatch',
                  'unknown format', 'empty', 'huge header', 'depth', 'stamp', 'bit flips'),
    Topic.JOINTS: ('non-finite', 'missing joint', 'duplicate name', 'length mismatch', 'empty',
                   'huge', 'stamp'),
    Topic.INSTRUCTION: ('blank', 'text'),
    Topic.ASK: ('question',),
}
"""Every (topic, defect) the fuzz test runs, each with its own examples."""
_STRATEGIES = {Topic.BASE: raw_images, Topic.WRIST: compressed_images,
               Topic.JOINTS: joint_states, Topic.INSTRUCTION: instructions,
               Topic.ASK: questions}


def cases(topic: Topic, defect: str) -> st.SearchStrategy[Case]:
    """Return the strategy of one (topic, defect) of ``DEFECTS``."""
    return _STRATEGIES[topic](defect)


# ---------------------------------------------------------------------------------- messages

def build(case: Case, now_ns: int, previous_ns: int) -> object:
    """
    Return the message of ``case`` at node time ``now_ns``.

    :param previous_ns: stamp of the valid image of the same camera sent just before (for
        out-of-order stamps).
    """
    if case.topic is Topic.BASE:
        h, w, enc, bigendian, step, size, frame_id = case.fields
        msg = Image(header=_header(case.stamp, now_ns, previous_ns, frame_id), height=h,
                    width=w, encoding=enc, is_bigendian=bigendian, step=step)
        msg.data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
        return msg
    if case.topic is Topic.WRIST:
        fmt, data = case.fields
        return CompressedImage(header=_header(case.stamp, now_ns, previous_ns, 'wrist'),
                               format=fmt, data=data)
    if case.topic is Topic.JOINTS:
        names, positions, velocity = case.fields
        return JointState(header=_header(case.stamp, now_ns, previous_ns, ''), name=names,
                          position=positions, velocity=velocity)
    return String(data=case.fields[0])


__all__ = ['Case', 'DEFECTS', 'JOINTS', 'MAX_AGE_S', 'Stamp', 'StampKind', 'Topic', 'WRIST',
           'build', 'cases']
