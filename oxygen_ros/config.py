"""
Model presets: the π0.5 architecture at full size and at reduced sizes.

Pure Python (stdlib only) so that every layer, including the torch-free ``kv`` and ``sched``
packages, can read sizes from one place. Full-size numbers come from openpi
(``src/openpi/models/gemma.py``, ``models/siglip.py``, ``models/pi0_config.py``,
``training/config.py``): ``docs/model.md#presets`` and the sections after it.

Vocabulary used across the project (``docs/model.md``): B batch, P prefix tokens, S suffix
tokens, H action horizon, A action dim, L layers, Hkv kv-heads, D head dim, W width.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import difflib
import enum
from typing import Sequence

CAMERA_SLOTS: tuple[str, ...] = ('base_0_rgb', 'left_wrist_0_rgb', 'right_wrist_0_rgb')
"""openpi image keys (``src/openpi/models/model.py`` ``IMAGE_KEYS``): every π0.5 checkpoint
knows exactly these three slots."""

PALIGEMMA_VOCAB_SIZE = 257_152
"""256000 Gemma pieces + 1024 ``<locNNNN>`` + 128 ``<segNNN>`` (docs/checkpoints.md#tokenizer)."""

PAD_ID, EOS_ID, BOS_ID = 0, 1, 2
EE_DELTA_DIMS = 6
"""Translation (3) + axis-angle rotation (3) dims of an ``ActionSpace.EE_DELTA`` action."""


def is_ee_delta_layout(num_dims: int, gripper_dims: Sequence[int]) -> bool:
    """Return whether ``num_dims`` are the ``EE_DELTA_DIMS`` deltas followed by the grippers."""
    return num_dims == EE_DELTA_DIMS + len(gripper_dims) and \
        all(d >= EE_DELTA_DIMS for d in gripper_dims)


class PrefixAttention(str, enum.Enum):
    """
    How prefix tokens attend to each other.

    ``docs/model.md#mixture-of-transformers-attention-and-masks``; ``docs/prompts.md`` for what
    each mode costs and shares.
    """

    BIDIRECTIONAL = 'bidirectional'
    """
    openpi π0.5: every valid image and prompt token sees every other (prefix-LM).

    Image K/V depends on the prompt, so only jobs with the same prompt can share a prefix.
    """

    CAUSAL_TEXT = 'causal_text'
    """
    OxyGen ``PI05_O2``: images bidirectional among themselves, prompt tokens causal.

    Image K/V is independent of the prompt: jobs with different prompts share the image part.
    """


class ActionSpace(str, enum.Enum):
    """
    What the robot-unit action dims of a preset mean (after openpi's output transforms).

    Dims listed in ``ModelConfig.gripper_dims`` are gripper positions (or commands) in every
    space.
    """

    JOINT_POSITION = 'joint_position'
    """Absolute joint positions, rad or m (ALOHA / ``pi05_base`` after ``AbsoluteActions``)."""

    JOINT_VELOCITY = 'joint_velocity'
    """Joint velocities, rad/s or m/s, applied for one ``action_dt`` each (DROID)."""

    EE_DELTA = 'ee_delta'
    """
    Per-step end-effector deltas (LIBERO, robosuite ``OSC_POSE``): dims 0-2 translation, 3-5
    axis-angle rotation, then the grippers; each point is applied once, relative to the pose
    reached before it (not cumulative from the observation).
    """


class RobotAdapter(str, enum.Enum):
    """Robot-specific transforms beyond (un)normalization (openpi ``policies/*_policy.py``)."""

    NONE = 'none'
    """State and actions pass through (openpi ``DroidInputs``/``LiberoInputs`` only repack)."""

    ALOHA = 'aloha'
    """
    ``AlohaInputs``/``AlohaOutputs`` with ``adapt_to_pi`` and ``DeltaActions``/
    ``AbsoluteActions`` over ``make_bool_mask(6, -1, 6, -1)`` (openpi ``LeRobotAlohaDataConfig``).
    """


class PromptFormat(str, enum.Enum):
    """Format of the action prompt (``docs/prompts.md#the-action-prompt-the-root``)."""

    PI05_STATE = 'pi05_state'
    """``"Task: {task}, State: {bins};\\nAction: "`` (pi05_droid, pi05_base)."""

    PI0 = 'pi0'
    """``"{task}"`` then a separately encoded ``"\\n"`` (pi05_libero: no state in prompt)."""

    PI05_NO_STATE = 'pi05_no_state'
    """``"Task: {task};\\nAction: "`` (LeRobot's pi05 with ``include_state_in_prompt`` off)."""


@dataclass(frozen=True, slots=True)
class VisionConfig:
    """SigLIP vision tower (docs/model.md#vision-tower); ``num_tokens`` = (image / patch size)²."""

    image_size: int = 224
    patch_size: int = 14
    width: int = 1152
    depth: int = 27
    num_heads: int = 16
    mlp_dim: int = 4304

    @property
    def num_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads


@dataclass(frozen=True, slots=True)
class GemmaConfig:
    """
    One expert of the Mixture-of-Transformers.

    ``docs/model.md#vlm-expert`` and ``docs/model.md#action-expert`` give the full sizes.
    """

    width: int
    depth: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """
    Everything that fixes tensor shapes, plus the prompt and camera conventions.

    :raises ValueError: if the two experts cannot share one attention (different depth,
        heads, kv heads or head dim:
        ``docs/model.md#mixture-of-transformers-attention-and-masks``), or a field is out of
        range.
    """

    name: str
    vision: VisionConfig
    vlm: GemmaConfig
    expert: GemmaConfig
    action_horizon: int
    """H: action tokens per chunk (openpi ``action_horizon``)."""
    state_dim: int
    """Robot state dims before padding to ``action_dim`` (in the prompt if PI05_STATE)."""
    robot_action_dim: int
    """Action dims kept after unnormalizing (openpi robot ``Outputs``)."""
    cameras: tuple[str, ...]
    """The camera slots this preset feeds; other slots of ``CAMERA_SLOTS`` are masked."""
    asset_id: str
    """``assets/<asset_id>/norm_stats.json`` inside a checkpoint."""
    prompt_format: PromptFormat = PromptFormat.PI05_STATE
    action_space: ActionSpace = ActionSpace.JOINT_POSITION
    gripper_dims: tuple[int, ...] = ()
    """Robot action dims that are gripper positions (or commands) whatever the space."""
    robot_adapter: RobotAdapter = RobotAdapter.NONE
    prefix_attention: PrefixAttention = PrefixAttention.BIDIRECTIONAL
    vocab_size: int = PALIGEMMA_VOCAB_SIZE
    action_dim: int = 32
    """A: padded action/state dim of the model (openpi ``action_dim``)."""
    max_token_len: int = 200
    """Prompt slots (openpi ``max_token_len``; longer prompts: ``docs/model.md#presets``)."""
    num_denoise_steps: int = 10
    """Euler steps of flow matching, t from 1 (noise) to 0 (``docs/model.md#flow-matching``)."""
    decode_budget: int = 30
    """Default max generated tokens of a text request."""
    min_period: float = 4e-3
    max_period: float = 4.0
    rope_base: float = 10_000.0
    norm_eps: float = 1e-6
    full_size: bool = False
    """True for presets meant for real checkpoints (pi05_*)."""

    def __post_init__(self) -> None:
        v, e = self.vlm, self.expert
        for attr in ('depth', 'num_heads', 'num_kv_heads', 'head_dim'):
            if getattr(v, attr) != getattr(e, attr):
                raise ValueError(
                    f'preset {self.name!r}: VLM and action expert must share {attr} for joint '
                    f'attention, got {getattr(v, attr)} and {getattr(e, attr)}')
        if v.num_heads % v.num_kv_heads:
            raise ValueError(f'preset {self.name!r}: num_heads {v.num_heads} is not a '
                             f'multiple of num_kv_heads {v.num_kv_heads}')
        if v.head_dim % 2:
            raise ValueError(
                f'preset {self.name!r}: RoPE needs an even head_dim, got {v.head_dim}')
        unknown = set(self.cameras) - set(CAMERA_SLOTS)
        if unknown or not self.cameras:
            raise ValueError(f'preset {self.name!r}: cameras must be a non-empty subset of '
                             f'{CAMERA_SLOTS}, got {self.cameras}')
        if not 0 < self.state_dim <= self.action_dim:
            raise ValueError(f'preset {self.name!r}: state_dim {self.state_dim} not in '
                             f'1..{self.action_dim}')
        if not 0 < self.robot_action_dim <= self.action_dim:
            raise ValueError(f'preset {self.name!r}: robot_action_dim {self.robot_action_dim} '
                             f'not in 1..{self.action_dim}')
        if len(set(self.gripper_dims)) != len(self.gripper_dims) or \
                not all(0 <= d < self.robot_action_dim for d in self.gripper_dims):
            raise ValueError(f'preset {self.name!r}: gripper_dims {self.gripper_dims} must be '
                             f'distinct dims in 0..{self.robot_action_dim - 1}')
        if self.action_space is ActionSpace.EE_DELTA and \
                not is_ee_delta_layout(self.robot_action_dim, self.gripper_dims):
            raise ValueError(f'preset {self.name!r}: ee_delta actions are 3 translation + 3 '
                             f'rotation dims followed by the gripper dims, got '
                             f'robot_action_dim {self.robot_action_dim}, gripper_dims '
                             f'{self.gripper_dims}')
        if self.robot_adapter is RobotAdapter.ALOHA and (
                self.state_dim != 14 or self.robot_action_dim != 14):
            raise ValueError(f'preset {self.name!r}: the ALOHA adapter needs 14 state and '
                             f'action dims, got {self.state_dim} and {self.robot_action_dim}')
        for attr in ('action_horizon', 'max_token_len', 'num_denoise_steps', 'decode_budget'):
            if getattr(self, attr) < 1:
                raise ValueError(f'preset {self.name!r}: {attr} must be >= 1, '
                                 f'got {getattr(self, attr)}')

    @property
    def num_layers(self) -> int:
        return self.vlm.depth

    @property
    def max_prefix_tokens(self) -> int:
        """Return the longest prefix: every camera's image tokens and a full prompt."""
        return len(self.cameras) * self.image_tokens_per_camera + self.max_token_len

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Return K+V bytes of one cached token, all layers (pi05 in bf16: 18 KiB)."""
        return self.vlm.depth * 2 * self.vlm.num_kv_heads * self.vlm.head_dim * dtype_bytes

    @property
    def image_tokens_per_camera(self) -> int:
        return self.vision.num_tokens

    def with_overrides(self, **changes: object) -> ModelConfig:
        """Return a copy with fields replaced (validated again)."""
        return replace(self, **changes)


_FULL_VISION = VisionConfig()
_GEMMA_2B = GemmaConfig(width=2048, depth=18, num_heads=8, num_kv_heads=1, head_dim=256,
                        mlp_dim=16_384)
_GEMMA_300M = GemmaConfig(width=1024, depth=18, num_heads=8, num_kv_heads=1, head_dim=256,
                          mlp_dim=4096)

_PRESETS: dict[str, ModelConfig] = {}


def _register(cfg: ModelConfig) -> ModelConfig:
    if cfg.name in _PRESETS:
        raise ValueError(f'duplicate preset {cfg.name!r}')
    _PRESETS[cfg.name] = cfg
    return cfg


_register(ModelConfig(
    name='pi05_droid', vision=_FULL_VISION, vlm=_GEMMA_2B, expert=_GEMMA_300M,
    action_horizon=15, state_dim=8, robot_action_dim=8,
    cameras=('base_0_rgb', 'left_wrist_0_rgb'), asset_id='droid',
    action_space=ActionSpace.JOINT_VELOCITY, gripper_dims=(7,), full_size=True))
_register(ModelConfig(
    name='pi05_libero', vision=_FULL_VISION, vlm=_GEMMA_2B, expert=_GEMMA_300M,
    action_horizon=10, state_dim=8, robot_action_dim=7,
    cameras=('base_0_rgb', 'left_wrist_0_rgb'), asset_id='physical-intelligence/libero',
    prompt_format=PromptFormat.PI0, action_space=ActionSpace.EE_DELTA, gripper_dims=(6,),
    full_size=True))
_register(ModelConfig(
    name='pi05_base', vision=_FULL_VISION, vlm=_GEMMA_2B, expert=_GEMMA_300M,
    action_horizon=50, state_dim=14, robot_action_dim=14, cameras=CAMERA_SLOTS,
    asset_id='trossen', gripper_dims=(6, 13), robot_adapter=RobotAdapter.ALOHA,
    full_size=True))
# CPU benchmark size (~90 M parameters, most of them the 257152-row tied embedding, as in
# the real model where it is 16 %): same architecture, same token counts per camera.
_register(ModelConfig(
    name='small',
    vision=VisionConfig(width=384, depth=6, num_heads=6, mlp_dim=1536),
    vlm=GemmaConfig(width=256, depth=6, num_heads=4, num_kv_heads=1, head_dim=64, mlp_dim=2048),
    expert=GemmaConfig(width=128, depth=6, num_heads=4, num_kv_heads=1, head_dim=64,
                       mlp_dim=512),
    action_horizon=10, state_dim=8, robot_action_dim=8,
    cameras=('base_0_rgb', 'left_wrist_0_rgb'), asset_id='small', gripper_dims=(7,)))
# ROS demo size: holds >= 5 Hz with two cameras on a 2-core CPU (config/demo.yaml).
_register(ModelConfig(
    name='demo',
    vision=VisionConfig(patch_size=28, width=128, depth=4, num_heads=4, mlp_dim=512),
    vlm=GemmaConfig(width=64, depth=4, num_heads=4, num_kv_heads=1, head_dim=32, mlp_dim=256),
    expert=GemmaConfig(width=64, depth=4, num_heads=4, num_kv_heads=1, head_dim=32,
                       mlp_dim=256),
    action_horizon=10, state_dim=8, robot_action_dim=8,
    cameras=('base_0_rgb', 'left_wrist_0_rgb'), asset_id='demo', gripper_dims=(7,),
    decode_budget=16))
# Test size (< 5 M parameters, 4.1 M of them the embedding): 64 tokens per camera.
_register(ModelConfig(
    name='tiny',
    vision=VisionConfig(patch_size=28, width=32, depth=2, num_heads=2, mlp_dim=64),
    vlm=GemmaConfig(width=16, depth=2, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32),
    expert=GemmaConfig(width=16, depth=2, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32),
    action_horizon=4, state_dim=8, robot_action_dim=7,
    cameras=('base_0_rgb', 'left_wrist_0_rgb'), asset_id='tiny', max_token_len=64,
    decode_budget=8))
# Test size of pi05_base's ALOHA layout (three cameras, 14 state and action dims, openpi's
# AlohaInputs/AlohaOutputs): the tiny model; 96 prompt slots hold 14 state bins.
_register(_PRESETS['tiny'].with_overrides(
    name='tiny_aloha', state_dim=14, robot_action_dim=14, cameras=CAMERA_SLOTS,
    asset_id='tiny_aloha', gripper_dims=(6, 13), robot_adapter=RobotAdapter.ALOHA,
    max_token_len=96))


def preset_names() -> tuple[str, ...]:
    """Names of all registered presets, in registration order."""
    return tuple(_PRESETS)


def get_preset(name: str) -> ModelConfig:
    """
    Return the preset called ``name``.

    :raises ValueError: unknown name, with the closest match suggested.
    """
    try:
        return _PRESETS[name]
    except KeyError:
        close = difflib.get_close_matches(name, _PRESETS, n=1)
        hint = f' (did you mean {close[0]!r}?)' if close else ''
        raise ValueError(f'unknown preset {name!r}{hint}; known: {", ".join(_PRESETS)}') from None


__all__ = [
    'ActionSpace', 'BOS_ID', 'CAMERA_SLOTS', 'EE_DELTA_DIMS', 'EOS_ID', 'GemmaConfig',
    'ModelConfig', 'PAD_ID', 'PALIGEMMA_VOCAB_SIZE', 'PrefixAttention', 'PromptFormat',
    'RobotAdapter', 'VisionConfig',
    'get_preset', 'preset_names',
]
