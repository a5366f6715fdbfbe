"""
Backend choices and the backend's settings, ``BackendConfig`` (no torch).

``engine.config.EngineConfig`` holds a ``BackendConfig`` (``config.backend``) and hands it to
``factory.make_backend`` with the scheduler's settings (``config.scheduler``: the block size,
the decode batch, k), so that backends never import the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
import enum
import os
from typing import Iterable


class BackendKind(enum.Enum):
    TORCH = 'torch'
    TENSORRT = 'tensorrt'


class CompileMode(enum.Enum):
    """
    How the torch backend runs its per-cycle model calls (``compiled.py``).

    The fast path pads every call to a few static shapes and (on CUDA) captures each in a
    CUDA graph; the kernels inside come from Inductor or are PyTorch's own.
    """

    NONE = 'none'
    """Eager PyTorch: one kernel launch per op, shapes as they come."""
    AUTO = 'auto'
    """``reduce-overhead`` on a CUDA device, ``none`` on the CPU (the node's default)."""
    DEFAULT = 'default'
    """Inductor kernels on static shapes, no CUDA graphs (also runs on the CPU)."""
    REDUCE_OVERHEAD = 'reduce-overhead'
    """Inductor kernels captured in CUDA graphs: the fast path (CUDA; on the CPU = default)."""
    CUDA_GRAPHS = 'cuda-graphs'
    """PyTorch's eager kernels in CUDA graphs: no compiler (where Triton cannot build)."""

    def resolve(self, device: str) -> CompileMode:
        """Return the mode to run on ``device`` (``cpu``, ``cuda``, ``cuda:N``): AUTO resolved."""
        if self is CompileMode.AUTO:
            return CompileMode.REDUCE_OVERHEAD if device.startswith('cuda') else CompileMode.NONE
        return self


class Quantization(enum.Enum):
    """
    Which weights are quantized at load (vLLM's ``--quantization`` term).

    Only the torch backend quantizes (TensorRT has its own ``trt_precision``).
    """

    NONE = 'none'
    """Every weight in the model dtype (openpi's float32 parameters in float32)."""
    FP8 = 'fp8'
    """E4M3 weights with per-output-channel scales in the large linears (``model/fp8.py``):
    per-token FP8 activations and ``torch._scaled_mm`` on CUDA compute capability >= 8.9
    (refused below), the weight-only reference path on the CPU (a reported fallback); held
    at load to the action rule of ``backends/fp8_gate.py`` (else the unquantized weights
    run, a reported fallback)."""


class Step(str, enum.Enum):
    """A per-cycle model call of the engine (``JobKind`` plus the causal-text prefill)."""

    VISION = 'vision'
    PREFILL = 'prefill'
    TEXT_PREFILL = 'text_prefill'
    SUFFIX = 'suffix'
    DENOISE = 'denoise'
    DECODE = 'decode'
    DECODE_STEPS = 'decode_steps'
    """A decode job's k greedy steps in one graph (``k`` = ``tokens_per_cycle``)."""
    SEED = 'seed'
    GUIDED_DENOISE = 'guided_denoise'
    """Denoise with real-time chunking's guidance (compiled only when asked: ``rtc``)."""


ATTENTION_ENV = 'OXYGEN_ROS_ATTENTION'
"""Environment variable naming the attention kernel where the configuration leaves it open."""


class AttentionBackend(enum.Enum):
    """
    Which kernels the model's attention may use (``backends/attention.py``).

    AUTO is PyTorch's own choice per call (but see MATMUL, TRITON, FLEX below); the SDPA kernel
    names restrict every ``scaled_dot_product_attention`` of the model (eager, compiled and
    captured) to one kernel through ``torch.nn.attention.sdpa_kernel``, so that one run can
    compare them. A kernel that cannot run a call raises there (on CUDA FLASH takes no mask,
    which every call of the model has; EFFICIENT and CUDNN are CUDA only). MATMUL runs the
    short-query attention of denoise and decode as two matrix products
    (``model/layers.py``, ``matmul_short_queries``) and leaves the prefill's to PyTorch's
    choice; AUTO does so only where compiled for CUDA (why: ``docs/gpu.md#attention-kernel``).
    TRITON runs the decode steps, causal suffixes and denoise of the fast path with the paged
    attention kernel (``fast_path/paged_attention.py``: the context read in place from the KV pool,
    no gather; the denoise with the fused norms of ``fast_path/denoise_fused.py``), in graphs of
    eager kernels too, the prefill's prefix with SDPA, and the rest as AUTO; AUTO uses those
    kernels where compiled for CUDA with Triton importable. The eager model and RTC's guided
    denoise always gather. FLEX runs the prefill's prefix attention and SigLIP's attention with
    PyTorch's FlexAttention where they are compiled (``model/flex.py``: one flash-style kernel, the
    prefix mask a block mask of per-row vectors), and the rest as AUTO; AUTO does so for the prefix
    where compiled for CUDA, and leaves SigLIP's attention to PyTorch's SDPA choice. Eagerly (the
    eager model, graphs of eager kernels) both keep SDPA.
    """

    AUTO = 'auto'
    MATH = 'math'
    EFFICIENT = 'efficient'
    FLASH = 'flash'
    CUDNN = 'cudnn'
    MATMUL = 'matmul'
    TRITON = 'triton'
    FLEX = 'flex'

    @classmethod
    def resolve(cls, value: AttentionBackend | str | None) -> AttentionBackend:
        """
        Return ``value``, or ``$OXYGEN_ROS_ATTENTION`` when it is None, else AUTO.

        :raises ValueError: a name that is none of the choices (the message lists them).
        """
        if isinstance(value, cls):
            return value
        name = os.environ.get(ATTENTION_ENV, '') if value is None else value
        try:
            return cls(name.strip().lower() or 'auto')
        except ValueError:
            source = f'{ATTENTION_ENV}={name!r}' if value is None else repr(name)
            raise ValueError(f'unknown attention backend {source}; choose one of '
                             f'{", ".join(b.value for b in cls)}') from None


MAX_AUTOTUNE_ENV = 'OXYGEN_ROS_MAX_AUTOTUNE'
"""Environment variable naming the fast-path steps whose Inductor compile autotunes."""


def max_autotune_steps(value: str | None = None) -> frozenset[Step]:
    """
    Return the steps Inductor compiles with ``max_autotune`` (``backends/graph_builder.py``).

    Autotuning benchmarks Triton GEMM templates (their epilogues fused: bias, GELU, residual)
    against cuBLAS per shape, and FlexAttention's tile configurations, at compile time
    (docs/gpu.md, "Prefill and vision": its cost and what it is expected to give).

    :param value: comma-separated ``Step`` values (``vision,prefill``) or ``all``; None:
        ``$OXYGEN_ROS_MAX_AUTOTUNE``, unset or empty: no step.
    :raises ValueError: a name that is no step (the message lists them).
    """
    text = os.environ.get(MAX_AUTOTUNE_ENV, '') if value is None else value
    names = [n.strip().lower() for n in text.split(',') if n.strip()]
    if names == ['all']:
        return frozenset(Step)
    try:
        return frozenset(Step(n) for n in names)
    except ValueError:
        source = f'{MAX_AUTOTUNE_ENV}={text!r}' if value is None else repr(text)
        raise ValueError(f'unknown step in {source}; name some of '
                         f'{", ".join(s.value for s in Step)}, or all') from None


ALL_STEPS = 'all'
"""``compile_steps`` value naming every step (the default)."""


def parse_compile_steps(names: Iterable[str | Step]) -> frozenset[Step] | None:
    """
    Return the steps the fast path compiles, from ``Step`` values or ``all``; None: every step.

    The steps left out run eagerly when the fast path is on (``FastPathModel(only=...)``), which
    is not a fallback: nothing was asked. Jetson Thor's "stable mode" of OxyGen (compiled
    vision, prefill and denoise, eager one-token text decode) is every step but ``decode`` and
    ``decode_steps`` (docs/gpu.md#compiled-decode-off-alone).

    :raises ValueError: no name, a name that is no step (the message lists them), ``all``
        beside step names, or ``decode_steps`` without ``decode``: the k-step graph replays
        the compiled decode step (``graph_builder.py``), so leaving ``decode`` eager alone
        would still run it compiled.
    """
    names = [n.value if isinstance(n, Step) else str(n).strip().lower() for n in names]
    if not names:
        raise ValueError(f'compile_steps names no step: give {ALL_STEPS!r} or some of '
                         f'{", ".join(s.value for s in Step)} (compile_mode none compiles '
                         f'nothing)')
    if ALL_STEPS in names:
        if len(set(names)) > 1:
            raise ValueError(f'compile_steps: {ALL_STEPS!r} stands alone, got {names}')
        return None
    unknown = [n for n in names if n not in {s.value for s in Step}]
    if unknown:
        raise ValueError(f'compile_steps: unknown step(s) {unknown}; name some of '
                         f'{", ".join(s.value for s in Step)}, or {ALL_STEPS!r}')
    steps = frozenset(Step(n) for n in names)
    if Step.DECODE_STEPS in steps and Step.DECODE not in steps:
        raise ValueError("compile_steps: 'decode_steps' replays the compiled decode step k "
                         "times in one graph: name 'decode' too, or neither")
    return steps


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """
    The backend's settings: ``EngineConfig.backend``.

    No defaults of its own: each field is declared once, with its default and description, in
    ``oxygen_ros/parameters/oxygen_parameters.yaml`` (``backend``, ``device``,
    ``compile_mode``, ``compile_steps``, ``rtc_jacobian_steps``; ``attention_backend``,
    ``trt_precision``, ``engine_cache_dir``, ``rtc``), and ``EngineConfig`` builds this config
    from there.

    :ivar kind: ``torch`` or ``tensorrt`` (engines built from our ONNX graphs).
    :ivar device: torch device (``cpu``, ``cuda``, ``cuda:N``): the weights and the KV pool.
    :ivar compile_mode: the torch backend's fast path (``compiled.py``); AUTO: compiled
        kernels in CUDA graphs on CUDA, eager on the CPU.
    :ivar compile_steps: the steps the fast path compiles (``parse_compile_steps``, names or
        ``('all',)`` given); None: every step. The others run eagerly.
    :ivar attention: the attention kernel (:class:`AttentionBackend`); None given:
        ``$OXYGEN_ROS_ATTENTION``, else AUTO.
    :ivar trt_precision: TensorRT precision mode: ``graph``, ``fp16``, ``bf16``, ``fp8``.
    :ivar engine_cache_dir: exported graphs and TensorRT engines (None: the default cache).
    :ivar rtc: chunks are guided (real-time chunking): the fast path compiles, captures and
        gates the guided denoise too.
    :ivar rtc_jacobian_steps: the guided denoise's ``RtcGuidance.jacobian_steps`` (None:
        every Euler step).
    :raises ValueError: an unknown attention backend, compile step or TensorRT precision (the
        message lists the choices).
    """

    kind: BackendKind
    device: str
    compile_mode: CompileMode
    compile_steps: frozenset[Step] | None
    attention: AttentionBackend
    trt_precision: str
    engine_cache_dir: str | None
    rtc: bool
    rtc_jacobian_steps: int | None

    def __post_init__(self) -> None:
        object.__setattr__(self, 'kind', BackendKind(self.kind))
        object.__setattr__(self, 'compile_mode', CompileMode(self.compile_mode))
        object.__setattr__(self, 'attention', AttentionBackend.resolve(self.attention))
        if self.compile_steps is not None:
            object.__setattr__(self, 'compile_steps', parse_compile_steps(self.compile_steps))
        if self.trt_precision not in TRT_PRECISIONS:
            raise ValueError(f'trt_precision must be one of {", ".join(TRT_PRECISIONS)}, got '
                             f'{self.trt_precision!r}')


TRT_PRECISIONS = ('graph', 'fp16', 'bf16', 'fp8')
"""TensorRT precision modes (``experimental/trt_profiles.TrtPrecision``)."""


__all__ = ['ALL_STEPS', 'ATTENTION_ENV', 'AttentionBackend', 'BackendConfig', 'BackendKind',
           'CompileMode', 'MAX_AUTOTUNE_ENV', 'Quantization', 'Step', 'max_autotune_steps',
           'TRT_PRECISIONS', 'parse_compile_steps']
