"""
Flow-matching time: the Euler time grid and the sine-cosine time embedding.

``docs/model.md#flow-matching`` and ``docs/model.md#π05-specifics`` (time condition).

Convention (openpi ``pi0.py``): t = 1 is noise, t = 0 is data; sampling integrates
``x += dt * v(x, t)`` with ``dt = -1 / N`` from t = 1, in float32.
"""

from __future__ import annotations

import math

import torch


def sincos_time_embedding(t: torch.Tensor, dim: int, min_period: float,
                          max_period: float) -> torch.Tensor:
    """
    Return the sine-cosine embedding of flow-matching times, float32.

    ``period_k = min_period * (max_period / min_period) ** linspace(0, 1, dim / 2)[k]``;
    ``emb = [sin(2 pi t / period), cos(2 pi t / period)]`` (openpi ``pi0.py``
    ``posemb_sincos``).

    :param t: ``float32 [M]`` times in [0, 1].
    :returns: ``float32 [M, dim]``.
    """
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float32, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angles = t.to(torch.float32)[:, None] * (2.0 * math.pi / period)
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)


def euler_times(num_steps: int) -> torch.Tensor:
    """
    Return the times of the Euler steps, accumulated in float32 as openpi (``pi0.py``).

    ``t_0 = 1``, ``t_{k+1} = t_k + dt`` with ``dt = float32(-1 / num_steps)``.

    :returns: ``float32 [num_steps]`` on the CPU.
    """
    dt = torch.tensor(-1.0 / num_steps, dtype=torch.float32)
    t = torch.tensor(1.0, dtype=torch.float32)
    times = []
    for _ in range(num_steps):
        times.append(t)
        t = t + dt
    return torch.stack(times)


__all__ = ['euler_times', 'sincos_time_embedding']
