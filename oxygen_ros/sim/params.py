"""
Parameters of ``oxygen_sim`` (all read-only) and their config, ``SimConfig``.

Declared once, in the ``oxygen_sim`` section of ``oxygen_ros/parameters/oxygen_parameters.yaml``
(type, default, unit, range, description), as the ``oxygen`` node's: the descriptors and
``SimConfig``'s defaults follow from there. Velocity limits of the executor default to
Franka's datasheet for the Panda (joints 1-4 2.175 rad/s, joints 5-7 2.61 rad/s) and 20 /s for
the gripper (0 open .. 1 closed: a full stroke in 50 ms, a sanity bound only; the simulated
fingers are slower). Position limits come from the model's joint ranges (and [0, 1] for the
gripper).
"""

from __future__ import annotations

from dataclasses import dataclass
import math

from oxygen_ros.parameters import declared, in_config, ParamSpec, ParamType, section, SIM_SECTION
from oxygen_ros.ros.param_spec import CHECKS, descriptor
from rclpy.node import Node

_ROBOTS = in_config('sim')['robots']


@dataclass(frozen=True, slots=True)
@declared('sim')
class SimConfig:
    """
    The simulator's settings (all read-only once it runs; defaults: the declaration's).

    :ivar real_time_factor: sim seconds per wall second (1.0 = real time).
    :ivar velocity_limits: ``[8]`` executor velocity limits, ``joint1`` .. ``joint7``,
        ``gripper``.
    :ivar sim_duration: stop after this many sim seconds (0 = run until stopped).
    :ivar robots: the arms (``sim.arms``; ``('',)``: the one arm).
    """

    real_time_factor: float
    camera_rate_hz: float
    joint_state_rate_hz: float
    clock_rate_hz: float
    diagnostics_period: float
    image_size: int
    panda_dir: str
    sim_duration: float
    velocity_limits: tuple[float, ...]
    robots: tuple[str, ...]

    def __post_init__(self) -> None:
        reason = CHECKS['robot_names'](_ROBOTS, self.robots)
        if reason is not None:
            raise ValueError(reason)
        if len(self.velocity_limits) != 8 or not all(
                math.isfinite(v) and v > 0 for v in self.velocity_limits):
            raise ValueError(f'velocity_limits must be 8 positive numbers (joint1..joint7, '
                             f'gripper), got {list(self.velocity_limits)}')


SIM_PARAMETERS: tuple[ParamSpec, ...] = section(SIM_SECTION)
"""The simulator's parameters, in declaration order."""
FRANKA_VELOCITY_LIMITS: tuple[float, ...] = SimConfig().velocity_limits[:7]
"""Panda joint velocity limits (rad/s), Franka Emika datasheet."""
GRIPPER_VELOCITY_LIMIT: float = SimConfig().velocity_limits[7]


_ARRAYS = (ParamType.DOUBLE_ARRAY, ParamType.STRING_ARRAY)


def declare_sim_parameters(node: Node) -> SimConfig:
    """
    Declare the simulator's parameters on ``node`` (all read-only) and return their config.

    :raises rclpy.exceptions.InvalidParameterValueException: a value out of range.
    :raises ValueError: bad velocity limits or arm names.
    """
    values = {}
    for spec in SIM_PARAMETERS:
        value = node.declare_parameter(spec.name, spec.default, descriptor(spec)).value
        values[spec.name] = tuple(value) if spec.kind in _ARRAYS else value
    return SimConfig(**values)


__all__ = ['FRANKA_VELOCITY_LIMITS', 'GRIPPER_VELOCITY_LIMIT', 'SIM_PARAMETERS', 'SimConfig',
           'declare_sim_parameters']
