"""
``oxygen_bag replay``: publish a rosbag2 over DDS with its recorded timing (no rosbag2 needed).

Usage::

    oxygen_bag replay BAG [--rate R] [--loop] [--topics T ...] [--exclude-topics T ...]
                  [--keep-stamps] [--clock [HZ]] [--wait-for-subscribers SECONDS] [--ros-args ...]

A real rclpy node ``oxygen_bag replay`` publishes the recorded CDR bytes as they are, spaced by the
recorded bag times divided by ``--rate``. Publishers have the recorded types and the QoS of the
node's subscriptions (``bag_topics.qos_role``: sensor data for cameras, reliable for joint
states, latched for the instruction).

Header stamps are rewritten by default so that a live node accepts the data as fresh: a message
stamped ``s`` in a bag starting at ``t0`` goes out stamped ``now0 + (s - t0) / rate``, where
``now0`` is the ROS time when (each loop of) the replay starts. Relative stamps survive exactly
(cameras that shared a stamp still do). This deserializes, sets ``header.stamp`` and serializes
again (``rclpy.serialization``); messages without a ``std_msgs/Header header`` pass through raw.
``--keep-stamps`` publishes every message raw.

``--clock [HZ]`` also publishes ``/clock`` (``rosgraph_msgs/Clock``, best effort, HZ times a
second, default 100) in the time base of the published stamps: the bag's own time with
``--keep-stamps`` (so a node with ``use_sim_time:=true`` accepts the recorded stamps as fresh),
else the shifted time. The clock runs at ``--rate``; with ``--loop`` it jumps back at each loop.

Large messages: Fast DDS (Jazzy, 2.14) puts a sample in the *publisher's* shared-memory
segment, 512 KiB by default; a larger sample (a 400x600 rgb8 image is 720 KB) falls back to UDP
fragments and, best effort, most of them were lost here (20 of 45 frames arrived at 15 Hz).
Unless the user set a Fast DDS profile (``FASTRTPS_DEFAULT_PROFILES_FILE`` or
``FASTDDS_DEFAULT_PROFILES_FILE``), replay therefore gives its own participant a segment sized
for the bag's largest messages (then 45 of 45 arrived); subscribers need no change.

With DDS security (docs/security.md) it runs in the robot's enclave (``--ros-args --enclave
/oxygen_ros/robot``) and refuses to start, with the reason, where the security settings would
not hold (``common.secure_node``), as the node does.

Exits 0 at the end of the bag (never with ``--loop``) and on SIGINT/SIGTERM; 1 on errors.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
import enum
import os
from pathlib import Path
import sys
import tempfile
import threading
import time
from typing import Sequence

from oxygen_ros.ros.security import ROBOT_ENCLAVE
from oxygen_ros.ros.stamps import ns_to_stamp, stamp_to_ns
from oxygen_ros.signals import stop_event_on_signals
from oxygen_ros.tools.bag.topics import has_header, message_class, qos_profile, qos_role
from oxygen_ros.tools.common.secure_node import start_node
from oxygen_ros.units import NS_PER_S
import rclpy
from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message, serialize_message
from rclpy.utilities import remove_ros_args
from rosbags.interfaces import Connection
from rosbags.rosbag2 import Reader
from rosgraph_msgs.msg import Clock

NODE_NAME = 'oxygen_replay'
_SLEEP_SLICE_S = 0.05
_ACK_TIMEOUT_S = 2.0
_PROFILE_ENV = ('FASTRTPS_DEFAULT_PROFILES_FILE', 'FASTDDS_DEFAULT_PROFILES_FILE')
_DEFAULT_SHM_FIT = 400_000
"""Largest message (bytes) that fits Fast DDS's default 512 KiB segment with its overhead."""
_MIB = 1 << 20
_SHM_PROFILE = """<?xml version="1.0" encoding="UTF-8" ?>
<dds xmlns="http://www.eprosima.com/XMLSchemas/fastRTPS_Profiles">
  <profiles>
    <transport_descriptors>
      <transport_descriptor>
        <transport_id>oxygen_replay_shm</transport_id>
        <type>SHM</type>
        <segment_size>{segment}</segment_size>
        <maxMessageSize>{max_message}</maxMessageSize>
      </transport_descriptor>
    </transport_descriptors>
    <participant profile_name="oxygen_replay" is_default_profile="true">
      <rtps>
        <userTransports>
          <transport_id>oxygen_replay_shm</transport_id>
        </userTransports>
        <useBuiltinTransports>true</useBuiltinTransports>
      </rtps>
    </participant>
  </profiles>
</dds>
"""


