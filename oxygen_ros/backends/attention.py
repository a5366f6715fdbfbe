"""
The attention-kernel switch: ``torch.nn.attention.sdpa_kernel`` around the model's calls.

``AttentionBackend`` (``backends/config.py``; the engine's ``attention_backend``, else
``$OXYGEN_ROS_ATTENTION``) names the kernel; :func:`sdpa_context` is the context the torch
backend runs its warm-up (compiling and capturing: the kernel is chosen while tracing) and
every cycle in. AUTO leaves PyTorch's choice alone.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from oxygen_ros.backends.config import AttentionBackend


def sdpa_context(backend: AttentionBackend) -> AbstractContextManager:
    """
    Return the context that restricts ``scaled_dot_product_attention`` to ``backend``.

    :returns: ``nullcontext()`` for AUTO, else ``sdpa_kernel([SDPBackend.<kernel>])``.
    """
    if backend is AttentionBackend.AUTO:
        return nullcontext()
    from torch.nn.attention import sdpa_kernel, SDPBackend

    kernel = {AttentionBackend.MATH: SDPBackend.MATH,
              AttentionBackend.EFFICIENT: SDPBackend.EFFICIENT_ATTENTION,
              AttentionBackend.FLASH: SDPBackend.FLASH_ATTENTION,
              AttentionBackend.CUDNN: SDPBackend.CUDNN_ATTENTION}[backend]
    return sdpa_kernel([kernel])


__all__ = ['sdpa_context']
