"""
Greedy token ids as the backends compute them: on the device where the model can, else argmax.

The fast path (``fast_path.model.FastPathModel``) puts the LM head and the argmax inside its
graphs (``decode_greedy``, ``lm_greedy``) and k decode steps in one graph
(``decode_greedy_steps``, ``fast_path/decode_steps.py``); the eager model returns logits.
"""

from __future__ import annotations

from typing import Callable

import torch

_Greedy = Callable[..., torch.Tensor]


def greedy_calls(model: object) -> tuple[_Greedy, _Greedy]:
    """
    Return ``(decode, seed)``: greedy token ids as the backend computes them.

    ``decode(tokens, positions, cache, write_slots, ctx_slots, ctx_mask[, adapter])`` and
    ``seed(hidden)`` return ``int64 [B]``: the model's own ``decode_greedy`` / ``lm_greedy``
    where it has them (the compiled fast path: LM head and argmax inside its graphs), else the
    argmax of ``decode_step`` / ``lm_logits``. ``adapter`` (``AdapterRows``) is passed on only
    when given (models without the suffix LoRA do not take it).
    """
    decode = getattr(model, 'decode_greedy', None) or \
        (lambda *args: model.decode_step(*args).argmax(dim=-1))
    seed = getattr(model, 'lm_greedy', None) or \
        (lambda hidden: model.lm_logits(hidden).argmax(dim=-1))
    return decode, seed


__all__ = ['greedy_calls']
