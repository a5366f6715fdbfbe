"""
The action expert's adaRMS norm in Triton, with the gated residual before it: one kernel.

π0.5's action expert (``layers.AdaRMSNorm``; openpi ``models/gemma.py`` ``RMSNorm`` with
``cond``) normalizes the residual stream and modulates it with the ``[scale, shift, gate]``
of its time condition; the branch's output joins the stream through the gate. Eagerly, and
left to Inductor, a layer-step spends several small kernels on this. Here one program per
token row does, in one pass over the row:

- with a residual: ``x = x + delta * gate`` (``layers.gated_residual``, the gate of the
  previous adaRMS norm cast to the stream's dtype; each product and sum rounded to it, as
  PyTorch's eager ops do), written out as the new stream, then
- ``y = x / rms(x) * (1 + scale) + shift`` with the statistics and the modulation in
  float32 (``layers.rms_normalize``), cast to the stream's dtype: the next GEMM's input.

:func:`ada_rms_norm` is the norm alone (the first layer's input norm), and
:func:`gated_ada_rms_norm` the residual and the norm (every other norm of a layer-step, the
final norm included). Operators as ``paged_decode`` (``registration.kernel_operator``).
"""

from __future__ import annotations

from oxygen_ros.backends.fast_path.kernels.registration import (
    is_interpreted, kernel_operator, launch)
import torch
import triton
import triton.language as tl


@triton.jit
def _gated_norm(x_ptr, delta_ptr, gate_ptr, mod_ptr, x_out_ptr, y_ptr, width, rows_per_batch,
                stride_gb, stride_mb, eps, RESIDUAL: tl.constexpr,  # noqa: N803
                BLOCK_W: tl.constexpr):  # noqa: N803
    """One token row: the gated residual (``RESIDUAL``), then the modulated RMS norm."""
    eps = tl.cast(eps, tl.float32)     # Inductor passes a Python float as fp64
    row = tl.program_id(0).to(tl.int64)
    b = row // rows_per_batch
    cols = tl.arange(0, BLOCK_W)
    ok = cols < width
    x = tl.load(x_ptr + row * width + cols, mask=ok, other=0.0)
    dtype = x.dtype
    if RESIDUAL:
        delta = tl.load(delta_ptr + row * width + cols, mask=ok, other=0.0).to(tl.float32)
        gate = tl.load(gate_ptr + b * stride_gb + 2 * width + cols, mask=ok, other=0.0)
        gated = (delta * gate.to(dtype).to(tl.float32)).to(dtype)
        x = (x.to(tl.float32) + gated.to(tl.float32)).to(dtype)
        tl.store(x_out_ptr + row * width + cols, x, mask=ok)
    xf = x.to(tl.float32)
    normed = xf * tl.rsqrt(tl.sum(xf * xf, 0) / width + eps)
    scale = tl.load(mod_ptr + b * stride_mb + cols, mask=ok, other=0.0).to(tl.float32)
    shift = tl.load(mod_ptr + b * stride_mb + width + cols, mask=ok, other=0.0).to(tl.float32)
    y = normed * (1.0 + scale) + shift
    tl.store(y_ptr + row * width + cols, y.to(dtype), mask=ok)


INTERPRETED = is_interpreted(_gated_norm)
"""The kernel is Triton's CPU interpreter's (``TRITON_INTERPRET=1`` at import)."""


def _check(x: torch.Tensor, mod: torch.Tensor, delta: torch.Tensor | None = None,
           gate_mod: torch.Tensor | None = None) -> None:
    """Raise ``ValueError`` naming the first argument whose shape, dtype or device is wrong."""
    if x.dim() != 3:
        raise ValueError(f'x must be [B, S, W], got {list(x.shape)}')
    b, _, w = x.shape
    mods = {'mod': mod} if gate_mod is None else {'mod': mod, 'gate_mod': gate_mod}
    for name, m in mods.items():
        if tuple(m.shape) not in ((3 * w,), (b, 3 * w), (1, 3 * w)):
            raise ValueError(f'{name} must be [3W] or [B, 3W] with W = {w}, got '
                             f'{list(m.shape)}')
        if m.device != x.device or not m.is_floating_point():
            raise ValueError(f'{name} must be a floating tensor on {x.device}')
    if delta is not None and (delta.shape != x.shape or delta.dtype != x.dtype
                              or delta.device != x.device):
        raise ValueError(f'delta must be {list(x.shape)} {x.dtype} like x, got '
                         f'{list(delta.shape)} {delta.dtype}')


