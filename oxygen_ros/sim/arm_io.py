"""
One simulated arm: its Panda, its chunk executor and its topics (``SimArm``).

``oxygen_sim`` holds one per entry of its ``robots`` parameter, each a Panda in a scene of its
own (its own ``MjData`` of the one compiled model: its table, cup and cameras, so no arm sees
or touches another), all stepped together on the one sim clock. Arm ``''`` has the topics of
docs/simulation.md; a named arm has them under its namespace (``endpoints.arm_topic``) and its
joints prefixed with its name (``arms.joint_name``).
"""

from __future__ import annotations

from collections import deque
import threading
import time
from typing import Callable

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
import numpy as np
from oxygen_ros.control.chunk_executor import ChunkExecutor, ChunkRefused, Command, JointLimits
from oxygen_ros.control.trajectory_msg import trajectory_from_msg
from oxygen_ros.ros.images.raw import rgb_to_image
from oxygen_ros.ros.stamps import ns_to_stamp
from oxygen_ros.ros.topics import qos_profile, QosRole
from oxygen_ros.sim import endpoints, reports
from oxygen_ros.sim.arms import ARM_JOINTS, arm_joints, COMMAND_JOINTS, FINGER_JOINTS, GRIPPER
from oxygen_ros.sim.physics import PandaPhysics
from oxygen_ros.sim.render import CameraRenderer
from oxygen_ros.sim.scene import BASE_CAMERA, WRIST_CAMERA
from oxygen_ros.units import NS_PER_S
from rclpy.node import Node
from rclpy.qos import QoSProfile
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Header
from trajectory_msgs.msg import JointTrajectory

CAMERAS = tuple(zip((BASE_CAMERA, WRIST_CAMERA), (ep.name for ep in endpoints.CAMERAS)))
"""The scene's cameras and the one arm's topics of them."""


def header(now_ns: int, frame_id: str = '') -> Header:
    """Return a header stamped ``now_ns`` (sim time)."""
    return Header(stamp=ns_to_stamp(now_ns), frame_id=frame_id)


