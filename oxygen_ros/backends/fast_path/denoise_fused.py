"""
The action expert's velocity on the fused Triton kernels: what the fast path's denoise runs.

The same function as ``denoise.expert_velocity`` (one evaluation of ``v(x_t)`` for given
adaRMS modulations), built so that each layer-step is a fixed, short list of kernels instead
of what a compiler makes of some forty eager operations:

==========================  ===============================================================
kernel                      work
==========================  ===============================================================
Q/K/V GEMM                  ``layer.qkv`` (one fused projection, ``weights.py``)
attention (2 launches)      ``kernels/paged_decode.py``: the prefix K/V read in place from
                            the pool by slot (nothing gathered per call), the H action
                            tokens among themselves (``causal=False``: every valid action
                            token sees every other, as ``denoise_context``'s mask), q and k
                            rotated by RoPE as they are loaded (straight from the Q/K/V
                            output, no RoPE kernel, no copy of the suffix K/V)
O GEMM                      ``layer.o``
residual + norm             ``kernels/adarms.py``: ``x += o * gate``, then the
                            post-attention adaRMS norm: the gate/up GEMM's input
gate/up GEMM, GeGLU, down   ``layer.mlp`` (gate and up one GEMM; GeGLU one pointwise kernel)
residual + norm             ``x += mlp * gate``, then the next layer's input norm (or the
                            final norm after the last layer): the next Q/K/V GEMM's input
==========================  ===============================================================

The first layer's input norm is :func:`paged_attention.ada_rms_norm` alone. Results equal
``expert_velocity`` on the gathered prefix (float32: 1e-5; 16 bits: each rounding where the
eager operations round; tests ``test/backends/fast_path/test_denoise_fused.py``).
"""

from __future__ import annotations

from oxygen_ros.backends.fast_path.paged_attention import (
    ada_rms_norm, gated_ada_rms_norm, paged_attention)
from oxygen_ros.model.denoise import ActionExpertModel
from oxygen_ros.model.layers import rope_cos_sin

import torch


def action_tokens(noise: torch.Tensor, num_tokens: torch.Tensor,
                  model: ActionExpertModel) -> tuple[torch.Tensor, ...]:
    """
    Return what :func:`fused_velocity` needs of the action tokens, once per denoise call.

    :param noise: ``[B, H, A]`` (its shape and device only).
    :param num_tokens: ``int64 [B]`` real prefix tokens: the first action token's position.
    :returns: ``(cos, sin, index, valid)``: the RoPE of positions ``num_tokens + arange(H)``
        (``float32 [B, H, D/2]`` each), ``index = arange(H)`` per row (``int64 [B, H]``) and
        ``valid`` (``bool [B, H]``, all True).
    """
    b, horizon = noise.shape[:2]
    index = torch.arange(horizon, device=noise.device).expand(b, horizon)
    cos, sin = rope_cos_sin(num_tokens[:, None] + index, model.cfg.expert.head_dim,
                            model.cfg.rope_base)
    return cos, sin, index, torch.ones(b, horizon, dtype=torch.bool, device=noise.device)


def fused_velocity(model: ActionExpertModel, k_pool: torch.Tensor, v_pool: torch.Tensor,
                   ctx_slots: torch.Tensor, ctx_mask: torch.Tensor, cos: torch.Tensor,
                   sin: torch.Tensor, index: torch.Tensor, valid: torch.Tensor,
                   x_t: torch.Tensor, mod_in: torch.Tensor, mod_post: torch.Tensor,
                   mod_final: torch.Tensor) -> torch.Tensor:
    """
    Return ``v(x_t)`` with the prefix read in place (after ``paged_attention.load_kernel``).

    :param k_pool: ``[L, num_slots, Hkv, D]`` the VLM expert's keys (``KVCache.k``), the
        model's dtype.
    :param v_pool: the values, same shape.
    :param ctx_slots: ``int64 [B, C]`` pool slot of each prefix position (padding: any slot).
    :param ctx_mask: ``bool [B, C]`` True for real prefix tokens.
    :param cos: ``float32 [B, H, D/2]`` RoPE of the action tokens' positions
        (``num_tokens + arange(H)``, ``layers.rope_cos_sin``).
    :param sin: same shape as ``cos``.
    :param index: ``int64 [B, H]`` ``arange(H)``; ``valid`` ``bool [B, H]`` all True: the
        kernel's query index and new-token mask (:func:`action_tokens` makes the four once
        per call, so that no step spends a kernel on them).
    :param x_t: ``float [B, H, A]`` the noisy action chunk.
    :param mod_in: ``[L, 3W]`` or ``[L, B, 3W]`` modulations of the input norms.
    :param mod_post: the same for the post-attention norms.
    :param mod_final: ``[3W]`` or ``[B, 3W]`` of the final norm.
    :returns: ``float32 [B, H, A]``.
    """
    ex = model.cfg.expert
    b, horizon = x_t.shape[:2]
    h, hkv, d = ex.num_heads, ex.num_kv_heads, ex.head_dim
    layers = model.expert.layers
    x = model.embed_actions(x_t)
    y = ada_rms_norm(x, mod_in[0], layers[0].input_norm.eps)
    for i, layer in enumerate(layers):
        q, k, v = layer.qkv(y).view(b, horizon, h + 2 * hkv, d).split([h, hkv, hkv], dim=2)
        attn = paged_attention(q, index, k_pool[i], v_pool[i], ctx_slots, ctx_mask, k, v,
                               valid, cos, sin, causal=False)
        x, y = gated_ada_rms_norm(x, layer.o(attn), mod_in[i], mod_post[i], layer.post_norm.eps)
        last = i == len(layers) - 1
        norm = model.expert.final_norm if last else layers[i + 1].input_norm
        x, y = gated_ada_rms_norm(x, layer.mlp(y), mod_post[i],
                                  mod_final if last else mod_in[i + 1], norm.eps)
    return model.project_actions(y)


__all__ = ['action_tokens', 'fused_velocity']