def num_warps(width: int) -> int:
    """Return the warps of a row of ``width``: one per 256 columns, 1 to 16."""
    return min(16, max(1, triton.next_power_of_2(width) // 256))


def _batch_stride(mod: torch.Tensor) -> int:
    """Return the modulation's stride between batch rows (0: one for every row)."""
    return mod.stride(0) if mod.dim() == 2 and mod.shape[0] > 1 else 0


def _run(x: torch.Tensor, mod: torch.Tensor, eps: float, delta: torch.Tensor | None,
         gate_mod: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    _check(x, mod, delta, gate_mod)
    b, s, w = x.shape
    x, mod = x.contiguous(), mod.contiguous()
    y = torch.empty((b, s, w), dtype=x.dtype, device=x.device)
    residual = delta is not None
    if residual:
        delta, gate_mod = delta.contiguous(), gate_mod.contiguous()
        x_out = torch.empty((b, s, w), dtype=x.dtype, device=x.device)
    else:                  # never read or written (RESIDUAL is a constant of the kernel)
        delta, gate_mod, x_out = x, mod, y
    block = triton.next_power_of_2(w)
    launch(_gated_norm, (b * s,), x, delta, gate_mod, mod, x_out, y, w, s,
           _batch_stride(gate_mod), _batch_stride(mod), eps, RESIDUAL=residual, BLOCK_W=block,
           num_warps=num_warps(w))
    return x_out, y


def _norm(x: torch.Tensor, mod: torch.Tensor, eps: float) -> torch.Tensor:
    """
    Return ``AdaRMSNorm(x, mod)[0]``: ``x / rms(x) * (1 + scale) + shift`` in x.dtype.

    :param x: ``[B, S, W]`` the residual stream (float32, float16 or bfloat16).
    :param mod: ``[3W]`` or ``[B, 3W]`` the norm's modulation (``AdaRMSNorm.modulation``:
        scale, shift, gate), any floating dtype (float32 in a 16-bit model).
    :param eps: the norm's epsilon.
    :returns: ``[B, S, W]`` in ``x.dtype``.
    :raises ValueError: shapes or devices that do not fit.
    """
    return _run(x, mod, eps, None, None)[1]


def _gated_norm_op(x: torch.Tensor, delta: torch.Tensor, gate_mod: torch.Tensor,
                   mod: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Return ``(x + delta * gate, AdaRMSNorm(x + delta * gate, mod)[0])``, each in x.dtype.

    :param x: ``[B, S, W]`` the residual stream before the branch.
    :param delta: ``[B, S, W]`` the branch's output, x's dtype.
    :param gate_mod: ``[3W]`` or ``[B, 3W]``: the modulation of the norm that opened the
        branch; its gate (the last W) is cast to x's dtype, as ``AdaRMSNorm`` returns it.
    :param mod: the modulation of the norm that follows (scale, shift).
    :param eps: the norm's epsilon.
    :returns: the new stream and the normalized, modulated stream.
    :raises ValueError: shapes, dtypes or devices that do not fit.
    """
    x_out, y = _run(x, mod, eps, delta, gate_mod)
    return x_out, y


def _norm_shape(x, mod, eps):
    _check(x, mod)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _gated_norm_shape(x, delta, gate_mod, mod, eps):
    _check(x, mod, delta, gate_mod)
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(x.shape, dtype=x.dtype, device=x.device))


ada_rms_norm = kernel_operator('oxygen_ros::ada_rms_norm', _norm, _norm_shape,
                               interpreted=INTERPRETED)
gated_ada_rms_norm = kernel_operator('oxygen_ros::gated_ada_rms_norm', _gated_norm_op,
                                     _gated_norm_shape, interpreted=INTERPRETED)

__all__ = ['INTERPRETED', 'ada_rms_norm', 'gated_ada_rms_norm', 'num_warps']
