"""
The parity gate: a compiled call must be as close to eager as the model's precision allows.

A compiled call (other kernels, other summation order, folded norm weights) never equals eager
bit for bit; the question is whether it differs by more than rounding. In float32 rounding is
~1e-6 relative, so a small absolute floor decides. In bfloat16 (8 bits of mantissa) two correct
computations of the same thing differ by up to a few 1e-2 (the H100's figures:
``docs/gpu.md#parity-gate-and-fallbacks``), which a fixed float32-sized tolerance rejected, and
no fixed tolerance fits every output of every model. So the gate measures the scale of rounding on
the same inputs: it also runs eager in float32 (the same weights, upcast) and accepts when

    max |compiled - eager| <= max(FLOOR * scale, FACTOR * max |eager - eager_fp32|)

with ``scale = max(1, max |eager|)``. Rationale: eager in the model dtype is itself
``e = max |eager - eager_fp32|`` away from exact arithmetic on these weights; a compiled call
that is as accurate lies within ``e`` of it too, hence within ``2 e`` of eager (triangle
inequality). ``FACTOR = 3`` leaves a margin over that worst case, while a wrong computation (a
missing mask, a wrong layer, a scaled output) differs by O(1) relative, far beyond 3x
rounding. In a float32 model ``e = 0`` and the floor alone decides (``FLOOR = 1e-4`` relative:
compiled float32 kernels differ by ~1e-6). Non-finite compiled outputs always fail.

The float32 reference is a copy of the model's weights (:func:`float32_copy`, built by
:func:`model_copy`), which the FP8 load check (``fp8_gate.py``) makes in bf16 too.
"""

from __future__ import annotations

from dataclasses import dataclass
import logging
from typing import Sequence

from oxygen_ros.model.fp8 import fp8_kernel_of
from oxygen_ros.model.pi05 import Pi05Model
import torch

_LOG = logging.getLogger(__name__)

FLOOR = 1e-4
"""Tolerance relative to the output scale when rounding is below it (float32 models)."""
FACTOR = 3.0
"""How many times eager's own distance to float32 a compiled call may differ from eager."""


@dataclass(frozen=True, slots=True)
class ParityResult:
    """
    One gate decision.

    :ivar name: what was compared (``decode b8 ctx512``).
    :ivar error: max |compiled - eager| over every output.
    :ivar tolerance: the bound it was held to.
    :ivar reference_error: max |eager - eager_fp32| (0 without a float32 reference).
    :ivar finite: every compiled output is finite.
    """

    name: str
    error: float
    tolerance: float
    reference_error: float
    finite: bool = True

    @property
    def passed(self) -> bool:
        return self.finite and self.error <= self.tolerance

    def describe(self) -> str:
        """Return ``'<name>: |compiled - eager| 0.03 <= tolerance 0.08 (...)'``."""
        if not self.finite:
            return f'{self.name}: non-finite compiled output'
        verdict = '<=' if self.passed else '>'
        return (f'{self.name}: |compiled - eager| {self.error:.3g} {verdict} tolerance '
                f'{self.tolerance:.3g} (eager vs float32 {self.reference_error:.3g})')


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.to(a.device).float()).abs().max()) if a.numel() else 0.0


def check_parity(name: str, compiled: Sequence[torch.Tensor], eager: Sequence[torch.Tensor],
                 reference: Sequence[torch.Tensor] | None = None, *, floor: float = FLOOR,
                 factor: float = FACTOR) -> ParityResult:
    """
    Hold compiled outputs against eager ones (see the module docstring for the rule).

    :param compiled: the outputs of the compiled call.
    :param eager: the same outputs of eager in the model dtype, same inputs.
    :param reference: the same outputs of eager in float32 (inputs upcast); None when the
        model runs in float32 (then eager is the reference).
    :raises ValueError: output counts or shapes disagree.
    """
    if len(compiled) != len(eager) or (reference is not None and len(reference) != len(eager)):
        raise ValueError(f'{name}: {len(compiled)} compiled, {len(eager)} eager and '
                         f'{len(reference) if reference is not None else "no"} reference '
                         f'outputs')
    for c, e in zip(compiled, eager):
        if c.shape != e.shape:
            raise ValueError(f'{name}: compiled output {tuple(c.shape)} != eager '
                             f'{tuple(e.shape)}')
    finite = all(bool(torch.isfinite(c).all()) for c in compiled if c.is_floating_point())
    error = max(_max_abs(c, e) for c, e in zip(compiled, eager))
    scale = max([1.0] + [float(e.float().abs().max()) for e in eager if e.numel()])
    ref_error = 0.0 if reference is None else max(_max_abs(e, r)
                                                  for e, r in zip(eager, reference))
    return ParityResult(name, error, max(floor * scale, factor * ref_error), ref_error,
                        finite)


def float32_copy(model: Pi05Model) -> Pi05Model | None:
    """
    Return a float32 copy of a 16-bit model (same weights, upcast), or None for float32.

    The parity gate's reference (``model_copy`` in float32).

    :raises ValueError: an FP8-quantized model (its reference is made from its unquantized
        weights before quantizing: ``engine/loading.py``).
    """
    if fp8_kernel_of(model) is None and model.dtype == torch.float32:
        return None
    return model_copy(model, torch.float32)


def model_copy(model: Pi05Model, dtype: torch.dtype) -> Pi05Model:
    """
    Return a copy of ``model`` in ``dtype`` (``Pi05Model.parameter_dtypes``), eval mode.

    Built on the model's device; where that runs out of memory, on the CPU (slower, same
    numbers).

    :raises ValueError: an FP8-quantized model (its E4M3 weights are no model dtype).
    :raises RuntimeError: no memory anywhere.
    """
    if fp8_kernel_of(model) is not None:
        raise ValueError('the model has FP8 weights: its float32 reference is a copy of the '
                         'unquantized weights, made before quantizing (engine/loading.py '
                         'load_model hands it to the fast path as reference=)')
    for device in dict.fromkeys((model.device, torch.device('cpu'))):
        try:
            with torch.device('meta'):
                out = Pi05Model(model.cfg, untied_lm_head=model.lm_head is not None)
            out = out.set_precision(dtype).to_empty(device=device)
            out.load_state_dict(model.state_dict())
            return out.eval()
        except torch.OutOfMemoryError:
            _LOG.warning('no memory for a %s copy of the model on %s', dtype, device)
    raise RuntimeError(f'no memory for a {dtype} copy of the model')


__all__ = ['FACTOR', 'FLOOR', 'ParityResult', 'check_parity', 'float32_copy', 'model_copy']
