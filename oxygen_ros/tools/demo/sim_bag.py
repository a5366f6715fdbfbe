"""
Read back a closed-loop run recorded by ``oxygen_demo sim`` (a rosbag2 of the sim and node).

Every time here is **sim time** from the messages' own stamps (bag times are wall receive
times and are not used): chunks by ``header.stamp``, chunk arrival and switch times from the
simulator's ``~/chunk_events``, joint states and commands by their stamps. With several arms
each is read on its own (``read_run(bag, arm)``: its topics, ``ArmTopics``, its executor's
status and the node's status of that robot).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
from oxygen_ros.ros.diagnostics import STATUS_NAME
from oxygen_ros.ros.images.raw import image_to_rgb
from oxygen_ros.ros.stamps import duration_to_ns, stamp_to_ns
from oxygen_ros.sim import endpoints
from oxygen_ros.sim.reports import executor_status_name
from oxygen_ros.tools.bag.topics import typestore
from rosbags.rosbag2 import Reader

DIAGNOSTICS = endpoints.DIAGNOSTICS.name
NODE_STATUS = STATUS_NAME


def _absolute(name: str, arm: str) -> str:
    """Return arm ``arm``'s endpoint ``name`` resolved in the root namespace."""
    topic = endpoints.arm_topic(name, arm)
    if topic.startswith('~/'):
        return f'/{endpoints.NODE_NAME}/{topic[2:]}'
    return topic if topic.startswith('/') else f'/{topic}'


@dataclass(frozen=True, slots=True)
class ArmTopics:
    """The recorded topics of one arm (``of('')``: the one arm's, unnamespaced)."""

    chunks: str
    joint_states: str
    command: str
    events: str
    base_images: str

    @classmethod
    def of(cls, arm: str = '') -> ArmTopics:
        """Return arm ``arm``'s topics (``sim.endpoints.arm_topic``)."""
        return cls(*(_absolute(ep.name, arm) for ep in (
            endpoints.ACTION_CHUNK, endpoints.JOINT_STATES, endpoints.JOINT_COMMAND,
            endpoints.CHUNK_EVENTS, endpoints.CAMERAS[0])))

    @property
    def every(self) -> tuple[str, ...]:
        """Return every one of them."""
        return (self.chunks, self.joint_states, self.command, self.events, self.base_images)


def recorded_topics(arms: tuple[str, ...] = ('',)) -> tuple[str, ...]:
    """Return what ``oxygen_demo sim`` records for ``arms``: each arm's, and ``/diagnostics``."""
    return (*(t for arm in arms for t in ArmTopics.of(arm).every), DIAGNOSTICS)


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """One published chunk: absolute point times (sim ns) and positions ``[H, J]``."""

    stamp_ns: int
    times_ns: np.ndarray
    positions: np.ndarray


@dataclass(slots=True)
class SimRun:
    """
    A recorded run, in sim time.

    :ivar joint_names: the command joints (``joint1`` .. ``joint7``, ``gripper``).
    :ivar state_t: ``int64 [n]`` joint-state stamps; ``state_q``: ``float64 [n, J]`` achieved.
    :ivar command_t: ``int64 [m]``; ``command_q``: ``float64 [m, J]`` commanded positions.
    :ivar chunks: the node's chunks as published.
    :ivar events: the simulator's chunk events (``message``, values as str).
    :ivar node_status: the node's ``oxygen: engine`` statuses (values as str).
    :ivar sim_status: the simulator's statuses by name, newest last.
    :ivar frames: base camera frames ``uint8 [h, w, 3]`` with their stamps.
    """

    joint_names: tuple[str, ...] = ()
    state_t: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    state_q: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    command_t: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    command_q: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    chunks: list[ChunkPlan] = field(default_factory=list)
    events: list[dict[str, str]] = field(default_factory=list)
    node_status: list[dict[str, str]] = field(default_factory=list)
    sim_status: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    frames: list[tuple[int, np.ndarray]] = field(default_factory=list)

    def executed(self) -> list[dict[str, str]]:
        """Return the ``executed`` events (one per switch), in order."""
        return [e for e in self.events if e['message'] == 'executed']


def _status_dict(status: object) -> dict[str, str]:
    return {'message': status.message, 'level': str(int(status.level)),
            **{kv.key: kv.value for kv in status.values}}


