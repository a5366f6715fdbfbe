"""
Preallocated K/V storage of the VLM expert and the read-only view of a prefix in it.

Only the VLM expert is ever cached; the action expert recomputes its H suffix tokens at every
denoise step and reads the prefix K/V without writing (openpi ``src/openpi/models/pi0.py``
``sample_actions``; ``docs/model.md#the-kv-cache``).

Storage is a flat array of token *slots* shared by every layer: ``k[l, slot]`` is the key of
one token at layer ``l``. Who owns which slot is decided outside the model (``oxygen_ros.kv``
hands out blocks of ``block_size`` slots, slot = block_id * block_size + offset); the model
only reads and writes the slots it is given.
"""

from __future__ import annotations

from dataclasses import dataclass

from oxygen_ros.config import GemmaConfig
import torch


class KVCache:
    """
    K and V of the VLM expert for ``num_slots`` token slots, allocated once.

    :ivar k: ``[L, num_slots, Hkv, D]`` post-RoPE keys.
    :ivar v: ``[L, num_slots, Hkv, D]`` values.
    """

    def __init__(self, vlm: GemmaConfig, num_slots: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = 'cpu') -> None:
        if num_slots < 1:
            raise ValueError(f'num_slots must be >= 1, got {num_slots}')
        shape = (vlm.depth, num_slots, vlm.num_kv_heads, vlm.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def num_slots(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        """Return bytes held by K and V together."""
        return self.k.nbytes + self.v.nbytes

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    @property
    def device(self) -> torch.device:
        return self.k.device


@dataclass(frozen=True, slots=True)
class PrefixKV:
    """
    A prefix (images + prompt) whose K/V sits in a ``KVCache``; read-only for its readers.

    Tokens are packed: invalid tokens (masked cameras, prompt padding) are never stored, so
    the rope position of the i-th valid token is i (positions = cumsum(valid) - 1, as openpi:
    ``docs/model.md#mixture-of-transformers-attention-and-masks``).

    :ivar cache: the storage.
    :ivar slots: ``int64 [B, P]`` slot of each prefix token in ``cache``; entries where
        ``mask`` is False are padding and may point at any slot.
    :ivar mask: ``bool [B, P]`` True for real prefix tokens.
    :ivar num_tokens: ``int64 [B]`` count of real tokens = rope position of the next token.
    :ivar last_hidden: ``[B, W_vlm]`` VLM output (before the final norm) at the last real
        token; the LM head of it gives the logits of the first generated token
        (``docs/model.md#the-kv-cache``).
    """

    cache: KVCache
    slots: torch.Tensor
    mask: torch.Tensor
    num_tokens: torch.Tensor
    last_hidden: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.slots.shape[0]
