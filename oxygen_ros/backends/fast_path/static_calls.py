"""
The model's per-cycle calls as static-shape functions: no host sync, no data-dependent shape.

What a compiler (``torch.compile(fullgraph=True)``) and a CUDA graph need: every shape is
fixed by the inputs' shapes, nothing reads a tensor value on the host, and the KV pool is
only read (new K/V are returned; the caller writes them, inside the same CUDA graph).
Variable lengths become padding with masks, so that a few buckets of shapes serve every
call:

================  ==========================================================================
call              padding
================  ==========================================================================
``VisionCall``    none (one shape per camera count)
``PrefillCall``   prompt padded at its end to a bucket; padded tokens are masked as keys and
                  attend only themselves, so valid tokens' K/V and hidden states are those of
                  the unpadded prefix (positions = index among valid tokens:
                  ``docs/model.md#mixture-of-transformers-attention-and-masks``); the
                  mask a dense bias, or FlexAttention's block mask (``flex.py``)
``ExtendCall``    T new tokens per row on a cached context (decode step T = 1, a prompt on an
                  image prefix, or causal suffixes on action prefixes): new tokens padded at
                  the end, context padded with masked slots; optionally a suffix LoRA on the
                  rows a mask selects; the context gathered, or read in place by the paged
                  Triton kernel (``paged_attention.py``)
``DecodeCall``    ``ExtendCall`` with T = 1 plus the LM head and greedy argmax
``DecodeLoopCall`` k ``DecodeCall`` steps, each step's argmax the next one's token; rows with no
                  step left write to the null slot; the context padded with masked slots
``DenoiseCall``   the prefix context padded with masked slots; all N Euler steps in one call,
                  the adaRMS modulations of the N fixed times computed once (constructor);
                  the prefix gathered once per call, or read in place by the fused Triton
                  kernels (``denoise_fused.py``)
``SeedCall``      LM head + argmax of a batch of hidden states
================  ==========================================================================

Each equals the eager ``Pi05Model`` entry point on the valid part (tests: float32, 1e-5).
``DecodeLoopCall`` alone writes the pool (its steps read what the previous ones wrote); it
is a loop around a step, which is what gets compiled.
The VLM layers are passed in, so that the norm-folded layers (``folding.py``) or the model's
own can be used.
"""

from __future__ import annotations

from typing import Callable

from oxygen_ros.backends.fast_path.denoise_fused import action_tokens, fused_velocity
from oxygen_ros.backends.fast_path.paged_attention import paged_attention, use_paged_kernel
from oxygen_ros.model.denoise import (
    denoise_context, DenoiseContext, euler_step_modulations, expert_velocity)
from oxygen_ros.model.flex import (
    prefix_attention, prefix_block_mask, prefix_row_mask, use_flex_prefill)
from oxygen_ros.model.layers import attention, AttentionMask, rope_cos_sin
from oxygen_ros.model.lora import AdapterRows, SuffixLoRA
from oxygen_ros.model.masks import make_attn_mask, text_ar
from oxygen_ros.model.pi05 import Pi05Model

import torch
from torch import nn
import torch.nn.functional as F  # noqa: N812


