"""
Fixtures for tests over real DDS: an isolated ROS domain, a test node, tool subprocesses.

Every test that uses ``ros_domain_id`` (directly or through ``ros_node``, ``ros_env`` or
``ros_processes``) gets its own random ``ROS_DOMAIN_ID`` and
``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST``, so concurrent test runs on one machine do not see each
other. Discovery across processes takes 1-4 s here (``docs/running.md#ros-2-from-pypi-the-venv``):
wait for matched endpoints (``RosTestNode.wait_for_subscribers`` / ``wait_for_publishers``), never
sleep blindly.

Typical use::

    def test_x(ros_node, ros_processes, demo_bag):
        images = ros_node.collect('/camera/base/image_raw', Image, qos_profile_sensor_data)
        proc = ros_processes.start('oxygen_ros.tools.bag.replay', str(demo_bag.path))
        assert ros_node.spin_until(lambda: len(images) >= 10, timeout_s=20)
        assert proc.wait(timeout_s=20) == 0, proc.output()
"""

from __future__ import annotations

from dataclasses import dataclass, field
import os
from pathlib import Path
import random
import signal
import subprocess
import sys
import time
from typing import Callable, Iterator

from oxygen_ros.tools.bag.make_demo import DemoBagConfig, write_demo_bag
import pytest
import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import QoSProfile

# Fast DDS ports are 7400 + 250 * domain + ...; domains 0-101 and 215-232 stay clear of the
# Linux ephemeral port range (ROS 2 docs, "The ROS_DOMAIN_ID"). 0 is left to people.
_DOMAIN_IDS = tuple(range(1, 102)) + tuple(range(215, 233))
DISCOVERY_TIMEOUT_S = 20.0
"""Generous bound on DDS discovery (1-4 s normally) for a loaded shared machine."""


@pytest.fixture
def ros_domain_id(monkeypatch: pytest.MonkeyPatch) -> int:
    """Return a fresh random ROS domain id, also set in this process's environment."""
    domain_id = random.SystemRandom().choice(_DOMAIN_IDS)
    monkeypatch.setenv('ROS_DOMAIN_ID', str(domain_id))
    monkeypatch.setenv('ROS_AUTOMATIC_DISCOVERY_RANGE', 'LOCALHOST')
    return domain_id


@pytest.fixture
def ros_env(ros_domain_id: int) -> dict[str, str]:
    """Return the environment for ROS subprocesses (the test's domain, unbuffered output)."""
    env = dict(os.environ)
    env['PYTHONUNBUFFERED'] = '1'
    env.setdefault('AMENT_PREFIX_PATH', sys.prefix)
    return env


@dataclass(slots=True)
class Received:
    """One message taken by a ``Collector``."""

    msg: object
    """The message (``bytes`` for raw collectors)."""
    received_ns: int
    """DDS receive time, system clock (``MessageInfo['received_timestamp']``)."""


@dataclass(slots=True)
class Collector:
    """Messages received on one topic, in arrival order."""

    topic: str
    messages: list[Received] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.messages)

    @property
    def msgs(self) -> list[object]:
        """Return the messages without receive times."""
        return [r.msg for r in self.messages]

    def _take(self, msg: object, info: dict) -> None:
        self.messages.append(Received(msg, info['received_timestamp']))


