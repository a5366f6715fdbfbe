"""
One Gemma expert of the Mixture-of-Transformers: the VLM expert or the action expert.

Both experts run the same layer routine with their own weights
(``docs/model.md#mixture-of-transformers-attention-and-masks``): a layer is split in two halves
around the attention so that the caller decides which keys and values the queries see: only
its own tokens (prefill), a cached prefix plus its own tokens (denoise, decode), or the
concatenation of both experts' tokens (``reference.joint_forward``).
"""

from __future__ import annotations

import enum

from oxygen_ros.config import GemmaConfig
from oxygen_ros.model.layers import AdaRMSNorm, apply_rope, gated_residual, GeGLU, RMSNorm
from oxygen_ros.model.lora import RowLoRA

import torch
from torch import nn


class NormKind(enum.Enum):
    """
    Which norm an expert uses.

    ``docs/model.md#vlm-expert`` (RMS) and ``docs/model.md#π05-specifics`` (adaptive).
    """

    RMS = 'rms'
    """Plain Gemma RMSNorm with a learned ``(1 + w)`` scale (VLM expert)."""
    ADAPTIVE = 'adaptive'
    """adaRMSNorm conditioned on the flow-matching time (π0.5 action expert)."""


class GemmaLayer(nn.Module):
    """
    Pre-norm decoder layer: attention then GeGLU MLP, each with a (gated) residual.

    Q, K and V are one fused projection ``[(H + 2 Hkv) D, W]`` (split in ``weights.py``); the
    width need not equal ``H * D``.
    """

    def __init__(self, cfg: GemmaConfig, norm: NormKind, eps: float) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        if norm is NormKind.RMS:
            self.input_norm: RMSNorm | AdaRMSNorm = RMSNorm(cfg.width, eps)
            self.post_norm: RMSNorm | AdaRMSNorm = RMSNorm(cfg.width, eps)
        else:
            self.input_norm = AdaRMSNorm(cfg.width, cfg.width, eps)
            self.post_norm = AdaRMSNorm(cfg.width, cfg.width, eps)
        qkv_out = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.qkv = nn.Linear(cfg.width, qkv_out, bias=False)
        self.o = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.width, bias=False)
        self.mlp = GeGLU(cfg.width, cfg.mlp_dim)

    def project_qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    modulation: torch.Tensor | None = None, lora: RowLoRA | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """
        First half of the layer: input norm, Q/K/V projection, RoPE on Q and K.

        :param x: ``[B, S, W]`` residual stream.
        :param cos: ``float32 [B, S, D/2]`` from ``layers.rope_cos_sin``.
        :param sin: same shape as ``cos``.
        :param modulation: ``[B or 1, 3W]`` adaRMS modulation of the input norm (adaptive only).
        :param lora: a suffix LoRA on the rows it selects (``model/lora.py``), or None.
        :returns: ``q [B, S, H, D]``, ``k [B, S, Hkv, D]``, ``v [B, S, Hkv, D]`` (q and k
            post-RoPE; q is not pre-scaled) and the residual gate of the attention branch.
        """
        b, s, _ = x.shape
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        y, gate = self.input_norm(x, modulation)
        qkv = self.qkv(y)
        if lora is not None:
            qkv = qkv + lora.qkv(y)
        q, k, v = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
        q = apply_rope(q.view(b, s, h, d), cos, sin)
        k = apply_rope(k.view(b, s, hkv, d), cos, sin)
        return q, k, v.view(b, s, hkv, d), gate

    def finish(self, x: torch.Tensor, attn: torch.Tensor, gate: torch.Tensor | None,
               modulation: torch.Tensor | None = None,
               lora: RowLoRA | None = None) -> torch.Tensor:
        """
        Second half: output projection, residual, post-attention norm, MLP, residual.

        :param x: ``[B, S, W]`` residual stream that entered :meth:`project_qkv`.
        :param attn: ``[B, S, H * D]`` attention output.
        :param gate: the gate returned by :meth:`project_qkv`.
        :param modulation: ``[B or 1, 3W]`` adaRMS modulation of the post-attention norm.
        :param lora: as :meth:`project_qkv`.
        :returns: ``[B, S, W]`` residual stream after the layer.
        """
        o = self.o(attn)
        if lora is not None:
            o = o + lora.o(attn)
        x = gated_residual(x, o, gate)
        y, gate2 = self.post_norm(x, modulation)
        return gated_residual(x, self.mlp(y, lora), gate2)


class GemmaExpert(nn.Module):
    """
    A stack of :class:`GemmaLayer` plus the final norm.

    No embedding: π0.5 keeps the token embedding in ``Pi05Model``; the action expert has none.
    """

    def __init__(self, cfg: GemmaConfig, norm: NormKind, eps: float) -> None:
        super().__init__()
        self.cfg = cfg
        self.norm_kind = norm
        self.layers = nn.ModuleList(GemmaLayer(cfg, norm, eps) for _ in range(cfg.depth))
        if norm is NormKind.RMS:
            self.final_norm: RMSNorm | AdaRMSNorm = RMSNorm(cfg.width, eps)
        else:
            self.final_norm = AdaRMSNorm(cfg.width, cfg.width, eps)

    def modulations(self, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """
        Return every adaRMS modulation of the adaptive expert for a time condition.

        :param cond: ``[..., W]`` output of the time MLP.
        :returns: ``(input [L, ..., 3W], post [L, ..., 3W], final [..., 3W])``.
        :raises ValueError: if this expert uses plain RMSNorm.
        """
        if self.norm_kind is not NormKind.ADAPTIVE:
            raise ValueError('modulations() needs an expert with adaptive norms')
        inputs = torch.stack([layer.input_norm.modulation(cond) for layer in self.layers])
        posts = torch.stack([layer.post_norm.modulation(cond) for layer in self.layers])
        return inputs, posts, self.final_norm.modulation(cond)


__all__ = ['GemmaExpert', 'GemmaLayer', 'NormKind']
