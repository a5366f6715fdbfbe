"""
Every parameter and setting of the package, declared once: ``oxygen_parameters.yaml``.

As ros2_control's generate_parameter_library reads one YAML table per node (name, ``type``,
``default_value``, ``description``, ``read_only``, ``validation`` with ``bounds<>`` and
``one_of<>``; ``joint_trajectory_controller_parameters.yaml`` in ros2_controllers), the file
declares each parameter once, as data, and everything else follows from it:

- the ``oxygen`` node's parameters (``ros/params.py``: descriptors with ranges and
  ``read_only``, checks, what a change does) and docs/parameters.md (``ros/param_docs.py``);
- the defaults of the typed configs: a config class names the ``config`` it is
  (``@declared('engine')``), and each of its fields that the declaration places there takes
  the declared default (:func:`declared`); a sub-config (``SchedulerConfig``,
  ``BackendConfig``) has no default of its own: ``EngineConfig`` builds it from the
  declaration (:func:`declared_config`);
- the simulator's parameters (``oxygen_sim``, ``sim/params.py``).

Sections of the file: ``oxygen`` (the node's parameters), ``engine`` (settings of the engine
that are no node parameter: the Python API, the benchmarks' flags), ``oxygen_sim``. An entry's
``config`` names the typed configs that hold it (``node``, ``engine``, ``scheduler``,
``backend``, ``sim``), ``field`` its field's name there when it differs from the entry's;
an entry without ``config`` feeds fields that ``ros/node_config.py`` derives.

Pure: the standard library and PyYAML (no torch, no rclpy); kv/ and sched/ do not import it.
"""

from __future__ import annotations

import array
from dataclasses import dataclass, replace
import enum
from functools import lru_cache
from importlib import resources
import math
import sys
import types
import typing
from typing import Any, Callable, Mapping, Sequence, TypeVar, Union

import yaml

DECLARATION = 'oxygen_parameters.yaml'
"""The declaration, beside this module (package data)."""

NODE_SECTION, ENGINE_SECTION, SIM_SECTION = 'oxygen', 'engine', 'oxygen_sim'
MAP_PREFIX = '__map_'
"""A key declaring its entries once per item of a string array (generate_parameter_library)."""


class ParamType(enum.Enum):
    """A parameter's type, as docs/parameters.md names it (``type`` in the file: the key)."""

    BOOL = 'bool'
    INT = 'int'
    DOUBLE = 'double'
    STRING = 'string'
    STRING_ARRAY = 'string[]'
    DOUBLE_ARRAY = 'double[]'


_TYPE_NAMES = {'bool': ParamType.BOOL, 'int': ParamType.INT, 'double': ParamType.DOUBLE,
               'string': ParamType.STRING, 'string_array': ParamType.STRING_ARRAY,
               'double_array': ParamType.DOUBLE_ARRAY}
"""generate_parameter_library's type names."""


class OnChange(enum.Enum):
    """What a change of a dynamic parameter does while the node runs (``ros/param_handler``)."""

    NEXT_CYCLE = 'next cycle'
    """Nothing more: the next control cycle reads it from the node's config."""
    FRAME_ID = 'frame id'
    """Text messages take it at once; chunk messages from the next cycle on."""
    CONTROL_RATE = 'control rate'
    """The control timer is retimed; each cycle's deadline follows from the timer."""
    DIAGNOSTICS_PERIOD = 'diagnostics period'
    """The ``/diagnostics`` timer is retimed."""
    INSTRUCTION = 'instruction'
    """The prompt is replaced (as a ``~/instruction`` message replaces it)."""
    WAITING_BOUND = 'waiting bound'
    """The scheduler's waiting queue is bounded anew, from its next request on."""


class ParameterError(ValueError):
    """A parameter value the node cannot use (the message names it and the value)."""


class DeclarationError(ValueError):
    """The declaration file is malformed (the message names the entry and the key)."""


_NOT_OPTIONAL = object()
_KEYS = {'type', 'default_value', 'description', 'unit', 'read_only', 'on_change', 'validation',
         'unset', 'config', 'field', 'preset_default'}
