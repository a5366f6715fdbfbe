"""
``oxygen_sim``: the simulated Panda as a ROS 2 node (``oxygen_sim``) that speaks only topics.

The simulation loop (main thread) steps the physics in fixed 2 ms steps, paced against the wall
clock at ``real_time_factor``, and at each step sets the servo targets from the chunk executor
(``control.ChunkExecutor``, evaluated every physics step at sim time). With several arms (the
``robots`` parameter) each is a ``SimArm`` (``arm_io``) with the topics below under its
namespace, all stepped together; ``/clock`` and ``/diagnostics`` are one for all. On their own
schedules in sim time it publishes:

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
``gripper`` (a named arm's joints: ``<arm>_joint1`` .., ``arms.joint_name``); a chunk's
arrival time is the sim time of the first physics step after it was received (2 ms
resolution), when the executor takes it.
"""

from __future__ import annotations

from pathlib import Path
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray
from oxygen_ros.ros.stamps import ns_to_stamp
from oxygen_ros.sim import endpoints, reports
from oxygen_ros.sim.arm_io import CAMERAS, header, SimArm
from oxygen_ros.sim.arms import COMMAND_JOINTS
from oxygen_ros.sim.assets import panda_dir
from oxygen_ros.sim.params import declare_sim_parameters, SimConfig
from oxygen_ros.sim.physics import PandaPhysics
from oxygen_ros.sim.render import CameraRenderer
from oxygen_ros.sim.scene import build_model, SceneConfig
from oxygen_ros.units import NS_PER_S
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rosgraph_msgs.msg import Clock

NODE_NAME = endpoints.NODE_NAME
ACTION_CHUNK_TOPIC = endpoints.ACTION_CHUNK.name
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
    The simulated arms: physics, rendering and the chunk executors behind ROS topics.

    :param kwargs: passed to ``Node`` (``context``, ``parameter_overrides``, ...).
    :raises FileNotFoundError: the Menagerie Panda is not in the cache (run
        ``oxygen_fetch sim_assets``).
    :raises RuntimeError: no headless OpenGL context (``render.CameraRenderer``).
    :raises ValueError: bad velocity limits or arm names.
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self.cfg: SimConfig = declare_sim_parameters(self)
        folder = panda_dir(Path(self.cfg.panda_dir) if self.cfg.panda_dir else None)
        model = build_model(folder, SceneConfig(self.cfg.image_size))
        self.renderer = CameraRenderer(model, self.cfg.image_size)
        warn = self.get_logger().warning
        self.arms = [SimArm(self, name, PandaPhysics(model), self.cfg.velocity_limits, warn)
                     for name in self.cfg.robots]
        self._clock_pub = self.create_publisher(Clock, endpoints.CLOCK.name,
                                                QoSProfile(depth=10))
        self._diag_pub = self.create_publisher(DiagnosticArray, endpoints.DIAGNOSTICS.name, 10)
        self._lag_resets = 0
        self._wall_start = time.monotonic()
        arms = '; '.join(f'{arm.name or "the arm"}: chunks on {arm.chunk_topic} for '
                         f'{list(arm.command_joints)}' for arm in self.arms)
        self.get_logger().info(
            f'{len(self.arms)} Panda(s) from {folder}; {self.cfg.image_size}x'
            f'{self.cfg.image_size} cameras at {self.cfg.camera_rate_hz:g} Hz, joint states at '
            f'{self.cfg.joint_state_rate_hz:g} Hz, real-time factor '
            f'{self.cfg.real_time_factor:g}; {arms}')

    @property
    def physics(self) -> PandaPhysics:
        """Return the first arm's Panda (the one arm's); every arm's runs on the same sim time."""
        return self.arms[0].physics

    # -- the loop (main thread) -------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Step, command and publish until ``stop`` is set or ``sim_duration`` is reached."""
        cfg, physics, arms = self.cfg, self.physics, self.arms
        clock, cams = _Every(cfg.clock_rate_hz), _Every(cfg.camera_rate_hz)
        joints, diag = _Every(cfg.joint_state_rate_hz), _Every(1.0 / cfg.diagnostics_period)
        end_ns = round(cfg.sim_duration * NS_PER_S) if cfg.sim_duration > 0 else None
        origin_wall, origin_sim = time.monotonic(), 0
        self._wall_start = origin_wall
        while not stop.is_set() and (end_ns is None or physics.time_ns < end_ns):
            now = physics.time_ns
            commands = [arm.command(now) for arm in arms]
            if clock.due(now):
                self._clock_pub.publish(Clock(clock=ns_to_stamp(now)))
            if joints.due(now):
                for arm, cmd in zip(arms, commands):
                    arm.publish_joints(now, cmd.positions, cmd.velocities)
            if cams.due(now):
                for arm in arms:
                    arm.publish_images(now, self.renderer)
            if diag.due(now):
                self._publish_diagnostics(now)
            for arm in arms:
                arm.physics.step()
            target = origin_wall + (physics.time_ns - origin_sim) / NS_PER_S / cfg.real_time_factor
            delay = target - time.monotonic()
            if delay > 0:
                stop.wait(delay)
            elif delay < -_MAX_LAG_S:  # too slow: do not sprint to catch up
                origin_wall, origin_sim = time.monotonic(), physics.time_ns
                self._lag_resets += 1
        self._publish_diagnostics(physics.time_ns)

    def _publish_diagnostics(self, now_ns: int) -> None:
        frames = sum(arm.frames for arm in self.arms)
        render_s = sum(arm.render_s for arm in self.arms)
        stats = reports.SimStats(
            sim_time_s=now_ns / NS_PER_S, wall_time_s=time.monotonic() - self._wall_start,
            frames_rendered=frames, render_s_per_frame=render_s / frames if frames else 0.0,
            num_lagging_resets=self._lag_resets)
        self._diag_pub.publish(DiagnosticArray(header=header(now_ns), status=[
            *(arm.executor_status() for arm in self.arms),
            reports.simulation_status(stats, self.cfg.real_time_factor)]))

    def close(self) -> None:
        """Free the renderer; then ``destroy_node``."""
        self.renderer.close()


def summary_line(node: SimNode) -> str:
    """Return one line of the executors' counters (logged at exit)."""
    return (f'sim time {node.physics.time_ns / NS_PER_S:.2f} s; '
            + '; '.join(arm.summary() for arm in node.arms))


__all__ = ['ACTION_CHUNK_TOPIC', 'CAMERAS', 'COMMAND_JOINTS', 'NODE_NAME', 'SimNode',
           'summary_line']
