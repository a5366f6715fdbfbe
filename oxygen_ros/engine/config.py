"""
Engine configuration (no torch); what the engine hands back per cycle is in ``outputs.py``.

``EngineConfig`` is what the node's parameters and the benchmark's flags map onto; what a
cycle's caller asks of real-time chunking is ``control.rtc.RtcRequest``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oxygen_ros.backends.config import (  # noqa: F401 (ALL_STEPS: for the node's parameters)
    ALL_STEPS, AttentionBackend, BackendConfig, BackendKind, CompileMode, max_autotune_steps,
    parse_compile_steps, Quantization, Step)
from oxygen_ros.config import get_preset, ModelConfig, PrefixAttention, PromptFormat
from oxygen_ros.sched.request import TextContext
from oxygen_ros.sched.scheduler import Policy, SchedulerConfig
from oxygen_ros.transforms.images import ImageResize
from oxygen_ros.transforms.prompt import TextTask


MAX_STATE_PROMPT_PAD = 256
"""Largest ``state_prompt_pad`` (LeRobot pads to ``max_state_dim``, 32)."""

DTYPE_BYTES = {'float32': 4, 'bfloat16': 2}
"""Bytes per element of the engine's dtypes (weights and KV cache)."""
QUANTIZATION_FALLBACK = 'quantization'
"""Key of a quantization fallback in ``Engine.fallbacks`` (beside the compiled steps')."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """
    Everything needed to build an ``Engine``.

    :param preset: model preset (``oxygen_ros.config.preset_names()``).
    :param checkpoint: directory with ``model.safetensors`` (openpi-PyTorch or LeRobot
        layout) and ``assets/<asset_id>/norm_stats.json``; None: random weights (logged).
    :param tokenizer: ``paligemma_tokenizer.model`` path; None: the fetched default.
    :param norm_stats: ``norm_stats.json`` path overriding the checkpoint's (openpi's or
        LeRobot's; ``transforms/conventions.py``).
    :param prompt_format: the action prompt's format; None: the checkpoint family's (LeRobot:
        with the state, or as its processor says), else the preset's.
    :param state_prompt_pad: zero-pad the normalized state to this many dims before binning
        it into the prompt (LeRobot <= v0.4.4 fine-tunes: 32); 0: no padding (openpi,
        LeRobot >= v0.5.0).
    :param quantile_eps: added to ``q99 - q01`` by the quantile normalization; None: the
        stats' family's (openpi 1e-6, LeRobot 0).
    :param image_resize: the resize-with-pad filter (``transforms/images.py``); None: the
        checkpoint family's (openpi: Pillow's; LeRobot: ``F.interpolate``'s).
    :param resize_on_device: uint8 camera images go up as they came and are resized and
        scaled on the backend's device; None: on CUDA.
    :param dtype: ``float32`` or ``bfloat16``.
    :param quantization: ``none``, or ``fp8``: the large linears' weights in E4M3 with
        per-output-channel scales, quantized at load (``model/fp8.py``; docs/gpu.md "FP8
        weights"): on CUDA it needs compute capability >= 8.9 and dtype ``bfloat16`` (the
        FP8 GEMM writes bf16), on the CPU the weight-only reference path runs (a reported
        fallback); at load the FP8 actions are held to the rule of
        ``backends/fp8_gate.py`` (at most 1.5x bf16's error against float32), else the
        unquantized weights run (a reported fallback). Torch backend only.
    :param backend: ``torch`` or ``tensorrt`` (engines built from our ONNX graphs).
    :param compile_mode: the torch backend's fast path (``backends/fast_path/``); AUTO:
        compiled kernels in CUDA graphs on CUDA, eager on the CPU.
    :param compile_steps: which per-cycle model calls take the fast path when it is on: step
        names (``Step`` values) or ``('all',)``; None: every step. The others run eagerly
        (``backends/config.py`` ``parse_compile_steps``; e.g. every step but ``decode`` and
        ``decode_steps``: OxyGen's stable mode on Jetson Thor).
    :param attention_backend: the attention kernel of the torch backend (``math``,
        ``efficient``, ``flash``, ``cudnn``, ``matmul``, ``triton``, ``flex``; ``auto``:
        PyTorch's choice but where compiled for CUDA; ``backends/config.py``
        ``AttentionBackend``); None: ``$OXYGEN_ROS_ATTENTION``, else ``auto``.
    :param trt_precision: TensorRT precision mode: ``graph`` (strongly typed, the exported
        dtype), ``fp16`` / ``bf16`` (TensorRT 10 builder flags), ``fp8`` (not built yet).
    :param engine_cache_dir: where exported graphs and TensorRT engines are cached (default
        ``$OXYGEN_ROS_CACHE`` or ``~/.cache/oxygen_ros``).
    :param prefix_attention: override of the preset's prefix attention mode.
    :param cameras: override of the preset's camera slots (``CAMERA_SLOTS`` names).
    :param tokens_per_cycle: k, decode tokens per text request per control cycle.
    :param decode_budget: default max tokens of a text request (None: the preset's).
    :param kv_cache_mb: KV pool size in MiB; None sizes it for ``max_running_requests``
        requests with unshared prefixes plus the action reserve.
    :param control_period_s: action deadline per cycle (k adapts to it); None: fixed k.
    :param stop_on_eos: False decodes every request to its budget (OxyGen's benchmarks).
    :param max_waiting_requests: text requests waiting for admission (the scheduler's one
        queue); ``Engine.submit_text`` refuses one more (``QueueFullError``).
    :param seed: random weights and the flow-matching noise of frame i (seeded by seed, i).
    :param subtask_context: what a subtask request reads (``TextContext``): its own prompt
        (``Task: {instr}. Subtask: ``, openpi_subtask_generation's, the default) or the
        action prefix + the suffix ``Subtask: `` (docs/prompts.md).
    :param answer_context: what an answer reads; default the action prefix + ``Question:
        {q} Answer: ``.
    :param memory_context: what a memory note reads; default the action prefix + ``Memory: ``
        (OxyGen's textual memory, which its adapter was trained on).
    :param memory_adapter: OxyGen's textual-memory LoRA (``.npz``, ``model/lora.py``),
        active on the suffix and decoded tokens of memory requests; None: none.
    :param memory_adapter_alpha: the alpha it was trained with (OxyGen's: 16).
    :param rtc: chunks will be guided (the node's ``chunk_smoothing: rtc``): a backend that
        cannot guide is refused, the fast path compiles the guided denoise too and
        ``Engine.warmup`` runs a guided cycle.
    :param rtc_jacobian_steps: RTC's Euler steps (the first ones) that take the
        vector-Jacobian product through the action expert; the later ones guide by the error
        alone, at a plain step's cost (``model.guidance.RtcGuidance.jacobian_steps``; None: every
        step, RTC as the paper; docs/action_semantics.md#the-cost-of-exact-guidance).
    """

    preset: str = 'small'
    checkpoint: str | None = None
    tokenizer: str | None = None
    norm_stats: str | None = None
    prompt_format: PromptFormat | None = None
    state_prompt_pad: int = 0
    quantile_eps: float | None = None
    image_resize: ImageResize | None = None
    resize_on_device: bool | None = None
    dtype: str = 'float32'
    quantization: Quantization = Quantization.NONE
    device: str = 'cpu'
    backend: BackendKind = BackendKind.TORCH
    compile_mode: CompileMode = CompileMode.AUTO
    compile_steps: tuple[str | Step, ...] | frozenset[Step] | None = None
    attention_backend: AttentionBackend | None = None
    trt_precision: str = 'graph'
    engine_cache_dir: str | None = None
    policy: Policy = Policy.OXYGEN
    prefix_attention: PrefixAttention | None = None
    cameras: tuple[str, ...] | None = None
    tokens_per_cycle: int = 5
    min_tokens_per_cycle: int = 1
    decode_budget: int | None = None
    block_size: int = 16
    kv_cache_mb: float | None = None
    max_running_requests: int = 32
    control_period_s: float | None = None
    stop_on_eos: bool = True
    max_waiting_requests: int = 16
    seed: int = 0
    subtask_context: TextContext = TextContext.OWN_PROMPT
    answer_context: TextContext = TextContext.ACTION_PREFIX
    memory_context: TextContext = TextContext.ACTION_PREFIX
    memory_adapter: str | None = None
    memory_adapter_alpha: float = 16.0
    rtc: bool = False
    rtc_jacobian_steps: int | None = None

    def __post_init__(self) -> None:
        steps = get_preset(self.preset).num_denoise_steps  # raises with a suggestion
        if self.rtc_jacobian_steps is not None and not 0 <= self.rtc_jacobian_steps <= steps:
            raise ValueError(f'rtc_jacobian_steps must be in 0..{steps} (the Euler steps of '
                             f'preset {self.preset}), got {self.rtc_jacobian_steps}')
        AttentionBackend.resolve(self.attention_backend)  # a bad environment fails here
        if self.compile_steps is not None:
            object.__setattr__(self, 'compile_steps', parse_compile_steps(self.compile_steps))
        max_autotune_steps()                                # likewise
        if self.trt_precision not in ('graph', 'fp16', 'bf16', 'fp8'):
            raise ValueError(f'trt_precision must be one of graph, fp16, bf16, fp8, got '
                             f'{self.trt_precision!r}')
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
        for name in ('tokens_per_cycle', 'block_size', 'max_running_requests',
                     'max_waiting_requests'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
        if self.decode_budget is not None and self.decode_budget < 1:
            raise ValueError(f'decode_budget must be >= 1, got {self.decode_budget}')
        if self.kv_cache_mb is not None and self.kv_cache_mb <= 0:
            raise ValueError(f'kv_cache_mb must be > 0, got {self.kv_cache_mb}')
        if self.control_period_s is not None and self.control_period_s <= 0:
            raise ValueError(f'control_period_s must be > 0, got {self.control_period_s}')
        if not 0 <= self.state_prompt_pad <= MAX_STATE_PROMPT_PAD:
            raise ValueError(f'state_prompt_pad must be in 0..{MAX_STATE_PROMPT_PAD}, got '
                             f'{self.state_prompt_pad}')
        if self.quantile_eps is not None and not 0 <= self.quantile_eps <= 1:
            raise ValueError(f'quantile_eps must be in [0, 1], got {self.quantile_eps}')
        self._check_quantization()
        if self.prompt_format is not None:
            object.__setattr__(self, 'prompt_format', PromptFormat(self.prompt_format))
        if self.image_resize is not None:
            object.__setattr__(self, 'image_resize', ImageResize(self.image_resize))
        for name in ('subtask_context', 'answer_context', 'memory_context'):
            object.__setattr__(self, name, TextContext(getattr(self, name)))
        if self.memory_adapter:
            if self.memory_context is not TextContext.ACTION_PREFIX:
                raise ValueError('memory_adapter is active on the suffix of a memory request '
                                 'only (OxyGen trained it so): it needs memory_context '
                                 "'action_prefix', got 'own_prompt'")
            if self.backend is not BackendKind.TORCH:
                raise ValueError(f'memory_adapter runs on the torch backend only (the '
                                 f'{self.backend.value} graphs have no LoRA)')
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
        if self.backend is not BackendKind.TORCH:
            raise ValueError(f"quantization '{self.quantization.value}' runs on the torch backend "
                             f'only; backend {self.backend.value!r} builds its engines from the '
                             f'exported graphs (its own precision: trt_precision)')
        if self.device.startswith('cuda') and self.dtype != 'bfloat16':
            raise ValueError(f"quantization '{self.quantization.value}' on CUDA needs dtype "
                             f"'bfloat16', got {self.dtype!r}: the FP8 GEMM with per-token and "
                             f'per-channel scales writes bf16 (float32 output only from cuBLAS '
                             f'on sm_90)')

    def text_context(self, task: TextTask) -> TextContext:
        """Return what a request of ``task`` reads before its own tokens."""
        return {TextTask.SUBTASK: self.subtask_context, TextTask.ANSWER: self.answer_context,
                TextTask.MEMORY: self.memory_context}[TextTask(task)]

    def model_config(self) -> ModelConfig:
        """Return the preset with this config's overrides applied."""
        cfg = get_preset(self.preset)
        changes: dict[str, object] = {}
        if self.prefix_attention is not None:
            changes['prefix_attention'] = self.prefix_attention
        if self.decode_budget is not None:
            changes['decode_budget'] = self.decode_budget
        if self.cameras is not None:
            changes['cameras'] = tuple(self.cameras)
        return cfg.with_overrides(**changes) if changes else cfg

    def pool_blocks(self) -> int:
        """
        Return the KV pool size in blocks (null block included) of an engine of this config.

        ``kv_cache_mb`` when given, else room for ``max_running_requests`` requests with
        unshared prefixes, plus two prefixes (the action path's reserve).
        """
        cfg = self.model_config()
        bytes_per_token = cfg.kv_bytes_per_token(DTYPE_BYTES[self.dtype])
        if self.kv_cache_mb is not None:
            return int(self.kv_cache_mb * 2**20 // (bytes_per_token * self.block_size))
        per_prefix = -(-cfg.max_prefix_tokens // self.block_size) + 1
        per_request = per_prefix + -(-cfg.decode_budget // self.block_size)
        return 1 + 2 * per_prefix + self.max_running_requests * per_request

    def scheduler_config(self, eos_token_id: int) -> SchedulerConfig:
        """
        Return the scheduler's config of an engine of this config.

        :param eos_token_id: the tokenizer's EOS id (ends a text request when
            ``stop_on_eos``).
        """
        cfg = self.model_config()
        return SchedulerConfig(
            num_blocks=self.pool_blocks(), max_prefix_tokens=cfg.max_prefix_tokens,
            policy=self.policy, prefix_attention=cfg.prefix_attention,
            block_size=self.block_size, tokens_per_cycle=self.tokens_per_cycle,
            min_tokens_per_cycle=min(self.min_tokens_per_cycle, self.tokens_per_cycle),
            adapt_tokens_per_cycle=self.control_period_s is not None,
            max_running_requests=self.max_running_requests,
            max_waiting_requests=self.max_waiting_requests,
            eos_token_id=eos_token_id if self.stop_on_eos else None)

    def rtc_note(self) -> str:
        """
        Return what ``/diagnostics`` adds to ``chunk smoothing rtc``: K of N, or '' (exact).

        E.g. ``' (the Jacobian on 5 of 10 Euler steps)'``; '' without RTC or with the
        Jacobian at every step.
        """
        if not self.rtc or self.rtc_jacobian_steps is None:
            return ''
        steps = get_preset(self.preset).num_denoise_steps
        return f' (the Jacobian on {self.rtc_jacobian_steps} of {steps} Euler steps)'

    def backend_config(self) -> BackendConfig:
        """Return the fields a backend needs (``backends.factory.make_backend``)."""
        return BackendConfig(
            backend=self.backend, compile_mode=self.compile_mode, device=self.device,
            block_size=self.block_size, max_running_requests=self.max_running_requests,
            decode_budget=self.decode_budget, trt_precision=self.trt_precision,
            engine_cache_dir=self.engine_cache_dir,
            attention=AttentionBackend.resolve(self.attention_backend), rtc=self.rtc,
            rtc_jacobian_steps=self.rtc_jacobian_steps, tokens_per_cycle=self.tokens_per_cycle,
            compile_steps=self.compile_steps)
