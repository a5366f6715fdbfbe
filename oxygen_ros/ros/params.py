"""
Parameters of the ``oxygen`` node: names, types, defaults, ranges, and the configs they build.

Every parameter is declared with a ``ParameterDescriptor`` (description, range, ``read_only``).
Read-only parameters shape the engine (weights, KV pool, cameras, joint order) and are fixed
once the node exists: set them in ``config/<preset>.yaml`` or with ``-p``. The others are
dynamic and are checked again by the node's ``add_on_set_parameters_callback``
(``check_update``), which rejects bad values with a reason.

Defaults that depend on the model (``cameras``, ``joint_names``, ``action_joint_names``) are
taken from the ``preset`` parameter, which is declared first.
"""

from __future__ import annotations

import array
from dataclasses import dataclass, fields, replace
import math
import re
from typing import Mapping, Sequence

from oxygen_ros.config import (
    ActionSpace, CAMERA_SLOTS, get_preset, ModelConfig, PrefixAttention, PromptFormat)
from oxygen_ros.control.action_space import ActionSemantics, JointLimits
from oxygen_ros.control.smoothing import ChunkSmoothing
from oxygen_ros.engine.config import (
    BackendKind, CompileMode, EngineConfig, MAX_STATE_PROMPT_PAD, Quantization)
from oxygen_ros.model.preprocess import ImageResize
from oxygen_ros.ros.compressed import ImageTransport, transport
from oxygen_ros.ros.input_limits import instruction_refusal, MAX_INSTRUCTION_BYTES
from oxygen_ros.ros.topics import CAMERA_TOPICS
from oxygen_ros.sched.request import TextContext
from oxygen_ros.sched.scheduler import Policy
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.node import Node

DEFAULT_PRESET = 'demo'
"""Preset of a node started without a params file (random weights, fast on a CPU)."""


class ParameterError(ValueError):
    """A parameter value the node cannot use (the message names it and the value)."""


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """
    One node parameter.

    :ivar default: the default; None for the model-dependent ones (see ``model_defaults``).
    :ivar limits: ``(from, to)`` inclusive range of a number parameter.
    :ivar read_only: fixed after the node starts (shapes the engine).
    """

    name: str
    default: object
    description: str
    limits: tuple[float, float] | None = None
    read_only: bool = False

    def descriptor(self) -> ParameterDescriptor:
        """Return the ``ParameterDescriptor`` (type is inferred from the default)."""
        desc = ParameterDescriptor(description=self.description, read_only=self.read_only)
        if self.limits is not None:
            lo, hi = self.limits
            if isinstance(self.default, float):
                desc.floating_point_range = [
                    FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)]
            else:
                desc.integer_range = [IntegerRange(from_value=int(lo), to_value=int(hi), step=1)]
        return desc


def _choices(enum_values: Sequence[str]) -> str:
    return ', '.join(repr(v) for v in enum_values)


PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec('preset', DEFAULT_PRESET, 'model preset (sizes, cameras, action horizon): '
              'pi05_droid, pi05_libero, pi05_base, small, demo, tiny', read_only=True),
    ParamSpec('checkpoint', '', 'directory with model.safetensors (openpi-PyTorch or LeRobot '
              'layout) and its norm stats (assets/<asset_id>/norm_stats.json or LeRobot '
              "processor files, docs/checkpoints.md); '' = seeded random weights (logged, "
              'meaningless actions)', read_only=True),
    ParamSpec('tokenizer', '', "paligemma_tokenizer.model path; '' = the one fetched by "
              'oxygen_fetch tokenizer', read_only=True),
    ParamSpec('norm_stats', '', "norm_stats.json overriding the checkpoint's; '' = the "
              "checkpoint's (identity stats for random weights)", read_only=True),
    ParamSpec('prompt_format', '', "action prompt: '' = the checkpoint's (LeRobot: with the "
              "state) or the preset's; 'pi05_state' (Task, State bins, Action), 'pi0' (task "
              "only, openpi pi05_libero), 'pi05_no_state' (Task, Action)", read_only=True),
    ParamSpec('state_prompt_pad', 0, 'zero-pad the normalized state to this many dims before '
              'binning it into the prompt: 32 for checkpoints fine-tuned with LeRobot <= '
              '0.4.4; 0 = no padding (openpi, LeRobot >= 0.5)', (0, MAX_STATE_PROMPT_PAD),
              read_only=True),
    ParamSpec('quantile_eps', -1.0, 'added to q99 - q01 by quantile normalization; -1 = the '
              "stats' own (openpi norm_stats.json 1e-6, LeRobot files 0)", (-1.0, 1.0),
              read_only=True),
    ParamSpec('image_resize', '', "camera image resize-with-pad filter: '' = the "
              "checkpoint's ('openpi': Pillow bilinear; LeRobot checkpoints: 'lerobot', "
              'F.interpolate bilinear without antialiasing, as each family trained)',
              read_only=True),
    ParamSpec('dtype', 'float32', "weights and KV cache dtype: 'float32' or 'bfloat16'",
              read_only=True),
    ParamSpec('quantization', Quantization.NONE.value, "weights quantized at load: 'none', or "
              "'fp8' (E4M3 weights with per-channel scales in the large linears; CUDA: compute "
              "capability >= 8.9 and dtype 'bfloat16'; CPU: the weight-only reference path; held "
              'to the FP8 action check at load, else the unquantized weights run: '
              "docs/gpu.md 'FP8 weights')", read_only=True),
    ParamSpec('device', 'cpu', "torch device: 'cpu', 'cuda', 'cuda:N'", read_only=True),
    ParamSpec('backend', BackendKind.TORCH.value,
              f'execution backend: {_choices([b.value for b in BackendKind])}', read_only=True),
    ParamSpec('compile_mode', CompileMode.AUTO.value, "torch backend fast path: 'auto' = "
              "'reduce-overhead' (compiled kernels in CUDA graphs) on CUDA, 'none' (eager) on "
              f'the CPU; {_choices([m.value for m in CompileMode])}', read_only=True),
    ParamSpec('policy', Policy.OXYGEN.value, "'oxygen' (one shared prefill per cycle) or "
              "'isolated' (the baseline: one prefill per job)", read_only=True),
    ParamSpec('prefix_attention', '', "'' = the preset's; "
              f'{_choices([p.value for p in PrefixAttention])}', read_only=True),
    ParamSpec('cameras', None, 'camera slots to subscribe (base_0_rgb, left_wrist_0_rgb, '
              "right_wrist_0_rgb); default: the preset's", read_only=True),
    ParamSpec('joint_names', None, 'joint names of the robot state in model order, looked up '
              'by name in /joint_states; default joint_1..joint_<state_dim>', read_only=True),
    ParamSpec('action_joint_names', None, 'joint_names of ~/action_chunk (robot_action_dim '
              'of them); default: the first robot_action_dim joint_names', read_only=True),
    ParamSpec('action_space', '', "what the action dims mean; '' = the preset's (pi05_droid: "
              "joint_velocity, pi05_libero: ee_delta, others: joint_position): 'joint_position', "
              "'joint_velocity' (~/action_chunk carries the integrated positions and the "
              "velocities), 'ee_delta' (~/ee_delta_chunk)", read_only=True),
    ParamSpec('position_limits_lower', None, 'lowest position of each action joint (rad, m; '
              'ee_delta: lowest raw action value); -.inf = none. Every chunk is clipped',
              read_only=True),
    ParamSpec('position_limits_upper', None, 'highest position of each action joint; .inf = '
              'none', read_only=True),
    ParamSpec('velocity_limits', None, 'largest speed of each action joint (rad/s, m/s; '
              'ee_delta: of the scaled deltas); .inf = none. Velocities are clipped, '
              'positions rate-limited from the observed state', read_only=True),
    ParamSpec('joint_velocity_scale', 1.0, 'rad/s (m/s) per unit of a joint_velocity action '
              '(DROID: 3.0, its controller moves 0.2 rad per unit per 15 Hz step)', (1e-9, 1e3),
              read_only=True),
    ParamSpec('end_effector_name', 'end_effector', 'joint name of ~/ee_delta_chunk '
              '(ee_delta action space)', read_only=True),
    ParamSpec('ee_translation_scale', 1.0, 'metres per unit of an ee_delta translation '
              'action (robosuite OSC_POSE: 0.05)', (1e-9, 1e3), read_only=True),
    ParamSpec('ee_rotation_scale', 1.0, 'radians per unit of an ee_delta rotation action '
              '(robosuite OSC_POSE: 0.5)', (1e-9, 1e3), read_only=True),
    ParamSpec('chunk_smoothing', ChunkSmoothing.NONE.value, 'how a new action chunk meets the '
              "previous one: 'none' (naive switching), 'ensemble' (ACT temporal ensembling "
              "of every prediction for a time), 'rtc' (real-time chunking: denoised toward "
              "the previous chunk's tail, the measured inference delay frozen)",
              read_only=True),
    ParamSpec('ensemble_decay', 0.01, "ACT's m: a prediction's weight is exp(-m k), k = 0 for "
              'the oldest (chunk_smoothing ensemble)', (0.0, 100.0), read_only=True),
    ParamSpec('rtc_max_guidance_weight', 5.0, "RTC's beta, the largest guidance weight "
              '(chunk_smoothing rtc)', (0.01, 1000.0), read_only=True),
    ParamSpec('frame_id', '', 'header.frame_id of ~/action_chunk and ~/ee_delta_chunk'),
    ParamSpec('control_rate_hz', 10.0, 'control cycles (action chunks) per second; the engine '
              'adapts decode tokens per cycle to 1/control_rate_hz', (0.1, 1000.0)),
    ParamSpec('action_dt', 0.1, 'seconds between consecutive points of an action chunk '
              '(time_from_start = i * action_dt)', (0.001, 10.0)),
    ParamSpec('max_observation_age', 0.5, 'never act on an image or joint state older than '
              'this (seconds, node clock now - header.stamp)', (0.01, 60.0)),
    ParamSpec('tokens_per_cycle', 5, 'k: max decode tokens per text request per control cycle',
              (1, 1024), read_only=True),
    ParamSpec('decode_budget', 0, "max tokens of a text request; 0 = the preset's",
              (0, 100_000), read_only=True),
    ParamSpec('subtask_period', 0.0, 'seconds between SUBTASK requests (~/subtask); 0 = never',
              (0.0, 86_400.0)),
    ParamSpec('memory_period', 0.0, 'seconds between MEMORY requests (~/memory); 0 = never',
              (0.0, 86_400.0)),
    *(ParamSpec(f'{task}_context', default, f'what {task} requests read before their own '
                f'tokens: {_choices([c.value for c in TextContext])} (the action prefix '
                f'of the frame + the suffix {suffix!r}: one prefill per frame; or the own '
                f'prompt {own!r}, a prefix of their own; docs/prompts.md)', read_only=True)
      for task, default, suffix, own in (
          ('subtask', TextContext.OWN_PROMPT.value, 'Subtask: ', 'Task: {instr}. Subtask: '),
          ('answer', TextContext.ACTION_PREFIX.value, 'Question: {q} Answer: ',
           'Task: {instr}. Question: {q} Answer: '),
          ('memory', TextContext.ACTION_PREFIX.value, 'Memory: ', 'Task: {instr}. Memory: '))),
    ParamSpec('memory_adapter', '', 'textual-memory LoRA of OxyGen (.npz, '
              'language_adaptation/libero): active on the suffix of memory requests only '
              "(needs memory_context 'action_prefix', backend torch); '' = none",
              read_only=True),
    ParamSpec('memory_adapter_alpha', 16.0, 'the LoRA alpha the memory adapter was trained with '
              "(scale alpha / rank on its attention projections; OxyGen's: 16)", (1e-6, 1e6),
              read_only=True),
    ParamSpec('kv_cache_mb', 0.0, 'KV pool size in MiB; 0 = sized for max_running_requests',
              (0.0, 1_000_000.0), read_only=True),
    ParamSpec('max_running_requests', 32, 'text requests decoding at once', (1, 4096),
              read_only=True),
    ParamSpec('max_waiting_requests', 16, 'text requests (~/ask topic and action, periodic '
              'subtask and memory) waiting for admission in the scheduler; one more is refused '
              'at once (no answer: queue full; goals rejected)', (1, 100_000)),
    ParamSpec('stop_on_eos', True, 'stop a text at EOS (False decodes every text to its '
              'budget)', read_only=True),
    ParamSpec('seed', 0, 'random weights and flow-matching noise seed', (0, 2**31 - 1),
              read_only=True),
    ParamSpec('torch_threads', 0, 'torch intra-op CPU threads (torch.set_num_threads); 0 = '
              "torch's default. 1 avoids OpenMP spin-waits on small, shared CPUs",
              (0, 1024), read_only=True),
    ParamSpec('instruction', '', "task prompt until a ~/instruction message arrives; '' = "
              f'wait for one. At most {MAX_INSTRUCTION_BYTES} UTF-8 bytes: a longer one is '
              'refused (configure fails, a set is rejected)'),
    ParamSpec('autostart', True, 'configure and activate right after start', read_only=True),
    ParamSpec('diagnostics_period', 1.0, 'seconds between /diagnostics messages', (0.05, 60.0)),
)
"""Every parameter of the node, in declaration order (``preset`` first)."""
PARAMETERS += tuple(
    ParamSpec(f'image_transport.{slot}', ImageTransport.RAW.value,
              f"how the {slot} camera's images arrive: 'raw' (sensor_msgs/Image on its topic) "
              "or 'compressed' (sensor_msgs/CompressedImage, JPEG or PNG, on <its topic>/"
              'compressed, the image_transport convention)', read_only=True)
    for slot in CAMERA_SLOTS)

