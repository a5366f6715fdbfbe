"""
``oxygen_sim``: the simulated Panda as a ROS 2 node (``oxygen_sim``) that speaks only topics.

The simulation loop (main thread) steps the physics in fixed 2 ms steps, paced against the wall
clock at ``real_time_factor``, and at each step sets the servo targets from the chunk executor
(``control.ChunkExecutor``, evaluated every physics step at sim time). On their own schedules
in sim time it publishes:

- ``/clock`` (rosgraph_msgs/Clock, reliable) at ``clock_rate_hz``;
- ``/camera/base/image_raw`` and ``/camera/left_wrist/image_raw`` (sensor_msgs/Image rgb8,
  sensor-data QoS) at ``camera_rate_hz``: the base and wrist cameras;
- ``/joint_states`` (sensor_msgs/JointState, reliable) at ``joint_state_rate_hz``;
- ``~/joint_command`` (sensor_msgs/JointState: the executor's commanded positions and
  velocities) at ``joint_state_rate_hz``;
- ``~/chunk_events`` (diagnostic_msgs/DiagnosticArray, ``reports``): one status per chunk
  accepted, refused or executed;
- ``/diagnostics`` every ``diagnostics_period``.

Every stamp is sim time (``/clock``'s), so a node with ``use_sim_time:=true`` sees fresh
frames. ``/joint_states`` names ``joint1`` .. ``joint7`` (rad), ``finger_joint1/2`` (m) and
``gripper`` (0 open .. 1 closed). It subscribes to ``/oxygen/action_chunk``
(trajectory_msgs/JointTrajectory, reliable; remap it) with joints ``joint1`` .. ``joint7`` and
``gripper``; a chunk's arrival time is the sim time of the first physics step after it was
received (2 ms resolution), when the executor takes it.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray
import numpy as np
from oxygen_ros.control.chunk_executor import ChunkExecutor, ChunkRefused, JointLimits
from oxygen_ros.control.trajectory_msg import trajectory_from_msg
from oxygen_ros.ros.images.raw import rgb_to_image
from oxygen_ros.ros.stamps import ns_to_stamp
from oxygen_ros.ros.topics import qos_profile, QosRole
from oxygen_ros.sim import endpoints, reports
from oxygen_ros.sim.assets import panda_dir
from oxygen_ros.sim.params import declare_sim_parameters, SimConfig
from oxygen_ros.sim.physics import PandaPhysics
from oxygen_ros.sim.render import CameraRenderer
from oxygen_ros.sim.scene import (
    ARM_JOINTS, BASE_CAMERA, build_model, FINGER_JOINTS, GRIPPER, SceneConfig, WRIST_CAMERA)
from oxygen_ros.units import NS_PER_S
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Header
from trajectory_msgs.msg import JointTrajectory

NODE_NAME = endpoints.NODE_NAME
ACTION_CHUNK_TOPIC = endpoints.ACTION_CHUNK.name
COMMAND_JOINTS = (*ARM_JOINTS, GRIPPER)
"""Joints the executor commands (the chunks' joint names)."""
CAMERAS = tuple(zip((BASE_CAMERA, WRIST_CAMERA), (ep.name for ep in endpoints.CAMERAS)))
_MAX_LAG_S = 0.05
"""Behind the paced schedule by more than this, the loop stops trying to catch up."""


class _Every:
    """A periodic deadline in integer sim-time ns."""

    def __init__(self, rate_hz: float) -> None:
        self.period_ns = round(NS_PER_S / rate_hz)
        self.next_ns = 0

    def due(self, now_ns: int) -> bool:
        if now_ns < self.next_ns:
            return False
        self.next_ns += self.period_ns * max(1, (now_ns - self.next_ns) // self.period_ns + 1)
        return True


class SimNode(Node):
    """
    The simulated arm: physics, rendering and the chunk executor behind ROS topics.

    :param kwargs: passed to ``Node`` (``context``, ``parameter_overrides``, ...).
    :raises FileNotFoundError: the Menagerie Panda is not in the cache (run
        ``oxygen_fetch sim_assets``).
    :raises RuntimeError: no headless OpenGL context (``render.CameraRenderer``).
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self.cfg: SimConfig = declare_sim_parameters(self)
        folder = panda_dir(Path(self.cfg.panda_dir) if self.cfg.panda_dir else None)
        self.physics = PandaPhysics(build_model(folder, SceneConfig(self.cfg.image_size)))
        self.renderer = CameraRenderer(self.physics.model, self.cfg.image_size)
        lower = (*self.physics.arm_lower, 0.0)
        upper = (*self.physics.arm_upper, 1.0)
        self._last_refusal = ''
        self.chunk_executor = ChunkExecutor(
            COMMAND_JOINTS, (*self.physics.arm_positions(), self.physics.gripper_position()),
            JointLimits(lower, upper, self.cfg.velocity_limits), log=self._on_refused)
        self._inbox: deque[JointTrajectory] = deque()
        self._inbox_lock = threading.Lock()
        reliable = qos_profile(QosRole.RELIABLE)
        self._clock_pub = self.create_publisher(Clock, endpoints.CLOCK.name,
                                                QoSProfile(depth=10))
        sensor = qos_profile(QosRole.SENSOR_DATA)
        self._image_pubs = [(camera, self.create_publisher(Image, topic, sensor))
                            for camera, topic in CAMERAS]
        self._joint_pub = self.create_publisher(JointState, endpoints.JOINT_STATES.name,
                                                reliable)
        self._command_pub = self.create_publisher(JointState, endpoints.JOINT_COMMAND.name,
                                                  reliable)
        self._event_pub = self.create_publisher(DiagnosticArray, endpoints.CHUNK_EVENTS.name,
                                                QoSProfile(depth=100))
        self._diag_pub = self.create_publisher(DiagnosticArray, endpoints.DIAGNOSTICS.name, 10)
        self.create_subscription(JointTrajectory, ACTION_CHUNK_TOPIC, self._on_chunk, reliable)
        self._frames, self._render_s, self._lag_resets = 0, 0.0, 0
        self._wall_start = time.monotonic()
        self.get_logger().info(
            f'Panda from {folder}; {self.cfg.image_size}x{self.cfg.image_size} cameras at '
            f'{self.cfg.camera_rate_hz:g} Hz, joint states at {self.cfg.joint_state_rate_hz:g} '
            f'Hz, real-time factor {self.cfg.real_time_factor:g}; chunks on '
            f'{ACTION_CHUNK_TOPIC} for {list(COMMAND_JOINTS)}')

    # -- chunks in (executor thread) ---------------------------------------------------------
    def _on_chunk(self, msg: JointTrajectory) -> None:
        with self._inbox_lock:
            self._inbox.append(msg)

    def _on_refused(self, line: str) -> None:
        self.get_logger().warning(line)
        self._last_refusal = line

    def _take_chunks(self, arrival: int) -> list:
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
    def run(self, stop: threading.Event) -> None:
        """Step, command and publish until ``stop`` is set or ``sim_duration`` is reached."""
        cfg, physics = self.cfg, self.physics
        clock, cams = _Every(cfg.clock_rate_hz), _Every(cfg.camera_rate_hz)
        joints, diag = _Every(cfg.joint_state_rate_hz), _Every(1.0 / cfg.diagnostics_period)
        end_ns = round(cfg.sim_duration * NS_PER_S) if cfg.sim_duration > 0 else None
        origin_wall, origin_sim = time.monotonic(), 0
        self._wall_start = origin_wall
        while not stop.is_set() and (end_ns is None or physics.time_ns < end_ns):
            now = physics.time_ns
            events = self._take_chunks(now)
            cmd = self.chunk_executor.command(now)
            physics.set_command(cmd.positions[:7], cmd.positions[7])
            for switch in self.chunk_executor.take_switches():
                events.append(reports.executed_event(switch, COMMAND_JOINTS))
            if events:
                self._event_pub.publish(DiagnosticArray(header=self._header(now),
                                                        status=events))
            if clock.due(now):
                self._clock_pub.publish(Clock(clock=ns_to_stamp(now)))
            if joints.due(now):
                self._publish_joints(now, cmd.positions, cmd.velocities)
            if cams.due(now):
                self._publish_images(now)
            if diag.due(now):
                self._publish_diagnostics(now)
            physics.step()
            target = origin_wall + (physics.time_ns - origin_sim) / NS_PER_S / cfg.real_time_factor
            delay = target - time.monotonic()
            if delay > 0:
                stop.wait(delay)
            elif delay < -_MAX_LAG_S:  # too slow: do not sprint to catch up
                origin_wall, origin_sim = time.monotonic(), physics.time_ns
                self._lag_resets += 1
        self._publish_diagnostics(physics.time_ns)

    def _header(self, now_ns: int, frame_id: str = '') -> Header:
        return Header(stamp=ns_to_stamp(now_ns), frame_id=frame_id)

    def _publish_joints(self, now_ns: int, command: np.ndarray, velocity: np.ndarray) -> None:
        p = self.physics
        state = JointState(header=self._header(now_ns, 'world'))
        state.name = [*ARM_JOINTS, *FINGER_JOINTS, GRIPPER]
        state.position = [*p.arm_positions(), *p.finger_positions(), p.gripper_position()]
        state.velocity = [*p.arm_velocities(), *p.finger_velocities(), 0.0]
        self._joint_pub.publish(state)
        commanded = JointState(header=self._header(now_ns, 'world'))
        commanded.name = list(COMMAND_JOINTS)
        commanded.position = [float(v) for v in command]
        commanded.velocity = [float(v) for v in velocity]
        self._command_pub.publish(commanded)

    def _publish_images(self, now_ns: int) -> None:
        for camera, pub in self._image_pubs:
            t0 = time.perf_counter()
            rgb = self.renderer.render(self.physics.data, camera)
            self._render_s += time.perf_counter() - t0
            self._frames += 1
            pub.publish(rgb_to_image(rgb, now_ns, camera))

    def _publish_diagnostics(self, now_ns: int) -> None:
        stats = reports.SimStats(
            sim_time_s=now_ns / NS_PER_S, wall_time_s=time.monotonic() - self._wall_start,
            frames_rendered=self._frames,
            render_s_per_frame=self._render_s / self._frames if self._frames else 0.0,
            num_lagging_resets=self._lag_resets)
        self._diag_pub.publish(DiagnosticArray(header=self._header(now_ns), status=[
            reports.executor_status(self.chunk_executor.stats),
            reports.simulation_status(stats, self.cfg.real_time_factor)]))

    def close(self) -> None:
        """Free the renderer; then ``destroy_node``."""
        self.renderer.close()


def summary_line(node: SimNode) -> str:
    """Return one line of the executor's counters (logged at exit)."""
    s = node.chunk_executor.stats
    return (f'sim time {node.physics.time_ns / NS_PER_S:.2f} s; chunks received {s.num_received}, '
            f'executed {s.num_executed}, refused {s.num_refused}; points skipped '
            f'{s.num_points_skipped}; hold {s.hold_ns / NS_PER_S:.2f} s')


__all__ = ['ACTION_CHUNK_TOPIC', 'CAMERAS', 'COMMAND_JOINTS', 'NODE_NAME', 'SimNode',
           'summary_line']
