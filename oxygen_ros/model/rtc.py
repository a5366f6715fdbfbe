"""
Real-time chunking: flow-matching sampling guided toward the previous chunk (RTC).

Black, Galliker, Levine 2025, "Real-Time Execution of Action Chunking Flow Policies"
(arXiv 2506.07339), Algorithm 1, in openpi's time convention (t = 1 noise, t = 0 data,
``x += dt * u`` with ``dt = -1/N``; the paper's ``tau = 1 - t`` and its velocity ``-u``).
At each Euler step the data estimate ``x1 = x - t u(x)`` is compared with the target ``Y``
(the previous chunk's still-to-come points, aligned to the new chunk) under the soft mask
``W``; the velocity is corrected by the vector-Jacobian product of that error::

    e = W * (Y - x1)            (stop-gradient)
    g = (d x1 / d x)^T e        (autograd through the denoiser: one backward per step)
    u' = u - w(t) g             (w(t) = guidance_weight, paper eq. 2 and §4.2)

Where ``W`` is 0 the target is ignored (RTC never pulls toward a zero-padded leftover).

Two forms of the same step: :func:`guided_sample` takes the denoiser as a callable and the
product with ``torch.autograd.grad`` (eager; :func:`guided_denoise` runs it on the model: the
reference); :func:`guided_velocity` takes it with ``torch.func.vjp``, functionally, so that
``torch.compile(fullgraph=True)`` traces the forward and its vector-Jacobian product into one
graph that a CUDA graph can capture (the fast path's guided denoise, ``model/guided_call.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from oxygen_ros.config import ModelConfig
from oxygen_ros.model.denoise import DenoiseContext
from oxygen_ros.model.flow import euler_times
from oxygen_ros.model.kv_cache import PrefixKV
import torch

Velocity = Callable[[torch.Tensor, int], torch.Tensor]
"""``velocity(x float32 [B, H, A], step) -> float32 [B, H, A]``, the flow at ``times[step]``."""


@dataclass(frozen=True, slots=True)
class RtcGuidance:
    """
    What a new chunk is guided toward.

    :ivar target: ``float32 [B, H, A]`` the previous chunk's points for the new chunk's times,
        in normalized model space (any value where ``weights`` is 0).
    :ivar weights: ``float32 [H]`` the soft mask (``control.smoothing.rtc_prefix_weights``).
    :ivar max_weight: ``beta``, the largest guidance weight (paper: 5).
    """

    target: torch.Tensor
    weights: torch.Tensor
    max_weight: float = 5.0


def guidance_weight(t: float, max_weight: float) -> float:
    """
    Return RTC's guidance weight at flow time ``t`` (openpi convention: t = 1 is noise).

    With the paper's ``tau = 1 - t``: ``min(beta, (1 - tau) / (tau r²))``,
    ``r² = (1 - tau)² / (tau² + (1 - tau)²)``, i.e. ``min(beta, (tau² + (1 - tau)²) /
    (tau (1 - tau)))``; ``beta`` at both ends.
    """
    tau = 1.0 - t
    if tau <= 0.0 or tau >= 1.0:
        return max_weight
    return min(max_weight, (tau**2 + (1 - tau) ** 2) / (tau * (1 - tau)))


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
    :raises ValueError: ``num_steps < 1`` or guidance shapes that do not fit ``noise``.
    """
    if num_steps < 1:
        raise ValueError(f'num_steps must be >= 1, got {num_steps}')
    if guidance is not None and (
            guidance.target.shape != noise.shape or guidance.weights.shape != noise.shape[1:2]):
        raise ValueError(f'guidance target {tuple(guidance.target.shape)} / weights '
                         f'{tuple(guidance.weights.shape)} do not fit noise {tuple(noise.shape)}')
    times = euler_times(num_steps).tolist()
    dt = torch.tensor(-1.0 / num_steps, dtype=torch.float32).item()
    with torch.inference_mode(False):
        x = noise.to(torch.float32).clone()
        active = guidance is not None and bool((guidance.weights > 0).any())
        if active:
            target = guidance.target.to(torch.float32).clone()
            w = guidance.weights.to(torch.float32).clone()[None, :, None]
        for step, t in enumerate(times):
            if not active:
                with torch.no_grad():
                    u = velocity(x, step)
            else:
                with torch.enable_grad():
                    xg = x.detach().requires_grad_(True)
                    u = velocity(xg, step)
                    x1 = xg - t * u
                    err = (w * (target - x1)).detach()
                    (g,) = torch.autograd.grad(x1, xg, err)
                u = u.detach() - guidance_weight(t, guidance.max_weight) * g
            x = (x + dt * u).detach()
    return x


def guidance_weights(num_steps: int, max_weight: float) -> torch.Tensor:
    """Return :func:`guidance_weight` at each of the ``num_steps`` Euler times: ``float32 [N]``."""
    return torch.tensor([guidance_weight(t, max_weight) for t in euler_times(num_steps).tolist()],
                        dtype=torch.float32)


def guided_velocity(velocity: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                    t: torch.Tensor, target: torch.Tensor, weights: torch.Tensor,
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
    :param target: ``float32 [B, H, A]`` the previous chunk's points (``RtcGuidance``).
    :param weights: ``float32 [H]`` the soft mask.
    :param step_weight: ``float32 []`` the guidance weight at ``t`` (:func:`guidance_weights`).
    :returns: ``float32 [B, H, A]``.
    """
    def data_estimate(xg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u = velocity(xg)
        return xg - t * u, u
    x1, vjp, u = torch.func.vjp(data_estimate, x, has_aux=True)
    (g,) = vjp(weights[None, :, None] * (target - x1))
    return u - step_weight * g


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


__all__ = ['GuidableModel', 'RtcGuidance', 'Velocity', 'guidance_weight', 'guidance_weights',
           'guided_denoise', 'guided_sample', 'guided_velocity']