SPECS: dict[str, ParamSpec] = {spec.name: spec for spec in PARAMETERS}
_ENUMS = {'backend': BackendKind, 'chunk_smoothing': ChunkSmoothing,
          'compile_mode': CompileMode, 'policy': Policy, 'prompt_format': PromptFormat,
          'quantization': Quantization,
          'subtask_context': TextContext, 'answer_context': TextContext,
          'memory_context': TextContext, 'image_resize': ImageResize}


def model_defaults(model: ModelConfig) -> dict[str, list]:
    """Return the model-dependent defaults (``cameras``, ``joint_names``, ...) of a preset."""
    joints = [f'joint_{i}' for i in range(1, model.state_dim + 1)]
    dims = model.robot_action_dim
    return {'cameras': list(model.cameras), 'joint_names': joints,
            'action_joint_names': joints[:dims],
            'position_limits_lower': [-math.inf] * dims,
            'position_limits_upper': [math.inf] * dims, 'velocity_limits': [math.inf] * dims}


def declare_parameters(node: Node) -> None:
    """
    Declare every parameter of ``PARAMETERS`` on ``node`` (overrides apply).

    An unknown preset is not an error here (configure reports it): the model-dependent
    defaults then come from ``DEFAULT_PRESET``.

    :raises rclpy.exceptions.InvalidParameterTypeException: an override of the wrong type,
        e.g. ``10`` for a double (write ``10.0``).
    :raises rclpy.exceptions.InvalidParameterValueException: an override out of range.
    """
    preset = node.declare_parameter('preset', DEFAULT_PRESET, SPECS['preset'].descriptor()).value
    try:
        model = get_preset(preset)
    except ValueError:
        model = get_preset(DEFAULT_PRESET)
    defaults = model_defaults(model)
    for spec in PARAMETERS[1:]:
        default = spec.default
        if spec.name == 'action_joint_names':
            joints = list(node.get_parameter('joint_names').value)
            default = joints[:model.robot_action_dim] or defaults[spec.name]
        elif default is None:
            default = defaults[spec.name]
        node.declare_parameter(spec.name, default, spec.descriptor())


