"""
Engine configuration (no torch); what the engine hands back per cycle is in ``outputs.py``.

``EngineConfig`` is what the node's parameters and the benchmark's flags map onto: its
settings, the scheduler's (``config.scheduler``) and the backend's (``config.backend``), each
declared once with its default in ``oxygen_ros/parameters/oxygen_parameters.yaml``. What a
cycle's caller asks of real-time chunking is ``control.rtc.RtcRequest``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

from oxygen_ros.backends.config import (  # noqa: F401 (the node's and the tools' names)
    AttentionBackend, BackendConfig, BackendKind, CompileMode, max_autotune_steps,
    parse_compile_steps, Quantization)
from oxygen_ros.config import get_preset, ModelConfig, PrefixAttention, PromptFormat
from oxygen_ros.parameters import coerce, declared, declared_config, field_types, load
from oxygen_ros.policies import preset_robot, RobotPolicy
from oxygen_ros.sched.request import TextContext
from oxygen_ros.sched.scheduler import SchedulerConfig
from oxygen_ros.transforms.images import ImageResize
from oxygen_ros.transforms.prompt import TextTask


DTYPE_BYTES = {'float32': 4, 'bfloat16': 2}
"""Bytes per element of the engine's dtypes (weights and KV cache)."""
QUANTIZATION_FALLBACK = 'quantization'
"""Key of a quantization fallback in ``Engine.fallbacks`` (beside the compiled steps')."""
T = TypeVar('T')


ENGINE_CONFIGS = ('engine', 'scheduler', 'backend')
"""The ``config`` names of the declaration that ``EngineConfig`` and its sub-configs hold."""