class StampMode(enum.Enum):
    """What happens to ``header.stamp`` on replay."""

    REWRITE = 'rewrite'
    """Shift to the current ROS time, keeping relative stamps."""
    KEEP = 'keep'
    """Publish the recorded bytes unchanged."""


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """Command-line options of ``oxygen_bag replay``."""

    bag: Path
    rate: float = 1.0
    loop: bool = False
    topics: tuple[str, ...] = ()
    """Topics to replay; empty means all."""
    exclude: tuple[str, ...] = ()
    """Topics of the bag left out (a secured launch: those its enclave may not publish)."""
    stamps: StampMode = StampMode.REWRITE
    wait_for_subscribers_s: float = 0.0
    clock_hz: float = 0.0
    """Rate of ``/clock`` messages; 0 = no clock."""

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError(f'--rate must be > 0, got {self.rate}')
        if not 0 <= self.clock_hz <= 10_000:
            raise ValueError(f'--clock must be in (0, 10000] Hz, got {self.clock_hz}')
        if not self.wait_for_subscribers_s >= 0:
            raise ValueError(
                f'--wait-for-subscribers must be >= 0, got {self.wait_for_subscribers_s}')


class _Topic:
    """One replayed topic: its publisher and how to restamp its messages."""

    def __init__(self, node: Node, name: str, msgtype: str) -> None:
        self.name = name
        self.msg_class = message_class(msgtype)
        self.restamp = has_header(self.msg_class)
        self.qos = qos_profile(qos_role(name, msgtype))
        self.publisher = node.create_publisher(self.msg_class, name, self.qos)
        self.count = 0


