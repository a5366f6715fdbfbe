"""
The configs the node's parameters build: ``NodeConfig`` for the node, ``EngineConfig``.

``build_configs`` checks every value against its row of ``params.PARAMETERS`` and fills each
config field the row names (``ParamSpec.into``); the fields that several parameters or the
preset feed (cameras in slot order, the action space, limits, end-effector scales, compressed
cameras, the control period, RTC) are derived here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from oxygen_ros.config import ActionSpace, CAMERA_SLOTS, get_preset
from oxygen_ros.control.action_space import ActionSemantics, JointLimits
from oxygen_ros.control.smoothing import ChunkSmoothing
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.ros.images.transport import ImageTransport
from oxygen_ros.ros.param_spec import Into, ParameterError
from oxygen_ros.ros.params import DEFAULT_PRESET, model_defaults, PARAMETERS, SPECS
from oxygen_ros.ros.topics import CAMERA_TOPICS


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """
    What the node itself needs besides the engine (built at configure; dynamic fields change).

    Built by ``build_configs`` (every field checked there) and changed by ``updated``.

    :ivar cameras: camera slots in ``CAMERA_SLOTS`` order.
    :ivar control_rate_hz: timer rate; ``1 / control_rate_hz`` is the engine's deadline.
    :ivar max_observation_age: seconds.
    :ivar subtask_period: seconds, 0 = never.
    :ivar action_space: what the chunk's action dims mean.
    :ivar gripper_dims: action dims that are gripper positions (the preset's).
    :ivar limits: per action dim, checked (``JointLimits``).
    """

    preset: str
    cameras: tuple[str, ...]
    joint_names: tuple[str, ...]
    action_joint_names: tuple[str, ...]
    action_space: ActionSpace = ActionSpace.JOINT_POSITION
    gripper_dims: tuple[int, ...] = ()
    limits: JointLimits | None = None
    end_effector_name: str = 'end_effector'
    ee_scale: tuple[float, float] = (1.0, 1.0)
    joint_velocity_scale: float = 1.0
    chunk_smoothing: ChunkSmoothing = ChunkSmoothing.NONE
    ensemble_decay: float = 0.01
    rtc_max_guidance_weight: float = 5.0
    frame_id: str = ''
    control_rate_hz: float = 10.0
    action_dt: float = 0.1
    max_observation_age: float = 0.5
    subtask_period: float = 0.0
    memory_period: float = 0.0
    instruction: str = ''
    autostart: bool = True
    torch_threads: int = 0
    diagnostics_period: float = 1.0
    malloc_trim_mb: float = 4.0
    max_waiting_requests: int = 16
    compressed_cameras: tuple[str, ...] = ()
    """Camera slots subscribed on ``<topic>/compressed`` (``image_transport.<slot>``)."""

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

    def updated(self, name: str, value: object) -> NodeConfig:
        """
        Return a copy with one dynamic parameter changed.

        :raises ParameterError: read-only or unknown parameter, or a bad value.
        """
        spec = SPECS.get(name)
        if spec is None or spec.read_only:
            raise ParameterError(f'parameter {name!r} cannot change while the node runs')
        spec.validate(value)
        return replace(self, **{name: spec.field_value(value)})


def build_configs(values: Mapping[str, object]) -> tuple[EngineConfig, NodeConfig]:
    """
    Build the engine and node configs from parameter values (``params.parameter_values``).

    :param values: ``{name: value}``; missing names take their defaults.
    :raises ParameterError: an unknown preset, a value its row of ``PARAMETERS`` refuses (out
        of range, not one of the choices, a bad device, cameras or joint names, an
        ``instruction`` longer than ``input_limits.MAX_INSTRUCTION_BYTES``), limits or joint
        names that do not fit the preset's state/action dims, an action space the joints cannot
        carry, or a value ``EngineConfig`` refuses; the message names the parameter and the
        value.
    """
    try:
        model = get_preset(str(values.get('preset', DEFAULT_PRESET)))
    except ValueError as exc:
        raise ParameterError(f'preset: {exc}') from None
    v = {spec.name: spec.default for spec in PARAMETERS}
    v.update(model_defaults(model))
    v.update(values)
    if 'action_joint_names' not in values and 'joint_names' in values:
        v['action_joint_names'] = list(v['joint_names'])[:model.robot_action_dim]
    for spec in PARAMETERS:
        spec.validate(v[spec.name])
    fields = {into: {s.name: s.field_value(v[s.name]) for s in PARAMETERS if into in s.into}
              for into in (Into.NODE, Into.ENGINE)}
    compressed = [s for s in CAMERA_SLOTS if SPECS[f'image_transport.{s}'].field_value(
        v[f'image_transport.{s}']) is ImageTransport.COMPRESSED]
    node = NodeConfig(
        preset=model.name, cameras=tuple(s for s in CAMERA_SLOTS if s in v['cameras']),
        action_space=SPECS['action_space'].field_value(v['action_space']) or model.action_space,
        gripper_dims=model.gripper_dims, limits=_limits(v, model.robot_action_dim),
        ee_scale=(float(v['ee_translation_scale']), float(v['ee_rotation_scale'])),
        compressed_cameras=tuple(s for s in compressed if s in v['cameras']),
        **fields[Into.NODE])
    if len(node.joint_names) != model.state_dim:
        raise ParameterError(f'joint_names: preset {model.name} has a {model.state_dim}-dim '
                             f'state, got {len(node.joint_names)} names {list(node.joint_names)}')
    if len(node.action_joint_names) != model.robot_action_dim:
        raise ParameterError(
            f'action_joint_names: preset {model.name} has {model.robot_action_dim} action '
            f'dims, got {len(node.action_joint_names)} names {list(node.action_joint_names)}')
    node.action_semantics()  # raises ParameterError for a space the joints cannot carry
    try:
        engine = EngineConfig(
            preset=model.name, cameras=node.cameras, control_period_s=node.control_period_s,
            rtc=node.chunk_smoothing is ChunkSmoothing.RTC, **fields[Into.ENGINE])
    except ValueError as exc:
        raise ParameterError(str(exc)) from None
    return engine, node


def _limits(values: Mapping[str, object], num_dims: int) -> JointLimits:
    """Return the limit parameters as ``JointLimits`` of ``num_dims`` action dims."""
    arrays = {}
    for name in ('position_limits_lower', 'position_limits_upper', 'velocity_limits'):
        value = list(values[name])
        if len(value) != num_dims:
            raise ParameterError(f'{name} needs one value per action joint ({num_dims}), got '
                                 f'{len(value)}: {value}')
        arrays[name] = value
    try:
        return JointLimits(arrays['position_limits_lower'], arrays['position_limits_upper'],
                           arrays['velocity_limits'])
    except ValueError as exc:
        raise ParameterError(f'limits: {exc}') from None


def check_update(current: NodeConfig | None, name: str, value: object) -> str | None:
    """
    Check a parameter change requested while the node exists.

    Types, ranges and ``read_only`` are enforced by rclpy from the descriptors before; this
    adds what they cannot express (and a clear reason).

    :param current: the node's config; None before the first configure (then only the row's
        checks apply).
    :returns: None if the change is acceptable, else the reason to reject it.
    """
    spec = SPECS.get(name)
    if spec is None:
        return None  # not ours (e.g. use_sim_time)
    try:
        if current is None:
            spec.validate(value)
        else:
            current.updated(name, value)
    except (ParameterError, TypeError) as exc:
        return str(exc)
    return None


__all__ = ['NodeConfig', 'build_configs', 'check_update']