class RosTestNode:
    """
    An rclpy node in its own context on the test's domain, with helpers to wait on DDS.

    :param domain_id: the ROS domain.
    :param name: node name.
    """

    def __init__(self, domain_id: int, name: str = 'oxygen_test') -> None:
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node(name, context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)

    def spin_until(self, predicate: Callable[[], bool],
                   timeout_s: float = DISCOVERY_TIMEOUT_S) -> bool:
        """Spin until ``predicate()`` is true; return False on timeout."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() >= deadline:
                return False
            self.executor.spin_once(timeout_sec=0.02)
        return True

    def publish_until(self, publish: Callable[[], None], predicate: Callable[[], bool],
                      timeout_s: float, period_s: float = 0.05) -> bool:
        """Call ``publish()`` every ``period_s``, spin until ``predicate()``; False on timeout."""
        deadline = time.monotonic() + timeout_s
        next_publish = 0.0
        while not predicate():
            now = time.monotonic()
            if now >= deadline:
                return False
            if now >= next_publish:
                publish()
                next_publish = now + period_s
            self.executor.spin_once(timeout_sec=0.01)
        return True

    def spin_for(self, seconds: float) -> None:
        """Spin for ``seconds`` (to take messages still in flight, not for discovery)."""
        self.spin_until(lambda: False, timeout_s=seconds)

    def collect(self, topic: str, msg_type: type, qos: QoSProfile | int,
                *, raw: bool = False) -> Collector:
        """Subscribe to ``topic`` and return the collector its messages go to."""
        collector = Collector(topic)
        self.node.create_subscription(
            msg_type, topic, lambda msg, info: collector._take(msg, info), qos, raw=raw)
        return collector

    def wait_for_subscribers(self, publisher: object, count: int = 1,
                             timeout_s: float = DISCOVERY_TIMEOUT_S) -> bool:
        """Spin until ``publisher`` has ``count`` matched subscriptions."""
        return self.spin_until(lambda: publisher.get_subscription_count() >= count, timeout_s)

    def wait_for_publishers(self, topic: str, count: int = 1,
                            timeout_s: float = DISCOVERY_TIMEOUT_S) -> bool:
        """Spin until ``topic`` has ``count`` publishers in the graph."""
        return self.spin_until(lambda: self.node.count_publishers(topic) >= count, timeout_s)

    def close(self) -> None:
        """Destroy the node and shut the context down."""
        self.executor.shutdown()
        self.node.destroy_node()
        self.context.try_shutdown()


@pytest.fixture
def rclpy_context(ros_domain_id: int) -> Iterator[Context]:
    """Return an rclpy context of its own on the test's domain (for nodes built in the test)."""
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    yield ctx
    ctx.try_shutdown()


@pytest.fixture
def ros_node(ros_domain_id: int) -> Iterator[RosTestNode]:
    """Return a test node on the test's domain (destroyed after the test)."""
    node = RosTestNode(ros_domain_id)
    yield node
    node.close()


class ToolProcess:
    """A Python module run as a subprocess, output captured in a file."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        with open(log_path, 'wb') as log:
            self.popen = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)

    def output(self) -> str:
        """Return everything the process printed so far."""
        return self.log_path.read_text(errors='replace')

    def wait(self, timeout_s: float) -> int:
        """
        Wait for the process to exit and return its exit status.

        :raises AssertionError: on timeout (the process is killed, its output shown).
        """
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            raise AssertionError(f'{self.args} did not exit within {timeout_s} s; output:\n'
                                 f'{self.output()}') from None

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 15.0) -> int:
        """Send ``sig`` and return the exit status (see ``wait``)."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        return self.wait(timeout_s)


class ToolProcesses:
    """Starts ``python -m <module>`` subprocesses on the test's domain; kills leftovers."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self._env = env
        self._log_dir = log_dir
        self._procs: list[ToolProcess] = []

    def start(self, module: str, *args: str) -> ToolProcess:
        """Start ``sys.executable -m module args...`` (no installed scripts needed)."""
        log = self._log_dir / f'{module.rsplit(".", 1)[-1]}-{len(self._procs)}.log'
        proc = ToolProcess([sys.executable, '-m', module, *args], self._env, log)
        self._procs.append(proc)
        return proc

    def close(self) -> None:
        """Interrupt, then kill, every process still running."""
        for proc in self._procs:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGINT)
                try:
                    proc.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.popen.kill()
                    proc.popen.wait()


@pytest.fixture
def ros_processes(ros_env: dict[str, str], tmp_path: Path) -> Iterator[ToolProcesses]:
    """Return a starter of tool subprocesses on the test's domain."""
    procs = ToolProcesses(ros_env, tmp_path)
    yield procs
    procs.close()


@dataclass(frozen=True, slots=True)
class DemoBag:
    """A demo bag written once per session (read-only for tests)."""

    path: Path
    config: DemoBagConfig
    counts: dict[str, int]


DEMO_BAG_CONFIG = DemoBagConfig(duration_s=2.0, camera_rate_hz=15.0, joint_rate_hz=50.0,
                                start_ns=1_700_000_000 * 10**9)


@pytest.fixture(scope='session')
def demo_bag(tmp_path_factory: pytest.TempPathFactory) -> DemoBag:
    """Return a 2 s mcap demo bag (``oxygen_bag make_demo`` content, fixed start stamp)."""
    path = tmp_path_factory.mktemp('bags') / 'demo'
    counts = write_demo_bag(path, DEMO_BAG_CONFIG)
    return DemoBag(path, DEMO_BAG_CONFIG, counts)
