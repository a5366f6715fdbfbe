"""
Norm weights folded into the following linear: a graph simplification of the VLM expert.

A Gemma RMSNorm scales the normalized input by ``(1 + w)`` before the Q/K/V projection (input
norm) and before the gated MLP (post-attention norm), so ``W (x̂ ⊙ (1 + w)) = (W diag(1 + w))
x̂``: the scale moves into the weight columns once, and each norm at run time is the bare
``x̂`` (one multiply kernel fewer per norm; realtime-vla, arXiv 2510.26742, does the same).
Q, K and V are one fused projection already (``GemmaLayer.qkv``, fused at load by
``weights.py``).

Precision: ``W diag(1 + w)`` is computed in float32 from the float32 norm weight (openpi keeps
it float32 in a 16-bit model: ``docs/model.md#precision``) and rounded once to the weight
dtype. In float32 the folded layer equals the original to rounding (tests: 1e-5); in bfloat16
it rounds at another point than openpi (the weight, not the activation), a difference of the
size of bfloat16's own, which the backends' parity gate measures against a float32 run.

The folded weights are new tensors (the model is untouched and still runs unfolded), so they
cost memory: in the full-size VLM expert 1.3 G parameters (2.6 GB in bfloat16).
"""

from __future__ import annotations

from oxygen_ros.model.gemma import GemmaLayer
from oxygen_ros.model.layers import apply_rope, rms_normalize, RMSNorm
from oxygen_ros.model.lora import RowLoRA, SuffixLoRA

import torch
from torch import nn
import torch.nn.functional as F  # noqa: N812


def fold_scale(weight: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    """
    Return ``weight diag(1 + norm.weight)`` in ``weight``'s dtype, computed in float32.

    :param weight: ``[out, W]`` a linear weight reading the norm's output.
    """
    return (weight.float() * (1.0 + norm.weight.float())[None, :]).to(weight.dtype)


class FoldedGemmaLayer(nn.Module):
    """
    A plain-RMSNorm :class:`GemmaLayer` with both norm scales folded into its linears.

    Same ``project_qkv`` / ``finish`` interface and results as the layer it is built from.
    The output projection and the MLP's down projection are the original modules (shared).

    :raises ValueError: the layer uses adaptive norms (their scale depends on t), or its
        Q/K/V or gate/up projection is no ``nn.Linear`` (e.g. FP8 weights).
    """

    def __init__(self, layer: GemmaLayer) -> None:
        super().__init__()
        if not isinstance(layer.input_norm, RMSNorm) or not isinstance(layer.post_norm,
                                                                       RMSNorm):
            raise ValueError('only plain RMSNorm layers can be folded (adaRMS scales depend on '
                             'the flow-matching time)')
        if not isinstance(layer.qkv, nn.Linear) or not isinstance(layer.mlp.gate_up, nn.Linear):
            raise ValueError(f'only nn.Linear weights can take a norm scale, not '
                             f'{type(layer.qkv).__name__} (FP8 weights are not folded)')
        self.num_heads, self.num_kv_heads, self.head_dim = (
            layer.num_heads, layer.num_kv_heads, layer.head_dim)
        self.eps = layer.input_norm.eps
        with torch.no_grad():
            self.register_buffer('qkv_weight', fold_scale(layer.qkv.weight, layer.input_norm))
            self.register_buffer('gate_up_weight',
                                 fold_scale(layer.mlp.gate_up.weight, layer.post_norm))
        self.o = layer.o
        self.down = layer.mlp.down

    def project_qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    modulation: None = None, lora: RowLoRA | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        """
        Return q, k (post-RoPE), v and no gate, as ``GemmaLayer.project_qkv``.

        ``lora`` must come from a folded adapter (``SuffixLoRA.folded``): its ``A`` carries the
        norm scale too.
        """
        b, s, _ = x.shape
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        y = rms_normalize(x, self.eps).to(x.dtype)
        qkv = F.linear(y, self.qkv_weight)
        if lora is not None:
            qkv = qkv + lora.qkv(y)
        q, k, v = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
        q = apply_rope(q.view(b, s, h, d), cos, sin)
        k = apply_rope(k.view(b, s, hkv, d), cos, sin)
        return q, k, v.view(b, s, hkv, d), None

    def finish(self, x: torch.Tensor, attn: torch.Tensor, gate: None = None,
               modulation: None = None, lora: RowLoRA | None = None) -> torch.Tensor:
        """Return the layer output, as ``GemmaLayer.finish`` (o-proj, residual, MLP, residual)."""
        o = self.o(attn)
        x = x + (o if lora is None else o + lora.o(attn))
        y = rms_normalize(x, self.eps).to(x.dtype)
        gate_up = F.linear(y, self.gate_up_weight)
        if lora is not None:
            gate_up = gate_up + lora.gate_up(y)
        g, u = gate_up.chunk(2, dim=-1)
        h = F.gelu(g, approximate='tanh') * u
        return x + (self.down(h) if lora is None else self.down(h) + lora.down(h))


def fold_layers(layers: nn.ModuleList) -> nn.ModuleList:
    """Return a :class:`FoldedGemmaLayer` for each plain-RMSNorm layer of ``layers``."""
    return nn.ModuleList(FoldedGemmaLayer(layer) for layer in layers)


def fold_adapter(adapter: SuffixLoRA, layers: nn.ModuleList) -> SuffixLoRA:
    """
    Return the suffix LoRA for the folded copies of ``layers`` (the unfolded VLM layers).

    A folded layer feeds the bare ``x̂`` to its Q/K/V and gate/up projections, so the
    adapter's ``A`` of those takes the norm scale ``(1 + w)`` as the weights did.
    """
    return adapter.folded([1.0 + layer.input_norm.weight.float() for layer in layers],
                          [1.0 + layer.post_norm.weight.float() for layer in layers])


__all__ = ['FoldedGemmaLayer', 'fold_adapter', 'fold_layers', 'fold_scale']