class BagReplayer:
    """
    Publish the messages of an open bag with their recorded timing.

    :param node: the node that owns the publishers.
    :param reader: an open rosbags ``Reader``.
    :param options: what to replay and how.
    :param stop: set to end the replay early (signal handlers set it).
    :raises ValueError: if a requested topic is not in the bag or a type is not installed.
    """

    def __init__(self, node: Node, reader: Reader, options: ReplayOptions,
                 stop: threading.Event) -> None:
        self._node = node
        self._reader = reader
        self._options = options
        self._stop = stop
        in_bag = {c.topic for c in reader.connections}
        missing = sorted(set(options.topics) - in_bag)
        if missing:
            raise ValueError(f'topics {missing} are not in {options.bag}; it has '
                             f'{sorted(in_bag)}')
        wanted = (set(options.topics) or in_bag) - set(options.exclude)
        self._connections: list[Connection] = [
            c for c in reader.connections if c.topic in wanted]
        if not sum(c.msgcount for c in self._connections):
            raise ValueError(f'{options.bag} holds no messages on {sorted(wanted)}')
        self._topics: dict[str, _Topic] = {}
        for conn in self._connections:
            if conn.topic not in self._topics:
                self._topics[conn.topic] = _Topic(node, conn.topic, conn.msgtype)
        self._clock_lock = threading.Lock()
        self._clock_origin: tuple[float, int] | None = None
        """(monotonic s, ROS ns) of the replay's time base; None before the first message."""
        self._clock_done = threading.Event()
        self._clock_thread = None
        if options.clock_hz > 0:
            pub = node.create_publisher(
                Clock, '/clock', QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT))
            self._clock_thread = threading.Thread(target=self._clock_loop, args=(pub,),
                                                  name='clock', daemon=True)
            self._clock_thread.start()

    def _clock_loop(self, pub: object) -> None:
        """Publish ``/clock`` every 1/clock_hz s until ``close`` (the node is not spun)."""
        period = 1.0 / self._options.clock_hz
        while not (self._clock_done.wait(period) or self._stop.is_set()):
            with self._clock_lock:
                origin = self._clock_origin
            if origin is None:
                continue
            start_mono, start_ns = origin
            elapsed_ns = round((time.monotonic() - start_mono) * self._options.rate * NS_PER_S)
            pub.publish(Clock(clock=ns_to_stamp(max(0, start_ns + elapsed_ns))))

    def close(self) -> None:
        """Stop the ``/clock`` thread (if any)."""
        self._clock_done.set()
        if self._clock_thread is not None:
            self._clock_thread.join(timeout=5.0)

    @property
    def counts(self) -> dict[str, int]:
        """Return messages published per topic so far."""
        return {name: topic.count for name, topic in self._topics.items()}

    def wait_for_subscribers(self, timeout_s: float) -> list[str]:
        """
        Wait until every replayed topic has a subscriber, at most ``timeout_s`` seconds.

        :returns: topics still without a subscriber (empty when all matched).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            lonely = [name for name, topic in self._topics.items()
                      if topic.publisher.get_subscription_count() == 0]
            if not lonely or time.monotonic() >= deadline or self._stop.is_set():
                return lonely
            time.sleep(_SLEEP_SLICE_S)

    def play_once(self) -> bool:
        """
        Publish the bag once with its recorded timing.

        :returns: False if stopped before the end.
        """
        rate = self._options.rate
        clock = self._node.get_clock()
        start_mono = time.monotonic()
        start_ros_ns = clock.now().nanoseconds
        bag_t0 = None
        for conn, bag_ns, raw in self._reader.messages(connections=self._connections):
            if bag_t0 is None:
                bag_t0 = bag_ns
                base = bag_t0 if self._options.stamps is StampMode.KEEP else start_ros_ns
                with self._clock_lock:
                    self._clock_origin = (start_mono, base)
            if not self._sleep_until(start_mono + (bag_ns - bag_t0) / rate / NS_PER_S):
                return False
            topic = self._topics[conn.topic]
            data = bytes(raw)
            if topic.restamp and self._options.stamps is StampMode.REWRITE:
                msg = deserialize_message(data, topic.msg_class)
                delta = stamp_to_ns(msg.header.stamp) - bag_t0
                delta = delta if rate == 1.0 else round(delta / rate)
                msg.header.stamp = ns_to_stamp(max(0, start_ros_ns + delta))
                data = serialize_message(msg)
            topic.publisher.publish(data)
            topic.count += 1
        return True

    def flush(self, timeout_s: float = _ACK_TIMEOUT_S) -> None:
        """Wait (bounded) until reliable subscribers acknowledged everything published."""
        for topic in self._topics.values():
            if topic.qos.reliability == ReliabilityPolicy.RELIABLE:
                topic.publisher.wait_for_all_acked(Duration(seconds=timeout_s))
        time.sleep(0.1)  # let best-effort samples in flight leave the process

    def _sleep_until(self, target_mono: float) -> bool:
        while not self._stop.is_set():
            left = target_mono - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, _SLEEP_SLICE_S))
        return False


def largest_message_bytes(reader: Reader, topics: Sequence[str] = ()) -> int:
    """Return the size of the largest first message of the bag's (selected) connections."""
    largest = 0
    for conn in reader.connections:
        if topics and conn.topic not in topics:
            continue
        for _, _, raw in reader.messages(connections=[conn]):
            largest = max(largest, len(raw))
            break
    return largest