def _messages(bag: Path, topics: tuple[str, ...]) -> Iterator[tuple[str, object]]:
    store = typestore()
    with Reader(bag) as reader:
        conns = [c for c in reader.connections if c.topic in topics]
        for conn, _, raw in reader.messages(connections=conns):
            yield conn.topic, store.deserialize_cdr(raw, conn.msgtype)


def read_run(bag: Path, arm: str = '', *, with_frames: bool = True) -> SimRun:
    """
    Read a recorded run of one arm.

    :param bag: the rosbag2 folder.
    :param arm: the arm ('' = the one arm): its topics, its executor's status
        (``oxygen_sim: chunk executor <arm>``) and the node's status of robot ``arm``
        (``oxygen: robot <arm>``).
    :param with_frames: decode the base camera images (for the video).
    :raises FileNotFoundError: no bag there.
    """
    run = SimRun()
    states: list[tuple[int, list[float]]] = []
    commands: list[tuple[int, list[float]]] = []
    state_names: list[str] = []
    topics = ArmTopics.of(arm)
    node_status = f'oxygen: robot {arm}' if arm else NODE_STATUS  # EngineDiagnostics.name
    own_executor, executors = executor_status_name(arm), executor_status_name()
    for topic, msg in _messages(bag, (*topics.every, DIAGNOSTICS)):
        if topic == topics.chunks:
            stamp = stamp_to_ns(msg.header.stamp)
            tfs = np.array([duration_to_ns(p.time_from_start) for p in msg.points],
                           dtype=np.int64)
            run.chunks.append(ChunkPlan(stamp, stamp + tfs,
                                        np.array([p.positions for p in msg.points])))
        elif topic == topics.command:
            run.joint_names = tuple(msg.name)
            commands.append((stamp_to_ns(msg.header.stamp), list(msg.position)))
        elif topic == topics.joint_states:
            state_names = list(msg.name)
            states.append((stamp_to_ns(msg.header.stamp), list(msg.position)))
        elif topic == topics.events:
            run.events.extend(_status_dict(s) for s in msg.status)
        elif topic == DIAGNOSTICS:
            for status in msg.status:
                if status.name == node_status:
                    run.node_status.append(_status_dict(status))
                elif status.name == own_executor:  # filed under the one name, for any arm
                    run.sim_status.setdefault(executors, []).append(_status_dict(status))
                elif status.name.startswith('oxygen_sim') and \
                        not status.name.startswith(executors):
                    run.sim_status.setdefault(status.name, []).append(_status_dict(status))
        elif topic == topics.base_images and with_frames:
            run.frames.append((stamp_to_ns(msg.header.stamp), image_to_rgb(msg)))
    commands.sort(key=lambda item: item[0])
    states.sort(key=lambda item: item[0])
    run.frames.sort(key=lambda item: item[0])
    if commands:
        run.command_t = np.array([t for t, _ in commands], dtype=np.int64)
        run.command_q = np.array([q for _, q in commands])
    if states and run.joint_names:
        columns = [state_names.index(n) for n in run.joint_names]
        run.state_t = np.array([t for t, _ in states], dtype=np.int64)
        run.state_q = np.array([q for _, q in states])[:, columns]
    return run


def trim(run: SimRun, start_ns: int, end_ns: int) -> SimRun:
    """Return the part of ``run`` stamped in ``[start_ns, end_ns]`` (chunks by stamp)."""
    def inside(t: int) -> bool:
        return start_ns <= t <= end_ns

    s = (run.state_t >= start_ns) & (run.state_t <= end_ns)
    c = (run.command_t >= start_ns) & (run.command_t <= end_ns)
    return SimRun(
        joint_names=run.joint_names, state_t=run.state_t[s], state_q=run.state_q[s],
        command_t=run.command_t[c], command_q=run.command_q[c],
        chunks=[k for k in run.chunks if inside(k.stamp_ns)],
        events=[e for e in run.events
                if inside(int(e.get('switch_ns', e.get('arrival_ns', -1))))],
        node_status=run.node_status, sim_status=run.sim_status,
        frames=[f for f in run.frames if inside(f[0])])


__all__ = ['ArmTopics', 'ChunkPlan', 'DIAGNOSTICS', 'SimRun', 'read_run', 'recorded_topics',
           'trim']
