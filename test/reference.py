"""
Uncached reference forwards: the ground truth that the cached entry points must match.

These follow openpi's training-style computation (``pi0.py compute_loss`` /
``sample_actions`` without a cache): the prefix keeps its fixed slots (invalid tokens stay,
masked), ONE Mixture-of-Transformers pass runs both experts over ``[prefix ; suffix]`` with
one 2-D mask from the ar-mask rule, and attention is computed eagerly (float32 logits, masked
logits set to openpi's -2.3819763e38, softmax in float32). Slow by design: the tests' ground
truth, used by nothing in ``oxygen_ros/``.
"""

from __future__ import annotations

from oxygen_ros.model.layers import rope_cos_sin
from oxygen_ros.model.masks import make_attn_mask
from oxygen_ros.model.pi05 import Pi05Model
from oxygen_ros.model.prefix import padded_prefix

import torch
from torch import nn


MASKED_LOGIT = -2.3819763e38
"""openpi's fill value for masked attention logits (a fully masked row becomes uniform)."""


def suffix_ar(horizon: int, device: torch.device | str = 'cpu') -> torch.Tensor:
    """
    Return the ar flags of the π0.5 action suffix: ``[1, 0, ..., 0]`` (int64 ``[H]``).

    Actions see the whole valid prefix and each other; the prefix never sees them.
    """
    ar = torch.zeros(horizon, dtype=torch.int64, device=device)
    ar[0] = 1
    return ar


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
    """
    Attention written out: ``softmax(q k^T / sqrt(D), masked) v`` with fp32 logits.

    :param q: ``[B, S, H, D]``; ``k``, ``v``: ``[B, P, Hkv, D]``.
    :param mask: ``bool [B, S, P]``.
    :returns: ``[B, S, H * D]`` in v.dtype.
    """
    b, s, h, d = q.shape
    groups = h // k.shape[2]
    k = k.repeat_interleave(groups, dim=2)
    v = v.repeat_interleave(groups, dim=2)
    logits = torch.einsum('bqhd,bkhd->bhqk', q.float(), k.float()) * d ** -0.5
    logits = logits.masked_fill(~mask[:, None], MASKED_LOGIT)
    probs = torch.softmax(logits, dim=-1).to(v.dtype)
    return torch.einsum('bhqk,bkhd->bqhd', probs, v).reshape(b, s, h * d)


