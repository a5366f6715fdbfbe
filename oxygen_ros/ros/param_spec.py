"""
One row of the node's parameter table (``params.PARAMETERS``) and what follows from it.

As ros2_control's generate_parameter_library reads one table of parameters (name, type,
``default_value``, ``description``, ``read_only``, ``validation`` with ``bounds<>`` and
``one_of<>``; ``joint_trajectory_controller_parameters.yaml`` in ros2_controllers), every
parameter of the node is one ``ParamSpec``, and from it follow:

- its declaration: ``descriptor`` (description, range, ``read_only``; rclpy enforces these);
- its checks: ``validate`` (range, choices and what a descriptor cannot say);
- its place in the configs: ``into`` and ``field_value`` (``node_config.build_configs``);
- what a change does while the node runs: ``on_change`` (``param_handler``);
- its row of docs/parameters.md (``param_docs``).
"""

from __future__ import annotations

import array
from dataclasses import dataclass
import enum
import math
from typing import Callable, Sequence

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor


class ParameterError(ValueError):
    """A parameter value the node cannot use (the message names it and the value)."""


class ParamType(enum.Enum):
    """A parameter's type, as docs/parameters.md names it (rclpy infers it from the default)."""

    BOOL = 'bool'
    INT = 'int'
    DOUBLE = 'double'
    STRING = 'string'
    STRING_ARRAY = 'string[]'
    DOUBLE_ARRAY = 'double[]'

    @classmethod
    def of(cls, value: object) -> ParamType:
        """Return the type of a default value."""
        if isinstance(value, bool):
            return cls.BOOL
        if isinstance(value, int):
            return cls.INT
        if isinstance(value, float):
            return cls.DOUBLE
        if isinstance(value, str):
            return cls.STRING
        raise TypeError(f'no parameter type for {value!r}; give the ParamSpec a param_type')


class Into(enum.Flag):
    """The config fields a parameter sets under its name (DERIVED: ``build_configs`` derives)."""

    DERIVED = 0
    NODE = enum.auto()
    """``NodeConfig.<name>``."""
    ENGINE = enum.auto()
    """``EngineConfig.<name>``."""


class OnChange(enum.Enum):
    """What a change of a dynamic parameter does while the node runs (``param_handler``)."""

    NEXT_CYCLE = 'next cycle'
    """Nothing more: the next control cycle reads it from the node's config."""
    FRAME_ID = 'frame id'
    """Text messages take it at once; chunk messages from the next cycle on."""
    CONTROL_RATE = 'control rate'
    """The control timer is retimed; the engine's deadline follows in the next cycle."""
    DIAGNOSTICS_PERIOD = 'diagnostics period'
    """The ``/diagnostics`` timer is retimed."""
    INSTRUCTION = 'instruction'
    """The prompt is replaced (as a ``~/instruction`` message replaces it)."""
    WAITING_BOUND = 'waiting bound'
    """The scheduler's waiting queue is bounded anew, from its next request on."""


_NOT_OPTIONAL = object()


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """
    One node parameter: its declaration, checks, config field and change handling.

    :ivar default: the default; None for those the preset gives (``params.model_defaults``).
    :ivar description: the descriptor's and docs/parameters.md's text.
    :ivar limits: ``(from, to)`` inclusive range of a number parameter (descriptor range).
    :ivar choices: the enum whose values the parameter must take (``one_of``).
    :ivar unset: the value that means "not set" (``''``, ``0``, ``-1.0``): its config field is
        None then, and ``choices`` do not apply to it.
    :ivar into: the config fields it sets under its name; DERIVED: ``build_configs`` computes
        the fields it feeds.
    :ivar check: what a descriptor cannot say: returns the reason a value is refused, or None.
    :ivar on_change: None: read-only (fixed once the node exists; it shapes the engine);
        else dynamic, and what a change does.
    :ivar param_type: the type, for a default the preset gives (else inferred).
    :ivar preset_default: docs/parameters.md's text for a default the preset gives.
    """

    name: str
    default: object
    description: str
    limits: tuple[float, float] | None = None
    choices: type[enum.Enum] | None = None
    unset: object = _NOT_OPTIONAL
    into: Into = Into.DERIVED
    check: Callable[[object], str | None] | None = None
    on_change: OnChange | None = None
    param_type: ParamType | None = None
    preset_default: str = ''

    @property
    def read_only(self) -> bool:
        """Return whether the parameter is fixed once the node exists."""
        return self.on_change is None

    @property
    def kind(self) -> ParamType:
        """Return the parameter's type."""
        return self.param_type if self.param_type is not None else ParamType.of(self.default)

    def descriptor(self) -> ParameterDescriptor:
        """Return the ``ParameterDescriptor``: description, range, ``read_only``."""
        desc = ParameterDescriptor(description=self.description, read_only=self.read_only)
        if self.limits is not None:
            lo, hi = self.limits
            if self.kind is ParamType.DOUBLE:
                desc.floating_point_range = [
                    FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)]
            else:
                desc.integer_range = [IntegerRange(from_value=int(lo), to_value=int(hi), step=1)]
        return desc

    def validate(self, value: object) -> None:
        """
        Check a value against the range, the choices and ``check``.

        :raises ParameterError: the message names the parameter, what it must be and the value.
        """
        if self.limits is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value):
                raise ParameterError(f'{self.name} must be a finite number, got {value!r}')
            lo, hi = self.limits
            if not lo <= value <= hi:
                raise ParameterError(f'{self.name} must be in [{lo}, {hi}], got {value!r}')
        if self.choices is not None and not self._is_unset(value):
            try:
                self.choices(value)
            except ValueError:
                either = "'' or " if self.unset == '' else ''
                raise ParameterError(f'{self.name} must be {either}one of '
                                     f'{quoted([c.value for c in self.choices])}, got '
                                     f'{value!r}') from None
        if self.check is not None:
            reason = self.check(value)
            if reason is not None:
                raise ParameterError(reason)

    def field_value(self, value: object) -> object:
        """
        Return a checked value as its config field holds it.

        None when unset; the enum member of a choice; a tuple of an array; else the value of
        the parameter's type.
        """
        if self._is_unset(value):
            return None
        if self.choices is not None:
            return self.choices(value)
        if isinstance(value, (list, tuple, array.array)):
            return tuple(value)
        cast = {ParamType.BOOL: bool, ParamType.INT: int, ParamType.DOUBLE: float,
                ParamType.STRING: str}
        return cast[self.kind](value)

    def _is_unset(self, value: object) -> bool:
        return self.unset is not _NOT_OPTIONAL and type(value) is not bool and \
            not isinstance(value, (list, tuple, array.array)) and value == self.unset


def quoted(values: Sequence[str]) -> str:
    """Return ``'a', 'b'``: choices as the messages and descriptions list them."""
    return ', '.join(repr(v) for v in values)


__all__ = ['Into', 'OnChange', 'ParamSpec', 'ParamType', 'ParameterError', 'quoted']
