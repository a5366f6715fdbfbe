"""
The parameters of the ``oxygen`` node, declared once: the table ``PARAMETERS``.

Each row (``param_spec.ParamSpec``) gives a parameter's name, default, description, range or
choices, whether it is read-only or dynamic, the config field it sets and, for a dynamic one,
what a change does. From the table follow the declaration (``declare_parameters``: one
``ParameterDescriptor`` each), the checks and the configs (``node_config.build_configs``), the
handling of changes while the node runs (``param_handler.ParameterHandler``) and
docs/parameters.md (``param_docs``), as ros2_control's generate_parameter_library generates
them from its YAML table.

Read-only parameters shape the engine (weights, KV pool, cameras, joint order) and are fixed
once the node exists: set them in ``config/<preset>.yaml`` or with ``-p``. Defaults that depend
on the model (``cameras``, ``joint_names``, ``action_joint_names``, the limits) are taken from
the ``preset`` parameter, which is declared first.
"""

from __future__ import annotations

import array
import math
import re
from typing import Callable

from oxygen_ros.config import (
    ActionSpace, CAMERA_SLOTS, get_preset, ModelConfig, PrefixAttention, PromptFormat)
from oxygen_ros.control.smoothing import ChunkSmoothing
from oxygen_ros.engine.config import (
    ALL_STEPS, BackendKind, CompileMode, MAX_STATE_PROMPT_PAD, parse_compile_steps, Quantization,
    Step)
from oxygen_ros.ros.images.transport import ImageTransport
from oxygen_ros.ros.input_limits import instruction_refusal, MAX_INSTRUCTION_BYTES
from oxygen_ros.ros.param_spec import Into, OnChange, ParamSpec, ParamType, quoted
from oxygen_ros.sched.request import TextContext
from oxygen_ros.sched.scheduler import Policy
from oxygen_ros.transforms.images import ImageResize
from rclpy.node import Node

DEFAULT_PRESET = 'demo'
"""Preset of a node started without a params file (random weights, fast on a CPU)."""
NODE, ENGINE = Into.NODE, Into.ENGINE


def _device(value: object) -> str | None:
    if re.fullmatch(r'cpu|cuda(:\d+)?', str(value)):
        return None
    return f"device must be 'cpu', 'cuda' or 'cuda:N', got {value!r}"


def _compile_steps(value: object) -> str | None:
    try:
        parse_compile_steps(list(value))
    except ValueError as exc:
        return str(exc)
    return None


def _quantile_eps(value: object) -> str | None:
    if value == -1.0 or 0.0 <= value <= 1.0:
        return None
    return f"quantile_eps must be -1 (the stats' own) or in [0, 1], got {value!r}"


def _cameras(value: object) -> str | None:
    names = list(value)
    if names and not set(names) - set(CAMERA_SLOTS) and len(set(names)) == len(names):
        return None
    return f'cameras must be distinct names of {list(CAMERA_SLOTS)}, got {names}'


def _distinct_names(name: str) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        names = list(value)
        if all(names) and len(set(names)) == len(names):
            return None
        return f'{name} must be distinct non-empty names, got {names}'
    return check


def _not_empty(value: object) -> str | None:
    return None if value else 'end_effector_name must not be empty'


def _instruction(value: object) -> str | None:
    return instruction_refusal(str(value))  # as ~/instruction refuses it


_LIMITS_DOC = {'position_limits_lower': '`-.inf` per action joint',
               'position_limits_upper': '`.inf` per action joint',
               'velocity_limits': '`.inf` per action joint'}

PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec('preset', DEFAULT_PRESET, 'model preset (sizes, cameras, action horizon): '
              'pi05_droid, pi05_libero, pi05_base, small, demo, tiny, tiny_aloha'),
    ParamSpec('checkpoint', '', 'directory with model.safetensors (openpi-PyTorch or LeRobot '
              'layout) and its norm stats (assets/<asset_id>/norm_stats.json or LeRobot '
              "processor files, docs/checkpoints.md); '' = seeded random weights (logged, "
              'meaningless actions)', unset='', into=ENGINE),
    ParamSpec('tokenizer', '', "paligemma_tokenizer.model path; '' = the one fetched by "
              'oxygen_fetch tokenizer', unset='', into=ENGINE),
    ParamSpec('norm_stats', '', "norm_stats.json overriding the checkpoint's; '' = the "
              "checkpoint's (identity stats for random weights)", unset='', into=ENGINE),
    ParamSpec('prompt_format', '', "action prompt: '' = the checkpoint's (LeRobot: with the "
              "state) or the preset's; 'pi05_state' (Task, State bins, Action), 'pi0' (task "
              "only, openpi pi05_libero), 'pi05_no_state' (Task, Action)", choices=PromptFormat,
              unset='', into=ENGINE),
    ParamSpec('state_prompt_pad', 0, 'zero-pad the normalized state to this many dims before '
              'binning it into the prompt: 32 for checkpoints fine-tuned with LeRobot <= '
              '0.4.4; 0 = no padding (openpi, LeRobot >= 0.5)', (0, MAX_STATE_PROMPT_PAD),
              into=ENGINE),
    ParamSpec('quantile_eps', -1.0, 'added to q99 - q01 by quantile normalization; -1 = the '
              "stats' own (openpi norm_stats.json 1e-6, LeRobot files 0)", (-1.0, 1.0),
              unset=-1.0, into=ENGINE, check=_quantile_eps),
    ParamSpec('image_resize', '', "camera image resize-with-pad filter: '' = the "
              "checkpoint's ('openpi': Pillow bilinear; LeRobot checkpoints: 'lerobot', "
              'F.interpolate bilinear without antialiasing, as each family trained)',
              choices=ImageResize, unset='', into=ENGINE),
    ParamSpec('dtype', 'float32', "weights and KV cache dtype: 'float32' or 'bfloat16'",
              into=ENGINE),
    ParamSpec('quantization', Quantization.NONE.value, "weights quantized at load: 'none', or "
              "'fp8' (E4M3 weights with per-channel scales in the large linears; CUDA: compute "
              "capability >= 8.9 and dtype 'bfloat16'; CPU: the weight-only reference path; held "
              'to the FP8 action check at load, else the unquantized weights run: '
              "docs/gpu.md 'FP8 weights')", choices=Quantization, into=ENGINE),
    ParamSpec('device', 'cpu', "torch device: 'cpu', 'cuda', 'cuda:N'", into=ENGINE,
              check=_device),
    ParamSpec('backend', BackendKind.TORCH.value,
              f'execution backend: {quoted([b.value for b in BackendKind])}',
              choices=BackendKind, into=ENGINE),
    ParamSpec('compile_mode', CompileMode.AUTO.value, "torch backend fast path: 'auto' = "
              "'reduce-overhead' (compiled kernels in CUDA graphs) on CUDA, 'none' (eager) on "
              f'the CPU; {quoted([m.value for m in CompileMode])}', choices=CompileMode,
              into=ENGINE),
    ParamSpec('compile_steps', [ALL_STEPS], 'the model calls that take the fast path when '
              f'compile_mode turns it on: {ALL_STEPS!r}, or some of '
              f'{quoted([s.value for s in Step])}; the others run eagerly. Every step but '
              "'decode' and 'decode_steps' is OxyGen's stable mode on Jetson Thor "
              '(docs/gpu.md#compiled-decode-off-alone)', check=_compile_steps,
              param_type=ParamType.STRING_ARRAY, into=ENGINE),
    ParamSpec('policy', Policy.OXYGEN.value, "'oxygen' (one shared prefill per cycle) or "
              "'isolated' (the baseline: one prefill per job)", choices=Policy, into=ENGINE),
    ParamSpec('prefix_attention', '', "'' = the preset's; "
              f'{quoted([p.value for p in PrefixAttention])}', choices=PrefixAttention,
              unset='', into=ENGINE),
    ParamSpec('cameras', None, 'camera slots to subscribe (base_0_rgb, left_wrist_0_rgb, '
              "right_wrist_0_rgb); default: the preset's", check=_cameras,
              param_type=ParamType.STRING_ARRAY, preset_default="`preset's`"),
    ParamSpec('joint_names', None, 'joint names of the robot state in model order, looked up '
              'by name in /joint_states; default joint_1..joint_<state_dim>', into=NODE,
              check=_distinct_names('joint_names'), param_type=ParamType.STRING_ARRAY,
              preset_default='`joint_1..joint_<state_dim>`'),
    ParamSpec('action_joint_names', None, 'joint_names of ~/action_chunk (robot_action_dim '
              'of them); default: the first robot_action_dim joint_names', into=NODE,
              check=_distinct_names('action_joint_names'), param_type=ParamType.STRING_ARRAY,
              preset_default='`first robot_action_dim joint_names`'),
    ParamSpec('action_space', '', "what the action dims mean; '' = the preset's (pi05_droid: "
              "joint_velocity, pi05_libero: ee_delta, others: joint_position): 'joint_position', "
              "'joint_velocity' (~/action_chunk carries the integrated positions and the "
              "velocities), 'ee_delta' (~/ee_delta_chunk)", choices=ActionSpace, unset=''),
    *(ParamSpec(name, None, text, param_type=ParamType.DOUBLE_ARRAY,
                preset_default=_LIMITS_DOC[name]) for name, text in (
        ('position_limits_lower', 'lowest position of each action joint (rad, m; ee_delta: '
         'lowest raw action value); -.inf = none. Every chunk is clipped'),
        ('position_limits_upper', 'highest position of each action joint; .inf = none'),
        ('velocity_limits', 'largest speed of each action joint (rad/s, m/s; ee_delta: of the '
         'scaled deltas); .inf = none. Velocities are clipped, positions rate-limited from '
         'the observed state'))),
    ParamSpec('joint_velocity_scale', 1.0, 'rad/s (m/s) per unit of a joint_velocity action '
              '(DROID: 3.0, its controller moves 0.2 rad per unit per 15 Hz step)', (1e-9, 1e3),
              into=NODE),
    ParamSpec('end_effector_name', 'end_effector', 'joint name of ~/ee_delta_chunk '
              '(ee_delta action space)', into=NODE, check=_not_empty),
    ParamSpec('ee_translation_scale', 1.0, 'metres per unit of an ee_delta translation '
              'action (robosuite OSC_POSE: 0.05)', (1e-9, 1e3)),
    ParamSpec('ee_rotation_scale', 1.0, 'radians per unit of an ee_delta rotation action '
              '(robosuite OSC_POSE: 0.5)', (1e-9, 1e3)),
    ParamSpec('chunk_smoothing', ChunkSmoothing.NONE.value, 'how a new action chunk meets the '
              "previous one: 'none' (naive switching), 'ensemble' (ACT temporal ensembling "
              "of every prediction for a time), 'rtc' (real-time chunking: denoised toward "
              "the previous chunk's tail, the measured inference delay frozen)",
              choices=ChunkSmoothing, into=NODE),
    ParamSpec('ensemble_decay', 0.01, "ACT's m: a prediction's weight is exp(-m k), k = 0 for "
              'the oldest (chunk_smoothing ensemble)', (0.0, 100.0), into=NODE),
    ParamSpec('rtc_max_guidance_weight', 5.0, "RTC's beta, the largest guidance weight "
              '(chunk_smoothing rtc)', (0.01, 1000.0), into=NODE),
    ParamSpec('rtc_jacobian_steps', -1, "RTC's Euler steps, the first ones, that take the "
              'vector-Jacobian product through the action expert (about a plain step more '
              "each); the later ones guide by the error alone at a plain step's cost "
              '(docs/action_semantics.md#the-cost-of-exact-guidance); -1 = every step (exact '
              'RTC)', (-1, 1000), unset=-1, into=ENGINE),
    ParamSpec('frame_id', '', 'header.frame_id of ~/action_chunk and ~/ee_delta_chunk',
              into=NODE, on_change=OnChange.FRAME_ID),
    ParamSpec('control_rate_hz', 10.0, 'control cycles (action chunks) per second; the engine '
              'adapts decode tokens per cycle to 1/control_rate_hz', (0.1, 1000.0), into=NODE,
              on_change=OnChange.CONTROL_RATE),
    ParamSpec('action_dt', 0.1, 'seconds between consecutive points of an action chunk '
              '(time_from_start = i * action_dt)', (0.001, 10.0), into=NODE,
              on_change=OnChange.NEXT_CYCLE),
    ParamSpec('max_observation_age', 0.5, 'never act on an image or joint state older than '
              'this (seconds, node clock now - header.stamp)', (0.01, 60.0), into=NODE,
              on_change=OnChange.NEXT_CYCLE),
    ParamSpec('tokens_per_cycle', 5, 'k: max decode tokens per text request per control cycle',
              (1, 1024), into=ENGINE),
    ParamSpec('decode_budget', 0, "max tokens of a text request; 0 = the preset's",
              (0, 100_000), unset=0, into=ENGINE),
    ParamSpec('subtask_period', 0.0, 'seconds between SUBTASK requests (~/subtask); 0 = never',
              (0.0, 86_400.0), into=NODE, on_change=OnChange.NEXT_CYCLE),
    ParamSpec('memory_period', 0.0, 'seconds between MEMORY requests (~/memory); 0 = never',
              (0.0, 86_400.0), into=NODE, on_change=OnChange.NEXT_CYCLE),
    *(ParamSpec(f'{task}_context', default, f'what {task} requests read before their own '
                f'tokens: {quoted([c.value for c in TextContext])} (the action prefix '
                f'of the frame + the suffix {suffix!r}: one prefill per frame; or the own '
                f'prompt {own!r}, a prefix of their own; docs/prompts.md)',
                choices=TextContext, into=ENGINE)
      for task, default, suffix, own in (
          ('subtask', TextContext.OWN_PROMPT.value, 'Subtask: ', 'Task: {instr}. Subtask: '),
          ('answer', TextContext.ACTION_PREFIX.value, 'Question: {q} Answer: ',
           'Task: {instr}. Question: {q} Answer: '),
          ('memory', TextContext.ACTION_PREFIX.value, 'Memory: ', 'Task: {instr}. Memory: '))),
    ParamSpec('memory_adapter', '', 'textual-memory LoRA of OxyGen (.npz, '
              'language_adaptation/libero): active on the suffix of memory requests only '
              "(needs memory_context 'action_prefix', backend torch); '' = none", unset='',
              into=ENGINE),
    ParamSpec('memory_adapter_alpha', 16.0, 'the LoRA alpha the memory adapter was trained with '
              "(scale alpha / rank on its attention projections; OxyGen's: 16)", (1e-6, 1e6),
              into=ENGINE),
    ParamSpec('kv_cache_mb', 0.0, 'KV pool size in MiB; 0 = sized for max_running_requests',
              (0.0, 1_000_000.0), unset=0.0, into=ENGINE),
    ParamSpec('max_running_requests', 32, 'text requests decoding at once', (1, 4096),
              into=ENGINE),
    ParamSpec('max_waiting_requests', 16, 'text requests (~/ask topic and action, periodic '
              'subtask and memory) waiting for admission in the scheduler; one more is refused '
              'at once (no answer: queue full; goals rejected)', (1, 100_000),
              into=NODE | ENGINE, on_change=OnChange.WAITING_BOUND),
    ParamSpec('stop_on_eos', True, 'stop a text at EOS (False decodes every text to its '
              'budget)', into=ENGINE),
    ParamSpec('seed', 0, 'random weights and flow-matching noise seed', (0, 2**31 - 1),
              into=ENGINE),
    ParamSpec('torch_threads', 0, 'torch intra-op CPU threads (torch.set_num_threads); 0 = '
              "torch's default. 1 avoids OpenMP spin-waits on small, shared CPUs",
              (0, 1024), into=NODE),
    ParamSpec('instruction', '', "task prompt until a ~/instruction message arrives; '' = "
              f'wait for one. At most {MAX_INSTRUCTION_BYTES} UTF-8 bytes: a longer one is '
              'refused (configure fails, a set is rejected)', into=NODE, check=_instruction,
              on_change=OnChange.INSTRUCTION),
    ParamSpec('autostart', True, 'configure and activate right after start', into=NODE),
    ParamSpec('diagnostics_period', 1.0, 'seconds between /diagnostics messages', (0.05, 60.0),
              into=NODE, on_change=OnChange.DIAGNOSTICS_PERIOD),
    ParamSpec('malloc_trim_mb', 4.0, 'give the free pages glibc malloc holds back to the OS '
              '(malloc_trim, off the control cycle, 5-30 s apart) once RSS has grown this many '
              'MiB above its level after the previous trim and malloc holds as much free: '
              'after a burst of text requests (docs/robustness.md#soak); 0 = never',
              (0.0, 1_000_000.0), into=NODE, on_change=OnChange.NEXT_CYCLE),
    *(ParamSpec(f'image_transport.{slot}', ImageTransport.RAW.value,
                f"how the {slot} camera's images arrive: 'raw' (sensor_msgs/Image on its "
                "topic) or 'compressed' (sensor_msgs/CompressedImage, JPEG or PNG, on <its "
                'topic>/compressed, the image_transport convention)', choices=ImageTransport)
      for slot in CAMERA_SLOTS),
)
"""Every parameter of the node, in declaration order (``preset`` first)."""

SPECS: dict[str, ParamSpec] = {spec.name: spec for spec in PARAMETERS}


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


__all__ = ['DEFAULT_PRESET', 'PARAMETERS', 'SPECS', 'declare_parameters', 'model_defaults',
           'parameter_values']
