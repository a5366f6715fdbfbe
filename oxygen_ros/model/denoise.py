"""
The action expert on a cached prefix: the flow-matching velocity and the Euler loop.

π0.5 samples an action chunk by integrating ``dx/dt = v(x, t)`` from t = 1 (noise) to t = 0
with ``N`` Euler steps (openpi ``src/openpi/models/pi0.py`` ``sample_actions``;
``docs/model.md#flow-matching``). Each velocity runs only the action expert over the H suffix
tokens, which attend the valid prefix tokens (their K/V read from the cache, never written) and
each other (``docs/model.md#the-kv-cache``). The flow-matching time enters only through the
adaRMS modulations, which depend on t alone (``docs/model.md#π05-specifics``).

:func:`denoise_context` gathers the prefix K/V once per chunk; :func:`velocity` is one
evaluation of ``v(x_t, t)`` for any t, with autograd if the caller enables it (guided
denoising such as real-time chunking takes a gradient through it at every Euler step);
:func:`euler_loop` integrates with the modulations of the N fixed Euler times computed
beforehand (:func:`time_modulations`; the fast path computes them once per model load).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from oxygen_ros.config import ModelConfig
from oxygen_ros.model.flow import euler_times
from oxygen_ros.model.gemma import GemmaExpert
from oxygen_ros.model.layers import (
    attention, AttentionMask, fold_queries, QueryLayout, rope_cos_sin, unfold_queries)

import torch

Modulations = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""adaRMS modulations ``(input norms [L, ..., 3W], post-attention norms [L, ..., 3W], final
norm [..., 3W])``, as ``GemmaExpert.modulations`` returns them."""


class ActionExpertModel(Protocol):
    """What the denoise functions need of a model (``Pi05Model`` is one)."""

    cfg: ModelConfig
    expert: GemmaExpert

    @property
    def dtype(self) -> torch.dtype:
        """Activation dtype."""

    def time_condition(self, t: torch.Tensor) -> torch.Tensor:
        """Return the adaRMS condition of flow-matching times ``float32 [M]``: ``[M, W]``."""

    def embed_actions(self, x_t: torch.Tensor) -> torch.Tensor:
        """Return ``action_in_proj(x_t)`` in the activation dtype: ``[B, H, W]``."""

    def project_actions(self, hidden: torch.Tensor) -> torch.Tensor:
        """Return ``action_out_proj(hidden)`` in float32: ``[B, H, A]``."""


@dataclass(frozen=True, slots=True)
class DenoiseContext:
    """
    The prefix side of every velocity evaluation of one action chunk.

    :ivar keys: one ``[B, Hkv, P + H, D]`` tensor per layer, model dtype: the prefix keys
        (post-RoPE) at ``[:, :, :P]``; every :func:`velocity` overwrites ``[:, :, P:]`` with
        the suffix keys (one tensor per layer, not views of one: autograd through a call
        then works; a later call overwrites what the previous call's graph saved). With
        ``split``: ``[B, Hkv, P, D]``, the prefix only (any float dtype: the guided call
        passes float32 keys, converted once per chunk).
    :ivar values: the values, laid out as ``keys``.
    :ivar mask: H queries over P + H keys: the valid prefix tokens and every suffix token.
    :ivar cos: ``float32 [B, H, D/2]`` RoPE of the suffix positions ``num_tokens + arange(H)``.
    :ivar sin: same shape as ``cos``.
    :ivar prefix_len: P, prefix slots (padding included).
    :ivar split: a velocity attends the prefix K/V and the suffix's own K/V apart
        (:func:`split_prefix_attention`) and writes nothing in place (what ``torch.func``
        transforms need: the guided denoise takes its vector-Jacobian product with
        ``torch.func.vjp``); same values up to summation order.
    """

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    mask: AttentionMask
    cos: torch.Tensor
    sin: torch.Tensor
    prefix_len: int
    split: bool = False

    @property
    def horizon(self) -> int:
        return self.cos.shape[1]


