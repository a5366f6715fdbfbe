"""
Prefix embedding and packing: [image tokens of valid cameras] + [valid prompt tokens].

And the checks of a segment written to the cache: its slots, and the context it extends.

openpi lays the prefix out as fixed slots (every camera, then ``max_token_len`` prompt slots)
and masks the invalid ones; dropping them and packing the valid tokens to the left gives the
same outputs for valid tokens because positions come from ``cumsum(valid)``
(``docs/model.md#mixture-of-transformers-attention-and-masks``) and saves their compute and
cache space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from oxygen_ros.config import ModelConfig, PrefixAttention
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.model.masks import text_ar

import torch


class PrefixEmbedder(Protocol):
    """What prefix packing needs of a model (``Pi05Model`` is one; no import of it here)."""

    cfg: ModelConfig

    @property
    def dtype(self) -> torch.dtype:
        """Activation dtype of the VLM."""

    @property
    def device(self) -> torch.device:
        """Where the embeddings live."""

    def embed_text(self, tokens: torch.Tensor) -> torch.Tensor:
        """Return ``E[tokens] * sqrt(W)`` (``docs/model.md#vlm-expert``)."""


@dataclass(frozen=True, slots=True)
class PackedPrefix:
    """
    A prefix segment packed to the left.

    :ivar embeds: ``[B, P, W]`` input embeddings (padding rows are zeros).
    :ivar valid: ``bool [B, P]``: ``arange(P) < counts``.
    :ivar ar: ``int64 [B, P]`` ar flags of the packed tokens.
    :ivar counts: ``int64 [B]`` valid tokens per sample.
    :ivar all_valid: True when no token was dropped (no padding at all).
    """

    embeds: torch.Tensor
    valid: torch.Tensor
    ar: torch.Tensor
    counts: torch.Tensor
    all_valid: bool


def padded_prefix(model: PrefixEmbedder, tokens: torch.Tensor, token_mask: torch.Tensor,
                  image_embeds: torch.Tensor | None, image_mask: torch.Tensor | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """
    Return the openpi (unpacked) prefix: every camera slot, then every prompt slot.

    :param model: gives the text embedding, widths and the prefix attention mode.
    :param tokens: ``int64 [B, T]`` prompt ids.
    :param token_mask: ``bool [B, T]``.
    :param image_embeds: ``[B, N, Ti, W]`` or None.
    :param image_mask: ``bool [B, N]`` or None (all valid).
    :returns: ``embeds [B, N*Ti + T, W]``, ``valid bool [B, N*Ti + T]``, ``ar int64 [...]``.
    :raises ValueError: on inconsistent shapes.
    """
    cfg = model.cfg
    if tokens.dim() != 2 or tuple(token_mask.shape) != tuple(tokens.shape):
        raise ValueError(f'tokens and token_mask must both be [B, T], got '
                         f'{tuple(tokens.shape)} and {tuple(token_mask.shape)}')
    b, t = tokens.shape
    dev = model.device
    embeds = [model.embed_text(tokens)]
    valid = [token_mask.to(torch.bool)]
    ar = [torch.full((b, t), text_ar(cfg.prefix_attention), dtype=torch.int64, device=dev)]
    if image_embeds is not None:
        want = (b, cfg.image_tokens_per_camera, cfg.vlm.width)
        if image_embeds.dim() != 4 or (image_embeds.shape[0], *image_embeds.shape[2:]) != want:
            raise ValueError(f'image_embeds must be [{b}, N, {want[1]}, {want[2]}], '
                             f'got {tuple(image_embeds.shape)}')
        n, ti = image_embeds.shape[1:3]
        if image_mask is None:
            image_mask = torch.ones(b, n, dtype=torch.bool, device=dev)
        if tuple(image_mask.shape) != (b, n):
            raise ValueError(f'image_mask must be [{b}, {n}], got {tuple(image_mask.shape)}')
        embeds.insert(0, image_embeds.reshape(b, n * ti, -1).to(model.dtype))
        valid.insert(0, image_mask.to(torch.bool)[:, :, None].expand(b, n, ti).reshape(b, -1))
        ar.insert(0, torch.zeros(b, n * ti, dtype=torch.int64, device=dev))
    elif image_mask is not None:
        raise ValueError('image_mask given without image_embeds')
    return torch.cat(embeds, 1), torch.cat(valid, 1), torch.cat(ar, 1)


def pack_prefix(model: PrefixEmbedder, tokens: torch.Tensor, token_mask: torch.Tensor,
                image_embeds: torch.Tensor | None,
                image_mask: torch.Tensor | None) -> PackedPrefix:
    """
    Embed a prefix segment and drop its invalid tokens (one host sync for ``P``).

    Arguments as :func:`padded_prefix`.

    :returns: the packed segment; ``P`` = max valid count over the batch.
    """
    embeds, valid, ar = padded_prefix(model, tokens, token_mask, image_embeds, image_mask)
    b, s, w = embeds.shape
    counts = valid.sum(1)
    if bool(valid.all()):
        return PackedPrefix(embeds, valid, ar, counts, True)
    p = int(counts.max())
    rows, cols = valid.nonzero(as_tuple=True)
    dest = (valid.cumsum(1) - 1)[rows, cols]
    packed = embeds.new_zeros(b, p, w)
    packed[rows, dest] = embeds[rows, cols]
    packed_ar = ar.new_zeros(b, p)
    packed_ar[rows, dest] = ar[rows, cols]
    packed_valid = torch.arange(p, device=valid.device) < counts[:, None]
    return PackedPrefix(packed, packed_valid, packed_ar, counts,
                        bool(packed_valid.all()))


def suffix_tokens(model: PrefixEmbedder, tokens: torch.Tensor, token_mask: torch.Tensor | None,
                  batch_size: int) -> PackedPrefix:
    """
    Embed causal suffix tokens (ar = 1 each; no host sync unless a mask is given).

    :param tokens: ``int64 [B, T]`` left-aligned ids.
    :param token_mask: ``bool [B, T]``, a run of True then False per row; None: all True.
    :param batch_size: B of the context the suffixes extend.
    :raises ValueError: shapes that disagree, or a mask with a hole.
    """
    if tokens.dim() != 2 or tokens.shape[0] != batch_size:
        raise ValueError(f'suffix tokens must be [{batch_size}, T] (one row per context), got '
                         f'{tuple(tokens.shape)}')
    b, t = tokens.shape
    ar = torch.ones(b, t, dtype=torch.int64, device=tokens.device)
    if token_mask is None:
        valid = torch.ones(b, t, dtype=torch.bool, device=tokens.device)
        counts = torch.full((b,), t, dtype=torch.int64, device=tokens.device)
        return PackedPrefix(model.embed_text(tokens), valid, ar, counts, True)
    if tuple(token_mask.shape) != (b, t):
        raise ValueError(f'token_mask must be [{b}, {t}], got {tuple(token_mask.shape)}')
    counts = token_mask.sum(1)
    valid = torch.arange(t, device=tokens.device) < counts[:, None]
    if not bool((valid == token_mask).all()):
        raise ValueError('suffix token_mask must be left-aligned (True, then False, per row)')
    return PackedPrefix(model.embed_text(tokens), valid, ar, counts, bool(valid.all()))


def check_new_slots(slots: torch.Tensor | None, cache: KVCache, packed: PackedPrefix,
                    context: PrefixKV | None) -> torch.Tensor:
    """
    Return the first ``P_new`` columns of ``slots`` after checking them (host syncs).

    :raises ValueError: missing, misshapen, out of range, duplicate, or overlapping the
        context.
    """
    b, p = packed.valid.shape
    if slots is None:
        raise ValueError('slots are required when writing into a given cache or context')
    if slots.dim() != 2 or slots.shape[0] != b or slots.shape[1] < p:
        raise ValueError(f'slots must be [{b}, >= {p}] (P_new = {p}), got {tuple(slots.shape)}')
    slots = slots[:, :p].to(torch.int64)
    if bool((slots < 0).any()) or bool((slots >= cache.num_slots).any()):
        raise ValueError(f'slots out of range [0, {cache.num_slots})')
    written = slots[packed.valid]
    if written.unique().numel() != written.numel():
        raise ValueError('slots of valid new tokens must be distinct')
    if context is not None and bool(torch.isin(written, context.slots[context.mask]).any()):
        raise ValueError('slots of new tokens overlap the context')
    return slots


def check_context(context: PrefixKV, packed: PackedPrefix,
                  prefix_attention: PrefixAttention) -> None:
    """
    Check that ``packed`` may extend the cached prefix ``context`` (a causal prompt on it).

    :raises ValueError: a bidirectional prefix (its tokens would attend the new ones), another
        batch size, or a first new token with ar=0 (image tokens).
    """
    if prefix_attention is PrefixAttention.BIDIRECTIONAL:
        raise ValueError(
            'a prefix cannot be extended with prefix_attention=BIDIRECTIONAL: every '
            'prefix token attends the new ones (use CAUSAL_TEXT to share image K/V)')
    if context.batch_size != packed.valid.shape[0]:
        raise ValueError(f'context batch {context.batch_size} != batch '
                         f'{packed.valid.shape[0]}')
    if packed.valid.shape[1] and bool(((packed.counts > 0) & (packed.ar[:, 0] == 0)).any()):
        raise ValueError('with a context the first new token must have ar=1 (text only, '
                         'CAUSAL_TEXT); got image tokens')


__all__ = ['PackedPrefix', 'PrefixEmbedder', 'check_context', 'check_new_slots', 'pack_prefix',
           'padded_prefix', 'suffix_tokens']