class SimArm:
    """
    One arm of the simulator, on ``node``'s topics under its name.

    :param node: the simulator node (owns the publishers and the subscription).
    :param name: the arm (a ``robots`` entry; '' = the one arm, unnamespaced).
    :param physics: its Panda (its own ``MjData``).
    :param velocity_limits: ``[8]`` executor limits, ``joint1`` .. ``joint7`` (rad/s),
        ``gripper`` (1/s).
    :param log_refusal: where a refused chunk's line goes (a warning of the node).
    """

    def __init__(self, node: Node, name: str, physics: PandaPhysics,
                 velocity_limits: tuple[float, ...], log_refusal: Callable[[str], None]) -> None:
        self.name, self.physics = name, physics
        self.command_joints = arm_joints(COMMAND_JOINTS, name)
        self.state_joints = arm_joints((*ARM_JOINTS, *FINGER_JOINTS, GRIPPER), name)
        self._log_refusal, self._last_refusal = log_refusal, ''
        lower, upper = (*physics.arm_lower, 0.0), (*physics.arm_upper, 1.0)
        self.chunk_executor = ChunkExecutor(
            self.command_joints, (*physics.arm_positions(), physics.gripper_position()),
            JointLimits(lower, upper, velocity_limits), log=self._on_refused)
        self._inbox: deque[JointTrajectory] = deque()
        self._inbox_lock = threading.Lock()
        self.frames, self.render_s = 0, 0.0

        def topic(ep: endpoints.Endpoint) -> str:
            return endpoints.arm_topic(ep.name, name)
        reliable, sensor = qos_profile(QosRole.RELIABLE), qos_profile(QosRole.SENSOR_DATA)
        self._image_pubs = [(camera, node.create_publisher(Image, endpoints.arm_topic(t, name),
                                                           sensor)) for camera, t in CAMERAS]
        self._joint_pub = node.create_publisher(JointState, topic(endpoints.JOINT_STATES),
                                                reliable)
        self._command_pub = node.create_publisher(JointState, topic(endpoints.JOINT_COMMAND),
                                                  reliable)
        self._event_pub = node.create_publisher(DiagnosticArray, topic(endpoints.CHUNK_EVENTS),
                                                QoSProfile(depth=100))
        self.chunk_topic = topic(endpoints.ACTION_CHUNK)
        node.create_subscription(JointTrajectory, self.chunk_topic, self._on_chunk, reliable)

    # -- chunks in (executor thread) ---------------------------------------------------------
    def _on_chunk(self, msg: JointTrajectory) -> None:
        with self._inbox_lock:
            self._inbox.append(msg)

    def _on_refused(self, line: str) -> None:
        self._log_refusal(f'{self.name}: {line}' if self.name else line)
        self._last_refusal = line

    def _take_chunks(self, arrival: int) -> list[DiagnosticStatus]:
        with self._inbox_lock:
            items, self._inbox = list(self._inbox), deque()
        events = []
        for msg in items:
            stamp = msg.header.stamp.sec * NS_PER_S + msg.header.stamp.nanosec
            try:
                chunk = trajectory_from_msg(msg)
            except ChunkRefused as exc:
                self.chunk_executor.reject(str(exc))
                events.append(reports.refused_event(stamp, arrival, str(exc)))
                continue
            skipped_before = self.chunk_executor.stats.num_points_skipped
            if self.chunk_executor.submit(chunk, arrival):
                events.append(reports.accepted_event(
                    stamp, arrival, self.chunk_executor.stats.num_points_skipped - skipped_before))
            else:
                events.append(reports.refused_event(stamp, arrival, self._last_refusal))
        return events

    # -- the loop (main thread) -------------------------------------------------------------
    def command(self, now_ns: int) -> Command:
        """
        Take the chunks that arrived, set the servo targets for ``now_ns``, publish the events.

        :returns: the executor's command (positions and velocities of the command joints).
        """
        events = self._take_chunks(now_ns)
        cmd = self.chunk_executor.command(now_ns)
        self.physics.set_command(cmd.positions[:7], cmd.positions[7])
        for switch in self.chunk_executor.take_switches():
            events.append(reports.executed_event(switch, self.command_joints))
        if events:
            self._event_pub.publish(DiagnosticArray(header=header(now_ns), status=events))
        return cmd

    def publish_joints(self, now_ns: int, command: np.ndarray, velocity: np.ndarray) -> None:
        """Publish its joint states (measured) and its joint command (the executor's)."""
        p = self.physics
        state = JointState(header=header(now_ns, 'world'))
        state.name = list(self.state_joints)
        state.position = [*p.arm_positions(), *p.finger_positions(), p.gripper_position()]
        state.velocity = [*p.arm_velocities(), *p.finger_velocities(), 0.0]
        self._joint_pub.publish(state)
        commanded = JointState(header=header(now_ns, 'world'))
        commanded.name = list(self.command_joints)
        commanded.position = [float(v) for v in command]
        commanded.velocity = [float(v) for v in velocity]
        self._command_pub.publish(commanded)

    def publish_images(self, now_ns: int, renderer: CameraRenderer) -> None:
        """Render and publish its cameras (``renderer``: the shared model's)."""
        for camera, pub in self._image_pubs:
            t0 = time.perf_counter()
            rgb = renderer.render(self.physics.data, camera)
            self.render_s += time.perf_counter() - t0
            self.frames += 1
            pub.publish(rgb_to_image(rgb, now_ns, camera))

    def executor_status(self) -> DiagnosticStatus:
        """Return its ``oxygen_sim: chunk executor`` status (``reports.executor_status``)."""
        return reports.executor_status(self.chunk_executor.stats, self.name)

    def summary(self) -> str:
        """Return one line of its executor's counters (logged at exit)."""
        s = self.chunk_executor.stats
        return (f'{self.name + ": " if self.name else ""}chunks received {s.num_received}, '
                f'executed {s.num_executed}, refused {s.num_refused}; points skipped '
                f'{s.num_points_skipped}; hold {s.hold_ns / NS_PER_S:.2f} s')


__all__ = ['CAMERAS', 'SimArm', 'header']
