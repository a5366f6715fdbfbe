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

The entries under ``__map_robots`` (``ROBOT_PARAMETERS``: ``<robots>.joint_names``, ...) are
declared once per name of the ``robots`` parameter (``r1.joint_names``, as
generate_parameter_library declares a map per item), each defaulting to the node's parameter of
its name (:func:`robot_default`): a robot overrides what differs from the node's.
"""

from __future__ import annotations

import array
import math

from oxygen_ros.parameters import NODE_SECTION, ParameterError, ParamSpec, section
from oxygen_ros.policies import preset_robot, RobotPolicy
from oxygen_ros.ros.param_spec import descriptor, validate
from rclpy.exceptions import InvalidParameterValueException
from rclpy.node import Node

DECLARED: tuple[ParamSpec, ...] = section(NODE_SECTION)
"""The node's section of the declaration, in file order (docs/parameters.md's rows)."""
PARAMETERS: tuple[ParamSpec, ...] = tuple(s for s in DECLARED if not s.map_of)
"""Every parameter declared once on the node, in declaration order (``preset`` first)."""
ROBOT_PARAMETERS: tuple[ParamSpec, ...] = tuple(s for s in DECLARED if s.map_of == 'robots')
"""The entries declared once per robot (``<robots>.joint_names``, ...)."""

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


def named_robots(robots: object) -> tuple[str, ...]:
    """Return the named robots of a ``robots`` value (``()`` for ``['']``, the one robot)."""
    return tuple(name for name in robots if name)


def robot_specs(robots: object) -> tuple[ParamSpec, ...]:
    """Return the per-robot entries of a ``robots`` value (``r1.joint_names``, ...)."""
    return tuple(spec.for_item(name) for name in named_robots(robots)
                 for spec in ROBOT_PARAMETERS)


def robot_default(spec: ParamSpec, node_value: object) -> object:
    """
    Return the default of a robot's entry: the node's value of its key (``node_value``).

    An entry with a ``default_value`` of its own (``<robots>.control_rate_hz``: 0, its
    ``unset``) takes that instead: the robot follows the node's parameter, changes included.
    """
    return node_value if spec.default is None else spec.default


def declare_parameters(node: Node) -> None:
    """
    Declare every parameter of ``PARAMETERS`` on ``node``, then each robot's (overrides apply).

    An unknown preset is not an error here (configure reports it): the robot-dependent
    defaults then come from ``DEFAULT_PRESET``. A robot's entry defaults to the node's
    parameter of its name (:func:`robot_default`); its ``action_joint_names`` to the first
    ``robot_action_dim`` of its ``joint_names`` where those are its own.

    :raises rclpy.exceptions.InvalidParameterTypeException: an override of the wrong type,
        e.g. ``10`` for a double (write ``10.0``).
    :raises rclpy.exceptions.InvalidParameterValueException: an override out of range, or
        ``robots`` names that are not distinct ROS name tokens (they name parameters and
        namespaces).
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
    robots = list(node.get_parameter('robots').value)
    try:
        validate(SPECS['robots'], robots)
    except ParameterError as exc:
        raise InvalidParameterValueException('robots', robots, str(exc)) from None
    node_joints = _listed(node.get_parameter('joint_names').value)
    for spec in robot_specs(robots):
        default = robot_default(spec, _listed(node.get_parameter(spec.key).value))
        if spec.key == 'action_joint_names':
            own = spec.name[:-len(spec.key)] + 'joint_names'  # r1.joint_names, declared before
            joints = _listed(node.get_parameter(own).value)
            if joints != node_joints:
                default = joints[:robot.robot_action_dim]
        node.declare_parameter(spec.name, default, descriptor(spec))


def _listed(value: object) -> object:
    """Return an array parameter's value as a list (rclpy gives ``array.array`` too)."""
    return list(value) if isinstance(value, (list, tuple, array.array)) else value


def parameter_values(node: Node) -> dict[str, object]:
    """Return ``{name: value}`` of every declared parameter, each robot's too (arrays as lists)."""
    out = {spec.name: _listed(node.get_parameter(spec.name).value) for spec in PARAMETERS}
    for spec in robot_specs(out['robots']):
        out[spec.name] = _listed(node.get_parameter(spec.name).value)
    return out


__all__ = ['DECLARED', 'DEFAULT_PRESET', 'PARAMETERS', 'ROBOT_PARAMETERS', 'SPECS',
           'declare_parameters', 'named_robots', 'parameter_values', 'robot_default',
           'robot_defaults', 'robot_specs']
