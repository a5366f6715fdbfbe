"""
Parameters of ``oxygen_sim`` (``ParamSpec`` rows, as the node's; all read-only) and their config.

Velocity limits of the executor default to Franka's datasheet for the Panda (joints 1-4
2.175 rad/s, joints 5-7 2.61 rad/s) and 20 /s for the gripper (0 open .. 1 closed: a full
stroke in 50 ms, a sanity bound only; the simulated fingers are slower). Position limits come
from the model's joint ranges (and [0, 1] for the gripper).
"""

from __future__ import annotations

from dataclasses import dataclass
import math

from oxygen_ros.ros.param_spec import ParamSpec, ParamType
from rclpy.node import Node

FRANKA_VELOCITY_LIMITS = (2.175, 2.175, 2.175, 2.175, 2.61, 2.61, 2.61)
"""Panda joint velocity limits (rad/s), Franka Emika datasheet."""
GRIPPER_VELOCITY_LIMIT = 20.0


@dataclass(frozen=True, slots=True)
class SimConfig:
    """
    The simulator's settings (all read-only once it runs).

    :ivar real_time_factor: sim seconds per wall second (1.0 = real time).
    :ivar velocity_limits: ``[8]`` executor velocity limits, ``joint1`` .. ``joint7``,
        ``gripper``.
    :ivar sim_duration: stop after this many sim seconds (0 = run until stopped).
    """

    real_time_factor: float = 1.0
    camera_rate_hz: float = 15.0
    joint_state_rate_hz: float = 100.0
    clock_rate_hz: float = 250.0
    diagnostics_period: float = 1.0
    image_size: int = 224
    panda_dir: str = ''
    sim_duration: float = 0.0
    velocity_limits: tuple[float, ...] = (*FRANKA_VELOCITY_LIMITS, GRIPPER_VELOCITY_LIMIT)

    def __post_init__(self) -> None:
        if len(self.velocity_limits) != 8 or not all(
                math.isfinite(v) and v > 0 for v in self.velocity_limits):
            raise ValueError(f'velocity_limits must be 8 positive numbers (joint1..joint7, '
                             f'gripper), got {list(self.velocity_limits)}')


def _spec(name: str, text: str, limits: tuple[float, float] | None = None) -> ParamSpec:
    default = getattr(SimConfig(), name)
    if isinstance(default, tuple):
        return ParamSpec(name, list(default), text, limits, param_type=ParamType.DOUBLE_ARRAY)
    return ParamSpec(name, default, text, limits)


SIM_PARAMETERS: tuple[ParamSpec, ...] = (
    _spec('real_time_factor', 'sim seconds per wall second; the loop never sprints to catch up',
          (0.01, 100.0)),
    _spec('camera_rate_hz', 'base and wrist camera frames per sim second', (0.1, 120.0)),
    _spec('joint_state_rate_hz', '/joint_states and ~/joint_command per sim second',
          (1.0, 500.0)),
    _spec('clock_rate_hz', '/clock messages per sim second', (1.0, 500.0)),
    _spec('diagnostics_period', 'sim seconds between /diagnostics messages', (0.05, 60.0)),
    _spec('image_size', 'camera image width = height (px)', (16, 1024)),
    _spec('panda_dir', "Menagerie franka_emika_panda folder; '' = the one fetched by "
          'oxygen_fetch sim_assets'),
    _spec('sim_duration', 'stop after this many sim seconds; 0 = run until stopped',
          (0.0, 1e6)),
    _spec('velocity_limits', 'executor velocity limits joint1..joint7 (rad/s), gripper (1/s); '
          'chunks beyond them are refused'),
)
"""The simulator's parameters, in declaration order (defaults: ``SimConfig``'s)."""


def declare_sim_parameters(node: Node) -> SimConfig:
    """
    Declare the simulator's parameters on ``node`` (all read-only) and return their config.

    :raises rclpy.exceptions.InvalidParameterValueException: a value out of range.
    :raises ValueError: bad velocity limits.
    """
    values = {}
    for spec in SIM_PARAMETERS:
        value = node.declare_parameter(spec.name, spec.default, spec.descriptor()).value
        values[spec.name] = tuple(value) if spec.kind is ParamType.DOUBLE_ARRAY else value
    return SimConfig(**values)


__all__ = ['FRANKA_VELOCITY_LIMITS', 'GRIPPER_VELOCITY_LIMIT', 'SIM_PARAMETERS', 'SimConfig',
           'declare_sim_parameters']
