"""
The π0.5 computation as five pure-tensor graphs with the KV cache explicit (ONNX / TensorRT).

A graph never writes the KV pool: TensorRT cannot alias an output to an input, and copying
the whole pool out per call would be absurd. Graphs that read cached K/V take the pool
tensors ``k_pool``, ``v_pool`` ``[L, num_slots, Hkv, D]`` as inputs plus slot indices and
gather inside; they output only what is new, which the runner writes into the pool with one
``index_copy_`` (``graph_runner.py``).

=============  ===============================================================================
graph          computation (section of ``docs/model.md``)
=============  ===============================================================================
``vision``     SigLIP + projector: images -> image tokens (vision tower)
``prefill``    VLM expert over [valid cameras' tokens | valid prompt tokens] in the padded
               openpi layout; positions = cumsum(valid) - 1 (masks); K/V of every padded
               token, the prefix mask and the last valid token's hidden state
``decode``     VLM expert over T new text tokens per row that attend a cached context
               (gathered from the pool by slot) and, causally, each other: T = 1 is a
               decode step (the KV cache), B = 1 with T prompt tokens the text prefill on
               a cached image prefix (CAUSAL_TEXT); logits of the last valid token (fp32)
``denoise``    one flow-matching step of the action expert on a cached prefix: v(x_t, t)
               (π0.5 specifics, flow matching); the runner integrates the 10 Euler steps
``lm_head``    final RMSNorm + tied embedding: logits of a hidden state (seed token; VLM expert)
=============  ===============================================================================

The modules reuse the model's own layers (``GemmaLayer.project_qkv`` / ``finish``), so the
weights and the per-op precision (float32 norms, RoPE, softmax, flow state) are the model's.
Only attention is restated here, without ``scaled_dot_product_attention`` and without shape
branches (``AttentionMask`` picks a layout from the query length, which tracing would
freeze): the query heads of a kv head are folded onto a broadcast axis, logits and softmax
in float32, probabilities cast to the value dtype before P·V (``docs/model.md#precision``).
"""

from __future__ import annotations

from dataclasses import dataclass
import enum

from oxygen_ros.model.layers import rope_cos_sin
from oxygen_ros.model.masks import text_ar
from oxygen_ros.model.pi05 import Pi05Model
import torch
from torch import nn
import torch.nn.functional as F  # noqa: N812

MASKED_LOGIT = -2.3819763e38
"""Logit of a masked key (openpi ``gemma.py``); finite, so a fully masked row is uniform."""


