"""
A declared parameter on the node: its ``ParameterDescriptor`` and its checks.

The declaration (``oxygen_ros/parameters/oxygen_parameters.yaml``, read by
``oxygen_ros.parameters``) gives each parameter's range, choices and the names of the checks
a descriptor cannot express; this module turns an entry into what rclpy enforces
(:func:`descriptor`: description, range, ``read_only``) and holds those named checks
(:data:`CHECKS`), as generate_parameter_library's custom validators.
"""

from __future__ import annotations

import re
from typing import Callable

from oxygen_ros.config import CAMERA_SLOTS
from oxygen_ros.parameters import (
    NODE_SECTION, OnChange, ParameterError, ParamSpec, ParamType, quoted, section)
from oxygen_ros.ros.input_limits import instruction_refusal
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor


def _device(spec: ParamSpec, value: object) -> str | None:
    if re.fullmatch(r'cpu|cuda(:\d+)?', str(value)):
        return None
    return f"{spec.name} must be 'cpu', 'cuda' or 'cuda:N', got {value!r}"


def _compile_steps(spec: ParamSpec, value: object) -> str | None:
    from oxygen_ros.engine import parse_compile_steps  # the sim imports no engine
    try:
        parse_compile_steps(list(value))
    except ValueError as exc:
        return str(exc)
    return None


def _quantile_eps(spec: ParamSpec, value: object) -> str | None:
    if value == -1.0 or 0.0 <= value <= 1.0:
        return None
    return f"{spec.name} must be -1 (the stats' own) or in [0, 1], got {value!r}"


def _camera_slots(spec: ParamSpec, value: object) -> str | None:
    names = list(value)
    if names and not set(names) - set(CAMERA_SLOTS) and len(set(names)) == len(names):
        return None
    return f'{spec.name} must be distinct names of {list(CAMERA_SLOTS)}, got {names}'


def _distinct_names(spec: ParamSpec, value: object) -> str | None:
    names = list(value)
    if all(names) and len(set(names)) == len(names):
        return None
    return f'{spec.name} must be distinct non-empty names, got {names}'


ROBOT_NAME = re.compile(r'[A-Za-z][A-Za-z0-9_]*')
"""A robot's name: one ROS name token, the namespace of its topics (the engine's rule)."""


def _robot_names(spec: ParamSpec, value: object) -> str | None:
    names = list(value)
    if names == [''] or (names and all(ROBOT_NAME.fullmatch(n) for n in names)
                         and len(set(names)) == len(names)):
        return None
    return (f"{spec.name} must be [''] (one robot) or distinct names [A-Za-z][A-Za-z0-9_]*, "
            f'got {names}')


def _instruction(spec: ParamSpec, value: object) -> str | None:
    return instruction_refusal(str(value))  # as ~/instruction refuses it


def _the_nodes_bounds(spec: ParamSpec, value: object) -> str | None:
    """Refuse a robot's number unless unset (the node's) or in its node entry's bounds."""
    if spec.is_unset(value):
        return None
    node = next(s for s in section(NODE_SECTION) if s.name == spec.key and not s.map_of)
    lo, hi = node.limits
    if lo <= value <= hi:
        return None
    return f"{spec.name} must be {spec.unset!r} (the node's {spec.key}) or in [{lo}, {hi}], " \
        f'got {value!r}'


CHECKS: dict[str, Callable[[ParamSpec, object], str | None]] = {
    'device': _device, 'compile_steps': _compile_steps, 'quantile_eps': _quantile_eps,
    'camera_slots': _camera_slots, 'distinct_names': _distinct_names,
    'instruction': _instruction, 'robot_names': _robot_names,
    'the_nodes_bounds': _the_nodes_bounds}
"""The checks an entry names in its ``validation`` (beside ``bounds<>``, ``one_of<>`` and
``not_empty<>``): each returns why a value is refused, or None."""


def validate(spec: ParamSpec, value: object) -> None:
    """
    Check a value against its entry: range, choices, non-emptiness and its named checks.

    :raises ParameterError: the message names the parameter, what it must be and the value.
    """
    spec.validate(value)
    for name in spec.checks:
        reason = CHECKS[name](spec, value)
        if reason is not None:
            raise ParameterError(reason)


def descriptor(spec: ParamSpec) -> ParameterDescriptor:
    """Return the ``ParameterDescriptor`` of an entry: description, range, ``read_only``."""
    desc = ParameterDescriptor(description=spec.description, read_only=spec.read_only)
    if spec.limits is not None:
        lo, hi = spec.limits
        if spec.kind is ParamType.DOUBLE:
            desc.floating_point_range = [
                FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)]
        else:
            desc.integer_range = [IntegerRange(from_value=int(lo), to_value=int(hi), step=1)]
    return desc


__all__ = ['CHECKS', 'OnChange', 'ParamSpec', 'ParamType', 'ParameterError', 'ROBOT_NAME',
           'descriptor', 'quoted', 'validate']
