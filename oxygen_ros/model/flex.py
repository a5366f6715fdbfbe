"""
FlexAttention for the long bidirectional attentions: the prefix of a prefill, and SigLIP.

PyTorch's FlexAttention (``torch.nn.attention.flex_attention``; Dong et al. 2024, arXiv
2412.05496) is compiled by Inductor into one flash-style kernel (Triton on CUDA, a C++
template on the CPU): tiles of queries stream over tiles of keys with an online float32
softmax, the score matrix never reaches memory, and a ``BlockMask`` skips tiles that are
entirely masked and skips the mask itself on tiles that are entirely allowed. GQA is native
(``enable_gqa``: the 8 query heads of π0.5's one kv head read the same K/V). The mask is a
``mask_mod`` over per-row vectors, tensors of the graph: no dense bias, no recompile for
another length or pattern (the vectors are inputs, the lengths symbolic).

Why here (the H100's timings: ``docs/gpu.md#prefill-and-vision``): cuDNN's SDPA with a dense bias
took as long for the prefill's attention of a whole prefix as for a 15-query denoise call, a cost
per call, about ten times what the call's FLOPs need at the GPU's rate; the memory-efficient kernel
refuses GQA and flash any mask. A flex kernel's cost follows its work. Not yet timed on a GPU:
``oxygen_bench gpu`` session 3 times it against the current path kernel by kernel
(``tools/bench/gpu_components.py`` ``time_prefix_attention``).

:func:`flex_kernels` chooses, while tracing (Dynamo guards on the setting, as on
``paged_attention.paged_kernel``), and only where the call is compiled: eagerly FlexAttention
is a reference that materializes every score (PyTorch's ``math_attention``), so eager calls
and graphs of eager kernels keep ``scaled_dot_product_attention``.
``backends/attention.py`` enters it for the attention backend (``flex``; ``auto``: the
prefill's prefix where compiled for CUDA; ``triton`` and the SDPA kernel names: never).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, TYPE_CHECKING

import torch
import torch.nn.functional as F  # noqa: N812

if TYPE_CHECKING:  # pragma: no cover
    from torch.nn.attention.flex_attention import BlockMask

MIN_HEAD_DIM = 16
"""Head dims below this are zero-padded to it for FlexAttention (:func:`_flex`)."""
_enabled: bool | None = None
"""Set by :func:`flex_kernels`; None: AUTO's rule (:func:`use_flex_prefill`)."""


@contextmanager
def flex_kernels(enabled: bool | None = True) -> Iterator[None]:
    """
    Choose where FlexAttention runs inside this context (always where compiled only).

    :param enabled: True: the prefill's prefix attention (``static_calls.PrefillCall``) and
        SigLIP's attention; False: neither (``scaled_dot_product_attention``); None (the
        default outside any context): the prefix attention where compiled for CUDA, SigLIP's
        left to PyTorch's SDPA choice.
    """
    global _enabled
    before, _enabled = _enabled, enabled
    try:
        yield
    finally:
        _enabled = before


def use_flex_prefill(x: torch.Tensor) -> bool:
    """Return whether a prefill on ``x``'s device attends its prefix with FlexAttention here."""
    return prefill_attention(x.device, torch.compiler.is_compiling()) == 'flex'


def use_flex_vision() -> bool:
    """Return whether SigLIP's attention runs FlexAttention here (FLEX, compiled)."""
    return _enabled is True and torch.compiler.is_compiling()


def prefill_attention(device: torch.device | str, compiled: bool) -> str:
    """
    Return how a prefill on ``device`` attends its prefix here.

    :returns: ``'flex'`` (:func:`prefix_attention`) or ``'sdpa'`` (``layers.attention`` with
        a dense bias).
    """
    if not compiled or _enabled is False:
        return 'sdpa'
    return 'flex' if _enabled or torch.device(device).type == 'cuda' else 'sdpa'


