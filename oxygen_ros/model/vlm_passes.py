"""
The VLM expert over the KV cache: the layers of a prefill and of one decode step.

Both write each new token's K/V to its slot in the cache first, then, per layer, gather the
keys and values a token attends by slot (one ``index_select``) and attend them with one mask
(``layers.AttentionMask``). A prefill runs a packed prefix segment (``prefix.py``), optionally
after a cached context it extends (a causal prompt on shared image K/V, or OxyGen's language
suffix on the action prefix); a decode step feeds one token per row, rows of any prefixes and
lengths. ``Pi05Model.prefill``, ``prefill_suffix`` and ``decode_step`` check their inputs and
call these (docs/model.md "The KV cache"; openpi ``pi0.py``, OxyGen ``pi05.py``).
"""

from __future__ import annotations

from typing import Protocol

from oxygen_ros.config import ModelConfig
from oxygen_ros.model.gemma import GemmaExpert
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.model.layers import attention, AttentionMask, rope_cos_sin
from oxygen_ros.model.lora import AdapterRows
from oxygen_ros.model.masks import make_attn_mask
from oxygen_ros.model.prefix import PackedPrefix

import torch


class VlmModel(Protocol):
    """What the VLM passes need of a model (``Pi05Model`` is one; no import of it here)."""

    cfg: ModelConfig
    vlm: GemmaExpert

    @property
    def dtype(self) -> torch.dtype:
        """Activation dtype of the VLM."""

    @property
    def device(self) -> torch.device:
        """Where the model lives."""

    def embed_text(self, tokens: torch.Tensor) -> torch.Tensor:
        """Return ``E[tokens] * sqrt(W)``."""

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Return ``float32 [..., V]`` logits of hidden states before the final norm."""


def run_prefill(model: VlmModel, packed: PackedPrefix, cache: KVCache, slots: torch.Tensor,
                base: torch.Tensor, context: PrefixKV | None,
                adapter: AdapterRows | None = None) -> torch.Tensor:
    """
    Run the VLM expert over a packed segment, writing its K/V; return the last hidden states.

    :param packed: ``B`` rows of ``P`` packed tokens (``prefix.pack_prefix`` or
        ``suffix_tokens``), ``P >= 1``.
    :param slots: ``int64 [B, P]`` slots of the new tokens (checked: ``check_new_slots``).
    :param base: ``int64 [B]`` position of each row's first new token.
    :param context: a cached prefix the new tokens attend (``context.mask``) before each
        other, or None.
    :param adapter: a suffix LoRA active on the rows it selects (``lora.py``).
    :returns: ``[B, W]`` the hidden state at each row's last valid token, after the last
        layer (before the final norm); for a row without a valid token, that of its first
        (padding) position, which the caller replaces.
    """
    b, p = packed.valid.shape
    vlm = model.cfg.vlm
    dev = model.device
    positions = base[:, None] + torch.arange(p, device=dev)
    cos, sin = rope_cos_sin(positions, vlm.head_dim, model.cfg.rope_base)
    # Padding queries attend themselves only (never read, avoids NaN rows).
    mask = make_attn_mask(packed.valid, packed.ar) | torch.eye(p, dtype=torch.bool, device=dev)
    key_slots = None
    if context is not None:
        pc = context.slots.shape[1]
        mask = torch.cat([context.mask[:, None, :].expand(b, p, pc), mask], dim=2)
        key_slots = torch.cat([context.slots, slots], dim=1).reshape(-1)
    if packed.all_valid:
        write_rows, write_slots = None, slots.reshape(-1)
    else:
        write_rows = packed.valid.nonzero(as_tuple=True)
        write_slots = slots[write_rows]
    last = (packed.counts - 1).clamp(min=0)
    rows = torch.arange(b, device=dev)
    full_mask = AttentionMask.build(mask, vlm.num_heads, vlm.num_kv_heads, model.dtype)
    last_mask = AttentionMask.build(mask[rows, last][:, None], vlm.num_heads,
                                    vlm.num_kv_heads, model.dtype)
    h = packed.embeds
    num_layers = len(model.vlm.layers)
    loras = adapter.layers(h.dtype) if adapter is not None else [None] * num_layers
    for i, (layer, lora) in enumerate(zip(model.vlm.layers, loras)):
        q, k, v, _ = layer.project_qkv(h, cos, sin, lora=lora)
        kw, vw = ((k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:]))
                  if write_rows is None else (k[write_rows], v[write_rows]))
        cache.k[i].index_copy_(0, write_slots, kw.to(cache.dtype))
        cache.v[i].index_copy_(0, write_slots, vw.to(cache.dtype))
        if key_slots is not None:
            k = cache.k[i].index_select(0, key_slots).view(b, -1, *k.shape[2:])
            v = cache.v[i].index_select(0, key_slots).view(b, -1, *v.shape[2:])
        k, v = k.to(model.dtype).transpose(1, 2), v.to(model.dtype).transpose(1, 2)
        if i < num_layers - 1:
            h = layer.finish(h, attention(q, k, v, full_mask), None, lora=lora)
        else:  # only the last token's output is needed after the last layer
            h = h[rows, last][:, None]
            h = layer.finish(h, attention(q[rows, last][:, None], k, v, last_mask), None,
                             lora=lora)
    return h[:, 0]


def run_decode_step(model: VlmModel, tokens: torch.Tensor, positions: torch.Tensor,
                    cache: KVCache, write_slots: torch.Tensor, ctx_slots: torch.Tensor,
                    ctx_mask: torch.Tensor, adapter: AdapterRows | None = None
                    ) -> torch.Tensor:
    """
    Feed one token per row through the VLM expert; return the next-token logits.

    Shapes and meaning as ``Pi05Model.decode_step``: ``tokens``, ``positions``,
    ``write_slots`` ``int64 [B]``; ``ctx_slots`` ``int64 [B, C]``, ``ctx_mask`` ``bool
    [B, C]``. No host sync.

    :returns: ``float32 [B, V]``.
    """
    b, c = ctx_slots.shape
    vlm = model.cfg.vlm
    h = model.embed_text(tokens[:, None])
    cos, sin = rope_cos_sin(positions[:, None], vlm.head_dim, model.cfg.rope_base)
    key_slots = torch.cat([ctx_slots, write_slots[:, None]], dim=1).reshape(-1)
    mask = torch.cat([ctx_mask, torch.ones(b, 1, dtype=torch.bool, device=h.device)], 1)
    amask = AttentionMask.build(mask[:, None, :], vlm.num_heads, vlm.num_kv_heads, model.dtype)
    loras = adapter.layers(h.dtype) if adapter is not None else [None] * len(model.vlm.layers)
    for i, (layer, lora) in enumerate(zip(model.vlm.layers, loras)):
        q, k, v, _ = layer.project_qkv(h, cos, sin, lora=lora)
        cache.k[i].index_copy_(0, write_slots, k[:, 0].to(cache.dtype))
        cache.v[i].index_copy_(0, write_slots, v[:, 0].to(cache.dtype))
        kk = cache.k[i].index_select(0, key_slots).view(b, c + 1, vlm.num_kv_heads, -1)
        vv = cache.v[i].index_select(0, key_slots).view(b, c + 1, vlm.num_kv_heads, -1)
        attn = attention(q, kk.to(model.dtype).transpose(1, 2),
                         vv.to(model.dtype).transpose(1, 2), amask)
        h = layer.finish(h, attn, None, lora=lora)
    return model.lm_logits(h[:, 0])


__all__ = ['VlmModel', 'run_decode_step', 'run_prefill']