def _rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Return ``x[b, index[b]]`` as ``[B, 1, ...]`` for ``x [B, S, ...]``, ``index [B]``."""
    shape = (x.shape[0], 1) + tuple(x.shape[2:])
    return torch.gather(x, 1, index.view(-1, 1, *([1] * (x.dim() - 2))).expand(shape))


def _lm_head(model: Pi05Model, hidden: torch.Tensor) -> torch.Tensor:
    """``Pi05Model.lm_logits`` without its no_grad decorator: ``float32 [B, V]``."""
    y, _ = model.vlm.final_norm(hidden)
    return F.linear(y, model.lm_head_weight).float()


class VisionCall(nn.Module):
    """``images [M, 3, S, S]`` in [-1, 1] -> ``image tokens [M, Ti, W]`` (SigLIP + projector)."""

    def __init__(self, model: Pi05Model) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.projector(self.model.vision(images))


class PrefillCall(nn.Module):
    """
    A robot batch of whole prefixes ``[image tokens | prompt padded to T]`` through the VLM.

    ``forward(image_embeds [B, N, Ti, W], tokens [B, T], valid [B, N*Ti + T], last [B])``
    returns ``(last_hidden [B, W], k [L, B * (N*Ti + T), Hkv, D], v [...])``: K/V of every
    position, row after row (padding included, to be written to a null slot), and the hidden
    state at index ``last`` (the last valid token) after the last layer. The prefix attends
    itself with a dense bias (``layers.attention``) or, where ``flex.use_flex_prefill``
    chooses it, FlexAttention over a block mask built from ``valid`` and the ar flags in the
    call; the last layer's one query row attends with the bias of its row either way.
    """

    def __init__(self, model: Pi05Model, layers: nn.ModuleList) -> None:
        super().__init__()
        self.model = model
        self.layers = layers

    def forward(self, image_embeds: torch.Tensor, tokens: torch.Tensor, valid: torch.Tensor,
                last: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m = self.model
        cfg = m.cfg
        b, n, ti, w = image_embeds.shape
        h = torch.cat([image_embeds.reshape(b, n * ti, w).to(m.dtype), m.embed_text(tokens)],
                      1)
        p = h.shape[1]
        ar = torch.cat([torch.zeros(b, n * ti, dtype=torch.int64, device=h.device),
                        torch.full_like(tokens, text_ar(cfg.prefix_attention))], 1)
        positions = torch.arange(p, device=h.device).expand(b, p)
        cos, sin = rope_cos_sin(positions, cfg.vlm.head_dim, cfg.rope_base)
        heads = (cfg.vlm.num_heads, cfg.vlm.num_kv_heads, m.dtype)
        if use_flex_prefill(h):
            block = prefix_block_mask(valid, ar)

            def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                return prefix_attention(q, k, v, block)
        else:
            eye = torch.eye(p, dtype=torch.bool, device=h.device)
            full = AttentionMask.build(make_attn_mask(valid, ar) | eye, *heads)

            def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                return attention(q, k, v, full)
        tail = AttentionMask.build(prefix_row_mask(valid, ar, last), *heads)
        ks, vs = [], []
        for i, layer in enumerate(self.layers):
            q, k, v, _ = layer.project_qkv(h, cos, sin)
            ks.append(k.flatten(0, 1))
            vs.append(v.flatten(0, 1))
            kt, vt = k.transpose(1, 2), v.transpose(1, 2)
            if i < len(self.layers) - 1:
                h = layer.finish(h, attend(q, kt, vt), None)
            else:  # only the last valid token is needed after the last layer
                h = layer.finish(_rows(h, last), attention(_rows(q, last), kt, vt, tail), None)
        return h[:, 0], torch.stack(ks), torch.stack(vs)


class ExtendCall(nn.Module):
    """
    T new text tokens per row on a cached context: a decode step (T = 1) or a text prefill.

    ``forward(k_pool, v_pool, tokens [B, T], token_valid [B, T], positions [B],
    ctx_slots [B, C], ctx_mask [B, C][, adapter_rows bool [B]])`` returns ``(last_hidden
    [B, W], k [L, B, T, Hkv, D], v [...])``: new token i of row b sits at rope position
    ``positions[b] + i``, attends the context where ``ctx_mask`` and the valid new tokens up to
    itself (causal: ``docs/model.md#the-kv-cache``); ``last_hidden`` is the output at the last
    valid new token. The pool is read, not written: per layer either the context slots are gathered
    (``index_select``) and concatenated with the new K/V, or, where ``paged_attention.py``
    chooses the Triton kernel (at most ``PAGED_MAX_QUERIES`` new tokens), read in place. With
    an ``adapter`` (for ``layers``: folded layers need ``fold_adapter``), ``adapter_rows``
    selects the rows it is active on.
    """

    def __init__(self, model: Pi05Model, layers: nn.ModuleList,
                 adapter: SuffixLoRA | None = None) -> None:
        super().__init__()
        self.model = model
        self.layers = layers
        self.adapter = adapter

    def forward(self, k_pool: torch.Tensor, v_pool: torch.Tensor, tokens: torch.Tensor,
                token_valid: torch.Tensor, positions: torch.Tensor, ctx_slots: torch.Tensor,
                ctx_mask: torch.Tensor, adapter_rows: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m = self.model
        vlm = m.cfg.vlm
        b, t = tokens.shape
        dev = tokens.device
        h = m.embed_text(tokens)
        cos, sin = rope_cos_sin(positions[:, None] + torch.arange(t, device=dev),
                                vlm.head_dim, m.cfg.rope_base)
        last = (token_valid.sum(1) - 1).clamp(min=0)
        if use_paged_kernel(tokens, t):
            attend = self._paged(k_pool, v_pool, token_valid, ctx_slots, ctx_mask, last)
        else:
            attend = self._gathered(k_pool, v_pool, token_valid, ctx_slots, ctx_mask, last)
        loras = [None] * len(self.layers)
        if self.adapter is not None and adapter_rows is not None:
            loras = AdapterRows(self.adapter, adapter_rows).layers(h.dtype)
        ks, vs = [], []
        for i, (layer, lora) in enumerate(zip(self.layers, loras)):
            q, k, v, _ = layer.project_qkv(h, cos, sin, lora=lora)
            ks.append(k)
            vs.append(v)
            if i < len(self.layers) - 1:
                h = layer.finish(h, attend(i, q, k, v, False), None, lora=lora)
            else:  # only the last valid token is needed after the last layer
                h = layer.finish(_rows(h, last), attend(i, q, k, v, True), None, lora=lora)
        return h[:, 0], torch.stack(ks), torch.stack(vs)

    def _gathered(self, k_pool: torch.Tensor, v_pool: torch.Tensor, token_valid: torch.Tensor,
                  ctx_slots: torch.Tensor, ctx_mask: torch.Tensor, last: torch.Tensor
                  ) -> Callable[..., torch.Tensor]:
        """Return ``attend(layer, q, k, v, last_only)``: the context gathered per layer."""
        m = self.model
        vlm = m.cfg.vlm
        (b, t), c = token_valid.shape, ctx_slots.shape[1]
        own = make_attn_mask(token_valid, torch.ones_like(token_valid, dtype=torch.int64)) | \
            torch.eye(t, dtype=torch.bool, device=token_valid.device)
        mask = torch.cat([ctx_mask[:, None, :].expand(b, t, c), own], 2)
        full = AttentionMask.build(mask, vlm.num_heads, vlm.num_kv_heads, m.dtype)
        tail = AttentionMask.build(_rows(mask, last), vlm.num_heads, vlm.num_kv_heads, m.dtype)
        flat = ctx_slots.reshape(-1)

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   last_only: bool) -> torch.Tensor:
            kk = torch.cat([k_pool[i].index_select(0, flat).view(b, c, vlm.num_kv_heads, -1)
                            .to(m.dtype), k], 1).transpose(1, 2)
            vv = torch.cat([v_pool[i].index_select(0, flat).view(b, c, vlm.num_kv_heads, -1)
                            .to(m.dtype), v], 1).transpose(1, 2)
            if last_only:
                return attention(_rows(q, last), kk, vv, tail)
            return attention(q, kk, vv, full)
        return attend

    @staticmethod
    def _paged(k_pool: torch.Tensor, v_pool: torch.Tensor, token_valid: torch.Tensor,
               ctx_slots: torch.Tensor, ctx_mask: torch.Tensor, last: torch.Tensor
               ) -> Callable[..., torch.Tensor]:
        """Return ``attend(layer, q, k, v, last_only)``: the pool read in place (Triton)."""
        b, t = token_valid.shape
        every = torch.arange(t, device=token_valid.device).expand(b, t)

        def attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   last_only: bool) -> torch.Tensor:
            if last_only:
                q, index = _rows(q, last), last[:, None]
            else:
                index = every
            return paged_attention(q, index, k_pool[i], v_pool[i], ctx_slots, ctx_mask, k, v,
                                   token_valid)
        return attend


class DecodeCall(nn.Module):
    """
    One greedy decode step of B rows: ``ExtendCall`` with T = 1, LM head and argmax.

    ``forward(k_pool, v_pool, tokens [B], positions [B], ctx_slots [B, C], ctx_mask [B, C][,
    adapter_rows bool [B]])`` returns ``(logits float32 [B, V], next ids int64 [B],
    k [L, B, Hkv, D], v [...])``: the same as ``Pi05Model.decode_step`` (which writes K/V
    itself) followed by ``argmax``; the suffix LoRA as in ``ExtendCall``.
    """

    def __init__(self, model: Pi05Model, layers: nn.ModuleList,
                 adapter: SuffixLoRA | None = None) -> None:
        super().__init__()
        self.model = model
        self.extend = ExtendCall(model, layers, adapter)

    def forward(self, k_pool: torch.Tensor, v_pool: torch.Tensor, tokens: torch.Tensor,
                positions: torch.Tensor, ctx_slots: torch.Tensor, ctx_mask: torch.Tensor,
                adapter_rows: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        valid = torch.ones(tokens.shape[0], 1, dtype=torch.bool, device=tokens.device)
        hidden, k, v = self.extend(k_pool, v_pool, tokens[:, None], valid, positions, ctx_slots,
                                   ctx_mask, adapter_rows)
        logits = _lm_head(self.model, hidden)
        return logits, logits.argmax(-1), k[:, :, 0], v[:, :, 0]


class DecodeLoopCall(nn.Module):
    """
    ``k`` greedy decode steps of B rows in one call: the loop of ``TorchBackend._decode``.

    ``forward(k_pool, v_pool, tokens [B], base [B], steps [B], all_slots [B, C], null [][,
    adapter_rows bool [B]])`` returns the ids ``int64 [B, k]`` and writes each step's K/V into
    the pool in place. Step ``s`` of row ``b`` feeds the previous step's argmax (``tokens``
    first) at rope position ``base[b] + s`` (its context length), attends the context slots
    ``all_slots[b, :base[b] + s]`` (``all_slots`` holds the context, then the new tokens'
    slots; padded with any slot) and writes its K/V to ``all_slots[b, base[b] + s]`` while
    ``s < steps[b]``, else to the ``null`` slot (its ids are then meaningless). The step
    ``decode`` has ``DecodeCall``'s signature (``DecodeCall`` itself or it compiled).
    """

    def __init__(self, decode: Callable[..., tuple[torch.Tensor, ...]], num_steps: int) -> None:
        super().__init__()
        self.decode = decode
        self.num_steps = num_steps

    def forward(self, k_pool: torch.Tensor, v_pool: torch.Tensor, tokens: torch.Tensor,
                base: torch.Tensor, steps: torch.Tensor, all_slots: torch.Tensor,
                null: torch.Tensor, adapter_rows: torch.Tensor | None = None) -> torch.Tensor:
        extra = () if adapter_rows is None else (adapter_rows,)
        last = all_slots.shape[1] - 1
        cols = torch.arange(all_slots.shape[1], device=all_slots.device)
        ids = []
        for s in range(self.num_steps):
            pos = base + s
            own = all_slots.gather(1, pos.clamp(max=last)[:, None])[:, 0]
            write = torch.where(s < steps, own, null)
            _, tokens, k, v = self.decode(k_pool, v_pool, tokens, pos, all_slots,
                                          cols[None] < pos[:, None], *extra)
            k_pool.index_copy_(1, write, k.to(k_pool.dtype))
            v_pool.index_copy_(1, write, v.to(v_pool.dtype))
            ids.append(tokens)
        return torch.stack(ids, 1)


class SeedCall(nn.Module):
    """``hidden [B, W]`` -> ``(logits float32 [B, V], greedy ids int64 [B])``: the first token."""

    def __init__(self, model: Pi05Model) -> None:
        super().__init__()
        self.model = model

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = _lm_head(self.model, hidden)
        return logits, logits.argmax(-1)


VelocityStep = Callable[..., torch.Tensor]
"""``(*context, x, mod_in, mod_post, mod_final) -> v``: the context of
``DenoiseCall.velocity_step`` or of ``DenoiseCall.fused_step``."""


class DenoiseCall(nn.Module):
    """
    The whole flow-matching loop of B action chunks, N Euler steps in one call.

    ``forward(k_pool, v_pool, ctx_slots [B, C], ctx_mask [B, C], num_tokens [B],
    noise [B, H, A])`` returns the actions ``float32 [B, H, A]``, as ``Pi05Model.denoise``
    (B: one robot's chunk, or a robot batch's).
    The Euler times are fixed, so the time MLP and every adaRMS ``Dense`` are evaluated once,
    here, for the N times (the model's ``denoise`` does it once per call).

    Two velocities, one result: :meth:`velocity_step` attends the prefix gathered once per
    call (``denoise.denoise_context``; its suffix K/V written into the gathered buffers),
    :meth:`fused_step` reads it in place from the pool with the Triton kernels
    (``denoise_fused.py``: no gather, the norms and gated residuals fused). ``fused`` picks
    one: True or False, or None (the default): as ``paged_attention.paged_kernel`` chooses
    at each call (:func:`paged_attention.use_paged_kernel`: the kernels where the call is
    compiled for CUDA, or forced). ``step`` is the velocity of one step on plain tensors; a
    compiler may replace it (:meth:`use`; ``torch.compile`` of one step compiles ~N times
    faster than of the loop, and a CUDA graph of this whole ``forward`` still makes the
    loop one replay).
    """

    def __init__(self, model: Pi05Model, num_steps: int | None = None) -> None:
        super().__init__()
        self.model = model
        n = model.cfg.num_denoise_steps if num_steps is None else num_steps
        self.num_steps = n
        self.mods = euler_step_modulations(model, n, model.device)
        self.dt = torch.tensor(-1.0 / n, dtype=torch.float32).item()
        self.fused: bool | None = None
        self.step: VelocityStep = self.velocity_step

    def use(self, fused: bool | None, step: VelocityStep | None = None) -> None:
        """
        Choose the velocity: fused (True), gathered (False) or per call (None).

        :param step: what runs it (a compiled :meth:`fused_step` or :meth:`velocity_step`,
            whichever ``fused`` names); default the method itself. With None, ``step`` must
            be None.
        :raises ValueError: a ``step`` without a decided ``fused``.
        """
        if fused is None and step is not None:
            raise ValueError('a replacement step needs fused=True or False')
        self.fused = fused
        self.step = step if step is not None else \
            self.fused_step if fused else self.velocity_step

    def velocity_step(self, keys: list[torch.Tensor], values: list[torch.Tensor],
                      bias: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor,
                      mod_in: torch.Tensor, mod_post: torch.Tensor,
                      mod_final: torch.Tensor) -> torch.Tensor:
        """Return ``expert_velocity`` on a context given as tensors (writes its suffix K/V)."""
        ex = self.model.cfg.expert
        layout = AttentionMask.layout_for(x.shape[1], ex.num_heads, ex.num_kv_heads)
        ctx = DenoiseContext(tuple(keys), tuple(values), AttentionMask(bias, layout), cos, sin,
                             keys[0].shape[2] - x.shape[1])
        return expert_velocity(self.model, ctx, x, mod_in, mod_post, mod_final)

    def fused_step(self, k_pool: torch.Tensor, v_pool: torch.Tensor, ctx_slots: torch.Tensor,
                   ctx_mask: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   index: torch.Tensor, valid: torch.Tensor, x: torch.Tensor,
                   mod_in: torch.Tensor, mod_post: torch.Tensor,
                   mod_final: torch.Tensor) -> torch.Tensor:
        """Return ``denoise_fused.fused_velocity``: the prefix read in place from the pool."""
        return fused_velocity(self.model, k_pool, v_pool, ctx_slots, ctx_mask, cos, sin, index,
                              valid, x, mod_in, mod_post, mod_final)

    def forward(self, k_pool: torch.Tensor, v_pool: torch.Tensor, ctx_slots: torch.Tensor,
                ctx_mask: torch.Tensor, num_tokens: torch.Tensor,
                noise: torch.Tensor) -> torch.Tensor:
        horizon = noise.shape[1]
        if self.fused is None:
            fused = use_paged_kernel(noise, horizon)
            step = self.fused_step if fused else self.velocity_step
        else:
            fused, step = self.fused, self.step
        if fused:
            context: tuple = (k_pool, v_pool, ctx_slots, ctx_mask,
                              *action_tokens(noise, num_tokens, self.model))
        else:
            ctx = denoise_context(self.model, k_pool, v_pool, ctx_slots, ctx_mask, num_tokens,
                                  horizon)
            context = (list(ctx.keys), list(ctx.values), ctx.mask.bias, ctx.cos, ctx.sin)
        x = noise.to(torch.float32)
        for mod_in, mod_post, mod_final in self.mods:
            x = x + self.dt * step(*context, x, mod_in, mod_post, mod_final)
        return x


__all__ = ['DecodeCall', 'DecodeLoopCall', 'DenoiseCall', 'ExtendCall', 'PrefillCall', 'SeedCall',
           'VelocityStep', 'VisionCall']
