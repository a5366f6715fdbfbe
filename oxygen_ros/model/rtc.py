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

Where ``W`` is 0 the target is ignored (RTC never pulls toward a zero-padded leftover). The
denoiser is a callable, so this module does not depend on how the model computes it (eager;
the backward needs autograd, so this path is never a CUDA graph).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from oxygen_ros.model.flow import euler_times
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


__all__ = ['RtcGuidance', 'Velocity', 'guidance_weight', 'guided_sample']
