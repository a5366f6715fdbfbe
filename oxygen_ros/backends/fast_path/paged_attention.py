"""
Where the cached-context calls attend the KV pool in place (the Triton kernels) or gather it.

``ExtendCall`` (decode steps, causal suffixes) and ``DenoiseCall`` (the action expert's Euler
loop; both ``static_calls.py``) attend a context in the pool. Two ways: gather the
context slots of every row and layer (``index_select``), concatenate the new tokens' K/V and
run ``layers.attention`` (what the eager model does; float32 K inside the matrix-product
attention), or the Triton kernel ``kernels/paged_decode.py``, which reads K and V in place by
slot and takes the new tokens' K/V as they are. The denoise with the kernels is the fused
step of ``denoise_fused.py`` (the attention with RoPE on load, the adaRMS norms and
gated residuals of ``kernels/adarms.py``). :func:`paged_kernel` chooses, while tracing
(Dynamo guards on it, as on ``layers.matmul_short_queries``); ``backends/attention.py``
enters it for the attention backend (``triton``; ``auto`` where compiled for CUDA).
"""

from __future__ import annotations

from contextlib import contextmanager
import importlib
import logging
from types import ModuleType
from typing import Callable, Iterator

import torch

PAGED_MAX_QUERIES = 64
"""New tokens per row up to which the kernel serves a call (decode, suffixes, the action
tokens of a denoise); longer calls (a text prefill of up to 200 tokens) keep the gather and
a fused SDPA kernel."""

_KERNEL_MODULE = 'oxygen_ros.backends.fast_path.kernels.paged_decode'
_NORM_MODULE = 'oxygen_ros.backends.fast_path.kernels.adarms'
_LOG = logging.getLogger(__name__)
_enabled: bool | None = None
"""Set by :func:`paged_kernel`; None: the kernel where compiled for CUDA and it loaded."""
_kernel: Callable[..., torch.Tensor] | None = None
_norms: ModuleType | None = None
_load_error: str | None = None


def load_kernel(required: bool = True) -> bool:
    """
    Import the Triton kernels (and Triton); return whether they are available.

    :param required: raise where they cannot be imported; else log a WARNING once and return
        False (the context is then gathered: slower, same results).
    :raises ImportError: ``required`` and Triton (or a kernel) cannot be imported.
    """
    global _kernel, _norms, _load_error
    if _kernel is None and _load_error is None:
        try:
            norms = importlib.import_module(_NORM_MODULE)
            _kernel, _norms = importlib.import_module(_KERNEL_MODULE).paged_attention, norms
        except ImportError as exc:
            _load_error = f'{type(exc).__name__}: {exc}'
            if not required:
                _LOG.warning('paged attention kernel unavailable (%s): decode and denoise '
                             'attention gather the context instead', _load_error)
    if _kernel is None and required:
        raise ImportError(f'the paged attention kernel needs Triton ({_load_error}); install '
                          f'triton or choose another attention backend')
    return _kernel is not None


@contextmanager
def paged_kernel(enabled: bool | None = True) -> Iterator[None]:
    """
    Choose how ``ExtendCall`` and ``DenoiseCall`` attend the context inside this context.

    :param enabled: True: the paged kernel (imported here; CUDA, or the CPU under
        ``TRITON_INTERPRET=1``); False: gather the context; None (the default outside any
        context): the kernel where the call is compiled for CUDA and the kernel was loaded
        (:func:`load_kernel`), else the gather.
    :raises ImportError: ``enabled`` is True and Triton cannot be imported.
    """
    global _enabled
    if enabled:
        load_kernel()
    before, _enabled = _enabled, enabled
    try:
        yield
    finally:
        _enabled = before


def _chosen(on_cuda: bool, compiled: bool) -> bool:
    if _kernel is None:
        return False
    return on_cuda and compiled if _enabled is None else _enabled


def use_paged_kernel(x: torch.Tensor, num_queries: int) -> bool:
    """Return whether a call with ``num_queries`` new tokens per row on ``x``'s device uses it."""
    return num_queries <= PAGED_MAX_QUERIES and _chosen(x.is_cuda,
                                                        torch.compiler.is_compiling())


def decode_attention(device: torch.device | str, compiled: bool) -> str:
    """Return how a decode step on ``device`` attends here: ``'paged'`` or ``'gathered'``."""
    return 'paged' if _chosen(torch.device(device).type == 'cuda', compiled) else 'gathered'


def denoise_attention(device: torch.device | str, compiled: bool, horizon: int) -> str:
    """
    Return how a denoise of ``horizon`` action tokens on ``device`` runs here.

    :returns: ``'fused'`` (``denoise_fused.fused_velocity``: the paged kernel and the fused
        norms) or ``'gathered'`` (``denoise.expert_velocity`` on the gathered prefix).
    """
    on_cuda = torch.device(device).type == 'cuda'
    return 'fused' if horizon <= PAGED_MAX_QUERIES and _chosen(on_cuda, compiled) else \
        'gathered'


def paged_attention(q: torch.Tensor, q_index: torch.Tensor, k_pool: torch.Tensor,
                    v_pool: torch.Tensor, ctx_slots: torch.Tensor, ctx_mask: torch.Tensor,
                    k_new: torch.Tensor, v_new: torch.Tensor, new_valid: torch.Tensor,
                    cos: torch.Tensor | None = None, sin: torch.Tensor | None = None,
                    causal: bool = True) -> torch.Tensor:
    """
    Return the kernel's attention: ``[B, Tq, Hq * D]`` (``kernels/paged_decode.py``).

    Arguments as ``paged_decode.paged_attention``; only after :func:`load_kernel`.
    """
    assert _kernel is not None, 'load_kernel() first'
    out = _kernel(q, q_index, k_pool, v_pool, ctx_slots, ctx_mask, k_new, v_new, new_valid,
                  cos, sin, causal)
    return out.flatten(2)


def ada_rms_norm(x: torch.Tensor, mod: torch.Tensor, eps: float) -> torch.Tensor:
    """Return ``kernels/adarms.py``'s ``ada_rms_norm``; only after :func:`load_kernel`."""
    assert _norms is not None, 'load_kernel() first'
    return _norms.ada_rms_norm(x, mod, eps)


def gated_ada_rms_norm(x: torch.Tensor, delta: torch.Tensor, gate_mod: torch.Tensor,
                       mod: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``kernels/adarms.py``'s ``gated_ada_rms_norm``; only after :func:`load_kernel`."""
    assert _norms is not None, 'load_kernel() first'
    return _norms.gated_ada_rms_norm(x, delta, gate_mod, mod, eps)


__all__ = ['PAGED_MAX_QUERIES', 'ada_rms_norm', 'decode_attention', 'denoise_attention',
           'gated_ada_rms_norm', 'load_kernel', 'paged_attention', 'paged_kernel',
           'use_paged_kernel']
