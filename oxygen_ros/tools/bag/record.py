"""
``oxygen_bag record``: record live topics into a rosbag2 (no rosbag2 needed).

Usage::

    oxygen_bag record OUT_BAG TOPIC [TOPIC ...] [--duration S] [--storage mcap|sqlite3]
                  [--ros-args ...]

A real rclpy node ``oxygen_bag record`` polls the ROS graph until each topic has a publisher, then
subscribes raw (``raw=True``: the CDR bytes, never deserialized) with the type found in the
graph and a QoS compatible with every publisher seen (as rosbag2 does: reliable only if all
publishers are reliable, transient local only if all are, so latched messages are recorded
too). Each message is written with its DDS receive time (system clock, as rosbag2 does) as
bag time; the publishers' QoS goes into ``offered_qos_profiles``.

Stops on SIGINT or SIGTERM, or after ``--duration`` seconds from start, then writes what was
received before the stop and is still queued, and closes the bag, so the bag is complete and
readable. Exits 0 then; 1 on errors.

With DDS security (docs/security.md) it runs in the observer's enclave (``--ros-args --enclave
/oxygen_ros/observer``) and refuses to start, with the reason, where the security settings
would not hold (``common.secure_node``), as the node does.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
import functools
from pathlib import Path
import sys
import threading
import time
from typing import Sequence

from oxygen_ros.ros.security import OBSERVER_ENCLAVE
from oxygen_ros.signals import stop_event_on_signals
from oxygen_ros.tools.bag.topics import (
    bag_qos, check_known_type, message_class, Storage, typestore)
from oxygen_ros.tools.common.secure_node import start_node
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.subscription import Subscription
from rclpy.utilities import remove_ros_args
from rosbags.interfaces import Connection
from rosbags.rosbag2 import Writer

NODE_NAME = 'oxygen_record'
_GRAPH_POLL_S = 0.2
_SPIN_S = 0.05
_DRAIN_QUIET_S = 0.15
_DRAIN_MAX_S = 2.0
_DEPTH = 100


@dataclass(slots=True)
class _Topic:
    """Recording state of one requested topic."""

    name: str
    msgtype: str | None = None
    subscription: Subscription | None = None
    connection: Connection | None = None
    count: int = 0
    failed: bool = False
    qos: QoSProfile | None = field(default=None, repr=False)


def subscription_qos(offered: Sequence[QoSProfile]) -> QoSProfile:
    """
    Return a subscription QoS that matches every offered publisher QoS.

    :param offered: QoS of the publishers seen on the topic (at least one).
    :returns: keep last 100; reliable if all publishers are reliable, else best effort;
        transient local if all publishers are, else volatile.
    """
    reliable = all(q.reliability == ReliabilityPolicy.RELIABLE for q in offered)
    latched = all(q.durability == DurabilityPolicy.TRANSIENT_LOCAL for q in offered)
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST, depth=_DEPTH,
        reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE)


class BagRecorder:
    """
    Subscribe to topics as they appear and write their raw messages to an open bag.

    :param node: the node that owns the subscriptions.
    :param writer: an open rosbags ``Writer``.
    :param topics: fully qualified topic names.
    """

    def __init__(self, node: Node, writer: Writer, topics: Sequence[str]) -> None:
        self._node = node
        self._writer = writer
        self._topics = {name: _Topic(name) for name in topics}
        self.last_message_mono = time.monotonic()
        self.stop_ns: int | None = None
        """Once set, messages received later than this (system time, ns) are not written."""

    @property
    def counts(self) -> dict[str, int]:
        """Return messages written per topic."""
        return {name: topic.count for name, topic in self._topics.items()}

    @property
    def pending(self) -> list[str]:
        """Return topics not subscribed yet (and not given up on)."""
        return [t.name for t in self._topics.values() if t.subscription is None and not t.failed]

    def poll_graph(self) -> None:
        """Subscribe to every pending topic that now has a publisher with a known type."""
        types = dict(self._node.get_topic_names_and_types())
        for name in self.pending:
            if name not in types:
                continue
            infos = self._node.get_publishers_info_by_topic(name)
            if not infos:
                continue  # only subscribers so far: wait for a publisher to choose the QoS
            self._subscribe(self._topics[name], types[name], infos)

    def _subscribe(self, topic: _Topic, msgtypes: Sequence[str], infos: Sequence) -> None:
        log = self._node.get_logger()
        msgtype = msgtypes[0]
        if len(msgtypes) > 1:
            log.warning(f'{topic.name} has several types {msgtypes}; recording {msgtype}')
        try:
            msg_class = message_class(msgtype)
            check_known_type(msgtype)
        except ValueError as exc:
            log.error(f'cannot record {topic.name}: {exc}')
            topic.failed = True
            return
        offered = [info.qos_profile for info in infos if info.topic_type == msgtype]
        topic.msgtype, topic.qos = msgtype, subscription_qos(offered)
        topic.connection = self._writer.add_connection(
            topic.name, msgtype, typestore=typestore(),
            offered_qos_profiles=[bag_qos(q) for q in offered])
        topic.subscription = self._node.create_subscription(
            msg_class, topic.name, functools.partial(self._write, topic), topic.qos, raw=True)
        log.info(f'recording {topic.name} [{msgtype}] '
                 f'{topic.qos.reliability.name.lower()} {topic.qos.durability.name.lower()}')

    def _write(self, topic: _Topic, raw: bytes, info: dict) -> None:
        # Bag time = DDS receive time (system clock), as rosbag2 records it.
        received_ns = info['received_timestamp']
        if self.stop_ns is not None and received_ns > self.stop_ns:
            return
        self._writer.write(topic.connection, received_ns, raw)
        topic.count += 1
        self.last_message_mono = time.monotonic()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog='oxygen_bag record', description='Record live ROS 2 topics into a rosbag2.')
    parser.add_argument('out_bag', type=Path, help='bag directory to create')
    parser.add_argument('topics', nargs='+', metavar='TOPIC', help='topics to record')
    parser.add_argument('--duration', type=float, default=None, metavar='S',
                        help='stop after S seconds (default: run until SIGINT/SIGTERM)')
    parser.add_argument('--storage', choices=[s.value for s in Storage],
                        default=Storage.MCAP.value, help='rosbag2 storage (default mcap)')
    return parser


def _spin_until_stopped(executor: SingleThreadedExecutor, recorder: BagRecorder,
                        stop: threading.Event, duration_s: float | None) -> None:
    start = time.monotonic()
    next_poll = start
    while not stop.is_set():
        now = time.monotonic()
        if duration_s is not None and now - start >= duration_s:
            return
        if recorder.pending and now >= next_poll:
            recorder.poll_graph()
            next_poll = now + _GRAPH_POLL_S
        executor.spin_once(timeout_sec=_SPIN_S)


def _drain(executor: SingleThreadedExecutor, recorder: BagRecorder) -> None:
    """Write messages received before the stop that are still queued (bounded)."""
    recorder.stop_ns = time.time_ns()
    start = recorder.last_message_mono = time.monotonic()
    while time.monotonic() - start < _DRAIN_MAX_S:
        if time.monotonic() - recorder.last_message_mono > _DRAIN_QUIET_S:
            return
        executor.spin_once(timeout_sec=0.01)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``oxygen_bag record``; return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(remove_ros_args([NODE_NAME, *argv])[1:])
    if args.duration is not None and not args.duration > 0:
        parser.error(f'--duration must be > 0, got {args.duration}')
    if args.out_bag.exists():
        parser.error(f'{args.out_bag} exists; rosbag2 bags are never overwritten')
    topics = list(dict.fromkeys(t if t.startswith('/') else f'/{t}' for t in args.topics))
    stop = stop_event_on_signals()
    node = start_node('oxygen_bag record', NODE_NAME, argv, OBSERVER_ENCLAVE)
    if node is None:
        return 1
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    writer = Writer(args.out_bag, version=Writer.VERSION_LATEST,
                    storage_plugin=Storage(args.storage).plugin)
    writer.open()  # after ROS is up, so a failed start leaves no half-made bag
    recorder = BagRecorder(node, writer, topics)
    log = node.get_logger()
    try:
        log.info(f'waiting for {topics}')
        _spin_until_stopped(executor, recorder, stop, args.duration)
        _drain(executor, recorder)
    finally:
        writer.close()
        if recorder.pending:
            log.warning(f'never recorded {recorder.pending}: no publisher appeared')
        log.info(f'wrote {args.out_bag}: {recorder.counts}')
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