_BUILT_IN = ('bounds<>', 'one_of<>', 'not_empty<>')


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """
    One declared parameter or setting (an entry of ``oxygen_parameters.yaml``).

    :ivar section: ``oxygen`` (a node parameter), ``engine`` or ``oxygen_sim``.
    :ivar default: the default (``default_value``); None for one the preset gives
        (``preset_default`` says which) or, for an engine setting, one resolved at run time.
    :ivar unit: SI or REP-103 unit of a number (``s``, ``Hz``, ``MiB``, ``rad/s``), or ''.
    :ivar limits: ``bounds<>``: the inclusive range of a number.
    :ivar one_of: ``one_of<>``: the values a string must take.
    :ivar unset: the value that means "not set" (``''``, ``0``, ``-1.0``): its config field
        holds None then, and ``one_of`` does not apply to it.
    :ivar checks: validators beyond the built-in ones, by name (``ros/param_spec.CHECKS``).
    :ivar on_change: None: read-only (fixed once the node exists); else dynamic, and what a
        change does.
    :ivar configs: the typed configs that hold it (empty: derived by ``build_configs``).
    :ivar field: its field's name in them.
    :ivar preset_default: docs/parameters.md's text for a default the preset gives.
    :ivar map_of: the string-array parameter this entry is declared once per item of (as
        generate_parameter_library's ``__map_<parameter>``): its name is ``<robots>.x``, and
        the node declares ``<item>.x`` for each item (:meth:`for_item`); '' = a plain entry.
    """

    name: str
    section: str
    kind: ParamType
    default: object
    description: str
    unit: str = ''
    limits: tuple[float, float] | None = None
    one_of: tuple[str, ...] | None = None
    unset: object = _NOT_OPTIONAL
    not_empty: bool = False
    checks: tuple[str, ...] = ()
    on_change: OnChange | None = None
    configs: tuple[str, ...] = ()
    field: str = ''
    preset_default: str = ''
    map_of: str = ''

    def for_item(self, item: str) -> ParamSpec:
        """
        Return the entry of one item of a map entry: ``<robots>.joint_names`` → ``r1.joint_names``.

        :raises ValueError: a plain entry (no ``map_of``).
        """
        if not self.map_of:
            raise ValueError(f'{self.name} is declared once, not per item of a parameter')
        return replace(self, name=f'{item}.{self.key}')

    @property
    def key(self) -> str:
        """Return the name of a map entry within its item (``joint_names``), else the name."""
        return self.name.split('.', 1)[1] if self.map_of else self.name

    @property
    def read_only(self) -> bool:
        """Return whether the parameter is fixed once the node exists."""
        return self.on_change is None

    @property
    def field_default(self) -> object:
        """Return the default as its config field holds it (None: unset or the preset's)."""
        return None if self.default is None else self.config_value(self.default)

    def config_value(self, value: object) -> object:
        """
        Return a checked value as its config field holds it, enums aside (:func:`coerce`).

        None when unset; a tuple of an array; else the value in the parameter's type.
        """
        if self.is_unset(value):
            return None
        if isinstance(value, (list, tuple, array.array)):
            return tuple(value)
        cast = {ParamType.BOOL: bool, ParamType.INT: int, ParamType.DOUBLE: float,
                ParamType.STRING: str}
        return cast[self.kind](value)

    def is_unset(self, value: object) -> bool:
        """Return whether ``value`` is the one that means "not set"."""
        if self.unset is _NOT_OPTIONAL or type(value) is bool:
            return False
        if isinstance(value, (tuple, array.array)):
            value = list(value)
        return value == self.unset

    def validate(self, value: object) -> None:
        """
        Check a value against the built-in validators: ``bounds<>``, ``one_of<>``, ``not_empty<>``.

        :raises ParameterError: the message names the parameter, what it must be and the value.
        """
        if self.limits is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value):
                raise ParameterError(f'{self.name} must be a finite number, got {value!r}')
            lo, hi = self.limits
            if not lo <= value <= hi:
                raise ParameterError(f'{self.name} must be in [{lo}, {hi}], got {value!r}')
        if self.one_of is not None and not self.is_unset(value) and value not in self.one_of:
            either = "'' or " if self.unset == '' else ''
            raise ParameterError(f'{self.name} must be {either}one of {quoted(self.one_of)}, '
                                 f'got {value!r}')
        if self.not_empty and not value:
            raise ParameterError(f'{self.name} must not be empty')


