"""
RTC's guided denoise as a static-shape call: what the fast path compiles and captures.

``GuidedDenoiseCall`` is ``static_calls.DenoiseCall`` with real-time chunking's guidance at
every Euler step (``model/rtc.py``): the velocity's vector-Jacobian product is taken with
``torch.func.vjp`` (:func:`rtc.guided_velocity`), so the step is a pure function of tensors
that ``torch.compile(fullgraph=True)`` traces, forward and backward, into one graph, and the N
steps run as one CUDA-graph replay, like the plain loop. Nothing in it syncs with the host or
depends on a value: the soft mask, the target and the guidance weights of the N steps are
inputs, the Euler times and the adaRMS modulations constants of the call. The suffix attends
the prefix K/V apart from its own (``denoise.split_prefix_attention``): no copy of the prefix
K/V and no key or value gradient for its rows in any step; the prefix keys are converted to
float32 (the logits' dtype) once per call, not once per layer and step.

It equals the eager reference (``rtc.guided_denoise``: autograd through ``Pi05Model.velocity``)
on the valid part (tests: float32, 1e-5); the parity gate holds each graph to it.
"""

from __future__ import annotations

from typing import Callable

from oxygen_ros.model.denoise import (
    denoise_context, DenoiseContext, euler_step_modulations, expert_velocity)
from oxygen_ros.model.flow import euler_times
from oxygen_ros.model.layers import AttentionMask
from oxygen_ros.model.pi05 import Pi05Model
from oxygen_ros.model.rtc import guided_velocity
import torch
from torch import nn

GuidedStep = Callable[..., torch.Tensor]
"""``(keys, values, bias, cos, sin, x, mod_in, mod_post, mod_final, t, target, weights,
step_weight) -> guided velocity``."""


class GuidedDenoiseCall(nn.Module):
    """
    The guided flow-matching loop of one action chunk, N Euler steps in one call (batch 1).

    ``forward(k_pool, v_pool, ctx_slots [1, C], ctx_mask [1, C], num_tokens [1],
    noise [1, H, A], target [1, H, A], weights [H], step_weights [N])`` returns the actions
    ``float32 [1, H, A]``, as ``rtc.guided_denoise`` with ``RtcGuidance(target, weights)``
    and ``step_weights = rtc.guidance_weights(N, beta)``.

    ``step`` is one guided velocity on plain tensors (:meth:`guided_step`); a compiler may
    replace it, as ``DenoiseCall.step``.
    """

    def __init__(self, model: Pi05Model, num_steps: int | None = None) -> None:
        super().__init__()
        self.model = model
        n = model.cfg.num_denoise_steps if num_steps is None else num_steps
        self.num_steps = n
        self.mods = euler_step_modulations(model, n, model.device)
        self.times = euler_times(n).to(model.device)
        self.dt = torch.tensor(-1.0 / n, dtype=torch.float32).item()
        self.step: GuidedStep = self.guided_step

    def guided_step(self, keys: list[torch.Tensor], values: list[torch.Tensor],
                    bias: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor,
                    mod_in: torch.Tensor, mod_post: torch.Tensor, mod_final: torch.Tensor,
                    t: torch.Tensor, target: torch.Tensor, weights: torch.Tensor,
                    step_weight: torch.Tensor) -> torch.Tensor:
        """
        Return ``rtc.guided_velocity`` on a prefix given as tensors (``[B, Hkv, P, D]``).

        The suffix attends the prefix K/V apart from its own (``denoise.split_prefix_attention``):
        the prefix K/V are constants of the vector-Jacobian product (no gradient, no copy).
        ``keys`` may be float32 (what :meth:`forward` passes: converted once per chunk).
        """
        ex = self.model.cfg.expert
        layout = AttentionMask.layout_for(x.shape[1], ex.num_heads, ex.num_kv_heads)
        ctx = DenoiseContext(tuple(keys), tuple(values), AttentionMask(bias, layout), cos, sin,
                             keys[0].shape[2], split=True)
        return guided_velocity(
            lambda xg: expert_velocity(self.model, ctx, xg, mod_in, mod_post, mod_final),
            x, t, target, weights, step_weight)

    def forward(self, k_pool: torch.Tensor, v_pool: torch.Tensor, ctx_slots: torch.Tensor,
                ctx_mask: torch.Tensor, num_tokens: torch.Tensor, noise: torch.Tensor,
                target: torch.Tensor, weights: torch.Tensor,
                step_weights: torch.Tensor) -> torch.Tensor:
        horizon = noise.shape[1]
        ctx = denoise_context(self.model, k_pool, v_pool, ctx_slots, ctx_mask, num_tokens,
                              horizon)
        p = ctx.prefix_len
        keys = [k[:, :, :p].float() for k in ctx.keys]   # the logits' dtype, once per chunk
        values = [v[:, :, :p] for v in ctx.values]
        x = noise.to(torch.float32)
        target = target.to(torch.float32)
        weights = weights.to(torch.float32)
        for s, (mod_in, mod_post, mod_final) in enumerate(self.mods):
            u = self.step(keys, values, ctx.mask.bias, ctx.cos, ctx.sin, x, mod_in, mod_post,
                          mod_final, self.times[s], target, weights, step_weights[s])
            x = x + self.dt * u
        return x


__all__ = ['GuidedDenoiseCall', 'GuidedStep']