def shm_profile_for(max_message_bytes: int) -> str | None:
    """
    Return a Fast DDS profile whose shared-memory segment carries such messages.

    :param max_message_bytes: the largest serialized message that will be published.
    :returns: the XML text, or None if the default segment is large enough.
    """
    if max_message_bytes <= _DEFAULT_SHM_FIT:
        return None
    # Room for the sensor-data history (5 samples) of three cameras, plus slack.
    segment = -(-(16 * max_message_bytes + _MIB) // _MIB) * _MIB
    max_message = -(-(max_message_bytes + 64 * 1024) // _MIB) * _MIB
    return _SHM_PROFILE.format(segment=segment, max_message=max_message)


def _install_shm_profile(max_message_bytes: int) -> Path | None:
    if any(os.environ.get(name) for name in _PROFILE_ENV):
        return None  # the user's own Fast DDS configuration wins
    if os.environ.get('RMW_IMPLEMENTATION', 'rmw_fastrtps_cpp') != 'rmw_fastrtps_cpp':
        return None
    profile = shm_profile_for(max_message_bytes)
    if profile is None:
        return None
    fd, name = tempfile.mkstemp(prefix='oxygen_replay_fastdds_', suffix='.xml')
    with os.fdopen(fd, 'w') as f:
        f.write(profile)
    os.environ['FASTRTPS_DEFAULT_PROFILES_FILE'] = name
    return Path(name)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='oxygen_bag replay',
        description='Publish a rosbag2 (mcap or sqlite3) with its recorded timing.')
    parser.add_argument('bag', type=Path, help='bag directory (holds metadata.yaml)')
    parser.add_argument('--rate', type=float, default=1.0, help='playback speed factor')
    parser.add_argument('--loop', action='store_true', help='replay until interrupted')
    parser.add_argument('--topics', nargs='+', default=[], metavar='T',
                        help='replay only these topics (default: all)')
    parser.add_argument('--exclude-topics', nargs='+', default=[], metavar='T',
                        help='leave these topics out (those not in the bag are ignored)')
    parser.add_argument('--keep-stamps', action='store_true',
                        help='publish recorded header stamps unchanged (default: shift them '
                             'to now, keeping relative timing)')
    parser.add_argument('--clock', type=float, nargs='?', const=100.0, default=0.0,
                        metavar='HZ', help='also publish /clock at HZ (default 100) in the '
                        "stamps' time base (the bag's with --keep-stamps), for nodes with "
                        'use_sim_time:=true')
    parser.add_argument('--wait-for-subscribers', type=float, default=0.0, metavar='SECONDS',
                        help='before publishing, wait up to SECONDS until every replayed topic '
                             'has a subscriber (DDS discovery takes 1-4 s)')
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_bag replay``; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(remove_ros_args([NODE_NAME, *argv])[1:])
    try:
        options = ReplayOptions(
            bag=args.bag, rate=args.rate, loop=args.loop, topics=tuple(args.topics),
            exclude=tuple(args.exclude_topics),
            stamps=StampMode.KEEP if args.keep_stamps else StampMode.REWRITE,
            wait_for_subscribers_s=args.wait_for_subscribers, clock_hz=args.clock)
    except ValueError as exc:
        parser.error(str(exc))
    stop = stop_event_on_signals()
    try:
        reader = Reader(options.bag)
        reader.open()
    except Exception as exc:  # rosbags raises several types; report them all the same way
        print(f'oxygen_bag replay: error: cannot open bag {options.bag}: {exc}', file=sys.stderr)
        return 1
    profile = _install_shm_profile(largest_message_bytes(reader, options.topics))
    node = start_node('oxygen_bag replay', NODE_NAME, argv, ROBOT_ENCLAVE)
    if node is None:
        reader.close()
        if profile is not None:
            profile.unlink(missing_ok=True)
        return 1
    log = node.get_logger()
    if profile is not None:
        log.info(f'large messages: Fast DDS shared-memory profile {profile}')
    replayer = None
    try:
        replayer = BagReplayer(node, reader, options, stop)
        if options.wait_for_subscribers_s > 0:
            log.info(f'waiting up to {options.wait_for_subscribers_s} s for subscribers')
            lonely = replayer.wait_for_subscribers(options.wait_for_subscribers_s)
            if lonely:
                log.warning(f'no subscriber on {lonely}; replaying anyway')
        log.info(f'replaying {options.bag} at rate {options.rate} '
                 f'({options.stamps.value} stamps)')
        while replayer.play_once() and options.loop:
            pass
        if not stop.is_set():
            replayer.flush()
        log.info(f'published {replayer.counts}')
        return 0
    except ValueError as exc:
        log.error(str(exc))
        return 1
    finally:
        if replayer is not None:
            replayer.close()
        reader.close()
        node.destroy_node()
        rclpy.try_shutdown()
        if profile is not None:
            profile.unlink(missing_ok=True)


if __name__ == '__main__':
    sys.exit(main())