@dataclass(frozen=True, slots=True)
@declared('engine')
class EngineConfig:
    """
    Everything needed to build an ``Engine``: its settings, the scheduler's and the backend's.

    Each field is a setting declared once in ``oxygen_ros/parameters/oxygen_parameters.yaml``
    (its type, default, unit and description there; docs/parameters.md for those that are
    node parameters), and takes its default from there (``@declared``); the scheduler's
    settings are ``scheduler`` (``SchedulerConfig``), the backend's ``backend``
    (``BackendConfig``), built from the declaration too (neither has a default of its own).
    :meth:`create` takes every setting by its declared name (``tokens_per_cycle``, ``device``,
    ``backend``) and puts it where it lives.

    Where a field is None it means: ``checkpoint`` random weights (logged), ``tokenizer`` the
    fetched default, ``norm_stats`` the checkpoint's, ``prompt_format``, ``image_resize``,
    ``quantile_eps`` the checkpoint family's (``transforms/conventions.py``),
    ``resize_on_device`` on CUDA, ``prefix_attention``, ``cameras`` and ``decode_budget`` the
    preset's, ``kv_cache_mb`` a pool sized for ``max_running_requests`` requests with
    unshared prefixes plus the action reserve, ``memory_adapter`` none.

    ``quantization: fp8`` runs the large linears' weights in E4M3 with per-output-channel
    scales, quantized at load (``model/fp8.py``; docs/gpu.md "FP8 weights"): on CUDA it needs
    compute capability >= 8.9 and dtype ``bfloat16`` (the FP8 GEMM writes bf16), on the CPU
    the weight-only reference path runs (a reported fallback); at load the FP8 actions are
    held to the rule of ``backends/fp8_gate.py``, else the unquantized weights run (a reported
    fallback). Torch backend only. The memory adapter (OxyGen's textual-memory LoRA,
    ``model/lora.py``) is active on the suffix and decoded tokens of memory requests only.

    :raises ValueError: a value out of range or a mix that cannot run (the message says which).
    """

    preset: str
    checkpoint: str | None
    tokenizer: str | None
    norm_stats: str | None
    prompt_format: PromptFormat | None
    state_prompt_pad: int
    quantile_eps: float | None
    image_resize: ImageResize | None
    resize_on_device: bool | None
    dtype: str
    quantization: Quantization
    prefix_attention: PrefixAttention | None
    cameras: tuple[str, ...] | None
    decode_budget: int | None
    kv_cache_mb: float | None
    seed: int
    subtask_context: TextContext
    answer_context: TextContext
    memory_context: TextContext
    memory_adapter: str | None
    memory_adapter_alpha: float
    scheduler: SchedulerConfig = field(
        default_factory=lambda: declared_config(SchedulerConfig, 'scheduler'))
    backend: BackendConfig = field(
        default_factory=lambda: declared_config(BackendConfig, 'backend'))

    @classmethod
    def create(cls, **settings: object) -> EngineConfig:
        """
        Return the config with these settings, every other at its declared default.

        :param settings: by declared name (``preset='tiny'``, ``tokens_per_cycle=2``,
            ``device='cuda'``, ``backend='torch'``): each goes to the config that holds it.
        :raises TypeError: a name that is no setting of the engine.
        :raises ValueError: as the configs refuse a value.
        """
        own, sched, backend = _route(settings)
        return cls(**own, scheduler=declared_config(SchedulerConfig, 'scheduler', **sched),
                   backend=declared_config(BackendConfig, 'backend', **backend))

    def with_settings(self, **settings: object) -> EngineConfig:
        """Return a copy with these settings changed (by declared name, as :meth:`create`)."""
        own, sched, backend = _route(settings)
        return replace(self, **own, scheduler=_replaced(self.scheduler, sched),
                       backend=_replaced(self.backend, backend))

    def __post_init__(self) -> None:
        steps = get_preset(self.preset).model.num_denoise_steps  # raises with a suggestion
        jacobian = self.backend.rtc_jacobian_steps
        if jacobian is not None and not 0 <= jacobian <= steps:
            raise ValueError(f'rtc_jacobian_steps must be in 0..{steps} (the Euler steps of '
                             f'preset {self.preset}), got {jacobian}')
        max_autotune_steps()                                # a bad environment fails here
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        if self.decode_budget is not None and self.decode_budget < 1:
            raise ValueError(f'decode_budget must be >= 1, got {self.decode_budget}')
        if self.kv_cache_mb is not None and self.kv_cache_mb <= 0:
            raise ValueError(f'kv_cache_mb must be > 0, got {self.kv_cache_mb}')
        if not 0 <= self.state_prompt_pad <= MAX_STATE_PROMPT_PAD:
            raise ValueError(f'state_prompt_pad must be in 0..{MAX_STATE_PROMPT_PAD}, got '
                             f'{self.state_prompt_pad}')
        if self.quantile_eps is not None and not 0 <= self.quantile_eps <= 1:
            raise ValueError(f'quantile_eps must be in [0, 1], got {self.quantile_eps}')
        self._check_quantization()
        for name, kind in (('prompt_format', PromptFormat), ('image_resize', ImageResize),
                           ('prefix_attention', PrefixAttention)):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, kind(getattr(self, name)))
        for name in ('subtask_context', 'answer_context', 'memory_context'):
            object.__setattr__(self, name, TextContext(getattr(self, name)))
        if self.memory_adapter:
            if self.memory_context is not TextContext.ACTION_PREFIX:
                raise ValueError('memory_adapter is active on the suffix of a memory request '
                                 'only (OxyGen trained it so): it needs memory_context '
                                 "'action_prefix', got 'own_prompt'")
            if self.backend.kind is not BackendKind.TORCH:
                raise ValueError(f'memory_adapter runs on the torch backend only (the '
                                 f'{self.backend.kind.value} graphs have no LoRA)')
            if not (self.memory_adapter_alpha > 0 and np.isfinite(self.memory_adapter_alpha)):
                raise ValueError(f'memory_adapter_alpha must be > 0, got '
                                 f'{self.memory_adapter_alpha}')

    def _check_quantization(self) -> None:
        try:
            object.__setattr__(self, 'quantization', Quantization(self.quantization))
        except ValueError:
            raise ValueError(f'quantization must be one of '
                             f'{", ".join(q.value for q in Quantization)}, got '
                             f'{self.quantization!r}') from None
        if self.quantization is Quantization.NONE:
            return
        if self.backend.kind is not BackendKind.TORCH:
            raise ValueError(f"quantization '{self.quantization.value}' runs on the torch backend "
                             f'only; backend {self.backend.kind.value!r} builds its engines from '
                             f'the exported graphs (its own precision: trt_precision)')
        if self.backend.device.startswith('cuda') and self.dtype != 'bfloat16':
            raise ValueError(f"quantization '{self.quantization.value}' on CUDA needs dtype "
                             f"'bfloat16', got {self.dtype!r}: the FP8 GEMM with per-token and "
                             f'per-channel scales writes bf16 (float32 output only from cuBLAS '
                             f'on sm_90)')

    def text_context(self, task: TextTask) -> TextContext:
        """Return what a request of ``task`` reads before its own tokens."""
        return {TextTask.SUBTASK: self.subtask_context, TextTask.ANSWER: self.answer_context,
                TextTask.MEMORY: self.memory_context}[TextTask(task)]

    def model_config(self) -> ModelConfig:
        """Return the preset's network, with this config's ``prefix_attention``."""
        cfg = get_preset(self.preset).model
        if self.prefix_attention is None:
            return cfg
        return cfg.with_overrides(prefix_attention=self.prefix_attention)

    def robot(self) -> RobotPolicy:
        """
        Return the preset's robot policy, fed by this config's ``cameras``.

        :raises ValueError: cameras that are no non-empty subset of the slots.
        """
        robot = preset_robot(self.preset)
        return robot if self.cameras is None else robot.with_cameras(self.cameras)

    def text_budget(self) -> int:
        """Return the default budget of a text request: ``decode_budget``, else the preset's."""
        if self.decode_budget is not None:
            return self.decode_budget
        return get_preset(self.preset).decode_budget

    def max_prefix_tokens(self) -> int:
        """Return the longest prefix: the robot's cameras' image tokens and a full prompt."""
        return self.model_config().prefix_tokens(len(self.robot().cameras))

    def pool_blocks(self) -> int:
        """
        Return the KV pool size in blocks (null block included) of an engine of this config.

        ``kv_cache_mb`` when given, else room for ``max_running_requests`` requests with
        unshared prefixes, plus two prefixes per robot (the action path's reserve,
        ``scheduler.max_robots``).
        """
        cfg, block_size = self.model_config(), self.scheduler.block_size
        bytes_per_token = cfg.kv_bytes_per_token(DTYPE_BYTES[self.dtype])
        if self.kv_cache_mb is not None:
            return int(self.kv_cache_mb * 2**20 // (bytes_per_token * block_size))
        per_prefix = -(-self.max_prefix_tokens() // block_size) + 1
        per_request = per_prefix + -(-self.text_budget() // block_size)
        return 1 + 2 * self.scheduler.max_robots * per_prefix + \
            self.scheduler.max_running_requests * per_request

    def rtc_note(self) -> str:
        """
        Return what ``/diagnostics`` adds to ``chunk smoothing rtc``: K of N, or '' (exact).

        E.g. ``' (the Jacobian on 5 of 10 Euler steps)'``; '' without RTC or with the
        Jacobian at every step.
        """
        rtc, jacobian = self.backend.rtc, self.backend.rtc_jacobian_steps
        if not rtc or jacobian is None:
            return ''
        steps = get_preset(self.preset).model.num_denoise_steps
        return f' (the Jacobian on {jacobian} of {steps} Euler steps)'


def _route(settings: dict[str, object]) -> tuple[dict, dict, dict]:
    """Return ``settings`` split by the config that holds each: engine, scheduler, backend."""
    split: dict[str, dict] = {config: {} for config in ENGINE_CONFIGS}
    for name, value in settings.items():
        spec = _SETTINGS.get(name)
        if spec is None:
            raise TypeError(f'{name!r} is no setting of the engine; the settings: '
                            f'{", ".join(sorted(_SETTINGS))}')
        config = next(c for c in ENGINE_CONFIGS if c in spec.configs)
        split[config][spec.field] = value
    own = split['engine']
    hints = field_types(EngineConfig)
    return ({k: coerce(hints[k], v) for k, v in own.items()}, split['scheduler'],
            split['backend'])


def _replaced(config: T, changes: dict[str, object]) -> T:
    """Return ``config`` with ``changes`` (coerced to its fields' types), or itself."""
    if not changes:
        return config
    hints = field_types(type(config))
    return replace(config, **{k: coerce(hints[k], v) for k, v in changes.items()})


_SETTINGS = {spec.name: spec for spec in load() if set(spec.configs) & set(ENGINE_CONFIGS)}
"""Every setting an ``EngineConfig`` holds, by declared name."""
MAX_STATE_PROMPT_PAD = int(_SETTINGS['state_prompt_pad'].limits[1])
"""Largest ``state_prompt_pad``, its declared bound (LeRobot pads to ``max_state_dim``, 32)."""
