"""
The FP8 acceptance rule: FP8 weights may act only as accurately as bf16 ones, within 1.5x.

At load (``engine/loading.py``), before the FP8 model is used, the whole action path (vision,
prefill, 10-step denoise) runs on the same random inputs three times: with the FP8 weights,
with bf16 weights and with float32 weights (the unquantized ones, upcast: the reference). The
FP8 model is accepted when

    max |a_fp8 - a_fp32| <= max(FACTOR * max |a_bf16 - a_fp32|, FLOOR * scale)

with ``scale = max(1, max |a_fp32|)`` and ``FACTOR = 1.5`` (issue "the GPU path at the
anchors' speed": FP8 "behind the same parity gate, action error against the float32
reference no more than 1.5x bf16's"); the floor is the parity gate's (``parity.py``), for a
bf16 error that is itself ~0. Non-finite FP8 actions always fail. Otherwise the engine runs
the unquantized weights and reports the fallback with this check's numbers.

The inputs are random (images uniform in [-1, 1], prompt ids, flow-matching noise; seeded),
two samples per call: a check of the arithmetic on this model's weights, not of a task.
"""

from __future__ import annotations

from dataclasses import dataclass

from oxygen_ros.backends.parity import FLOOR
from oxygen_ros.model.pi05 import Pi05Model
import torch

FACTOR = 1.5
"""FP8's action error may be this many times bf16's (both against float32)."""
SAMPLES = 2
PROMPT_TOKENS = 16


@dataclass(frozen=True, slots=True)
class ActionCheck:
    """
    One decision of the rule.

    :ivar fp8_error: max |a_fp8 - a_fp32| over the samples' action chunks.
    :ivar bf16_error: max |a_bf16 - a_fp32|.
    :ivar tolerance: ``max(factor * bf16_error, FLOOR * scale)``.
    :ivar finite: every FP8 action is finite.
    """

    fp8_error: float
    bf16_error: float
    tolerance: float
    finite: bool = True
    factor: float = FACTOR

    @property
    def passed(self) -> bool:
        return self.finite and self.fp8_error <= self.tolerance

    @property
    def ratio(self) -> float:
        """Return ``fp8_error / bf16_error`` (inf when bf16's is 0)."""
        return self.fp8_error / self.bf16_error if self.bf16_error else float('inf')

    def describe(self) -> str:
        """Return e.g. ``'fp8 action error 0.012 <= tolerance 0.015 (1.5 x bf16's 0.01)'``."""
        if not self.finite:
            return 'fp8 actions are not finite'
        verdict = '<=' if self.passed else '>'
        return (f'fp8 action error vs float32 {self.fp8_error:.3g} {verdict} tolerance '
                f"{self.tolerance:.3g} ({self.factor:g} x bf16's {self.bf16_error:.3g}; "
                f'ratio {self.ratio:.2f})')

    def as_dict(self) -> dict:
        return {'fp8_error': self.fp8_error, 'bf16_error': self.bf16_error,
                'tolerance': self.tolerance, 'ratio': self.ratio, 'factor': self.factor,
                'finite': self.finite, 'passed': self.passed}


def probe_inputs(model: Pi05Model, num_cameras: int, *, seed: int = 0, samples: int = SAMPLES
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """
    Return the check's inputs, float32 on the CPU.

    :param num_cameras: the robot's cameras (each gets an image).
    :returns: ``images [S, N, 3, size, size]`` in [-1, 1] (N = ``num_cameras``),
        ``tokens int64 [S, T]``, ``noise [S, H, A]``.
    """
    cfg = model.cfg
    gen = torch.Generator().manual_seed(seed)
    size, n = cfg.vision.image_size, num_cameras
    images = torch.rand(samples, n, 3, size, size, generator=gen) * 2 - 1
    tokens = torch.randint(3, 1000, (samples, min(PROMPT_TOKENS, cfg.max_token_len)),
                           generator=gen)
    noise = torch.randn(samples, cfg.action_horizon, cfg.action_dim, generator=gen)
    return images, tokens, noise


@torch.inference_mode()
def action_chunks(model: Pi05Model, images: torch.Tensor, tokens: torch.Tensor,
                  noise: torch.Tensor) -> torch.Tensor:
    """
    Run the eager action path: vision, prefill (own KV cache), denoise.

    :returns: ``float32 [S, H, A]`` on the CPU.
    """
    dev = model.device
    embeds = model.encode_images(images.to(dev, model.dtype))
    prefix = model.prefill(tokens.to(dev), None, image_embeds=embeds)
    return model.denoise(prefix, noise.to(dev)).float().cpu()


def check_fp8_actions(fp8: Pi05Model, bf16: Pi05Model, reference: Pi05Model, *,
                      num_cameras: int, seed: int = 0, factor: float | None = None
                      ) -> ActionCheck:
    """
    Hold the FP8 model's actions against bf16's, both against float32 (module docstring).

    :param fp8: the model with FP8 weights (``model/fp8.py``).
    :param bf16: the same weights in bfloat16.
    :param reference: the same weights in float32.
    :param num_cameras: the robot's cameras (:func:`probe_inputs`).
    :param factor: default :data:`FACTOR`.
    """
    factor = FACTOR if factor is None else factor
    inputs = probe_inputs(reference, num_cameras, seed=seed)
    want = action_chunks(reference, *inputs)
    got = action_chunks(fp8, *inputs)
    base = action_chunks(bf16, *inputs)
    finite = bool(torch.isfinite(got).all())
    fp8_error = float((got - want).abs().max()) if finite else float('inf')
    bf16_error = float((base - want).abs().max())
    scale = max(1.0, float(want.abs().max()))
    return ActionCheck(fp8_error, bf16_error, max(factor * bf16_error, FLOOR * scale), finite,
                       factor)


__all__ = ['ActionCheck', 'FACTOR', 'action_chunks', 'check_fp8_actions', 'probe_inputs']