def prefix_block_mask(valid: torch.Tensor, ar: torch.Tensor) -> BlockMask:
    """
    Return the prefix's attention pattern as a FlexAttention block mask.

    The rule of ``masks.make_attn_mask`` (openpi ``pi0.py`` ``make_attn_mask``): with
    ``c = cumsum(ar)``, query i attends key j iff ``valid_i and valid_j and c_j <= c_i``;
    plus every query attends itself (padding queries attend only themselves, as
    ``PrefillCall``'s dense mask: their rows are never read and never NaN). Built from the
    vectors on their device inside the graph (``create_block_mask``: the pattern evaluated
    on the ``P x P`` grid once per call, reduced to 128 x 128 tiles; no host sync).

    :param valid: ``bool [B, P]`` real tokens.
    :param ar: ``int [B, P]`` autoregressive flags (images 0; prompt 0 bidirectional, 1
        CAUSAL_TEXT).
    :returns: the ``BlockMask`` of ``B`` rows, every head alike, ``P`` queries and keys.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    cum = torch.cumsum(ar.to(torch.int32), 1, dtype=torch.int32)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                 kv: torch.Tensor) -> torch.Tensor:
        return (valid[b, q] & valid[b, kv] & (cum[b, kv] <= cum[b, q])) | (q == kv)
    b, p = valid.shape
    return create_block_mask(mask_mod, b, None, p, p, device=valid.device)


def prefix_row_mask(valid: torch.Tensor, ar: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """
    Return row ``index[b]`` of the prefix's dense mask (the rule of :func:`prefix_block_mask`).

    :param valid: ``bool [B, P]``.
    :param ar: ``int [B, P]``.
    :param index: ``int64 [B]`` the query of each row.
    :returns: ``bool [B, 1, P]``.
    """
    cum = torch.cumsum(ar.to(torch.int32), 1, dtype=torch.int32)
    at = index[:, None]
    keys = torch.arange(valid.shape[1], device=valid.device)
    row = valid & (cum <= cum.gather(1, at)) & valid.gather(1, at)
    return (row | (keys == at))[:, None]


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     block_mask: BlockMask) -> torch.Tensor:
    """
    Return the FlexAttention of H query heads over Hkv kv heads with ``block_mask``.

    Scale ``D ** -0.5``; float32 scores and softmax inside the kernel, the probabilities in
    the value dtype for ``p v`` (as SDPA's fused kernels).

    :param q: ``[B, S, H, D]`` post-RoPE queries.
    :param k: ``[B, Hkv, P, D]`` post-RoPE keys; ``v`` alike.
    :param block_mask: from :func:`prefix_block_mask` (``S = P``).
    :returns: ``[B, S, H * D]`` head-major per token, as ``layers.attention``.
    """
    b, s, h, d = q.shape
    if not v.is_cuda:   # the C++ template misreads a strided view of the Q/K/V output
        v = v.contiguous()
    out = _flex(q.transpose(1, 2), k, v, block_mask=block_mask, enable_gqa=k.shape[1] != h)
    return out.transpose(1, 2).reshape(b, s, h * d)


def vision_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """
    Unmasked attention of SigLIP: FlexAttention where :func:`use_flex_vision`, else SDPA.

    Head dim 72 (So400m/14): every CUDA SDPA kernel takes it in 16 bits (multiples of 8;
    FlashAttention-2 runs its 96-dim instance), FlexAttention's Triton kernel rounds it to
    128 in registers (a power of two), both exact; nothing is padded here.

    :param q: ``[B, H, T, D]``; ``k`` and ``v`` alike.
    :returns: ``[B, H, T, D]``.
    """
    if use_flex_vision():
        return _flex(q, k, v)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def _flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """
    Return ``flex_attention(q, k, v, **kwargs)``, head dims below ``MIN_HEAD_DIM`` zero-padded.

    Zeros add nothing to ``q . k`` nor to ``p v`` (whose padded columns are dropped), and the
    scale stays ``D ** -0.5`` of the true D: exact. Triton's ``tl.dot`` takes no inner
    dimension below 16 in 16-bit types (``triton/backends/nvidia/compiler.py``
    ``min_dot_size``), which the tiny test models' 8-dim heads would be.
    """
    from torch.nn.attention.flex_attention import flex_attention

    d = q.shape[-1]
    if d >= MIN_HEAD_DIM:
        return flex_attention(q, k, v, **kwargs)
    pad = (0, MIN_HEAD_DIM - d)
    out = flex_attention(F.pad(q, pad), F.pad(k, pad), F.pad(v, pad), scale=d ** -0.5,
                         **kwargs)
    return out[..., :d]


__all__ = ['MIN_HEAD_DIM', 'flex_kernels', 'prefill_attention', 'prefix_attention',
           'prefix_block_mask', 'prefix_row_mask', 'use_flex_prefill', 'use_flex_vision',
           'vision_attention']
