"""
The attention-kernel switch: ``torch.nn.attention.sdpa_kernel`` around the model's calls.

``AttentionBackend`` (``backends/config.py``; the engine's ``attention_backend``, else
``$OXYGEN_ROS_ATTENTION``) names the kernel; :func:`sdpa_context` is the context the torch
backend runs its warm-up (compiling and capturing: the kernel is chosen while tracing) and
every cycle in. AUTO leaves PyTorch's choice alone, except that the short-query attention of
denoise and decode runs as two matrix products where compiled for CUDA; MATMUL runs it so
everywhere; the kernel names run every attention call with that SDPA kernel.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, ExitStack, nullcontext

from oxygen_ros.backends.config import AttentionBackend


def sdpa_context(backend: AttentionBackend) -> AbstractContextManager:
    """
    Return the context that restricts attention to ``backend``.

    :returns: ``nullcontext()`` for AUTO (PyTorch's kernel choice; short-query attention as
        matrix products where compiled for CUDA), ``matmul_short_queries()`` for MATMUL,
        else ``sdpa_kernel([SDPBackend.<kernel>])`` for every attention call.
    """
    if backend is AttentionBackend.AUTO:
        return nullcontext()
    from oxygen_ros.model.layers import matmul_short_queries
    if backend is AttentionBackend.MATMUL:
        return matmul_short_queries(True)
    from torch.nn.attention import sdpa_kernel, SDPBackend
    kernel = {AttentionBackend.MATH: SDPBackend.MATH,
              AttentionBackend.EFFICIENT: SDPBackend.EFFICIENT_ATTENTION,
              AttentionBackend.FLASH: SDPBackend.FLASH_ATTENTION,
              AttentionBackend.CUDNN: SDPBackend.CUDNN_ATTENTION}[backend]
    stack = ExitStack()
    stack.enter_context(matmul_short_queries(False))
    stack.enter_context(sdpa_kernel([kernel]))
    return stack


__all__ = ['sdpa_context']
