"""
The parameters of the ``oxygen`` node: the ``oxygen`` section of the declaration.

Each parameter is declared once, in ``oxygen_ros/parameters/oxygen_parameters.yaml`` (name,
type, default, unit, range or choices, read-only or what a change does, the config field it
sets); ``PARAMETERS`` is that section. From it follow the declaration on the node
(``declare_parameters``: one ``ParameterDescriptor`` each, ``param_spec.descriptor``), the
checks and the configs (``node_config.build_configs``), the handling of changes while the node
runs (``param_handler.ParameterHandler``) and docs/parameters.md (``param_docs``), as
ros2_control's generate_parameter_library generates them from its YAML table.

Read-only parameters shape the engine (weights, KV pool, cameras, joint order) and are fixed
once the node exists: set them in ``config/<preset>.yaml`` or with ``-p``. Defaults that depend
on the robot (``cameras``, ``joint_names``, ``action_joint_names``, the limits) are taken from
the robot policy of the ``preset`` parameter, which is declared first.
"""

from __future__ import annotations

import array
import math

from oxygen_ros.parameters import NODE_SECTION, ParamSpec, section
from oxygen_ros.policies import preset_robot, RobotPolicy
from oxygen_ros.ros.param_spec import descriptor
from rclpy.node import Node

PARAMETERS: tuple[ParamSpec, ...] = section(NODE_SECTION)
"""Every parameter of the node, in declaration order (``preset`` first)."""

SPECS: dict[str, ParamSpec] = {spec.name: spec for spec in PARAMETERS}

DEFAULT_PRESET: str = SPECS['preset'].default
"""Preset of a node started without a params file (random weights, fast on a CPU)."""


def robot_defaults(robot: RobotPolicy) -> dict[str, list]:
    """Return the robot-dependent defaults (``cameras``, ``joint_names``, ...) of a preset."""
    joints = [f'joint_{i}' for i in range(1, robot.state_dim + 1)]
    dims = robot.robot_action_dim
    return {'cameras': list(robot.cameras), 'joint_names': joints,
            'action_joint_names': joints[:dims],
            'position_limits_lower': [-math.inf] * dims,
            'position_limits_upper': [math.inf] * dims, 'velocity_limits': [math.inf] * dims}


def declare_parameters(node: Node) -> None:
    """
    Declare every parameter of ``PARAMETERS`` on ``node`` (overrides apply).

    An unknown preset is not an error here (configure reports it): the robot-dependent
    defaults then come from ``DEFAULT_PRESET``.

    :raises rclpy.exceptions.InvalidParameterTypeException: an override of the wrong type,
        e.g. ``10`` for a double (write ``10.0``).
    :raises rclpy.exceptions.InvalidParameterValueException: an override out of range.
    """
    first = PARAMETERS[0]                           # preset: the robot's defaults follow it
    preset = node.declare_parameter(first.name, first.default, descriptor(first)).value
    try:
        robot = preset_robot(preset)
    except ValueError:
        robot = preset_robot(DEFAULT_PRESET)
    defaults = robot_defaults(robot)
    for spec in PARAMETERS[1:]:
        default = spec.default
        if spec.name == 'action_joint_names':
            joints = list(node.get_parameter('joint_names').value)
            default = joints[:robot.robot_action_dim] or defaults[spec.name]
        elif default is None:
            default = defaults[spec.name]
        node.declare_parameter(spec.name, default, descriptor(spec))


def parameter_values(node: Node) -> dict[str, object]:
    """Return ``{name: value}`` of every declared ``PARAMETERS`` entry (arrays as lists)."""
    out = {}
    for spec in PARAMETERS:
        value = node.get_parameter(spec.name).value
        out[spec.name] = list(value) if isinstance(value, (list, tuple, array.array)) else value
    return out


__all__ = ['DEFAULT_PRESET', 'PARAMETERS', 'SPECS', 'declare_parameters', 'parameter_values',
           'robot_defaults']
