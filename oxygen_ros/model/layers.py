"""
Building blocks shared by the vision tower and both Gemma experts.

Precision follows openpi (``docs/model.md#precision``): RMSNorm statistics, RoPE angles and the
attention softmax run in float32 whatever the activation dtype; everything else runs in the
dtype of the weights. Shapes: B batch, S query tokens, P key tokens, H heads, Hkv kv heads,
D head dim, W width.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
import enum
from typing import Iterator, TYPE_CHECKING

import torch
from torch import nn
import torch.nn.functional as F  # noqa: N812

if TYPE_CHECKING:  # pragma: no cover
    from oxygen_ros.model.lora import RowLoRA

FOLD_MAX_QUERIES = 64
"""Query lengths up to this fold the query heads of a kv head into the query axis (below)."""
MASK_ALIGN = 16
"""Attention biases are allocated with their key axis a multiple of this many elements."""

_matmul_short_queries: bool | None = None
"""Set by :func:`matmul_short_queries`; None: matmul where compiled for CUDA, else SDPA."""


@contextmanager
def matmul_short_queries(enabled: bool | None = True) -> Iterator[None]:
    """
    Choose how folded (short-query) attention runs inside this context.

    Denoise and decode attend with at most ``FOLD_MAX_QUERIES`` queries per kv head. A fused
    SDPA kernel costs about as much for such a call however few its rows, while ``q @ k^T``, a
    softmax and ``p @ v`` compiled by Inductor cost what the call's work does (the timings:
    ``docs/gpu.md#attention-kernel``). Logits and softmax stay in float32, as inside the fused
    kernels; the probabilities are cast to the value dtype before ``p @ v``, as they do.
    Dynamo guards on the setting: changing it between calls of a compiled function recompiles
    it.

    :param enabled: True: :func:`matmul_attention`; False: ``scaled_dot_product_attention``;
        None (the default outside any context): matmul while compiling for CUDA, else SDPA
        (eagerly one fused kernel beats five launches).
    """
    global _matmul_short_queries
    before, _matmul_short_queries = _matmul_short_queries, enabled
    try:
        yield
    finally:
        _matmul_short_queries = before


class RMSNorm(nn.Module):
    """
    Gemma RMSNorm: ``y = x / rms(x) * (1 + w)`` with the statistics in float32.

    The weight is stored as an offset from 1 (openpi ``src/openpi/models/gemma.py``
    ``RMSNorm``; ``docs/model.md#vlm-expert``).
    """

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(width))

    def forward(self, x: torch.Tensor,
                modulation: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        """
        Normalize ``x``.

        :param x: ``[..., W]`` activations.
        :param modulation: unused (same call signature as :class:`AdaRMSNorm`).
        :returns: ``([..., W] in x.dtype, None)``: no residual gate.
        """
        y = rms_normalize(x, self.eps) * (1.0 + self.weight.float())
        return y.to(x.dtype), None


class AdaRMSNorm(nn.Module):
    """
    π0.5 adaptive RMSNorm of the action expert (``docs/model.md#π05-specifics``).

    ``[scale, shift, gate] = dense(cond)``; ``y = x / rms(x) * (1 + scale) + shift`` in float32;
    the caller adds ``gate * sublayer(y)`` to the residual stream. There is no learned scale
    vector. openpi zero-inits ``dense``; we never do (see ``init.py``).
    """

    def __init__(self, width: int, cond_width: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_width, 3 * width)

    def modulation(self, cond: torch.Tensor) -> torch.Tensor:
        """
        Return ``dense(cond)``: ``[..., 3W]`` (scale, shift, gate concatenated, that order).

        Depends only on the flow-matching time, so ``denoise`` computes it for all steps at once.
        Runs in the dtype of ``dense`` (float32 when the model is in 16 bits, as openpi).
        """
        return self.dense(cond.to(self.dense.weight.dtype))

    def forward(self, x: torch.Tensor,
                modulation: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """
        Normalize and modulate ``x``.

        :param x: ``[B, S, W]`` activations.
        :param modulation: ``[B, 3W]`` or ``[3W]`` output of :meth:`modulation`.
        :returns: ``(y [B, S, W], gate [B, 1, W] or [W])`` in x.dtype.
        :raises ValueError: if ``modulation`` is None.
        """
        if modulation is None:
            raise ValueError('AdaRMSNorm needs the modulation of the time condition')
        if modulation.dim() == 2:
            modulation = modulation[:, None]
        scale, shift, gate = modulation.chunk(3, dim=-1)
        y = rms_normalize(x, self.eps) * (1.0 + scale.float()) + shift.float()
        return y.to(x.dtype), gate.to(x.dtype)


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Return ``x / rms(x)`` in float32 (every RMSNorm's statistics: openpi ``gemma.py``)."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)


def gated_residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    """Return ``x + y`` (plain norm) or ``x + gate * y`` (adaptive norm, openpi ``gemma.py``)."""
    return x + y if gate is None else x + y * gate


class GeGLU(nn.Module):
    """Gemma MLP: ``down(gelu_tanh(x W_gate) * (x W_up))``; gate and up fused in one matmul."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(width, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor, lora: RowLoRA | None = None) -> torch.Tensor:
        """Map ``[..., W]`` to ``[..., W]``; ``lora`` adds a suffix LoRA's deltas."""
        gate_up = self.gate_up(x)
        if lora is not None:
            gate_up = gate_up + lora.gate_up(x)
        gate, up = gate_up.chunk(2, dim=-1)
        h = F.gelu(gate, approximate='tanh') * up
        return self.down(h) if lora is None else self.down(h) + lora.down(h)


def rope_cos_sin(positions: torch.Tensor, head_dim: int,
                 base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Return the RoPE rotation of each position, float32.

    ``angle[..., i] = position / base ** (2 i / D)`` for ``i < D / 2`` (openpi ``gemma.py``
    ``_apply_rope``; ``docs/model.md#vlm-expert``).

    :param positions: ``int64 [...]`` rope positions.
    :returns: ``(cos, sin)``, each ``float32 [..., D/2]``.
    """
    exponent = torch.arange(head_dim // 2, device=positions.device, dtype=torch.float32)
    timescale = base ** (2.0 * exponent / head_dim)
    angles = positions.to(torch.float32)[..., None] / timescale
    return torch.cos(angles), torch.sin(angles)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """
    Rotate ``x`` by RoPE, half-split: dim i is paired with dim i + D/2 (openpi ``gemma.py``).

    :param x: ``[B, S, H, D]`` queries or keys.
    :param cos: ``float32 [B, S, D/2]`` (or broadcastable) from :func:`rope_cos_sin`.
    :param sin: same shape as ``cos``.
    :returns: ``[B, S, H, D]`` in x.dtype, computed in float32.
    """
    cos, sin = cos[..., None, :], sin[..., None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class QueryLayout(enum.Enum):
    """How query heads are laid out for ``scaled_dot_product_attention`` with few kv heads."""

    HEADS = 'heads'
    """``q [B, H, S, D]`` against ``k [B, Hkv, P, D]`` with ``enable_gqa`` (long queries)."""
    FOLDED = 'folded'
    """
    The ``G = H / Hkv`` query heads of one kv head become ``G * S`` query rows of that head.

    Avoids repeating K/V per query head: ~10× faster on CPU for decode and denoise.
    """


@dataclass(frozen=True, slots=True)
class AttentionMask:
    """
    An attention mask prepared once per forward and shared by all layers.

    Stored as an additive bias (0 where allowed, -inf where masked) in the query dtype:
    the fused CPU kernel converts a boolean mask on every call (10-30 % slower). The bias is
    a view of a buffer whose key axis is padded to a multiple of ``MASK_ALIGN``: every stride
    but the last is then a multiple of 16 elements, which CUDA's memory-efficient SDPA kernel
    requires of a bias; an unaligned bias is padded and copied inside SDPA on every call
    (ATen ``attention.cpp``, ``preprocess_mask``), i.e. once per layer and Euler step.

    :ivar bias: ``[B, 1, S, P]`` (HEADS) or ``[B, 1, G*S, P]`` (FOLDED, G-major); strides
        ``(..., P16, 1)`` with ``P16`` = P rounded up to ``MASK_ALIGN``.
    :ivar layout: how queries must be laid out for this mask.
    """

    bias: torch.Tensor
    layout: QueryLayout

    @staticmethod
    def layout_for(num_queries: int, num_heads: int, num_kv_heads: int) -> QueryLayout:
        """Return the query layout :meth:`build` picks for ``num_queries`` queries."""
        if num_queries > FOLD_MAX_QUERIES or num_heads == num_kv_heads:
            return QueryLayout.HEADS
        return QueryLayout.FOLDED

    @classmethod
    def build(cls, mask: torch.Tensor, num_heads: int, num_kv_heads: int,
              dtype: torch.dtype) -> AttentionMask:
        """
        Prepare ``mask``.

        :param mask: ``bool [B, S, P]``, True where query s may attend key p. Every query row
            must allow at least one key (a fully masked row gives NaN).
        :param num_heads: query heads H.
        :param num_kv_heads: kv heads Hkv (divides H).
        :param dtype: dtype of the queries.
        """
        b, s, p = mask.shape
        groups = num_heads // num_kv_heads
        layout = cls.layout_for(s, num_heads, num_kv_heads)
        mask = mask[:, None]
        if layout is QueryLayout.FOLDED and s > 1:  # s == 1 broadcasts over the G rows
            mask = mask[:, :, None].expand(b, 1, groups, s, p).reshape(b, 1, groups * s, p)
        aligned = -(-p // MASK_ALIGN) * MASK_ALIGN
        bias = torch.zeros(mask.shape[:-1] + (aligned,), dtype=dtype, device=mask.device)
        bias = bias[..., :p]
        return cls(bias.masked_fill_(~mask, float('-inf')), layout)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              mask: AttentionMask) -> torch.Tensor:
    """
    Scaled dot-product attention of H query heads over Hkv kv heads (GQA / MQA).

    Scale ``D ** -0.5``; logits and softmax in float32 inside the fused kernel (openpi
    ``gemma.py`` ``Attention``; ``docs/model.md#vlm-expert``).

    :param q: ``[B, S, H, D]`` post-RoPE queries.
    :param k: ``[B, Hkv, P, D]`` post-RoPE keys (any strides with a contiguous last dim).
    :param v: ``[B, Hkv, P, D]`` values.
    :param mask: from :meth:`AttentionMask.build` for this (S, P).
    :returns: ``[B, S, H * D]`` head-major per token.
    """
    b, s, h, d = q.shape
    hkv = k.shape[1]
    if mask.layout is QueryLayout.HEADS:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask.bias,
                                             enable_gqa=hkv != h)
        return out.transpose(1, 2).reshape(b, s, h * d)
    qf = fold_queries(q, hkv)
    use_matmul = _matmul_short_queries
    if use_matmul is None:
        use_matmul = qf.is_cuda and torch.compiler.is_compiling()
    if use_matmul:
        out = matmul_attention(qf, k, v, mask.bias)
    else:
        out = F.scaled_dot_product_attention(qf, k, v, attn_mask=mask.bias)
    return unfold_queries(out, s)


def fold_queries(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """
    Lay the ``G = H / Hkv`` query heads of each kv head out as ``G * S`` rows of that head.

    The FOLDED layout (:class:`QueryLayout`): row ``g * S + s`` is query head ``kv * G + g``
    of token ``s`` (G-major, as :meth:`AttentionMask.build` lays out a folded bias).

    :param q: ``[B, S, H, D]``.
    :returns: ``[B, Hkv, G * S, D]`` (a copy unless S or G is 1).
    """
    b, s, h, d = q.shape
    g = h // num_kv_heads
    return q.view(b, s, num_kv_heads, g, d).permute(0, 2, 3, 1, 4).reshape(
        b, num_kv_heads, g * s, d)


def unfold_queries(out: torch.Tensor, num_queries: int) -> torch.Tensor:
    """
    Return attention outputs of :func:`fold_queries`' rows per token, head-major.

    :param out: ``[B, Hkv, G * S, D]``.
    :param num_queries: S.
    :returns: ``[B, S, H * D]``.
    """
    b, hkv, rows, d = out.shape
    g, s = rows // num_queries, num_queries
    return out.view(b, hkv, g, s, d).permute(0, 3, 1, 2, 4).reshape(b, s, hkv * g * d)


def matmul_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     bias: torch.Tensor) -> torch.Tensor:
    """
    ``softmax(q k^T / sqrt(D) + bias) v`` as two matrix products, logits in float32.

    Equal to ``F.scaled_dot_product_attention(q, k, v, attn_mask=bias)`` up to the rounding
    of the probabilities to ``v.dtype`` (which the fused kernels do too).

    :param q: ``[B, Hkv, R, D]`` query rows.
    :param k: ``[B, Hkv, P, D]`` keys; ``v`` alike.
    :param bias: additive bias broadcastable to ``[B, Hkv, R, P]`` (``-inf`` where masked).
    :returns: ``[B, Hkv, R, D]`` in ``v.dtype``.
    """
    scale = q.shape[-1] ** -0.5
    logits = torch.matmul(q.float() * scale, k.float().transpose(-1, -2)) + bias
    return torch.matmul(torch.softmax(logits, dim=-1).to(v.dtype), v)


__all__ = [
    'AdaRMSNorm', 'AttentionMask', 'GeGLU', 'MASK_ALIGN', 'QueryLayout', 'RMSNorm', 'apply_rope',
    'attention', 'fold_queries', 'gated_residual', 'matmul_attention', 'matmul_short_queries',
    'rms_normalize', 'rope_cos_sin', 'unfold_queries',
]
