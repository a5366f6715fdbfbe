"""
FP8 weights: E4M3 linears with per-output-channel scales, swapped in at load.

What is quantized (:func:`fp8_linear_names`): every ``nn.Linear`` of the model except those
openpi keeps in float32 (``Pi05Model.float32_parameters``: the action expert's adaRMS
``Dense``, ``action_in_proj``, ``action_out_proj``, the time MLP), i.e. SigLIP's Q/K/V, output
and MLP projections, the projector, and the Q/K/V, output, gate/up and down projections of
both Gemma experts: the FP8 GEMM sites FlashRT quantizes in π0.5
(``flash_rt/core/quant/pi05_sites.py``). Not the LM head: it is the token embedding (whose
rows the prompt reads in the model dtype; an FP8 copy would add 0.5 GB), the action path never
reads it, and its argmax is the text (vLLM leaves it unquantized too). A linear whose in or
out size is not a multiple of 16 (the FP8 GEMMs' alignment) stays as it is.

Weights, once (:func:`quantize_weight`): per output channel ``s_n = max_k |W_nk| / 448``
(448: E4M3's largest finite value; an all-zero row gets ``s_n = 1``), ``W_q = e4m3(W / s)``
with the division in float32, clamped to ``±448`` (a cast of a larger value gives NaN),
rounded to nearest even by the cast.

Two kernels (:class:`Fp8Kernel`):

- ``SCALED_MM`` (W8A8, CUDA compute capability >= 8.9): activations quantized per token at
  run time (:func:`quantize_rows`: ``s_m = max(max_k |x_mk| / 448, 1 / (448 * 512))``, the
  floor being vLLM's ``_FP8_MIN_SCALING_FACTOR``, ``input_quant_fp8.py``), then
  ``torch._scaled_mm(x_q, W_q^T, scale_a=s_m [M, 1], scale_b=s_n [1, N])``: ``(x_q s_m)
  (W_q s_n)^T`` accumulated in float32, written in the activation dtype, plus the bias.
  Traceable by Dynamo (an ATen op and a reduction), capturable in CUDA graphs. Its backward
  (for real-time chunking's guidance) treats the activation rounding as the identity (the
  straight-through estimator): ``dL/dx = dL/dy (W_q s)``.
- ``DEQUANT`` (weight-only, everywhere): ``F.linear(x, (W_q.float() * s).to(x.dtype), b)``:
  the weights' rounding and nothing else (in a float32 model: exactly that error).
"""

from __future__ import annotations

from contextlib import contextmanager
import copy
import enum
import itertools
from typing import Iterator

import torch
from torch import nn
import torch.nn.functional as F  # noqa: N812

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
"""Largest finite ``float8_e4m3fn`` value."""
MIN_ACTIVATION_SCALE = 1.0 / (E4M3_MAX * 512.0)
"""Floor of a per-token activation scale (vLLM's ``_FP8_MIN_SCALING_FACTOR``)."""
ALIGN = 16
"""In and out sizes of a quantized linear are multiples of this (FP8 GEMM alignment)."""
MIN_CAPABILITY = (8, 9)
"""CUDA compute capability with FP8 tensor cores: Ada 8.9, Hopper 9.0, Blackwell 10.x/12.x,
Jetson Thor 11.0 (whether torch's row-wise ``_scaled_mm`` runs there is probed, not assumed:
:func:`probe_scaled_mm`)."""


_scaled_mm_enabled = True
"""Set by :func:`scaled_mm_kernel`."""


@contextmanager
def scaled_mm_kernel(enabled: bool) -> Iterator[None]:
    """
    Let ``SCALED_MM`` linears use ``torch._scaled_mm`` inside this context, or not.

    Off, they multiply as ``DEQUANT`` does (the weights' rounding only): the fast path's
    warm-up compiles a step again so where its FP8 product fails to build, capture or pass
    the gate (``backends/fast_path/warmup.py``). Read while tracing: Dynamo guards on it.
    """
    global _scaled_mm_enabled
    before, _scaled_mm_enabled = _scaled_mm_enabled, enabled
    try:
        yield
    finally:
        _scaled_mm_enabled = before


class Fp8Kernel(enum.Enum):
    """How a :class:`Fp8Linear` multiplies (see the module docstring)."""

    SCALED_MM = 'scaled_mm'
    """W8A8: per-token FP8 activations, ``torch._scaled_mm`` (FP8 tensor cores on CUDA)."""
    DEQUANT = 'dequant'
    """Weight-only reference: the weight dequantized per call, the product in the model dtype."""


class Fp8Unsupported(ValueError):
    """FP8 weights asked for where their kernel cannot run; the message says why and what to do."""


_PROBE = object()
"""Default of ``fp8_kernel(scaled_mm=...)``: ask :func:`probe_scaled_mm`."""


