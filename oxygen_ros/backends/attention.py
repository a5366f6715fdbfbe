"""
The attention-kernel switch: ``torch.nn.attention.sdpa_kernel`` around the model's calls.

``AttentionBackend`` (``backends/config.py``; the engine's ``attention_backend``, else
``$OXYGEN_ROS_ATTENTION``) names the kernel; :func:`sdpa_context` is the context the torch backend
runs its warm-up (compiling and capturing: the kernel is chosen while tracing) and every cycle in.
AUTO leaves PyTorch's choice alone, except that where compiled for CUDA decode steps, causal
suffixes and the denoise read the KV pool in place with the paged Triton kernel
(``backends/fast_path/paged_attention.py``, the denoise fused:
``backends/fast_path/denoise_fused.py``; the graph builder loads the kernels on CUDA), the
prefill's prefix attends itself with FlexAttention (``model/flex.py``) and the other short-query
attention runs as two matrix products; MATMUL runs the short-query attention as matrix products
everywhere (decode and denoise gather their context); TRITON runs decode, suffixes and the denoise
with the paged kernel everywhere the fast path runs them (eager kernels in graphs too; on the CPU
only under ``TRITON_INTERPRET=1``) and the prefill's prefix with SDPA (AUTO without FlexAttention);
FLEX runs the prefill's prefix and SigLIP's attention with FlexAttention where compiled, on any
device; the SDPA kernel names run every attention call with that kernel (decode and denoise gather
their context; no FlexAttention).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Generator, TypeVar

from oxygen_ros.backends.config import AttentionBackend

Y = TypeVar('Y')
R = TypeVar('R')


def sdpa_context(backend: AttentionBackend) -> AbstractContextManager:
    """
    Return the context that restricts attention to ``backend``.

    :returns: ``nullcontext()`` for AUTO (PyTorch's kernel choice; short-query attention as
        matrix products, the paged kernel and the prefix's FlexAttention where compiled for
        CUDA), ``paged_kernel()`` and no FlexAttention for TRITON, ``flex_kernels()`` for
        FLEX, ``matmul_short_queries()`` and neither the paged kernel nor FlexAttention for
        MATMUL, else ``sdpa_kernel([SDPBackend.<kernel>])`` for every attention call and
        neither.
    :raises ImportError: TRITON without Triton.
    """
    if backend is AttentionBackend.AUTO:
        return nullcontext()
    from oxygen_ros.backends.fast_path.paged_attention import paged_kernel
    from oxygen_ros.model.flex import flex_kernels
    from oxygen_ros.model.layers import matmul_short_queries
    if backend is AttentionBackend.FLEX:
        return flex_kernels(True)
    stack = ExitStack()
    stack.enter_context(paged_kernel(backend is AttentionBackend.TRITON))  # raises first
    stack.enter_context(flex_kernels(False))
    if backend is AttentionBackend.TRITON:
        return stack
    if backend is AttentionBackend.MATMUL:
        stack.enter_context(matmul_short_queries(True))
        return stack
    from torch.nn.attention import sdpa_kernel, SDPBackend
    kernel = {AttentionBackend.MATH: SDPBackend.MATH,
              AttentionBackend.EFFICIENT: SDPBackend.EFFICIENT_ATTENTION,
              AttentionBackend.FLASH: SDPBackend.FLASH_ATTENTION,
              AttentionBackend.CUDNN: SDPBackend.CUDNN_ATTENTION}[backend]
    stack.enter_context(matmul_short_queries(False))
    stack.enter_context(sdpa_kernel([kernel]))
    return stack


def in_each_step(backend: AttentionBackend,
                 steps: Generator[Y, None, R]) -> Generator[Y, None, R]:
    """
    Run the generator ``steps`` (a backend's plan) with :func:`sdpa_context` around each step.

    The switch is in force while the plan runs, not while its caller holds what it yielded
    (the action chunk), as ``torch.inference_mode`` decorates a generator.
    """
    while True:
        with sdpa_context(backend):
            try:
                item = next(steps)
            except StopIteration as done:
                return done.value
        yield item


__all__ = ['in_each_step', 'sdpa_context']
