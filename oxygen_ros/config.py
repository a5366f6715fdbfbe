"""
Model presets: the π0.5 architecture at full and reduced sizes, and what each preset adds.

``ModelConfig`` is the network only (what fixes tensor shapes). A ``Preset`` names a network,
the robot policy it drives (``oxygen_ros.policies``: cameras, state and action spaces,
grippers, prompt format, transforms), the checkpoint's asset id and the default budget of a
text request (a serving limit), as openpi's ``TrainConfig`` pairs a model config with a data
config and a robot's ``policies/*_policy.py``.

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
from typing import Mapping, Sequence, TypeVar

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
    What the robot-unit action dims of a robot mean (after openpi's output transforms).

    Dims listed in ``RobotPolicy.gripper_dims`` are gripper positions (or commands) in every
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
    The network: everything that fixes tensor shapes (a preset's robot and serving are apart).

    :raises ValueError: if the two experts cannot share one attention (different depth,
        heads, kv heads or head dim:
        ``docs/model.md#mixture-of-transformers-attention-and-masks``), or a field is out of
        range.
    """

    name: str
    """The preset that sizes it."""
    vision: VisionConfig
    vlm: GemmaConfig
    expert: GemmaConfig
    action_horizon: int
    """H: action tokens per chunk (openpi ``action_horizon``)."""
    prefix_attention: PrefixAttention = PrefixAttention.BIDIRECTIONAL
    vocab_size: int = PALIGEMMA_VOCAB_SIZE
    action_dim: int = 32
    """A: padded action/state dim of the model (openpi ``action_dim``)."""
    max_token_len: int = 200
    """Prompt slots (openpi ``max_token_len``; longer prompts: ``docs/model.md#presets``)."""
    num_denoise_steps: int = 10
    """Euler steps of flow matching, t from 1 (noise) to 0 (``docs/model.md#flow-matching``)."""
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
        for attr in ('action_horizon', 'max_token_len', 'num_denoise_steps', 'action_dim'):
            if getattr(self, attr) < 1:
                raise ValueError(f'preset {self.name!r}: {attr} must be >= 1, '
                                 f'got {getattr(self, attr)}')

    @property
    def num_layers(self) -> int:
        return self.vlm.depth

    def prefix_tokens(self, num_cameras: int) -> int:
        """Return the longest prefix of ``num_cameras`` images: their tokens and a full prompt."""
        return num_cameras * self.image_tokens_per_camera + self.max_token_len

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Return K+V bytes of one cached token, all layers (pi05 in bf16: 18 KiB)."""
        return self.vlm.depth * 2 * self.vlm.num_kv_heads * self.vlm.head_dim * dtype_bytes

    @property
    def image_tokens_per_camera(self) -> int:
        return self.vision.num_tokens

    def with_overrides(self, **changes: object) -> ModelConfig:
        """Return a copy with fields replaced (validated again)."""
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Preset:
    """
    A preset: a network, the robot it drives, its checkpoint's assets, a serving default.

    :ivar model: the network.
    :ivar robot: its robot policy, by name (``oxygen_ros.policies.get_robot``).
    :ivar asset_id: ``assets/<asset_id>/norm_stats.json`` inside a checkpoint.
    :ivar decode_budget: the default max tokens of a text request (the node's and the
        engine's ``decode_budget`` when they give none).
    :raises ValueError: a budget < 1, or a model named otherwise.
    """

    name: str
    model: ModelConfig
    robot: str
    asset_id: str
    decode_budget: int

    def __post_init__(self) -> None:
        if self.decode_budget < 1:
            raise ValueError(f'preset {self.name!r}: decode_budget must be >= 1, got '
                             f'{self.decode_budget}')
        if self.model.name != self.name:
            raise ValueError(f'preset {self.name!r}: its model is named {self.model.name!r}')


_FULL_VISION = VisionConfig()
_GEMMA_2B = GemmaConfig(width=2048, depth=18, num_heads=8, num_kv_heads=1, head_dim=256,
                        mlp_dim=16_384)
_GEMMA_300M = GemmaConfig(width=1024, depth=18, num_heads=8, num_kv_heads=1, head_dim=256,
                          mlp_dim=4096)

_PRESETS: dict[str, Preset] = {}


def _register(preset: Preset) -> Preset:
    if preset.name in _PRESETS:
        raise ValueError(f'duplicate preset {preset.name!r}')
    _PRESETS[preset.name] = preset
    return preset


def _full_size(name: str, action_horizon: int) -> ModelConfig:
    return ModelConfig(name=name, vision=_FULL_VISION, vlm=_GEMMA_2B, expert=_GEMMA_300M,
                       action_horizon=action_horizon, full_size=True)


_register(Preset('pi05_droid', _full_size('pi05_droid', 15), robot='droid', asset_id='droid',
                 decode_budget=30))
_register(Preset('pi05_libero', _full_size('pi05_libero', 10), robot='libero',
                 asset_id='physical-intelligence/libero', decode_budget=30))
_register(Preset('pi05_base', _full_size('pi05_base', 50), robot='aloha', asset_id='trossen',
                 decode_budget=30))
# CPU benchmark size (~90 M parameters, most of them the 257152-row tied embedding, as in
# the real model where it is 16 %): same architecture, same token counts per camera.
_register(Preset('small', ModelConfig(
    name='small',
    vision=VisionConfig(width=384, depth=6, num_heads=6, mlp_dim=1536),
    vlm=GemmaConfig(width=256, depth=6, num_heads=4, num_kv_heads=1, head_dim=64, mlp_dim=2048),
    expert=GemmaConfig(width=128, depth=6, num_heads=4, num_kv_heads=1, head_dim=64,
                       mlp_dim=512),
    action_horizon=10), robot='panda', asset_id='small', decode_budget=30))
# ROS demo size: holds >= 5 Hz with two cameras on a 2-core CPU (config/demo.yaml).
_register(Preset('demo', ModelConfig(
    name='demo',
    vision=VisionConfig(patch_size=28, width=128, depth=4, num_heads=4, mlp_dim=512),
    vlm=GemmaConfig(width=64, depth=4, num_heads=4, num_kv_heads=1, head_dim=32, mlp_dim=256),
    expert=GemmaConfig(width=64, depth=4, num_heads=4, num_kv_heads=1, head_dim=32,
                       mlp_dim=256),
    action_horizon=10), robot='panda', asset_id='demo', decode_budget=16))
# Test size (< 5 M parameters, 4.1 M of them the embedding): 64 tokens per camera.
_TINY = ModelConfig(
    name='tiny',
    vision=VisionConfig(patch_size=28, width=32, depth=2, num_heads=2, mlp_dim=64),
    vlm=GemmaConfig(width=16, depth=2, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32),
    expert=GemmaConfig(width=16, depth=2, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32),
    action_horizon=4, max_token_len=64)
_register(Preset('tiny', _TINY, robot='test_arm', asset_id='tiny', decode_budget=8))
# Test size of pi05_base's ALOHA layout (three cameras, 14 state and action dims, openpi's
# AlohaInputs/AlohaOutputs): the tiny model; 96 prompt slots hold 14 state bins.
_register(Preset('tiny_aloha', _TINY.with_overrides(name='tiny_aloha', max_token_len=96),
                 robot='aloha', asset_id='tiny_aloha', decode_budget=8))


def preset_names() -> tuple[str, ...]:
    """Names of all registered presets, in registration order."""
    return tuple(_PRESETS)


def get_preset(name: str) -> Preset:
    """
    Return the preset called ``name``.

    :raises ValueError: unknown name, with the closest match suggested.
    """
    return by_name(_PRESETS, name, 'preset')


T = TypeVar('T')


def by_name(table: Mapping[str, T], name: str, what: str) -> T:
    """
    Return ``table[name]``, the registry of ``what`` (presets, robots).

    :raises ValueError: unknown name, with the closest match suggested and every name listed.
    """
    try:
        return table[name]
    except KeyError:
        close = difflib.get_close_matches(name, table, n=1)
        hint = f' (did you mean {close[0]!r}?)' if close else ''
        raise ValueError(f'unknown {what} {name!r}{hint}; known: {", ".join(table)}') from None


__all__ = [
    'ActionSpace', 'BOS_ID', 'CAMERA_SLOTS', 'EE_DELTA_DIMS', 'EOS_ID', 'GemmaConfig',
    'ModelConfig', 'PAD_ID', 'PALIGEMMA_VOCAB_SIZE', 'Preset', 'PrefixAttention',
    'PromptFormat', 'VisionConfig',
    'by_name', 'get_preset', 'preset_names',
]