def probe_scaled_mm(device: torch.device | str) -> str | None:
    """
    Return None where a row-wise ``torch._scaled_mm`` runs on ``device``, else why not.

    Runs one small product as :class:`Fp8Linear` does (E4M3 operands, per-row and per-column
    float32 scales, bf16 out) and compares it with the dequantized product. Capability
    alone does not say it: cuBLAS has no row-wise scaled FP8 product on every FP8 GPU
    (Jetson Thor's sm_110: pytorch/pytorch#161236 routes it to a CUTLASS kernel), and a
    torch build may lack the kernel for the device. Never raises.
    """
    device = torch.device(device)
    if device.type != 'cuda':
        return f'{device.type}: no FP8 tensor cores (torch._scaled_mm runs on CUDA only)'
    try:
        gen = torch.Generator(device='cpu').manual_seed(0)
        x = torch.randn(32, 64, generator=gen).to(device, torch.bfloat16)
        w = torch.randn(48, 64, generator=gen).to(device)
        wq, ws = quantize_weight(w)
        out = _scaled_mm(x, wq, ws)
        want = x.float() @ dequantize(wq, ws, torch.float32).t()
        torch.cuda.synchronize(device)
        err = (out.float() - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
    except Exception as exc:  # noqa: B902 - whatever torch raises is the answer
        text = str(exc).strip().splitlines()
        return f'{type(exc).__name__}: {text[0][:300] if text else ""}'
    if not err < 0.1:      # the activations' E4M3 rounding: ~2 % of the largest value
        return f'row-wise torch._scaled_mm gives wrong results here (relative error {err:.3g})'
    return None


def fp8_kernel(device: torch.device | str, capability: tuple[int, int] | None = None, *,
               scaled_mm: str | None | object = _PROBE) -> tuple[Fp8Kernel, str | None]:
    """
    Return the kernel FP8 weights use on ``device`` and why it is not ``SCALED_MM`` (or None).

    CUDA from compute capability 8.9 where row-wise ``torch._scaled_mm`` runs
    (:func:`probe_scaled_mm`): ``SCALED_MM``. Elsewhere (the CPU) ``DEQUANT``, with the
    reason to report: there is no FP8 tensor core to gain from, and the reference path shows
    the weights' rounding alone.

    :param capability: the CUDA device's (default: asked from the driver).
    :param scaled_mm: the probe's answer (None: it runs; a string: why not); default: probe
        ``device`` now.
    :raises Fp8Unsupported: a CUDA device below 8.9, or where the probe fails. Not a fallback
        to ``DEQUANT`` there: it dequantizes every weight on every call (more memory traffic
        than bf16, not less) and is less accurate than bf16, so there is nothing left to gain;
        ``engine/loading.py`` runs the unquantized weights instead, loudly.
    """
    device = torch.device(device)
    if device.type != 'cuda':
        return Fp8Kernel.DEQUANT, (
            f'{device.type}: no FP8 tensor cores, so the weight-only reference path runs (E4M3 '
            f'weights dequantized per call, activations unquantized); torch._scaled_mm with '
            f'per-token FP8 activations runs on CUDA compute capability >= 8.9')
    if capability is None:
        capability = torch.cuda.get_device_capability(device)
    name = torch.cuda.get_device_name(device) if torch.cuda.is_available() else 'the GPU'
    if tuple(capability) < MIN_CAPABILITY:
        raise Fp8Unsupported(
            f"quantization 'fp8' needs FP8 tensor cores (CUDA compute capability >= 8.9: Ada, "
            f'Hopper, Blackwell, Jetson Thor); {device} ({name}) has {capability[0]}.'
            f'{capability[1]}. Its only FP8 path would dequantize every weight on every call: '
            f"slower and less accurate than bf16. Use quantization 'none' (dtype bfloat16)")
    why = probe_scaled_mm(device) if scaled_mm is _PROBE else scaled_mm
    if why is not None:
        raise Fp8Unsupported(
            f"quantization 'fp8' needs torch._scaled_mm with per-row scales, which does not "
            f'run on {device} ({name}, compute capability {capability[0]}.{capability[1]}, '
            f'torch {torch.__version__}): {why}')
    return Fp8Kernel.SCALED_MM, None


def _rounded(values: torch.Tensor) -> torch.Tensor:
    """Return float32 ``values`` clamped to ``±448`` and cast to E4M3 (nearest even)."""
    return values.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Quantize a linear weight per output channel.

    :param weight: ``[N, K]`` floating.
    :returns: ``(W_q float8_e4m3fn [N, K], scale float32 [N])`` with ``W ~ W_q * scale[:, None]``.
    """
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return _rounded(w / scale[:, None]), scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Quantize activations per token (row), dynamically.

    :param x: ``[M, K]`` floating.
    :returns: ``(x_q float8_e4m3fn [M, K], scale float32 [M, 1])`` with ``x ~ x_q * scale``.
    """
    xf = x.float()
    scale = (xf.abs().amax(dim=-1, keepdim=True) / E4M3_MAX).clamp(min=MIN_ACTIVATION_SCALE)
    return _rounded(xf / scale), scale


def dequantize(weight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Return ``(W_q.float() * scale[:, None]).to(dtype)``: ``[N, K]``."""
    return (weight.float() * scale[:, None]).to(dtype)


def _scaled_mm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    xq, xs = quantize_rows(x)
    return torch._scaled_mm(xq, weight.t(), scale_a=xs, scale_b=scale[None, :],
                            out_dtype=x.dtype)


class _ScaledMatmul(torch.autograd.Function):
    """``_scaled_mm`` with the straight-through backward (``torch.func`` compatible)."""

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return _scaled_mm(x, weight, scale)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[1], inputs[2])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        weight, scale = ctx.saved_tensors
        return grad @ dequantize(weight, scale, grad.dtype), None, None


class Fp8Linear(nn.Module):
    """
    A linear layer with E4M3 weights and per-output-channel float32 scales.

    ``weight``: ``float8_e4m3fn [N, K]`` (a parameter without gradient: the model's
    parameter count stays the same); the buffer ``weight_scale``: ``float32 [N]``; the bias
    (``[N]``, the original parameter) stays in its dtype.

    :param kernel: how :meth:`forward` multiplies (:class:`Fp8Kernel`).
    """

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor,
                 bias: nn.Parameter | None, kernel: Fp8Kernel) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.kernel = kernel
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.register_buffer('weight_scale', weight_scale)
        self.register_parameter('bias', bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, kernel: Fp8Kernel) -> Fp8Linear:
        """Return ``linear`` quantized (:func:`quantize_weight`), sharing its bias."""
        weight, scale = quantize_weight(linear.weight)
        return cls(weight, scale, linear.bias, kernel)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Return ``W_q * scale`` in ``dtype``: ``[N, K]``."""
        return dequantize(self.weight, self.weight_scale, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``[..., K]`` to ``[..., N]`` in ``x.dtype``."""
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if self.kernel is Fp8Kernel.DEQUANT or not _scaled_mm_enabled:
            return F.linear(x, self.dequantized_weight(x.dtype), bias)
        rows = x.reshape(-1, self.in_features)
        if rows.requires_grad:
            out = _ScaledMatmul.apply(rows, self.weight, self.weight_scale)
        else:
            out = _scaled_mm(rows, self.weight, self.weight_scale)
        if bias is not None:
            out = out + bias
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f'in_features={self.in_features}, out_features={self.out_features}, '
                f'bias={self.bias is not None}, kernel={self.kernel.value}')


def fp8_linear_names(model: nn.Module) -> list[str]:
    """
    Return the names of the linears FP8 quantizes in ``model`` (a ``Pi05Model``).

    Every ``nn.Linear`` whose parameters are not among ``model.float32_parameters()`` and
    whose sizes are multiples of :data:`ALIGN`.
    """
    keep = model.float32_parameters()
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and f'{name}.weight' not in keep
            and m.in_features % ALIGN == 0 and m.out_features % ALIGN == 0]


def quantized_copy(model: nn.Module, kernel: Fp8Kernel) -> nn.Module:
    """
    Return a copy of ``model`` with its :func:`fp8_linear_names` as :class:`Fp8Linear`.

    The copy shares every other parameter and buffer with ``model`` (no memory twice); only
    the FP8 weights and scales are new. ``model`` is left as it was.
    """
    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    out = copy.deepcopy(model, shared)
    with torch.no_grad():
        for name in fp8_linear_names(out):
            parent, _, child = name.rpartition('.')
            owner = out.get_submodule(parent)
            setattr(owner, child, Fp8Linear.from_linear(getattr(owner, child), kernel))
    return out


def fp8_kernel_of(model: nn.Module) -> Fp8Kernel | None:
    """Return the kernel of ``model``'s FP8 linears, or None when it has none."""
    return next((m.kernel for m in model.modules() if isinstance(m, Fp8Linear)), None)


def describe_quantization(model: nn.Module) -> str:
    """Return ``'none'`` or e.g. ``'fp8 e4m3, per-channel scales, scaled_mm: 288 linears'``."""
    count = sum(isinstance(m, Fp8Linear) for m in model.modules())
    if not count:
        return 'none'
    return f'fp8 e4m3, per-channel scales, {fp8_kernel_of(model).value}: {count} linears'


__all__ = ['ALIGN', 'E4M3', 'E4M3_MAX', 'Fp8Kernel', 'Fp8Linear', 'Fp8Unsupported',
           'MIN_ACTIVATION_SCALE', 'MIN_CAPABILITY', 'dequantize', 'describe_quantization',
           'fp8_kernel', 'fp8_kernel_of', 'fp8_linear_names', 'probe_scaled_mm',
           'quantize_rows', 'quantize_weight', 'quantized_copy', 'scaled_mm_kernel']