class GraphName(str, enum.Enum):
    VISION = 'vision'
    PREFILL = 'prefill'
    DECODE = 'decode'
    DENOISE = 'denoise'
    LM_HEAD = 'lm_head'


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """
    One graph input or output.

    :ivar shape: ints for static dims, names for dynamic ones (``batch``, ``ctx_len``, ...).
    :ivar dtype: torch dtype name without the module (``float32``, ``bfloat16``, ``int64``,
        ``bool``).
    """

    name: str
    shape: tuple[int | str, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class GraphSpec:
    """The signature of one graph."""

    name: GraphName
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def dynamic_dims(self) -> tuple[str, ...]:
        """Return the names of the dynamic dims, in order of first use."""
        names: dict[str, None] = {}
        for t in self.inputs + self.outputs:
            names.update((d, None) for d in t.shape if isinstance(d, str))
        return tuple(names)


def dtype_name(dtype: torch.dtype) -> str:
    """Return ``'float32'`` for ``torch.float32`` etc."""
    return str(dtype).removeprefix('torch.')


def graph_specs(model: Pi05Model) -> dict[GraphName, GraphSpec]:
    """
    Return the signature of every graph of ``model`` (its config and dtype).

    Dims: L layers, Hkv kv heads, D head dim, W VLM width, V vocab, H action horizon,
    A action dim, S image size, Ti tokens per camera.
    """
    cfg = model.cfg
    dt, f32, i64, b8 = dtype_name(model.dtype), 'float32', 'int64', 'bool'
    vlm, size = cfg.vlm, cfg.vision.image_size
    L, hkv, d, w = vlm.depth, vlm.num_kv_heads, vlm.head_dim, vlm.width  # noqa: N806
    ti, h, a = cfg.image_tokens_per_camera, cfg.action_horizon, cfg.action_dim
    pool = (TensorSpec('k_pool', (L, 'num_slots', hkv, d), dt),
            TensorSpec('v_pool', (L, 'num_slots', hkv, d), dt))
    T = TensorSpec  # noqa: N806
    specs = [
        GraphSpec(GraphName.VISION,
                  (T('images', ('num_images', 3, size, size), f32),),
                  (T('image_embeds', ('num_images', ti, w), dt),)),
        GraphSpec(GraphName.PREFILL,
                  (T('image_embeds', (1, 'num_cameras', ti, w), dt),
                   T('image_mask', (1, 'num_cameras'), b8),
                   T('tokens', (1, 'num_tokens'), i64),
                   T('token_mask', (1, 'num_tokens'), b8)),
                  (T('k_new', (L, 1, 'prefix_len', hkv, d), dt),
                   T('v_new', (L, 1, 'prefix_len', hkv, d), dt),
                   T('prefix_mask', (1, 'prefix_len'), b8),
                   T('last_hidden', (1, w), dt))),
        GraphSpec(GraphName.DECODE,
                  pool + (T('tokens', ('batch', 'num_new'), i64),
                          T('token_mask', ('batch', 'num_new'), b8),
                          T('positions', ('batch',), i64),
                          T('ctx_slots', ('batch', 'ctx_len'), i64),
                          T('ctx_mask', ('batch', 'ctx_len'), b8)),
                  (T('logits', ('batch', cfg.vocab_size), f32),
                   T('last_hidden', ('batch', w), dt),
                   T('k_new', (L, 'batch', 'num_new', hkv, d), dt),
                   T('v_new', (L, 'batch', 'num_new', hkv, d), dt))),
        GraphSpec(GraphName.DENOISE,
                  pool + (T('ctx_slots', ('batch', 'ctx_len'), i64),
                          T('ctx_mask', ('batch', 'ctx_len'), b8),
                          T('x_t', ('batch', h, a), f32),
                          T('t', ('batch',), f32),
                          T('positions', ('batch',), i64)),
                  (T('velocity', ('batch', h, a), f32),)),
        GraphSpec(GraphName.LM_HEAD,
                  (T('hidden', ('batch', w), dt),),
                  (T('logits', ('batch', cfg.vocab_size), f32),)),
    ]
    return {s.name: s for s in specs}


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           allowed: torch.Tensor) -> torch.Tensor:
    """
    Grouped-query attention with a boolean mask, export-friendly.

    Same result as ``layers.attention`` (scale ``D ** -0.5``, query head j reads kv head
    ``j // (H / Hkv)``); logits and softmax in float32.

    :param q: ``[B, S, H, D]`` post-RoPE queries.
    :param k: ``[B, P, Hkv, D]`` post-RoPE keys.
    :param v: ``[B, P, Hkv, D]`` values.
    :param allowed: ``bool [B, S, P]``.
    :returns: ``[B, S, H * D]`` in v's dtype.
    """
    h, d, hkv = int(q.shape[2]), int(q.shape[3]), int(k.shape[2])  # static: baked in
    qf = q.unflatten(2, (hkv, h // hkv)).permute(0, 2, 3, 1, 4)     # [B, Hkv, G, S, D]
    kf = k.permute(0, 2, 1, 3).unsqueeze(2)                          # [B, Hkv, 1, P, D]
    vf = v.permute(0, 2, 1, 3).unsqueeze(2)
    logits = torch.matmul(qf.float(), kf.float().transpose(-1, -2)) * (float(d) ** -0.5)
    logits = torch.where(allowed[:, None, None], logits, MASKED_LOGIT)
    probs = torch.softmax(logits, dim=-1).to(v.dtype)
    out = torch.matmul(probs, vf)                                    # [B, Hkv, G, S, D]
    return out.permute(0, 3, 1, 2, 4).flatten(2)


def _ar_mask(valid: torch.Tensor, ar_cumsum: torch.Tensor) -> torch.Tensor:
    """
    Return the ar-mask rule (``masks.make_attn_mask``) plus the diagonal.

    Padding queries attend themselves (their rows are never read; no empty softmax).
    Index arithmetic runs in float32 (exact below 2**24): TensorRT's ONNX parser has
    narrower integer support for CumSum / reductions than for float32.

    :param valid: ``bool [B, N]``.
    :param ar_cumsum: ``float32 [B, N]`` cumulative sum of the ar flags.
    :returns: ``bool [B, N, N]``.
    """
    idx = torch.arange(valid.shape[1], device=valid.device, dtype=torch.float32)
    allowed = (ar_cumsum[:, None, :] <= ar_cumsum[:, :, None]) & valid[:, None, :] & \
        valid[:, :, None]
    return allowed | (idx[:, None] == idx[None, :])


def _packed_positions(valid: torch.Tensor) -> torch.Tensor:
    """Return ``float32 [B, N]``: index among the valid tokens (cumsum(valid) - 1, >= 0)."""
    return (valid.to(torch.float32).cumsum(1) - 1.0).clamp(min=0.0)


def _last_index(valid: torch.Tensor) -> torch.Tensor:
    """Return ``int64 [B, 1]`` index of the last True of each row (0 if none)."""
    idx = torch.arange(valid.shape[1], device=valid.device, dtype=torch.float32)
    return (idx * valid.to(torch.float32)).amax(1, keepdim=True).to(torch.int64)


def _take_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Return ``x[b, index[b]]`` for ``x [B, S, ...]``, ``index [B, 1]``: ``[B, 1, ...]``."""
    shape = (-1, 1) + tuple(x.shape[2:])
    return torch.gather(x, 1, index.view(-1, 1, *([1] * (x.dim() - 2))).expand(shape))


class VisionGraph(nn.Module):
    """
    ``images [M, 3, S, S]`` float32 in [-1, 1] -> ``image_embeds [M, Ti, W]``.

    The patch embedding (a stride = kernel convolution) is written as patchify + MatMul:
    the same sums, and a MatMul takes bfloat16 in opset 17 where ``Conv`` does not. As in
    ``SiglipTower.forward``, patch and position embeddings run in their own dtype (float32 in
    a 16-bit model), the blocks in the model dtype.
    """

    def __init__(self, model: Pi05Model) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tower = self.model.vision
        conv = tower.patch_embed
        p = tower.cfg.patch_size
        g = tower.cfg.image_size // p
        x = images.to(conv.weight.dtype).reshape(-1, 3, g, p, g, p)
        x = x.permute(0, 2, 4, 1, 3, 5).reshape(-1, g * g, 3 * p * p)
        x = F.linear(x, conv.weight.reshape(conv.weight.shape[0], -1), conv.bias)
        x = (x + tower.pos_embed).to(tower.final_norm.weight.dtype)
        for block in tower.blocks:
            x = block(x)
        return self.model.projector(tower.final_norm(x))


class PrefillGraph(nn.Module):
    """
    Prefill of a whole prefix (no context) in the padded openpi layout (``padded_prefix``).

    Padded tokens get positions and K/V too (never read: the prefix mask excludes them), so
    the valid tokens' K/V equal ``Pi05Model.prefill``'s packed computation
    (``docs/model.md#mixture-of-transformers-attention-and-masks``).
    """

    def __init__(self, model: Pi05Model) -> None:
        super().__init__()
        self.model = model

    def forward(self, image_embeds: torch.Tensor, image_mask: torch.Tensor,
                tokens: torch.Tensor, token_mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        m = self.model
        b, n, ti, w = image_embeds.shape
        embeds = torch.cat([image_embeds.reshape(b, n * ti, w).to(m.dtype),
                            m.embed_text(tokens)], 1)
        valid = torch.cat([image_mask[:, :, None].expand(b, n, ti).reshape(b, n * ti),
                           token_mask], 1)
        # ar flags (padded_prefix): images 0, prompt text_ar; their cumsum in float32
        text_c = torch.ones_like(tokens, dtype=torch.float32).cumsum(1) * float(
            text_ar(m.cfg.prefix_attention))
        ar_c = torch.cat([torch.zeros(b, n * ti, dtype=torch.float32,
                                      device=tokens.device), text_c], 1)
        cos, sin = rope_cos_sin(_packed_positions(valid), m.cfg.vlm.head_dim,
                                m.cfg.rope_base)
        allowed = _ar_mask(valid, ar_c)
        last = _last_index(valid)
        h = embeds
        ks, vs = [], []
        num_layers = len(m.vlm.layers)
        for i, layer in enumerate(m.vlm.layers):
            q, k, v, _ = layer.project_qkv(h, cos, sin)
            ks.append(k)
            vs.append(v)
            if i < num_layers - 1:
                h = layer.finish(h, attend(q, k, v, allowed), None)
            else:  # only the last valid token is needed after the last layer
                h = _take_rows(h, last)
                attn = attend(_take_rows(q, last), k, v, _take_rows(allowed, last))
                h = layer.finish(h, attn, None)
        return torch.stack(ks), torch.stack(vs), valid, h[:, 0]


class DecodeGraph(nn.Module):
    """
    T new text tokens per row on a cached context: a decode step (T = 1) or text prefill.

    Row b's valid new tokens (packed left) sit at rope positions ``positions[b] + i``, attend
    its context slots where ``ctx_mask`` and each other causally (a CAUSAL_TEXT prompt or a
    decode step: ``docs/model.md#the-kv-cache``). Same result as ``Pi05Model.decode_step`` /
    ``prefill(context=)``.
    """

    def __init__(self, model: Pi05Model) -> None:
        super().__init__()
        self.model = model

    def forward(self, k_pool: torch.Tensor, v_pool: torch.Tensor, tokens: torch.Tensor,
                token_mask: torch.Tensor, positions: torch.Tensor, ctx_slots: torch.Tensor,
                ctx_mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        m = self.model
        dtype = m.dtype
        h = m.embed_text(tokens)
        b, t = tokens.shape
        new_pos = positions.to(torch.float32)[:, None] + _packed_positions(token_mask)
        cos, sin = rope_cos_sin(new_pos, m.cfg.vlm.head_dim, m.cfg.rope_base)
        own = _ar_mask(token_mask, torch.ones_like(tokens, dtype=torch.float32).cumsum(1))
        allowed = torch.cat([ctx_mask[:, None, :].expand(b, t, ctx_mask.shape[1]), own], 2)
        kc = k_pool[:, ctx_slots].to(dtype)                         # [L, B, C, Hkv, D]
        vc = v_pool[:, ctx_slots].to(dtype)
        last = _last_index(token_mask)
        ks, vs = [], []
        num_layers = len(m.vlm.layers)
        for i, layer in enumerate(m.vlm.layers):
            q, k, v, _ = layer.project_qkv(h, cos, sin)
            ks.append(k)
            vs.append(v)
            kk, vv = torch.cat([kc[i], k], 1), torch.cat([vc[i], v], 1)
            if i < num_layers - 1:
                h = layer.finish(h, attend(q, kk, vv, allowed), None)
            else:
                h = _take_rows(h, last)
                attn = attend(_take_rows(q, last), kk, vv, _take_rows(allowed, last))
                h = layer.finish(h, attn, None)
        hidden = h[:, 0]
        return m.lm_logits(hidden), hidden, torch.stack(ks), torch.stack(vs)


class DenoiseGraph(nn.Module):
    """
    One flow-matching step: the velocity ``v(x_t, t)`` of the action expert.

    ``docs/model.md#π05-specifics`` (time condition) and ``docs/model.md#the-kv-cache``.

    The H action tokens sit at positions ``positions[b] + arange(H)`` (positions = the
    prefix's token count), attend the valid prefix (``ctx_mask``) and each other; the time
    condition and its adaRMS modulations are computed per row from ``t``. The Euler update
    ``x += dt * v`` stays outside (the runner), as in ``Pi05Model.denoise``.
    """

    def __init__(self, model: Pi05Model) -> None:
        super().__init__()
        self.model = model

    def forward(self, k_pool: torch.Tensor, v_pool: torch.Tensor, ctx_slots: torch.Tensor,
                ctx_mask: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor,
                positions: torch.Tensor) -> torch.Tensor:
        m = self.model
        dtype = m.dtype
        b, horizon = x_t.shape[0], x_t.shape[1]
        mod_in, mod_post, mod_final = m.expert.modulations(m.time_condition(t))
        h = m.embed_actions(x_t)
        new_pos = positions.to(torch.float32)[:, None] + torch.arange(
            horizon, device=x_t.device, dtype=torch.float32)
        cos, sin = rope_cos_sin(new_pos, m.cfg.expert.head_dim, m.cfg.rope_base)
        own = torch.ones(b, horizon, horizon, dtype=torch.bool, device=x_t.device)
        allowed = torch.cat([ctx_mask[:, None, :].expand(b, horizon, ctx_mask.shape[1]), own],
                            2)
        kc = k_pool[:, ctx_slots].to(dtype)
        vc = v_pool[:, ctx_slots].to(dtype)
        for i, layer in enumerate(m.expert.layers):
            q, k, v, gate = layer.project_qkv(h, cos, sin, mod_in[i])
            attn = attend(q, torch.cat([kc[i], k], 1), torch.cat([vc[i], v], 1), allowed)
            h = layer.finish(h, attn, gate, mod_post[i])
        h, _ = m.expert.final_norm(h, mod_final)
        return m.project_actions(h)


class LmHeadGraph(nn.Module):
    """``hidden [B, W]`` (before the final norm) -> ``float32 logits [B, V]``."""

    def __init__(self, model: Pi05Model) -> None:
        super().__init__()
        self.model = model

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_logits(hidden)


GRAPH_MODULES: dict[GraphName, type[nn.Module]] = {
    GraphName.VISION: VisionGraph, GraphName.PREFILL: PrefillGraph,
    GraphName.DECODE: DecodeGraph, GraphName.DENOISE: DenoiseGraph,
    GraphName.LM_HEAD: LmHeadGraph,
}


__all__ = [
    'GRAPH_MODULES', 'GraphName', 'GraphSpec', 'MASKED_LOGIT', 'TensorSpec', 'attend',
    'dtype_name', 'graph_specs',
]
