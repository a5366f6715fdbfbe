"""
The fast path's optional features, which a step's warm-up can drop one at a time.

A compiled step uses, besides Inductor and CUDA graphs, kernels that may fail on a given GPU,
torch or Triton while the rest of the step would build: the paged attention kernel with the
fused adaRMS norms (``kernels/``, Triton; the path that ran 12.5 frames/s on an H200
when Inductor's fp64 scalar broke its build, where the gathered context and SDPA would have
kept the step compiled), FlexAttention (``model/flex.py``) and the FP8 product
(``torch._scaled_mm``, ``model/fp8.py``). The warm-up (``warmup.py``) compiles a step again
without the feature a failure names (:func:`blame`), or, where none is named, without its
features one at a time in :data:`ORDER`, before it gives up the compiler (eager kernels in
graphs, then eager). A feature whose build failed is left out of every later step of the
same start. The decode of k steps in one graph is a step of its own (``Step.DECODE_STEPS``):
where it fails, the decode graphs run step by step.
"""

from __future__ import annotations

from contextlib import contextmanager, ExitStack
import enum
import traceback
from typing import Collection, Iterator

from oxygen_ros.backends.config import Step


class Feature(str, enum.Enum):
    """A kernel a compiled step may use and can do without."""

    PAGED_ATTENTION = 'paged_attention'
    """The Triton paged attention (decode, suffixes, the fused denoise with its adaRMS-norm
    kernel); without it: the context gathered and SDPA / matrix-product attention."""
    FLEX_ATTENTION = 'flex_attention'
    """FlexAttention for the prefill's prefix (and SigLIP with ``flex``); without it: SDPA."""
    FP8_MATMUL = 'fp8_matmul'
    """``torch._scaled_mm`` of FP8 weights; without it: the weights dequantized per call."""

    @property
    def description(self) -> str:
        return {Feature.PAGED_ATTENTION: 'the paged attention kernel (Triton)',
                Feature.FLEX_ATTENTION: 'FlexAttention',
                Feature.FP8_MATMUL: 'the FP8 product (torch._scaled_mm)'}[self]


ORDER = (Feature.PAGED_ATTENTION, Feature.FLEX_ATTENTION, Feature.FP8_MATMUL)
"""The order in which a step's features are dropped where a failure names none."""

STEP_FEATURES: dict[Step, tuple[Feature, ...]] = {
    Step.VISION: (Feature.FLEX_ATTENTION, Feature.FP8_MATMUL),
    Step.PREFILL: (Feature.FLEX_ATTENTION, Feature.FP8_MATMUL),
    Step.TEXT_PREFILL: (Feature.PAGED_ATTENTION, Feature.FP8_MATMUL),
    Step.SUFFIX: (Feature.PAGED_ATTENTION, Feature.FP8_MATMUL),
    Step.DENOISE: (Feature.PAGED_ATTENTION, Feature.FP8_MATMUL),
    Step.DECODE: (Feature.PAGED_ATTENTION, Feature.FP8_MATMUL),
    Step.DECODE_STEPS: (Feature.PAGED_ATTENTION, Feature.FP8_MATMUL),
    Step.SEED: (),
    Step.GUIDED_DENOISE: (Feature.FP8_MATMUL,),
}
"""The features each step's calls can use (``static_calls.py``; the LM head of the
seed is never quantized, RTC's guided denoise always gathers)."""

_MARKS = {
    Feature.PAGED_ATTENTION: ('_context_partials', '_new_tokens_and_merge', '_gated_norm',
                              'oxygen_ros::paged_attention', 'oxygen_ros::ada_rms_norm',
                              'oxygen_ros::gated_ada_rms_norm', 'kernels/paged_decode.py',
                              'kernels/adarms.py', 'triton_kernel_wrap',
                              'UserDefinedTritonKernel', 'user_defined_triton_kernel'),
    Feature.FLEX_ATTENTION: ('flex_attention', 'flex_decoding', 'BlockMask', 'model/flex.py'),
    Feature.FP8_MATMUL: ('_scaled_mm', 'float8_e4m3', 'Float8'),
}
"""Names a failure of each feature carries: its kernels, operators, source files (the
model's only user-defined Triton kernels, ``wrap_triton``'s, are the paged attention's)."""


def blame(exc: BaseException) -> list[Feature]:
    """
    Return the features ``exc`` names (its message, its causes', the frames it passed).

    A Triton build error names the kernel (``_context_partials``), a Dynamo or Inductor error
    the user code it was tracing; an error naming none of them (a failed parity gate, say)
    returns ``[]``.
    """
    text = ''.join(traceback.format_exception(exc))
    return [f for f in ORDER if any(mark in text for mark in _MARKS[f])]


@contextmanager
def features_off(off: Collection[Feature]) -> Iterator[None]:
    """
    Run the model's calls inside without the features ``off`` (read while tracing).

    Each switch is the model's own context (``paged_attention.paged_kernel(False)``,
    ``flex.flex_kernels(False)``, ``fp8.scaled_mm_kernel(False)``); Dynamo guards on them.
    """
    with ExitStack() as stack:
        if Feature.PAGED_ATTENTION in off:
            from oxygen_ros.backends.fast_path.paged_attention import paged_kernel
            stack.enter_context(paged_kernel(False))
        if Feature.FLEX_ATTENTION in off:
            from oxygen_ros.model.flex import flex_kernels
            stack.enter_context(flex_kernels(False))
        if Feature.FP8_MATMUL in off:
            from oxygen_ros.model.fp8 import scaled_mm_kernel
            stack.enter_context(scaled_mm_kernel(False))
        yield


def describe(off: Collection[Feature]) -> str:
    """Return ``'without the paged attention kernel (Triton)'`` or ``''`` for none."""
    if not off:
        return ''
    return 'without ' + ' and '.join(f.description for f in ORDER if f in off)


__all__ = ['Feature', 'ORDER', 'STEP_FEATURES', 'blame', 'describe', 'features_off']