def parameter_values(node: Node) -> dict[str, object]:
    """Return ``{name: value}`` of every declared ``PARAMETERS`` entry (arrays as lists)."""
    out = {}
    for spec in PARAMETERS:
        value = node.get_parameter(spec.name).value
        out[spec.name] = list(value) if isinstance(value, (list, tuple, array.array)) else value
    return out


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """
    What the node itself needs besides the engine (read at configure; dynamic fields change).

    :ivar cameras: camera slots in ``CAMERA_SLOTS`` order.
    :ivar camera_topics: default topic per camera (``bag_topics.CAMERA_TOPICS``; remap them).
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
    max_waiting_requests: int = 16
    compressed_cameras: tuple[str, ...] = ()
    """Camera slots subscribed on ``<topic>/compressed`` (``image_transport.<slot>``)."""

    def __post_init__(self) -> None:
        for name in ('control_rate_hz', 'action_dt', 'max_observation_age', 'subtask_period',
                     'memory_period', 'diagnostics_period', 'max_waiting_requests'):
            _check_range(name, getattr(self, name))
        if not self.cameras or set(self.cameras) - set(CAMERA_SLOTS) or \
                len(set(self.cameras)) != len(self.cameras):
            raise ParameterError(f'cameras must be distinct names of {list(CAMERA_SLOTS)}, '
                                 f'got {list(self.cameras)}')
        for name in ('joint_names', 'action_joint_names'):
            names = getattr(self, name)
            if not all(names) or len(set(names)) != len(names):
                raise ParameterError(f'{name} must be distinct non-empty names, got '
                                     f'{list(names)}')

    @property
    def camera_topics(self) -> tuple[str, ...]:
        """Return the default image topic of each camera."""
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
        if spec is None or spec.read_only or name not in _NODE_FIELDS:
            raise ParameterError(f'parameter {name!r} cannot change while the node runs')
        return replace(self, **{name: value})


_NODE_FIELDS = frozenset(f.name for f in fields(NodeConfig))


def _check_range(name: str, value: object) -> None:
    spec = SPECS[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value):
        raise ParameterError(f'{name} must be a finite number, got {value!r}')
    lo, hi = spec.limits
    if not lo <= value <= hi:
        raise ParameterError(f'{name} must be in [{lo}, {hi}], got {value!r}')


def _quantile_eps(value: float) -> float | None:
    """Return the ``quantile_eps`` parameter as the engine's field (-1: None, the stats')."""
    if value == -1.0:
        return None
    if not 0.0 <= value <= 1.0:
        raise ParameterError(f"quantile_eps must be -1 (the stats' own) or in [0, 1], got "
                             f'{value!r}')
    return value


def _enum(name: str, value: str) -> object:
    cls = _ENUMS[name]
    try:
        return cls(value)
    except ValueError:
        raise ParameterError(f'{name} must be one of {_choices([e.value for e in cls])}, '
                             f'got {value!r}') from None


def build_configs(values: Mapping[str, object]) -> tuple[EngineConfig, NodeConfig]:
    """
    Build the engine and node configs from parameter values (``parameter_values``).

    :param values: ``{name: value}``; missing names take their defaults.
    :raises ParameterError: an unknown preset, a bad choice (dtype, backend, policy,
        prefix_attention, cameras), joint names that do not fit the preset's state/action
        dims, a value out of range, an ``instruction`` longer than
        ``input_limits.MAX_INSTRUCTION_BYTES``; the message names the parameter and the value.
    """
    try:
        model = get_preset(str(values.get('preset', DEFAULT_PRESET)))
    except ValueError as exc:
        raise ParameterError(f'preset: {exc}') from None
    defaults = model_defaults(model)
    v = {spec.name: spec.default for spec in PARAMETERS}
    v.update(defaults)
    v.update(values)
    if 'action_joint_names' not in values and 'joint_names' in values:
        v['action_joint_names'] = list(v['joint_names'])[:model.robot_action_dim]
    prefix = str(v['prefix_attention'])
    try:
        prefix_attention = PrefixAttention(prefix) if prefix else None
    except ValueError:
        raise ParameterError(f"prefix_attention must be '' or one of "
                             f'{_choices([p.value for p in PrefixAttention])}, '
                             f'got {prefix!r}') from None
    cameras = tuple(s for s in CAMERA_SLOTS if s in v['cameras'])
    space = str(v['action_space'])
    try:
        action_space = ActionSpace(space) if space else model.action_space
    except ValueError:
        choices = _choices([a.value for a in ActionSpace])
        raise ParameterError(f"action_space must be '' or one of {choices}, "
                             f'got {space!r}') from None
    limits = _limits(v, model.robot_action_dim)
    try:
        compressed = tuple(s for s in CAMERA_SLOTS if transport(
            str(v[f'image_transport.{s}']), f'image_transport.{s}') is ImageTransport.COMPRESSED)
    except ValueError as exc:
        raise ParameterError(str(exc)) from None
    node = NodeConfig(
        preset=model.name,
        cameras=cameras if len(cameras) == len(v['cameras']) else tuple(v['cameras']),
        joint_names=tuple(v['joint_names']), action_joint_names=tuple(v['action_joint_names']),
        action_space=action_space, gripper_dims=model.gripper_dims, limits=limits,
        end_effector_name=str(v['end_effector_name']),
        ee_scale=(float(v['ee_translation_scale']), float(v['ee_rotation_scale'])),
        joint_velocity_scale=float(v['joint_velocity_scale']),
        chunk_smoothing=_enum('chunk_smoothing', v['chunk_smoothing']),
        ensemble_decay=float(v['ensemble_decay']),
        rtc_max_guidance_weight=float(v['rtc_max_guidance_weight']),
        compressed_cameras=tuple(s for s in compressed if s in v['cameras']),
        **{name: v[name] for name in ('frame_id', 'control_rate_hz', 'action_dt',
                                      'max_observation_age', 'subtask_period',
                                      'memory_period', 'instruction', 'autostart',
                                      'diagnostics_period', 'torch_threads',
                                      'max_waiting_requests')})
    if len(node.joint_names) != model.state_dim:
        raise ParameterError(f'joint_names: preset {model.name} has a {model.state_dim}-dim '
                             f'state, got {len(node.joint_names)} names {list(node.joint_names)}')
    if len(node.action_joint_names) != model.robot_action_dim:
        raise ParameterError(
            f'action_joint_names: preset {model.name} has {model.robot_action_dim} action '
            f'dims, got {len(node.action_joint_names)} names {list(node.action_joint_names)}')
    node.action_semantics()  # raises ParameterError for a space the joints cannot carry
    if not node.end_effector_name:
        raise ParameterError('end_effector_name must not be empty')
    refusal = instruction_refusal(str(node.instruction))
    if refusal is not None:  # as ~/instruction and a parameter set refuse it
        raise ParameterError(refusal)
    if not re.fullmatch(r'cpu|cuda(:\d+)?', str(v['device'])):
        raise ParameterError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {v['device']!r}")
    for name in ('tokens_per_cycle', 'decode_budget', 'kv_cache_mb', 'max_running_requests',
                 'seed', 'torch_threads', 'ee_translation_scale', 'ee_rotation_scale',
                 'joint_velocity_scale', 'ensemble_decay', 'rtc_max_guidance_weight',
                 'memory_adapter_alpha'):
        _check_range(name, v[name])
    try:
        engine = EngineConfig(
            preset=model.name, checkpoint=v['checkpoint'] or None,
            tokenizer=v['tokenizer'] or None, norm_stats=v['norm_stats'] or None,
            prompt_format=_enum('prompt_format', v['prompt_format']) if v['prompt_format']
            else None, state_prompt_pad=int(v['state_prompt_pad']),
            quantile_eps=_quantile_eps(float(v['quantile_eps'])),
            image_resize=_enum('image_resize', v['image_resize']) if v['image_resize']
            else None,
            dtype=str(v['dtype']), device=str(v['device']),
            quantization=_enum('quantization', v['quantization']),
            backend=_enum('backend', v['backend']), policy=_enum('policy', v['policy']),
            compile_mode=_enum('compile_mode', v['compile_mode']),
            prefix_attention=prefix_attention, cameras=node.cameras,
            tokens_per_cycle=int(v['tokens_per_cycle']),
            decode_budget=int(v['decode_budget']) or None,
            kv_cache_mb=float(v['kv_cache_mb']) or None,
            max_running_requests=int(v['max_running_requests']),
            max_waiting_requests=node.max_waiting_requests,
            control_period_s=node.control_period_s, stop_on_eos=bool(v['stop_on_eos']),
            seed=int(v['seed']), rtc=node.chunk_smoothing is ChunkSmoothing.RTC,
            **{f'{task}_context': _enum(f'{task}_context', v[f'{task}_context'])
               for task in ('subtask', 'answer', 'memory')},
            memory_adapter=str(v['memory_adapter']) or None,
            memory_adapter_alpha=float(v['memory_adapter_alpha']))
    except ParameterError:
        raise
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


def check_update(current: NodeConfig, name: str, value: object) -> str | None:
    """
    Check a parameter change requested while the node runs.

    Types and ranges are enforced by rclpy from the descriptors; this adds what they cannot
    express (and a clear reason).

    :returns: None if the change is acceptable, else the reason to reject it.
    """
    if name not in SPECS:
        return None  # not ours (e.g. use_sim_time)
    try:
        current.updated(name, value)
    except (ParameterError, TypeError) as exc:
        return str(exc)
    return None


__all__ = [
    'DEFAULT_PRESET', 'NodeConfig', 'PARAMETERS', 'ParamSpec', 'ParameterError', 'SPECS',
    'build_configs', 'check_update', 'declare_parameters', 'model_defaults', 'parameter_values',
]