def quoted(values: Sequence[str]) -> str:
    """Return ``'a', 'b'``: choices as the messages and descriptions list them."""
    return ', '.join(repr(v) for v in values)


def _spec(section: str, name: str, entry: Mapping[str, Any], map_of: str = '') -> ParamSpec:
    """Return the spec of one entry; raise DeclarationError naming what is wrong."""
    where = f'{DECLARATION}: {section}.{name}'
    unknown = set(entry) - _KEYS
    if unknown:
        raise DeclarationError(f'{where}: unknown keys {sorted(unknown)}')
    try:
        kind = _TYPE_NAMES[entry['type']]
        description = ' '.join(str(entry['description']).split())
    except KeyError as exc:
        raise DeclarationError(f'{where}: no {exc.args[0]!r} (or an unknown type)') from None
    default = entry.get('default_value')
    if isinstance(default, int) and not isinstance(default, bool) and kind is ParamType.DOUBLE:
        default = float(default)
    if isinstance(default, list) and kind is ParamType.DOUBLE_ARRAY:
        default = [float(v) for v in default]
    validation = dict(entry.get('validation') or {})
    limits = validation.pop('bounds<>', None)
    one_of = validation.pop('one_of<>', None)
    not_empty = 'not_empty<>' in validation
    validation.pop('not_empty<>', None)
    read_only = entry.get('read_only', section != NODE_SECTION)
    on_change = entry.get('on_change')
    if section == NODE_SECTION and (read_only is (on_change is not None)):
        raise DeclarationError(f'{where}: a dynamic parameter (read_only: false) names its '
                               f'on_change, a read-only one none')
    configs = entry.get('config') or ()
    configs = (configs,) if isinstance(configs, str) else tuple(configs)
    return ParamSpec(
        name=name, section=section, kind=kind, default=default, description=description,
        unit=str(entry.get('unit', '')),
        limits=None if limits is None else (limits[0], limits[1]),
        one_of=None if one_of is None else tuple(one_of[0]),
        unset=entry['unset'] if 'unset' in entry else _NOT_OPTIONAL, not_empty=not_empty,
        checks=tuple(validation), on_change=None if on_change is None else OnChange(on_change),
        configs=configs, field=str(entry.get('field', name)),
        preset_default=str(entry.get('preset_default', '')), map_of=map_of)


