"""
The big_vision "ar-mask" rule that builds every attention pattern of π0.5.

openpi ``src/openpi/models/pi0.py`` ``make_attn_mask``;
``docs/model.md#mixture-of-transformers-attention-and-masks``.

Each token carries ``valid`` (real, not padding) and ``ar`` (1 = later tokens may not be seen
from before this one). With ``c = cumsum(ar)``, query i may attend key j iff
``valid_i and valid_j and c_j <= c_i``. openpi ``pi0.py make_attn_mask`` examples:

- ``ar = [1 1 1 1 1 1]``: causal;
- ``ar = [0 0 0 1 1 1]``: prefix-LM (first three bidirectional, the rest causal);
- ``ar = [1 0 1 0 1 0 0 1 0 0]``: block-causal over four blocks.
"""

from __future__ import annotations

from oxygen_ros.config import PrefixAttention

import torch


def make_attn_mask(valid: torch.Tensor, ar: torch.Tensor) -> torch.Tensor:
    """
    Return the 2-D attention mask of the ar-mask rule.

    :param valid: ``bool [B, N]`` True for real tokens.
    :param ar: ``int or bool [B, N]`` (or ``[N]``, broadcast) autoregressive flags.
    :returns: ``bool [B, N, N]``, entry ``[b, i, j]`` True iff query i may attend key j.
    :raises ValueError: if the shapes disagree.
    """
    if valid.dim() != 2:
        raise ValueError(f'valid must be [B, N], got shape {tuple(valid.shape)}')
    ar = torch.as_tensor(ar, device=valid.device).expand_as(valid)
    c = torch.cumsum(ar.to(torch.int64), dim=1)
    causal = c[:, None, :] <= c[:, :, None]
    return causal & valid[:, None, :] & valid[:, :, None]


def text_ar(attention: PrefixAttention) -> int:
    """Return the ar flag of prompt tokens: 0 bidirectional (openpi), 1 causal (OxyGen)."""
    return 1 if attention is PrefixAttention.CAUSAL_TEXT else 0


__all__ = ['make_attn_mask', 'text_ar']