def denoise_context(model: ActionExpertModel, k_pool: torch.Tensor, v_pool: torch.Tensor,
                    slots: torch.Tensor, mask: torch.Tensor, num_tokens: torch.Tensor,
                    horizon: int) -> DenoiseContext:
    """
    Gather a cached prefix for the action expert (no host sync).

    :param k_pool: ``[L, num_slots, Hkv, D]`` the VLM expert's keys (``KVCache.k``).
    :param v_pool: the values, same shape.
    :param slots: ``int64 [B, P]`` slot of each prefix position (padding: any valid slot).
    :param mask: ``bool [B, P]`` True for real prefix tokens.
    :param num_tokens: ``int64 [B]`` real prefix tokens (the first suffix position).
    :param horizon: H, action tokens.
    :returns: the context; its buffers are in the model dtype on the pool's device.
    """
    ex = model.cfg.expert
    b, p = slots.shape
    dev = k_pool.device
    gathered = [pool.index_select(1, slots.reshape(-1)).view(ex.depth, b, p, ex.num_kv_heads,
                                                             ex.head_dim)
                for pool in (k_pool, v_pool)]
    buffers: list[list[torch.Tensor]] = [[], []]
    for src, out in zip(gathered, buffers):
        for i in range(ex.depth):
            buf = torch.empty(b, ex.num_kv_heads, p + horizon, ex.head_dim, dtype=model.dtype,
                              device=dev)
            buf[:, :, :p] = src[i].transpose(1, 2)
            out.append(buf)
    allowed = torch.cat([mask[:, None, :].expand(b, horizon, p),
                         torch.ones(b, horizon, horizon, dtype=torch.bool, device=dev)], 2)
    amask = AttentionMask.build(allowed, ex.num_heads, ex.num_kv_heads, model.dtype)
    positions = num_tokens[:, None] + torch.arange(horizon, device=dev)
    cos, sin = rope_cos_sin(positions, ex.head_dim, model.cfg.rope_base)
    return DenoiseContext(tuple(buffers[0]), tuple(buffers[1]), amask, cos, sin, p)


def time_modulations(model: ActionExpertModel, times: torch.Tensor) -> Modulations:
    """
    Return the adaRMS modulations of flow-matching times (``docs/model.md#π05-specifics``).

    :param times: ``float32 [M]``.
    :returns: ``([L, M, 3W], [L, M, 3W], [M, 3W])`` in the dtype of the adaRMS ``Dense``.
    """
    return model.expert.modulations(model.time_condition(times))


def euler_modulations(model: ActionExpertModel, num_steps: int,
                      device: torch.device | str) -> Modulations:
    """Return :func:`time_modulations` of the ``num_steps`` Euler times (``flow.euler_times``)."""
    return time_modulations(model, euler_times(num_steps).to(device))


def euler_step_modulations(model: ActionExpertModel, num_steps: int,
                           device: torch.device | str) -> list[Modulations]:
    """Return :func:`euler_modulations` per step, each contiguous (computed without grad)."""
    with torch.no_grad():
        mod_in, mod_post, mod_final = euler_modulations(model, num_steps, device)
    return [(mod_in[:, s].contiguous(), mod_post[:, s].contiguous(), mod_final[s].contiguous())
            for s in range(num_steps)]


def expert_velocity(model: ActionExpertModel, ctx: DenoiseContext, x_t: torch.Tensor,
                    mod_in: torch.Tensor, mod_post: torch.Tensor,
                    mod_final: torch.Tensor) -> torch.Tensor:
    """
    Return ``v(x_t)`` for given adaRMS modulations (the time already folded into them).

    :param x_t: ``float [B, H, A]`` the noisy action chunk.
    :param mod_in: ``[L, B or 1, 3W]`` or ``[L, 3W]`` modulations of the input norms.
    :param mod_post: the same for the post-attention norms.
    :param mod_final: ``[B or 1, 3W]`` or ``[3W]`` of the final norm.
    :returns: ``float32 [B, H, A]`` (``action_out_proj`` in float32, as openpi).
    """
    p = ctx.prefix_len
    h = model.embed_actions(x_t)
    for i, layer in enumerate(model.expert.layers):
        q, k, v, gate = layer.project_qkv(h, ctx.cos, ctx.sin, mod_in[i])
        if ctx.split:
            attn = split_prefix_attention(q, k, v, ctx.keys[i], ctx.values[i], ctx.mask)
        else:
            ctx.keys[i][:, :, p:] = k.transpose(1, 2)
            ctx.values[i][:, :, p:] = v.transpose(1, 2)
            attn = attention(q, ctx.keys[i], ctx.values[i], ctx.mask)
        h = layer.finish(h, attn, gate, mod_post[i])
    h, _ = model.expert.final_norm(h, mod_final)
    return model.project_actions(h)


