"""
Random initialisation of a π0.5 model: every parameter normal, activations O(1).

Used for tests and benchmarks (real weights come from ``weights.py``). Unlike openpi, nothing
is zero-initialised: openpi zero-inits the adaRMS ``Dense`` (so an untrained action expert
ignores the time) and LayerNorm/RMSNorm offsets; with zeros, tests comparing cached and
uncached paths could pass without exercising the prefix or the time condition.
"""

from __future__ import annotations

import math

from oxygen_ros.model.layers import AdaRMSNorm, RMSNorm

import torch
from torch import nn


NORM_STD = 0.1
"""Std of norm weights/biases around their neutral value (1 for scales, 0 for shifts)."""
BIAS_STD = 0.02
ADA_GAIN = 0.5
"""adaRMS Dense weight std = ADA_GAIN / sqrt(fan_in): scale, shift, gate ~ N(0, ~0.5)."""


@torch.no_grad()
def init_parameters(model: nn.Module) -> None:
    """
    Fill every parameter of ``model`` in place from the global torch RNG.

    Deterministic under ``torch.manual_seed`` (modules are visited in registration order).
    Meta tensors are left alone. Rules: ``Linear``/``Conv2d`` weights ``N(0, 1/fan_in)``,
    biases ``N(0, 0.02²)``; adaRMS Dense ``N(0, 0.25/fan_in)``; RMSNorm offsets and LayerNorm
    shifts ``N(0, 0.1²)``, LayerNorm scales ``N(1, 0.1²)``; the token embedding rows
    normal, then scaled to norm 1 (so ``E[id] * sqrt(W)`` is O(1)); the vision position
    embedding ``N(0, 0.5²)``.

    Equal-norm embedding rows matter for greedy decoding with the tied LM head: with 257152
    random rows in a narrow width, the few rows of largest norm ("hubs") would win the argmax
    for almost any hidden state, and a random model would emit the same token whatever its
    prefix, hiding KV-cache bugs from tests that compare texts.

    :param model: any module built from this package's layers.
    """
    ada_dense = {id(m.dense) for m in model.modules() if isinstance(m, AdaRMSNorm)}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if not param.is_meta:
                _init_one(module, name, param, id(module) in ada_dense)


def _init_one(module: nn.Module, name: str, param: torch.Tensor, ada_dense: bool) -> None:
    if isinstance(module, RMSNorm):
        param.normal_(0.0, NORM_STD)
    elif isinstance(module, nn.LayerNorm):
        param.normal_(1.0 if name == 'weight' else 0.0, NORM_STD)
    elif isinstance(module, (nn.Linear, nn.Conv2d)) and name == 'weight':
        fan_in = param[0].numel()
        gain = ADA_GAIN if ada_dense else 1.0
        param.normal_(0.0, gain / math.sqrt(fan_in))
    elif isinstance(module, (nn.Linear, nn.Conv2d)) and name == 'bias':
        param.normal_(0.0, BIAS_STD)
    elif param.dim() == 2 and name in ('embedding', 'lm_head'):
        param.normal_(0.0, 1.0)
        param.div_(param.norm(dim=1, keepdim=True))
    elif param.dim() == 2 and name == 'pos_embed':
        param.normal_(0.0, 0.5)
    elif param.dim() == 2:
        param.normal_(0.0, 1.0 / math.sqrt(param.shape[1]))
    else:
        raise AssertionError(f'no init rule for parameter {name!r} of {type(module).__name__}')


__all__ = ['init_parameters']
