"""
The configs the node's parameters build: ``NodeConfig`` for the node, ``EngineConfig``.

``build_configs`` checks every value against its entry of the declaration
(``params.PARAMETERS``) and puts it in the config the entry names (``config``: the node's, the
engine's, the scheduler's or the backend's); the fields that several parameters or the preset
feed (cameras in slot order, joint names, the action space, limits, end-effector scales,
compressed cameras, RTC) are derived here. Each robot of ``robots`` has its own joints, limits,
instruction, control rate and ``action_dt`` (``RobotSettings``, from its ``<robots>.*``
parameters), and ``NodeConfig.robot`` gives the config that robot's topics run on. A robot's
rate is the node's (the cycle rate) over a whole number: it is due every n-th control cycle
(``NodeConfig.due_every``; ``docs/running.md#a-rate-per-robot``), as ros2_control's controller
manager runs a controller whose ``update_rate`` is below its own on every n-th of its cycles.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import math
from typing import Mapping, Sequence

from oxygen_ros.config import ActionSpace, CAMERA_SLOTS, get_preset
from oxygen_ros.control.action_space import ActionSemantics, JointLimits
from oxygen_ros.control.smoothing import ChunkSmoothing
from oxygen_ros.engine import ENGINE_CONFIGS, EngineConfig
from oxygen_ros.parameters import coerce, declared, field_types, ParameterError, ParamSpec
from oxygen_ros.policies import get_robot, RobotPolicy
from oxygen_ros.ros.images.transport import ImageTransport
from oxygen_ros.ros.param_spec import validate
from oxygen_ros.ros.params import (
    DEFAULT_PRESET, named_robots, PARAMETERS, robot_default, robot_defaults, ROBOT_PARAMETERS,
    robot_specs, SPECS)
from oxygen_ros.ros.topics import CAMERA_TOPICS


@dataclass(frozen=True, slots=True)
class RobotSettings:
    """
    One robot's own parameters (``<name>.joint_names``, ...; each defaults to the node's).

    :ivar name: the robot (a ``robots`` entry): its namespace and its name in the engine.
    :ivar limits: per action dim, checked (``JointLimits``).
    :ivar control_rate_hz: its own rate, Hz (None: the node's ``control_rate_hz``).
    :ivar action_dt: its own seconds between chunk points (None: the node's ``action_dt``).
    """

    name: str
    joint_names: tuple[str, ...]
    action_joint_names: tuple[str, ...]
    limits: JointLimits
    instruction: str
    control_rate_hz: float | None
    action_dt: float | None


@dataclass(frozen=True, slots=True)
@declared('node')
class NodeConfig:
    """
    What the node itself needs besides the engine (built at configure; dynamic fields change).

    Built by ``build_configs`` (every field checked there) and changed by ``updated``. The
    fields the declaration places in ``node`` take its defaults (``@declared``; units and
    descriptions there); the others are derived, and required.

    :ivar cameras: camera slots in ``CAMERA_SLOTS`` order.
    :ivar action_space: what the chunk's action dims mean.
    :ivar gripper_dims: action dims that are gripper positions (the robot policy's).
    :ivar limits: per action dim, checked (``JointLimits``).
    :ivar ee_scale: ``(ee_translation_scale, ee_rotation_scale)``.
    :ivar compressed_cameras: camera slots subscribed on ``<topic>/compressed``
        (``image_transport.<slot>``).
    :ivar robot_settings: each named robot's own parameters, in ``robots`` order (empty: the
        one unnamed robot, on the fields above).
    """

    cameras: tuple[str, ...]
    joint_names: tuple[str, ...]
    action_joint_names: tuple[str, ...]
    action_space: ActionSpace
    gripper_dims: tuple[int, ...]
    limits: JointLimits
    ee_scale: tuple[float, float]
    compressed_cameras: tuple[str, ...]
    robot_settings: tuple[RobotSettings, ...]
    preset: str
    end_effector_name: str
    joint_velocity_scale: float
    chunk_smoothing: ChunkSmoothing
    ensemble_decay: float
    rtc_max_guidance_weight: float
    frame_id: str
    control_rate_hz: float
    action_dt: float
    max_observation_age: float
    subtask_period: float
    memory_period: float
    instruction: str
    autostart: bool
    torch_threads: int
    diagnostics_period: float
    malloc_trim_mb: float
    robots: tuple[str, ...]

    @property
    def robot_names(self) -> tuple[str, ...]:
        """Return the robots the engine serves: ``('',)`` for one, else the ``robots`` names."""
        return tuple(s.name for s in self.robot_settings) or ('',)

    def robot(self, name: str) -> NodeConfig:
        """
        Return the config robot ``name`` runs on: the node's with that robot's own settings.

        Its ``control_rate_hz`` is its rate (``control_rate_hz / due_every(name)``) and its
        ``action_dt`` its own, where it has them.

        :raises KeyError: a robot the node does not serve.
        """
        own = self._settings(name)
        if own is None:
            return self
        return replace(self, joint_names=own.joint_names,
                       action_joint_names=own.action_joint_names, limits=own.limits,
                       instruction=own.instruction, robot_settings=(),
                       control_rate_hz=self.control_rate_hz / self.due_every(name),
                       action_dt=self.action_dt if own.action_dt is None else own.action_dt)

    def due_every(self, name: str) -> int:
        """
        Return n: robot ``name`` is due every n-th control cycle (1: at ``control_rate_hz``).

        :raises KeyError: a robot the node does not serve.
        """
        own = self._settings(name)
        if own is None or own.control_rate_hz is None:
            return 1
        return cycles_per_due(own.control_rate_hz, self.control_rate_hz, name)

    def describe_rates(self) -> str:
        """Return the cycle rate, and each robot's that differs: ``10 Hz (right 5 Hz)``."""
        own = [f'{n} {self.control_rate_hz / k:g} Hz' for n in self.robot_names
               for k in [self.due_every(n)] if k > 1]
        return f'{self.control_rate_hz:g} Hz' + (f' ({", ".join(own)})' if own else '')

    def _settings(self, name: str) -> RobotSettings | None:
        """Return robot ``name``'s own settings (None: the one robot ``''``); KeyError."""
        if name == '' and not self.robot_settings:
            return None
        for own in self.robot_settings:
            if own.name == name:
                return own
        raise KeyError(f'no robot {name!r}; robots: {list(self.robot_names)}')

    @property
    def camera_topics(self) -> tuple[str, ...]:
        """Return the default image topic of each camera (``topics.CAMERA_TOPICS``; remap them)."""
        return tuple(CAMERA_TOPICS[slot] for slot in self.cameras)

    def transport(self, slot: str) -> ImageTransport:
        """Return how the images of camera ``slot`` arrive."""
        return ImageTransport.COMPRESSED if slot in self.compressed_cameras else \
            ImageTransport.RAW

    @property
    def control_period_s(self) -> float:
        """Return the timer's period, seconds (``1 / control_rate_hz``)."""
        return 1.0 / self.control_rate_hz

    def action_semantics(self) -> ActionSemantics:
        """
        Return the chunk semantics of these parameters (``control.action_space``).

        Action joints are looked up by name in ``joint_names`` for the observed state.

        :raises ParameterError: a joint-velocity joint that is not in ``joint_names`` (nothing
            to integrate from), or an ``ee_delta`` layout that does not fit.
        """
        index = [self.joint_names.index(n) if n in self.joint_names else -1
                 for n in self.action_joint_names]
        try:
            return ActionSemantics(self.action_space, len(self.action_joint_names),
                                   self.gripper_dims, self.limits, self.action_dt, index,
                                   self.ee_scale, self.joint_velocity_scale)
        except ValueError as exc:
            raise ParameterError(f'action_space {self.action_space.value}: {exc} (joints '
                                 f'{list(self.action_joint_names)})') from None

    def updated(self, name: str, value: object, *, check: bool = True) -> NodeConfig:
        """
        Return a copy with one dynamic parameter changed (itself: one another config holds).

        :param check: check the robots' rates of the copy (``check_rates``); False for one of
            several changes checked together (``check_updates``).
        :raises ParameterError: read-only or unknown parameter, a bad value, or a rate that
            leaves a robot's no whole fraction of the node's.
        """
        robot, _, key = name.partition('.')
        if name not in SPECS and robot in self.robot_names and key in _ROBOT_SPECS:
            spec = _ROBOT_SPECS[key].for_item(robot)
            if spec.read_only:
                raise ParameterError(f'parameter {name!r} cannot change while the node runs')
            validate(spec, value)  # a dynamic one of a robot: its instruction, rate, action_dt
            changed = replace(self, robot_settings=tuple(
                replace(own, **{key: spec.config_value(value)}) if own.name == robot else own
                for own in self.robot_settings))
        else:
            spec = SPECS.get(name)
            if spec is None or spec.read_only:
                raise ParameterError(f'parameter {name!r} cannot change while the node runs')
            validate(spec, value)
            if 'node' not in spec.configs:
                return self  # e.g. max_waiting_requests: the engine's scheduler holds it
            changed = replace(self, **{spec.field: _field(spec.field,
                                                          spec.config_value(value))})
        if check:
            check_rates(changed)
        return changed


RATE_TOLERANCE = 1e-6
"""How far ``control_rate_hz / <robots>.control_rate_hz`` may be from a whole number n,
relative to n: rates written in decimals (10 Hz / 3.333333 Hz)."""


def cycles_per_due(robot_hz: float, cycle_hz: float, robot: str) -> int:
    """
    Return n: a robot at ``robot_hz`` is due every n-th cycle of a node at ``cycle_hz``.

    n is ``cycle_hz / robot_hz`` rounded, within ``RATE_TOLERANCE`` of a whole number.

    :param robot: the robot's name (the messages name its parameter).
    :raises ParameterError: ``robot_hz`` above ``cycle_hz``, or no whole fraction of it (the
        message gives the nearest rates that are).
    """
    param = f'{robot}.control_rate_hz'
    if robot_hz > cycle_hz * (1.0 + RATE_TOLERANCE):
        raise ParameterError(
            f'{param} {robot_hz:g} Hz is above control_rate_hz {cycle_hz:g} Hz: a robot is due '
            f'at most once per control cycle (raise control_rate_hz, the cycle rate, or lower '
            f'{param})')
    ratio = cycle_hz / robot_hz
    n = round(ratio)
    if abs(ratio - n) > RATE_TOLERANCE * n:
        below, above = math.floor(ratio), math.ceil(ratio)
        raise ParameterError(
            f'{param} {robot_hz:g} Hz is not control_rate_hz {cycle_hz:g} Hz / n for a whole n '
            f'(a robot is due every n-th control cycle): the nearest are '
            f'{cycle_hz / below:.9g} Hz (n = {below}) and {cycle_hz / above:.9g} Hz '
            f'(n = {above})')
    return n


def check_rates(cfg: NodeConfig) -> None:
    """Raise ParameterError for a robot's rate that is no whole fraction of the node's."""
    for name in named_robots(cfg.robots):
        cfg.due_every(name)


def build_configs(values: Mapping[str, object]) -> tuple[EngineConfig, NodeConfig]:
    """
    Build the engine and node configs from parameter values (``params.parameter_values``).

    The engine's ``max_robots`` is the number of robots (``NodeConfig.robot_names``).

    :param values: ``{name: value}``; missing names take their defaults (a robot's
        ``<name>.x``: the node's ``x``, its ``action_joint_names`` the first
        ``robot_action_dim`` of its own ``joint_names`` when it has its own).
    :raises ParameterError: an unknown preset, a value its row of ``PARAMETERS`` refuses (out
        of range, not one of the choices, a bad device, cameras, robot or joint names, an
        ``instruction`` longer than ``input_limits.MAX_INSTRUCTION_BYTES``), limits or joint
        names (the node's or a robot's) that do not fit the preset's state/action dims, an
        action space the joints cannot carry, a robot's rate that is no whole fraction of
        ``control_rate_hz`` (``cycles_per_due``), or a value ``EngineConfig`` refuses; the
        message names the parameter and the value.
    """
    try:
        preset = get_preset(str(values.get('preset', DEFAULT_PRESET)))
    except ValueError as exc:
        raise ParameterError(f'preset: {exc}') from None
    robot = get_robot(preset.robot)
    v = {spec.name: spec.default for spec in PARAMETERS}
    v.update(robot_defaults(robot))
    v.update(values)
    if 'action_joint_names' not in values and 'joint_names' in values:
        v['action_joint_names'] = list(v['joint_names'])[:robot.robot_action_dim]
    for spec in PARAMETERS:
        validate(spec, v[spec.name])
    own = {s.field: _field(s.field, s.config_value(v[s.name]))
           for s in PARAMETERS if 'node' in s.configs}
    cameras = tuple(s for s in CAMERA_SLOTS if s in v['cameras'])
    compressed = [s for s in cameras
                  if ImageTransport(v[f'image_transport.{s}']) is ImageTransport.COMPRESSED]
    action_space = SPECS['action_space'].config_value(v['action_space'])
    node = NodeConfig(
        **{**own, 'preset': preset.name}, cameras=cameras,
        joint_names=tuple(v['joint_names']), action_joint_names=tuple(v['action_joint_names']),
        action_space=ActionSpace(action_space) if action_space else robot.action_space,
        gripper_dims=robot.gripper_dims, limits=_limits(v, robot.robot_action_dim),
        ee_scale=(float(v['ee_translation_scale']), float(v['ee_rotation_scale'])),
        compressed_cameras=tuple(compressed), robot_settings=_robot_settings(v, robot))
    _check_joints(node, preset.name, robot)
    check_rates(node)
    for name in named_robots(node.robots):
        _check_joints(node.robot(name), preset.name, robot, f'{name}.')
    settings = {s.name: s.config_value(v[s.name]) for s in PARAMETERS
                if set(s.configs) & set(ENGINE_CONFIGS)}
    try:
        engine = EngineConfig.create(**{**settings, 'preset': preset.name,
                                        'cameras': node.cameras},
                                     max_robots=len(node.robot_names),
                                     rtc=node.chunk_smoothing is ChunkSmoothing.RTC)
    except ValueError as exc:
        raise ParameterError(str(exc)) from None
    return engine, node


def _check_joints(cfg: NodeConfig, preset: str, robot: RobotPolicy, prefix: str = '') -> None:
    """Raise ParameterError for joints that do not fit the preset (``prefix``: a robot's)."""
    if len(cfg.joint_names) != robot.state_dim:
        raise ParameterError(f'{prefix}joint_names: preset {preset} has a {robot.state_dim}-dim '
                             f'state, got {len(cfg.joint_names)} names {list(cfg.joint_names)}')
    if len(cfg.action_joint_names) != robot.robot_action_dim:
        raise ParameterError(
            f'{prefix}action_joint_names: preset {preset} has {robot.robot_action_dim} action '
            f'dims, got {len(cfg.action_joint_names)} names {list(cfg.action_joint_names)}')
    try:
        cfg.action_semantics()  # a space the joints cannot carry
    except ParameterError as exc:
        raise ParameterError(f'{prefix}{exc}') from None


def _robot_settings(values: Mapping[str, object],
                    robot: RobotPolicy) -> tuple[RobotSettings, ...]:
    """Return each named robot's settings: its ``<name>.x`` values, else the node's ``x``."""
    out = []
    for name in named_robots(values['robots']):
        own = {}
        for spec in robot_specs([name]):
            value = values.get(spec.name, robot_default(spec, values[spec.key]))
            if spec.key == 'action_joint_names' and spec.name not in values and \
                    list(own['joint_names']) != list(values['joint_names']):
                value = list(own['joint_names'])[:robot.robot_action_dim]
            validate(spec, value)
            own[spec.key] = value
        out.append(RobotSettings(
            name, joint_names=tuple(own['joint_names']),
            action_joint_names=tuple(own['action_joint_names']),
            limits=_limits({k: own[k] for k in _LIMITS}, robot.robot_action_dim, f'{name}.'),
            instruction=str(own['instruction']),
            **{key: _ROBOT_SPECS[key].config_value(own[key]) for key in _OWN_NUMBERS}))
    return tuple(out)


def _field(name: str, value: object) -> object:
    """Return a value as ``NodeConfig.<name>`` holds it (an enum member for a choice)."""
    return coerce(_NODE_TYPES[name], value)


def _limits(values: Mapping[str, object], num_dims: int, prefix: str = '') -> JointLimits:
    """Return the limit parameters as ``JointLimits`` of ``num_dims`` action dims."""
    arrays = {}
    for name in _LIMITS:
        value = list(values[name])
        if len(value) != num_dims:
            raise ParameterError(f'{prefix}{name} needs one value per action joint ({num_dims}), '
                                 f'got {len(value)}: {value}')
        arrays[name] = value
    try:
        return JointLimits(arrays['position_limits_lower'], arrays['position_limits_upper'],
                           arrays['velocity_limits'])
    except ValueError as exc:
        raise ParameterError(f'{prefix}limits: {exc}') from None


def check_update(current: NodeConfig | None, name: str, value: object) -> str | None:
    """
    Check a parameter change requested while the node exists (``check_updates`` of one).

    :returns: None if the change is acceptable, else the reason to reject it.
    """
    return check_updates(current, [(name, value)])


def check_updates(current: NodeConfig | None,
                  changes: Sequence[tuple[str, object]]) -> str | None:
    """
    Check parameter changes requested together while the node exists.

    Types, ranges and ``read_only`` are enforced by rclpy from the descriptors before; this
    adds what they cannot express (and a clear reason). Changes set together
    (``set_parameters_atomically``) are checked as one: the robots' rates of their result
    (``check_rates``), so ``control_rate_hz`` and a robot's rate may change at once.

    :param current: the node's config; None before the first configure (then only the rows'
        checks apply).
    :param changes: ``(name, value)`` in the order they are set.
    :returns: None if the changes are acceptable, else the reason to reject them.
    """
    try:
        changed = current
        for name, value in changes:
            spec = declared_spec(name)
            if spec is None:
                continue  # not ours (e.g. use_sim_time)
            if changed is None:
                validate(spec, value)
            else:
                changed = changed.updated(name, value, check=False)
        if changed is not None:
            check_rates(changed)
    except (ParameterError, TypeError) as exc:
        return str(exc)
    return None


def declared_spec(name: str) -> ParamSpec | None:
    """Return the entry of a parameter name (``r1.instruction``: the robot's), or None."""
    spec = SPECS.get(name)
    robot, _, key = name.partition('.')
    if spec is None and robot and key in _ROBOT_SPECS:
        return _ROBOT_SPECS[key].for_item(robot)
    return spec


_NODE_TYPES = field_types(NodeConfig)
_ROBOT_SPECS = {spec.key: spec for spec in ROBOT_PARAMETERS}
_LIMITS = ('position_limits_lower', 'position_limits_upper', 'velocity_limits')
_OWN_NUMBERS = ('control_rate_hz', 'action_dt')
"""A robot's numbers that are None where it has none of its own (``unset``: the node's)."""

__all__ = ['NodeConfig', 'RATE_TOLERANCE', 'RobotSettings', 'build_configs', 'check_rates',
           'check_update', 'check_updates', 'cycles_per_due', 'declared_spec']