def split_prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           prefix_keys: torch.Tensor, prefix_values: torch.Tensor,
                           mask: AttentionMask) -> torch.Tensor:
    """
    Attention of the suffix over the prefix and itself, the prefix K/V kept apart.

    ``softmax([q Kp^T | q Ks^T] / sqrt(D) + bias) [Vp; Vs] = P_p Vp + P_s Vs``: one softmax
    over both blocks of logits (float32, as ``layers.matmul_attention``), the probabilities
    cast to the value dtype, two products summed. It equals :func:`layers.attention` over the
    concatenated K/V up to summation order, without the concatenation (a copy of the prefix
    K/V per layer and call); in a vector-Jacobian product in the suffix (RTC's guided step)
    the prefix K/V are constants, so no key or value gradient is formed for their P rows
    (docs/gpu.md, "RTC on the fast path").

    :param q: ``[B, S, H, D]`` post-RoPE suffix queries.
    :param k: ``[B, S, Hkv, D]`` post-RoPE suffix keys (``GemmaLayer.project_qkv``).
    :param v: ``[B, S, Hkv, D]`` suffix values.
    :param prefix_keys: ``[B, Hkv, P, D]``, any float dtype (converted to float32 here: pass
        float32 to convert once per chunk).
    :param prefix_values: ``[B, Hkv, P, D]`` in the dtype of ``v``.
    :param mask: S queries over P + S keys (prefix first), as :func:`denoise_context` builds.
    :returns: ``[B, S, H * D]`` in the dtype of ``v``.
    """
    s, h, d = q.shape[1:]
    hkv, p = prefix_keys.shape[1], prefix_keys.shape[2]
    bias = mask.bias
    if mask.layout is QueryLayout.HEADS and h != hkv:   # one bias row per folded query row
        bias = bias.repeat(1, 1, h // hkv, 1)
    qf = fold_queries(q, hkv).float() * d ** -0.5
    keys = k.transpose(1, 2).float()
    logits = torch.cat([torch.matmul(qf, prefix_keys.float().transpose(-1, -2)),
                        torch.matmul(qf, keys.transpose(-1, -2))], -1) + bias
    probs = torch.softmax(logits, dim=-1).to(v.dtype)
    out = torch.matmul(probs[..., :p], prefix_values) + \
        torch.matmul(probs[..., p:], v.transpose(1, 2))
    return unfold_queries(out, s)


def velocity(model: ActionExpertModel, ctx: DenoiseContext, x_t: torch.Tensor,
             t: torch.Tensor | float) -> torch.Tensor:
    """
    Return the flow-matching velocity ``v(x_t, t)`` of the action expert (eager).

    Differentiable: under ``torch.enable_grad()`` with ``x_t.requires_grad`` the result has
    a graph back to ``x_t`` (build ``ctx`` outside ``torch.inference_mode``). Take the
    gradient before the next call on the same ``ctx``: that call overwrites its buffers.

    :param ctx: from :func:`denoise_context`.
    :param x_t: ``float [B, H, A]``.
    :param t: flow-matching time(s), 1 = noise, 0 = data: a float or ``float32 [B]``.
    :returns: ``float32 [B, H, A]``.
    :raises ValueError: ``x_t`` does not match the context's batch and horizon.
    """
    b = ctx.cos.shape[0]
    if x_t.dim() != 3 or x_t.shape[0] != b or x_t.shape[1] != ctx.horizon:
        raise ValueError(f'x_t must be [{b}, {ctx.horizon}, A], got {tuple(x_t.shape)}')
    times = torch.as_tensor(t, dtype=torch.float32, device=x_t.device).reshape(-1)
    mod_in, mod_post, mod_final = time_modulations(model, times.expand(b))
    return expert_velocity(model, ctx, x_t, mod_in, mod_post, mod_final)


def euler_loop(model: ActionExpertModel, ctx: DenoiseContext, noise: torch.Tensor,
               mods: Modulations) -> torch.Tensor:
    """
    Integrate from t = 1 to 0: ``x += dt * v(x, t_k)``, ``dt = -1 / N`` (openpi ``pi0.py``).

    :param noise: ``float [B, H, A]`` x at t = 1.
    :param mods: :func:`euler_modulations` of N steps: ``[L, N, 3W]``, ``[L, N, 3W]``,
        ``[N, 3W]``.
    :returns: ``float32 [B, H, A]`` x at t = 0 (x and dt in float32, as openpi).
    """
    mod_in, mod_post, mod_final = mods
    n = mod_final.shape[0]
    dt = torch.tensor(-1.0 / n, dtype=torch.float32).item()  # the float32 value
    x = noise.to(torch.float32)
    for step in range(n):
        x = x + dt * expert_velocity(model, ctx, x, mod_in[:, step], mod_post[:, step],
                                     mod_final[step])
    return x


__all__ = ['ActionExpertModel', 'DenoiseContext', 'Modulations', 'denoise_context',
           'euler_loop', 'euler_modulations', 'euler_step_modulations', 'expert_velocity',
           'split_prefix_attention', 'time_modulations', 'velocity']