def joint_forward(model: Pi05Model, prefix_embeds: torch.Tensor, prefix_valid: torch.Tensor,
                  prefix_ar: torch.Tensor, suffix_embeds: torch.Tensor | None = None,
                  suffix_valid: torch.Tensor | None = None,
                  suffix_ar_flags: torch.Tensor | None = None,
                  cond: torch.Tensor | None = None, suffix_layers: nn.ModuleList | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """
    One Mixture-of-Transformers pass over ``[prefix ; suffix]`` (openpi ``pi0.py``, ``gemma.py``).

    ``docs/model.md#mixture-of-transformers-attention-and-masks``.

    Each expert applies its own norms and projections to its own tokens; Q/K/V are
    concatenated along the sequence, RoPE uses positions ``cumsum(valid) - 1`` over the joint
    sequence, one attention with the ar-mask rule, outputs split back per expert.

    :param model: the model whose ``vlm`` and ``expert`` weights are used.
    :param prefix_embeds: ``[B, Pp, W_vlm]`` VLM-expert tokens.
    :param prefix_valid: ``bool [B, Pp]``.
    :param prefix_ar: ``int [B, Pp]``.
    :param suffix_embeds: ``[B, S, W_expert]`` action-expert tokens, or None (VLM only).
    :param suffix_valid: ``bool [B, S]``.
    :param suffix_ar_flags: ``int [B, S]`` or ``[S]``.
    :param cond: ``[B, W_expert]`` adaRMS condition (time MLP output).
    :param suffix_layers: run the suffix through these plain-RMSNorm layers instead of the
        action expert (``cond`` None): VLM tokens with other weights, e.g. a LoRA merged in.
    :returns: final hidden states before the final norms: ``([B, Pp, W_vlm], [B, S, W_exp]
        or None)``.
    """
    b, pp, _ = prefix_embeds.shape
    valid, ar = prefix_valid.to(torch.bool), prefix_ar.to(torch.int64)
    if suffix_embeds is not None:
        s_ar = torch.as_tensor(suffix_ar_flags, device=valid.device).expand(b, -1)
        valid = torch.cat([valid, suffix_valid.to(torch.bool)], 1)
        ar = torch.cat([ar, s_ar.to(torch.int64)], 1)
    mask = make_attn_mask(valid, ar)
    positions = torch.cumsum(valid.to(torch.int64), dim=1) - 1
    cos, sin = rope_cos_sin(positions, model.cfg.vlm.head_dim, model.cfg.rope_base)
    hp, hs = prefix_embeds, suffix_embeds
    for lp, ls in zip(model.vlm.layers, model.expert.layers if suffix_layers is None
                      else suffix_layers):
        qp, kp, vp, _ = lp.project_qkv(hp, cos[:, :pp], sin[:, :pp])
        if hs is None:
            hp = lp.finish(hp, eager_attention(qp, kp, vp, mask), None)
            continue
        mod_in = mod_post = None
        if cond is not None:
            mod_in, mod_post = ls.input_norm.modulation(cond), ls.post_norm.modulation(cond)
        qs, ks, vs, gate = ls.project_qkv(hs, cos[:, pp:], sin[:, pp:], mod_in)
        out = eager_attention(torch.cat([qp, qs], 1), torch.cat([kp, ks], 1),
                              torch.cat([vp, vs], 1), mask)
        hp = lp.finish(hp, out[:, :pp], None)
        hs = ls.finish(hs, out[:, pp:], gate, mod_post)
    return hp, hs


@torch.no_grad()
def reference_sample_actions(model: Pi05Model, image_embeds: torch.Tensor | None,
                             image_mask: torch.Tensor | None, tokens: torch.Tensor,
                             token_mask: torch.Tensor, noise: torch.Tensor, *,
                             num_steps: int | None = None) -> torch.Tensor:
    """
    Sample actions recomputing the full joint forward at every Euler step, no cache.

    Same arguments and result as ``prefill`` + ``denoise`` (``docs/model.md#flow-matching``): t
    from 1 to 0, ``dt = -1/N`` accumulated in float32, x float32, suffix ar ``[1, 0, ...]``.

    :returns: ``float32 [B, H, A]``.
    """
    n = model.cfg.num_denoise_steps if num_steps is None else num_steps
    pe, pv, pa = padded_prefix(model, tokens, token_mask, image_embeds, image_mask)
    b, horizon, _ = noise.shape
    s_valid = torch.ones(b, horizon, dtype=torch.bool, device=noise.device)
    s_ar = suffix_ar(horizon, noise.device)
    dt = torch.tensor(-1.0 / n, dtype=torch.float32, device=noise.device)
    t = torch.tensor(1.0, dtype=torch.float32, device=noise.device)
    x = noise.to(torch.float32)
    for _ in range(n):
        cond = model.time_condition(t.expand(b))
        se = model.embed_actions(x)
        _, hs = joint_forward(model, pe, pv, pa, se, s_valid, s_ar, cond)
        hs, _ = model.expert.final_norm(hs, model.expert.final_norm.modulation(cond))
        x = x + dt * model.project_actions(hs)
        t = t + dt
    return x


@torch.no_grad()
def reference_text_logits(model: Pi05Model, image_embeds: torch.Tensor | None,
                          image_mask: torch.Tensor | None, tokens: torch.Tensor,
                          token_mask: torch.Tensor, generated: torch.Tensor, *,
                          generated_layers: nn.ModuleList | None = None) -> torch.Tensor:
    """
    Full-sequence text forward: prefix (prefix-LM) + generated tokens (causal, ar=1).

    The generated tokens may be a causal suffix (OxyGen's ``Memory: `` seed, a question)
    followed by decoded tokens: the mask is the same (ar = 1 after the prefix).

    :param generated: ``int64 [B, G]`` tokens appended after the prefix (G may be 0).
    :param generated_layers: VLM layers for the generated tokens only (the prefix keeps the
        model's), e.g. ``SuffixLoRA.merged``: OxyGen's suffix-only LoRA as merged weights.
    :returns: ``float32 [B, G + 1, V]``: logits at the last valid prefix token, then at each
        generated token, i.e. the prediction of generated token 0 .. G.
    """
    pe, pv, pa = padded_prefix(model, tokens, token_mask, image_embeds, image_mask)
    b, pp = pv.shape
    g = generated.shape[1]
    ge = model.embed_text(generated)
    ones = torch.ones(b, g, dtype=torch.int64, device=pv.device)
    last = (torch.arange(pp, device=pv.device) * pv).argmax(1)
    if generated_layers is None:
        hidden, _ = joint_forward(model, torch.cat([pe, ge], 1),
                                  torch.cat([pv, ones.bool()], 1), torch.cat([pa, ones], 1))
        rows = torch.cat([hidden[torch.arange(b), last][:, None], hidden[:, pp:]], 1)
    else:
        hp, hg = joint_forward(model, pe, pv, pa, ge, ones.bool(), ones,
                               suffix_layers=generated_layers)
        rows = torch.cat([hp[torch.arange(b), last][:, None], hg], 1)
    return model.lm_logits(rows)


__all__ = ['eager_attention', 'joint_forward', 'reference_sample_actions',
           'reference_text_logits']
