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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

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


__all__ = ['FACTOR', 'FLOOR', 'ParityResult', 'check_parity']
