"""
Real-time chunking's guided sampler: flow matching guided toward the previous chunk (RTC).

Black, Galliker, Levine 2025, "Real-Time Execution of Action Chunking Flow Policies"
(arXiv 2506.07339), Algorithm 1, in openpi's time convention (t = 1 noise, t = 0 data,
``x += dt * u`` with ``dt = -1/N``; the paper's ``tau = 1 - t`` and its velocity ``-u``).
At each Euler step the data estimate ``x1 = x - t u(x)`` is compared with the guidance target
``Y`` (the previous chunk's still-to-come points, aligned to the new chunk) under the soft mask
``W``; the velocity is corrected by the vector-Jacobian product of that error::

    e = W * (Y - x1)            (stop-gradient)
    g = (d x1 / d x)^T e        (autograd through the denoiser: one backward per step)
    u' = u - w(t) g             (w(t): the guidance weight, clipped at beta; paper eq. 2, §4.2)

Exact RTC takes that product at every step, a backward through the action expert that costs
about as much as the forward. ``jacobian_steps = k`` (``RtcGuidance``; default every step) takes
it at the first k steps only and ``d x1 / d x = I`` at the later ones, so ``g = e`` there and
they cost a plain step. Since ``d x1 / d x = I - t du/dx``, what the later steps drop is
``t (du/dx)^T e``, which shrinks with t toward the data end (docs/action_semantics.md,
"The cost of exact guidance", measured against the exact sampler).

Where ``W`` is 0 the target is ignored (RTC never pulls toward a zero-padded leftover). What
``Y`` and ``W`` are (the frozen prefix of ``d`` points, the decaying soft mask, the previous
chunk re-anchored and held past its end) is RTC's policy, ``control/rtc.py``; this module is
the torch math that samples with them.

Three forms of the same step:

- :func:`guided_sample` takes the denoiser as a callable and the product with
  ``torch.autograd.grad`` (eager; :func:`guided_denoise` runs it on the model: the reference);
- :func:`guided_velocity` takes it with ``torch.func.vjp``, functionally, so that
  ``torch.compile(fullgraph=True)`` traces the forward and its vector-Jacobian product into one
  graph that a CUDA graph can capture (:func:`error_guided_velocity`: a step past
  ``jacobian_steps``);
- :class:`GuidedDenoiseCall` is the static-shape guided denoise built on it, what the fast path
  compiles and captures (``backends/fast_path/guided_denoise.py``; docs/gpu.md, "RTC on the fast
  path").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np
from oxygen_ros.config import ModelConfig
from oxygen_ros.model.denoise import (
    denoise_context, DenoiseContext, euler_step_modulations, expert_velocity)
from oxygen_ros.model.flow import euler_times
from oxygen_ros.model.kv_cache import PrefixKV
from oxygen_ros.model.layers import AttentionMask
from oxygen_ros.model.pi05 import Pi05Model
import torch
from torch import nn

Velocity = Callable[[torch.Tensor, int], torch.Tensor]
"""``velocity(x float32 [B, H, A], step) -> float32 [B, H, A]``, the flow at ``times[step]``."""


@dataclass(frozen=True, slots=True)
class RtcGuidance:
    """
    What a new chunk is guided toward.

    :ivar target: ``float32 [B, H, A]`` the guidance target ``Y``: the previous chunk's points
        for the new chunk's times, in normalized model space (any value where ``soft_mask``
        is 0).
    :ivar soft_mask: ``float32 [H]`` ``W`` (``control.rtc.soft_mask``).
    :ivar max_guidance_weight: ``beta``, where the guidance weight is clipped (paper: 5).
    :ivar jacobian_steps: k, the Euler steps (the first ones) whose correction takes the
        vector-Jacobian product; the later ones take ``d x1 / d x = I``. None: every step
        (RTC as the paper; :func:`jacobian_step_count`).
    """

    target: torch.Tensor
    soft_mask: torch.Tensor
    max_guidance_weight: float = 5.0
    jacobian_steps: int | None = None

    @classmethod
    def from_numpy(cls, target: np.ndarray, soft_mask: np.ndarray,
                   max_guidance_weight: float, jacobian_steps: int | None = None
                   ) -> RtcGuidance:
        """
        Return the guidance of one chunk from RTC's policy (``control.rtc.GuidanceTarget``).

        :param target: ``float [H, A]``, copied to ``float32 [1, H, A]`` on the CPU.
        :param soft_mask: ``float [H]``, copied to ``float32 [H]`` on the CPU.
        """
        return cls(torch.tensor(target, dtype=torch.float32)[None],
                   torch.tensor(soft_mask, dtype=torch.float32), max_guidance_weight,
                   jacobian_steps)


def jacobian_step_count(jacobian_steps: int | None, num_steps: int) -> int:
    """
    Return how many of ``num_steps`` Euler steps take the vector-Jacobian product.

    :param jacobian_steps: ``RtcGuidance.jacobian_steps`` (None: every step).
    :raises ValueError: outside ``0..num_steps``.
    """
    if jacobian_steps is None:
        return num_steps
    if not 0 <= jacobian_steps <= num_steps:
        raise ValueError(f'jacobian_steps must be in 0..{num_steps} (the Euler steps), got '
                         f'{jacobian_steps}')
    return jacobian_steps


def guidance_weight(t: float, max_guidance_weight: float) -> float:
    """
    Return RTC's guidance weight ``w(t)`` at flow time ``t`` (openpi convention: t = 1 is noise).

    With the paper's ``tau = 1 - t`` (eq. 2): ``min(beta, (1 - tau) / (tau r²))``,
    ``r² = (1 - tau)² / (tau² + (1 - tau)²)``, i.e. ``min(beta, (tau² + (1 - tau)²) /
    (tau (1 - tau)))``; ``beta`` (``max_guidance_weight``) at both ends.
    """
    tau = 1.0 - t
    if tau <= 0.0 or tau >= 1.0:
        return max_guidance_weight
    return min(max_guidance_weight, (tau**2 + (1 - tau) ** 2) / (tau * (1 - tau)))


def guidance_weights(num_steps: int, max_guidance_weight: float) -> torch.Tensor:
    """Return :func:`guidance_weight` at each of the ``num_steps`` Euler times: ``float32 [N]``."""
    return torch.tensor([guidance_weight(t, max_guidance_weight)
                         for t in euler_times(num_steps).tolist()], dtype=torch.float32)


def guided_sample(velocity: Velocity, noise: torch.Tensor, num_steps: int,
                  guidance: RtcGuidance | None) -> torch.Tensor:
    """
    Euler sampling from ``noise`` with RTC guidance (plain Euler when ``guidance`` is None).

    Runs outside inference mode with autograd on for the guided steps (callers inside
    ``torch.inference_mode()`` are fine: it is switched off here); every input is cloned
    into a normal tensor first.

    :param velocity: the denoiser (see ``Velocity``); it must be differentiable in ``x``.
    :param noise: ``float [B, H, A]`` x at t = 1.
    :param num_steps: Euler steps N >= 1.
    :returns: ``float32 [B, H, A]`` the sampled chunk, normalized model space.
    :raises ValueError: ``num_steps < 1``, guidance shapes that do not fit ``noise`` or
        ``guidance.jacobian_steps`` outside ``0..num_steps``.
    """
    if num_steps < 1:
        raise ValueError(f'num_steps must be >= 1, got {num_steps}')
    if guidance is not None and (guidance.target.shape != noise.shape
                                 or guidance.soft_mask.shape != noise.shape[1:2]):
        raise ValueError(f'guidance target {tuple(guidance.target.shape)} / soft mask '
                         f'{tuple(guidance.soft_mask.shape)} do not fit noise '
                         f'{tuple(noise.shape)}')
    exact = jacobian_step_count(guidance.jacobian_steps if guidance else None, num_steps)
    times = euler_times(num_steps).tolist()
    dt = torch.tensor(-1.0 / num_steps, dtype=torch.float32).item()
    with torch.inference_mode(False):
        x = noise.to(torch.float32).clone()
        active = guidance is not None and bool((guidance.soft_mask > 0).any())
        if active:
            target = guidance.target.to(torch.float32).clone()
            w = guidance.soft_mask.to(torch.float32).clone()[None, :, None]
        for step, t in enumerate(times):
            if not active:
                with torch.no_grad():
                    u = velocity(x, step)
            elif step >= exact:     # d x1 / d x = I: the error itself
                with torch.no_grad():
                    u = velocity(x, step)
                    err = w * (target - (x - t * u))
                u = u - guidance_weight(t, guidance.max_guidance_weight) * err
            else:
                with torch.enable_grad():
                    xg = x.detach().requires_grad_(True)
                    u = velocity(xg, step)
                    x1 = xg - t * u
                    err = (w * (target - x1)).detach()
                    (g,) = torch.autograd.grad(x1, xg, err)
                u = u.detach() - guidance_weight(t, guidance.max_guidance_weight) * g
            x = (x + dt * u).detach()
    return x


def guided_velocity(velocity: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                    t: torch.Tensor, target: torch.Tensor, soft_mask: torch.Tensor,
                    step_weight: torch.Tensor) -> torch.Tensor:
    """
    Return RTC's corrected velocity ``u - w(t) (d x1 / d x)^T (W (Y - x1))`` at one step.

    The step of :func:`guided_sample` with the product by ``torch.func.vjp``: no autograd
    graph is kept between calls and nothing needs ``requires_grad``, so it compiles into one
    graph (forward and backward) and runs inside ``torch.inference_mode``. ``velocity`` must
    not write into tensors it did not create (``DenoiseContext.split``).

    :param velocity: ``x float32 [B, H, A] -> float32 [B, H, A]``, the flow at this step.
    :param x: ``float32 [B, H, A]``.
    :param t: ``float32 []`` the step's flow time (``flow.euler_times``).
    :param target: ``float32 [B, H, A]`` the guidance target ``Y`` (``RtcGuidance``).
    :param soft_mask: ``float32 [H]`` ``W``.
    :param step_weight: ``float32 []`` the guidance weight at ``t`` (:func:`guidance_weights`).
    :returns: ``float32 [B, H, A]``.
    """
    def data_estimate(xg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u = velocity(xg)
        return xg - t * u, u
    x1, vjp, u = torch.func.vjp(data_estimate, x, has_aux=True)
    (g,) = vjp(soft_mask[None, :, None] * (target - x1))
    return u - step_weight * g


def error_guided_velocity(velocity: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                          t: torch.Tensor, target: torch.Tensor, soft_mask: torch.Tensor,
                          step_weight: torch.Tensor) -> torch.Tensor:
    """
    Return :func:`guided_velocity` with ``d x1 / d x = I``: ``u - w(t) W (Y - x1)``.

    A step past ``RtcGuidance.jacobian_steps``: no vector-Jacobian product, the cost of a
    plain velocity. Same parameters and result as :func:`guided_velocity`.
    """
    u = velocity(x)
    return u - step_weight * (soft_mask[None, :, None] * (target - (x - t * u)))


class GuidableModel(Protocol):
    """What :func:`guided_denoise` needs of a model (``Pi05Model`` is one)."""

    cfg: ModelConfig

    def denoise_context(self, prefix: PrefixKV, horizon: int | None = None) -> DenoiseContext:
        """Gather a cached prefix for ``velocity``."""

    def velocity(self, ctx: DenoiseContext, x_t: torch.Tensor,
                 t: torch.Tensor | float) -> torch.Tensor:
        """Return ``v(x_t, t)``, differentiable."""


def guided_denoise(model: GuidableModel, prefix: PrefixKV, noise: torch.Tensor,
                   guidance: RtcGuidance) -> torch.Tensor:
    """
    Denoise an action chunk on a cached prefix with RTC, eagerly: the reference.

    :func:`guided_sample` on the model's eager velocity (one backward through the action
    expert per Euler step, autograd outside inference mode).

    :param noise: ``float [B, H, A]`` x at t = 1, on the model's device (so is ``guidance``).
    :returns: ``float32 [B, H, A]`` normalized actions.
    """
    n = model.cfg.num_denoise_steps
    with torch.inference_mode(False):  # the context must be usable by autograd
        ctx = model.denoise_context(prefix, noise.shape[1])
    times = euler_times(n).tolist()
    return guided_sample(lambda x, step: model.velocity(ctx, x, times[step]), noise, n,
                         guidance)


GuidedStep = Callable[..., torch.Tensor]
"""``(keys, values, bias, cos, sin, x, mod_in, mod_post, mod_final, t, target, soft_mask,
step_weight) -> guided velocity``."""


class GuidedDenoiseCall(nn.Module):
    """
    The guided denoise as a static-shape call: N Euler steps of one chunk in one call (batch 1).

    ``static_calls.DenoiseCall`` with RTC's guidance at every Euler step: the velocity's
    vector-Jacobian product (at the first ``jacobian_steps``; the error alone after, as
    :func:`guided_sample`) is taken with ``torch.func.vjp`` (:func:`guided_velocity`), so the
    step is a pure function of tensors that ``torch.compile(fullgraph=True)`` traces, forward
    and backward, into one graph, and the N steps run as one CUDA-graph replay, like the plain
    loop. Nothing in it syncs with the host or depends on a value: the soft mask, the target
    and the guidance weights of the N steps are inputs, the Euler times and the adaRMS
    modulations constants of the call. The suffix attends the prefix K/V apart from its own
    (``denoise.split_prefix_attention``): no copy of the prefix K/V and no key or value
    gradient for its rows in any step; the prefix keys are converted to float32 (the logits'
    dtype) once per call, not once per layer and step.

    ``forward(k_pool, v_pool, ctx_slots [1, C], ctx_mask [1, C], num_tokens [1],
    noise [1, H, A], target [1, H, A], soft_mask [H], step_weights [N])`` returns the actions
    ``float32 [1, H, A]``, as :func:`guided_denoise` with ``RtcGuidance(target, soft_mask,
    jacobian_steps=jacobian_steps)`` and ``step_weights = guidance_weights(N, beta)``: equal on
    the valid part (tests: float32, 1e-5); the parity gate holds each graph to it.

    ``step`` is one guided velocity on plain tensors (:meth:`guided_step`), ``error_step`` one
    of the steps past ``jacobian_steps`` (:meth:`error_guided_step`); a compiler may replace
    them, as ``DenoiseCall.step``.

    :param jacobian_steps: ``RtcGuidance.jacobian_steps``, fixed per call (None: every step).
    :raises ValueError: ``jacobian_steps`` outside ``0..N``.
    """

    def __init__(self, model: Pi05Model, num_steps: int | None = None,
                 jacobian_steps: int | None = None) -> None:
        super().__init__()
        self.model = model
        n = model.cfg.num_denoise_steps if num_steps is None else num_steps
        self.num_steps = n
        self.jacobian_steps = jacobian_step_count(jacobian_steps, n)
        self.mods = euler_step_modulations(model, n, model.device)
        self.times = euler_times(n).to(model.device)
        self.dt = torch.tensor(-1.0 / n, dtype=torch.float32).item()
        self.step: GuidedStep = self.guided_step
        self.error_step: GuidedStep = self.error_guided_step

    def _velocity(self, keys: list[torch.Tensor], values: list[torch.Tensor],
                  bias: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mod_in: torch.Tensor,
                  mod_post: torch.Tensor, mod_final: torch.Tensor
                  ) -> Callable[[torch.Tensor], torch.Tensor]:
        """Return ``x -> v(x)`` on a prefix given as tensors, attended apart (``split``)."""
        ex = self.model.cfg.expert
        layout = AttentionMask.layout_for(cos.shape[1], ex.num_heads, ex.num_kv_heads)
        ctx = DenoiseContext(tuple(keys), tuple(values), AttentionMask(bias, layout), cos, sin,
                             keys[0].shape[2], split=True)
        return lambda xg: expert_velocity(self.model, ctx, xg, mod_in, mod_post, mod_final)

    def guided_step(self, keys: list[torch.Tensor], values: list[torch.Tensor],
                    bias: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, x: torch.Tensor,
                    mod_in: torch.Tensor, mod_post: torch.Tensor, mod_final: torch.Tensor,
                    t: torch.Tensor, target: torch.Tensor, soft_mask: torch.Tensor,
                    step_weight: torch.Tensor) -> torch.Tensor:
        """
        Return :func:`guided_velocity` on a prefix given as tensors (``[B, Hkv, P, D]``).

        The suffix attends the prefix K/V apart from its own (``denoise.split_prefix_attention``):
        the prefix K/V are constants of the vector-Jacobian product (no gradient, no copy).
        ``keys`` may be float32 (what :meth:`forward` passes: converted once per chunk).
        """
        return guided_velocity(
            self._velocity(keys, values, bias, cos, sin, mod_in, mod_post, mod_final),
            x, t, target, soft_mask, step_weight)

    def error_guided_step(self, keys: list[torch.Tensor], values: list[torch.Tensor],
                          bias: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          x: torch.Tensor, mod_in: torch.Tensor, mod_post: torch.Tensor,
                          mod_final: torch.Tensor, t: torch.Tensor, target: torch.Tensor,
                          soft_mask: torch.Tensor, step_weight: torch.Tensor) -> torch.Tensor:
        """Return :func:`error_guided_velocity`, as :meth:`guided_step` its product."""
        return error_guided_velocity(
            self._velocity(keys, values, bias, cos, sin, mod_in, mod_post, mod_final),
            x, t, target, soft_mask, step_weight)

    def forward(self, k_pool: torch.Tensor, v_pool: torch.Tensor, ctx_slots: torch.Tensor,
                ctx_mask: torch.Tensor, num_tokens: torch.Tensor, noise: torch.Tensor,
                target: torch.Tensor, soft_mask: torch.Tensor,
                step_weights: torch.Tensor) -> torch.Tensor:
        horizon = noise.shape[1]
        ctx = denoise_context(self.model, k_pool, v_pool, ctx_slots, ctx_mask, num_tokens,
                              horizon)
        p = ctx.prefix_len
        keys = [k[:, :, :p].float() for k in ctx.keys]   # the logits' dtype, once per chunk
        values = [v[:, :, :p] for v in ctx.values]
        x = noise.to(torch.float32)
        target = target.to(torch.float32)
        soft_mask = soft_mask.to(torch.float32)
        for s, (mod_in, mod_post, mod_final) in enumerate(self.mods):
            step = self.step if s < self.jacobian_steps else self.error_step
            u = step(keys, values, ctx.mask.bias, ctx.cos, ctx.sin, x, mod_in, mod_post,
                     mod_final, self.times[s], target, soft_mask, step_weights[s])
            x = x + self.dt * u
        return x


__all__ = ['GuidableModel', 'GuidedDenoiseCall', 'GuidedStep', 'RtcGuidance', 'Velocity',
           'error_guided_velocity', 'guidance_weight', 'guidance_weights', 'guided_denoise',
           'guided_sample', 'guided_velocity', 'jacobian_step_count']