class _UniqueKeys(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key twice in one mapping (YAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise DeclarationError(f'{DECLARATION}: {key!r} declared twice '
                                       f'(line {key_node.start_mark.line + 1})')
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


@lru_cache(maxsize=None)
def load(text: str | None = None) -> tuple[ParamSpec, ...]:
    """
    Return every declared entry, in file order (the package's declaration by default).

    Nested mappings are name prefixes, as generate_parameter_library's
    (``image_transport: {base_0_rgb: {...}}`` is ``image_transport.base_0_rgb``), and
    ``__map_<parameter>`` declares its entries once per item of that string array (as
    generate_parameter_library's maps): ``__map_robots: {joint_names: {...}}`` is
    ``<robots>.joint_names``, with ``map_of`` = ``robots``.

    :raises DeclarationError: a key twice in one mapping, an entry without a type or
        description, an unknown key, or a dynamic node parameter without ``on_change``.
    """
    if text is None:
        text = resources.files(__name__).joinpath(DECLARATION).read_text(encoding='utf-8')
    specs: list[ParamSpec] = []

    def walk(section: str, prefix: str, table: Mapping[str, Any], map_of: str = '') -> None:
        for key, entry in table.items():
            if 'type' in entry:
                specs.append(_spec(section, prefix + key, entry, map_of))
            elif key.startswith(MAP_PREFIX):
                item = key[len(MAP_PREFIX):]
                walk(section, f'{prefix}<{item}>.', entry, item)
            else:
                walk(section, f'{prefix}{key}.', entry, map_of)
    for section, table in yaml.load(text, Loader=_UniqueKeys).items():
        walk(section, '', table)
    _check_once(specs)
    return tuple(specs)


def _check_once(specs: Sequence[ParamSpec]) -> None:
    """Raise DeclarationError for a name the node and the engine share, or a field twice."""
    names = [s.name for s in specs if s.section in (NODE_SECTION, ENGINE_SECTION)]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DeclarationError(f'{DECLARATION}: {twice} declared in both {NODE_SECTION} and '
                               f'{ENGINE_SECTION}')
    for config in {c for s in specs for c in s.configs}:
        fields = [s.field for s in specs if config in s.configs]
        twice = sorted({f for f in fields if fields.count(f) > 1})
        if twice:
            raise DeclarationError(f'{DECLARATION}: two entries set {config}.{twice[0]}')


def section(name: str) -> tuple[ParamSpec, ...]:
    """Return the entries of the section ``name`` (``oxygen``, ``engine``, ``oxygen_sim``)."""
    return tuple(s for s in load() if s.section == name)


def in_config(config: str) -> dict[str, ParamSpec]:
    """Return ``{field: spec}`` of every entry the typed config ``config`` holds."""
    return {s.field: s for s in load() if config in s.configs}


def field_types(cls: type) -> dict[str, Any]:
    """Return the resolved annotations of a config class (its module's names)."""
    return typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))


def coerce(hint: Any, value: object) -> object:
    """
    Return ``value`` as a field annotated ``hint`` holds it: the enum member of an enum field.

    None stays None; a list becomes a tuple; any other value is returned as it is.
    """
    if value is None:
        return None
    members = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) \
        else (hint,)
    for member in members:
        if isinstance(member, type) and issubclass(member, enum.Enum):
            return member(value)
    return tuple(value) if isinstance(value, list) else value


T = TypeVar('T')


def declared(config: str) -> Callable[[type[T]], type[T]]:
    """
    Return a class decorator (under ``@dataclass``): fields of ``config`` take declared defaults.

    Every field the declaration places in ``config`` gets its entry's default (:func:`coerce`
    for its annotation); the other fields keep what the class gives them (nothing: they are
    required, or a ``default_factory``).

    :raises DeclarationError: an entry of ``config`` is no field of the class.
    """
    def fill(cls: type[T]) -> type[T]:
        specs = in_config(config)
        missing = set(specs) - set(cls.__annotations__)
        if missing:
            raise DeclarationError(f'{DECLARATION} places {sorted(missing)} in {config}, but '
                                   f'{cls.__name__} has no such field')
        hints = field_types(cls)
        for name in cls.__annotations__:
            if name in specs:
                setattr(cls, name, coerce(hints[name], specs[name].field_default))
        return cls
    return fill


def declared_config(cls: type[T], config: str, **changes: object) -> T:
    """
    Return ``cls`` built from the declared defaults of ``config``, ``changes`` applied.

    How ``EngineConfig`` builds a sub-config that has no defaults of its own.

    :param changes: ``{field: value}``; values are coerced to the field's type.
    :raises TypeError: a field that ``config`` does not hold.
    """
    hints = field_types(cls)
    values = {name: spec.field_default for name, spec in in_config(config).items()}
    unknown = set(changes) - set(hints)
    if unknown:
        raise TypeError(f'{cls.__name__} has no field {sorted(unknown)}')
    values.update(changes)
    return cls(**{name: coerce(hints[name], value) for name, value in values.items()})


__all__ = ['DECLARATION', 'DeclarationError', 'ENGINE_SECTION', 'MAP_PREFIX', 'NODE_SECTION',
           'OnChange', 'ParamSpec', 'ParamType', 'ParameterError', 'SIM_SECTION', 'coerce',
           'declared', 'declared_config', 'field_types', 'in_config', 'load', 'quoted', 'section']
