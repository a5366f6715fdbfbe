"""
How far RTC with the Jacobian on the first k Euler steps lands from exact RTC, on one frame.

``oxygen_bench engine --rtc-jacobian-steps K`` reports it beside the guided denoise's time
(docs/action_semantics.md#the-cost-of-exact-guidance): the chunk sampled with
``RtcGuidance.jacobian_steps = K`` against the one sampled with the Jacobian at every step, both
eager (autograd, ``model.guidance.guided_denoise``), from the same noise toward the same target.
The target is what RTC guides toward in steady state: the policy's own chunk for this observation
from other noise, advanced by a third of the chunk (the points executed since it started), its
first third frozen (the inference delay) and the rest of what it covers soft-masked
(``control.rtc.soft_mask``). Figures are in normalized model units, as the model samples.
"""

from __future__ import annotations

from oxygen_ros.control.rtc import soft_mask
from oxygen_ros.model.guidance import guided_denoise, RtcGuidance
from oxygen_ros.model.kv_cache import PrefixKV
from oxygen_ros.model.pi05 import Pi05Model
import torch


def jacobian_steps_deviation(model: Pi05Model, prefix: PrefixKV, noise: torch.Tensor,
                             jacobian_steps: int, seed: int = 1) -> dict[str, float]:
    """
    Return the chunk of ``jacobian_steps`` against exact RTC's, and each one's frozen gap.

    :param model: the eager model (its ``velocity`` is differentiated).
    :param prefix: one frame's cached prefix (batch 1).
    :param noise: ``float32 [1, H, A]`` on the model's device.
    :param jacobian_steps: k in ``0..N``.
    :param seed: the previous chunk's noise.
    :returns: ``max_abs_vs_exact`` (whole chunk), ``frozen_max_abs_vs_exact`` (the frozen
        third), ``frozen_gap_exact`` / ``frozen_gap`` (largest distance of the frozen third
        to its target: how well each keeps what the robot already executes) and
        ``chunk_max_abs`` (the exact chunk's largest value, for scale).
    """
    h = noise.shape[1]
    third = max(h // 3, 1)
    gen = torch.Generator().manual_seed(seed)
    other = torch.randn(noise.shape, generator=gen).to(noise.device)
    with torch.inference_mode():
        previous = model.denoise(prefix, other).float()
    target = torch.zeros_like(previous)
    target[:, :h - third] = previous[:, third:]
    mask = torch.tensor(soft_mask(h, third, h - third), dtype=torch.float32,
                        device=noise.device)
    exact = guided_denoise(model, prefix, noise, RtcGuidance(target, mask))
    cut = guided_denoise(model, prefix, noise,
                         RtcGuidance(target, mask, jacobian_steps=jacobian_steps))
    return {'max_abs_vs_exact': float((cut - exact).abs().max()),
            'frozen_max_abs_vs_exact': float((cut - exact)[:, :third].abs().max()),
            'frozen_gap_exact': float((exact - target)[:, :third].abs().max()),
            'frozen_gap': float((cut - target)[:, :third].abs().max()),
            'chunk_max_abs': float(exact.abs().max())}


__all__ = ['jacobian_steps_deviation']
