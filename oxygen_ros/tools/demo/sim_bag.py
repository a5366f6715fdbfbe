"""
Read back a closed-loop run recorded by ``oxygen_demo sim`` (a rosbag2 of the sim and node).

Every time here is **sim time** from the messages' own stamps (bag times are wall receive
times and are not used): chunks by ``header.stamp``, chunk arrival and switch times from the
simulator's ``~/chunk_events``, joint states and commands by their stamps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
from oxygen_ros.ros.diagnostics import STATUS_NAME
from oxygen_ros.ros.images.raw import image_to_rgb
from oxygen_ros.ros.stamps import duration_to_ns, stamp_to_ns
from oxygen_ros.tools.bag.topics import CAMERA_TOPICS, JOINT_STATES_TOPIC, typestore
from rosbags.rosbag2 import Reader

CHUNK_TOPIC = '/oxygen/action_chunk'
JOINT_STATES = JOINT_STATES_TOPIC
COMMAND_TOPIC = '/oxygen_sim/joint_command'
EVENTS_TOPIC = '/oxygen_sim/chunk_events'
DIAGNOSTICS = '/diagnostics'
BASE_IMAGES = CAMERA_TOPICS['base_0_rgb']
RECORDED_TOPICS = (CHUNK_TOPIC, JOINT_STATES, COMMAND_TOPIC, EVENTS_TOPIC, DIAGNOSTICS,
                   BASE_IMAGES)
NODE_STATUS = STATUS_NAME


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


def _messages(bag: Path) -> Iterator[tuple[str, object]]:
    store = typestore()
    with Reader(bag) as reader:
        conns = [c for c in reader.connections if c.topic in RECORDED_TOPICS]
        for conn, _, raw in reader.messages(connections=conns):
            yield conn.topic, store.deserialize_cdr(raw, conn.msgtype)


def read_run(bag: Path, *, with_frames: bool = True) -> SimRun:
    """
    Read a recorded run.

    :param bag: the rosbag2 folder.
    :param with_frames: decode the base camera images (for the video).
    :raises FileNotFoundError: no bag there.
    """
    run = SimRun()
    states: list[tuple[int, list[float]]] = []
    commands: list[tuple[int, list[float]]] = []
    state_names: list[str] = []
    for topic, msg in _messages(bag):
        if topic == CHUNK_TOPIC:
            stamp = stamp_to_ns(msg.header.stamp)
            tfs = np.array([duration_to_ns(p.time_from_start) for p in msg.points],
                           dtype=np.int64)
            run.chunks.append(ChunkPlan(stamp, stamp + tfs,
                                        np.array([p.positions for p in msg.points])))
        elif topic == COMMAND_TOPIC:
            run.joint_names = tuple(msg.name)
            commands.append((stamp_to_ns(msg.header.stamp), list(msg.position)))
        elif topic == JOINT_STATES:
            state_names = list(msg.name)
            states.append((stamp_to_ns(msg.header.stamp), list(msg.position)))
        elif topic == EVENTS_TOPIC:
            run.events.extend(_status_dict(s) for s in msg.status)
        elif topic == DIAGNOSTICS:
            for status in msg.status:
                if status.name == NODE_STATUS:
                    run.node_status.append(_status_dict(status))
                elif status.name.startswith('oxygen_sim'):
                    run.sim_status.setdefault(status.name, []).append(_status_dict(status))
        elif topic == BASE_IMAGES and with_frames:
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


__all__ = ['BASE_IMAGES', 'CHUNK_TOPIC', 'COMMAND_TOPIC', 'ChunkPlan', 'DIAGNOSTICS',
           'EVENTS_TOPIC', 'JOINT_STATES', 'RECORDED_TOPICS', 'SimRun', 'read_run',
           'trim']
