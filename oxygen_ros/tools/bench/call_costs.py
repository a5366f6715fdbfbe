"""
Work per model call from the config: FLOPs and bytes moved, for roofline bounds (pure).

A call can be no faster than ``max(bytes / bandwidth, flops / peak)`` on a GPU. The counts
come from the config's shapes (the figures for π0.5: ``docs/model.md#sizes-and-costs``):

- vision: per image, the 27 SigLIP blocks' linears (``2 * Ti * params``) + attention
  (``4 * Ti^2 * Wv`` per block) + patch stem and projector; weights read once (~0.22 TFLOP,
  0.8 GB for pi05 in bf16).
- prefill of P tokens: ``2 * P * (VLM layer params)`` + attention ``8 * H * D * pairs`` per
  layer (``pairs`` = query-key pairs: P^2 bidirectional) and the K/V written (P * 18 KiB in
  bf16); ~3.3 TFLOP at P = 818.
- denoise, N Euler steps of H action tokens on a P-token prefix: per step the action
  expert's matrices (0.31 G params: 0.62 GB in bf16) and the prefix K/V are read; the
  adaRMS ``Dense`` is not (the fast path computes the modulations of the fixed times once
  per load).
- guided denoise (real-time chunking): per step the velocity and its vector-Jacobian
  product in x_t: each linear's input gradient ``W^T dy`` costs its forward's FLOPs and reads
  its weights once more (no weight gradient is formed), the attention's backward is dq and
  dP over the P + H keys plus the suffix's own dK, dV (the prefix K/V are constants: no
  gradient for their rows), the prefix K/V are read again: about twice a plain step in FLOPs
  and in bytes (:func:`denoise_layer_step_costs` per part; docs/gpu.md, "RTC on the fast
  path").
- decode step of B rows over C context tokens: every VLM layer weight (3.96 GB in bf16) and
  the tied LM head (1.05 GB) once per step whatever B, plus B * C * 18 KiB of K/V.
- seed: the LM head over B hidden states.

Norm weights (a few KB) and activations that stay in cache are left out; activation traffic
of the big-batch calls (prefill, vision) is not counted (they are compute-bound).

FP8 weights (``fp8_weights=True``, ``model/fp8.py``): the quantized linears (SigLIP's and the
projector, both experts' Q/K/V, output, gate/up, down) are read at 1 byte per weight and
their GEMM FLOPs run at the FP8 tensor rate (``CallCost.fp8_flops``); the LM head, the
float32 heads, the KV cache and attention stay as they were. The per-channel scales (4 bytes
per output channel, < 0.2 % of the weights) and the per-token activation quantization
(elementwise, in cache) are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from oxygen_ros.config import GemmaConfig, ModelConfig


@dataclass(frozen=True, slots=True)
class CallCost:
    """
    FLOPs and bytes read or written by one call.

    :ivar fp8_flops: the part of ``flops`` in FP8 GEMMs (FP8 weights), run at the FP8 rate.
    """

    flops: float
    num_bytes: float
    fp8_flops: float = 0.0

    def compute_seconds(self, flops_per_s: float, fp8_flops_per_s: float | None = None) -> float:
        """Return the FLOPs' time: bf16 ones at ``flops_per_s``, FP8 ones at their rate."""
        fp8_rate = fp8_flops_per_s or flops_per_s
        return (self.flops - self.fp8_flops) / flops_per_s + self.fp8_flops / fp8_rate

    def bound_seconds(self, bandwidth: float, flops_per_s: float,
                      fp8_flops_per_s: float | None = None) -> float:
        """Return ``max(bytes / bandwidth, compute_seconds)`` (bytes/s, FLOP/s)."""
        return max(self.num_bytes / bandwidth,
                   self.compute_seconds(flops_per_s, fp8_flops_per_s))

    def __add__(self, other: CallCost) -> CallCost:
        return CallCost(self.flops + other.flops, self.num_bytes + other.num_bytes,
                        self.fp8_flops + other.fp8_flops)


def gemma_layer_linear_params(g: GemmaConfig) -> int:
    """Return one Gemma layer's matrix parameters: Q/K/V, output, gated MLP (no norms)."""
    attn = g.width * (g.num_heads + 2 * g.num_kv_heads) * g.head_dim + \
        g.num_heads * g.head_dim * g.width
    return attn + 3 * g.width * g.mlp_dim


def _attention_flops(g: GemmaConfig, pairs: float) -> float:
    """Return QK^T and PV FLOPs of ``pairs`` query-key pairs over all layers."""
    return 4.0 * g.num_heads * g.head_dim * pairs * g.depth


def vision_cost(cfg: ModelConfig, num_images: int, dtype_bytes: int = 2, *,
                fp8_weights: bool = False) -> CallCost:
    """Return the cost of encoding ``num_images`` images (SigLIP + projector)."""
    v = cfg.vision
    t = v.num_tokens
    block = v.width * 3 * v.width + v.width * v.width + 2 * v.width * v.mlp_dim
    stem = 3 * v.patch_size ** 2 * v.width
    projector = v.width * cfg.vlm.width
    linear = v.depth * block + projector
    per_image = 2.0 * t * (linear + stem) + 4.0 * t * t * v.width * v.depth
    stem_bytes = 4 if dtype_bytes < 4 else dtype_bytes   # openpi keeps them float32
    weights = linear * (1 if fp8_weights else dtype_bytes) + (stem + t * v.width) * stem_bytes
    return CallCost(num_images * per_image, float(weights),
                    num_images * 2.0 * t * linear if fp8_weights else 0.0)


def prefill_cost(cfg: ModelConfig, num_tokens: int, *, context: int = 0,
                 causal: bool = False, dtype_bytes: int = 2,
                 fp8_weights: bool = False) -> CallCost:
    """
    Return the cost of a prefill of ``num_tokens`` new tokens on ``context`` cached ones.

    :param causal: the new tokens attend causally among themselves (else bidirectionally).
    """
    g = cfg.vlm
    n = num_tokens
    pairs = n * context + (n * (n + 1) / 2 if causal else n * n)
    gemm = 2.0 * n * g.depth * gemma_layer_linear_params(g)
    kv = cfg.kv_bytes_per_token(dtype_bytes)
    weights = g.depth * gemma_layer_linear_params(g) * (1 if fp8_weights else dtype_bytes)
    return CallCost(gemm + _attention_flops(g, pairs), float(weights + (n + context) * kv),
                    gemm if fp8_weights else 0.0)


def denoise_layer_step_costs(cfg: ModelConfig, prefix_tokens: int, *, guided: bool = False,
                             concatenated: bool = False, dtype_bytes: int = 2,
                             fp8_weights: bool = False) -> dict[str, CallCost]:
    """
    Return the work of one action-expert layer in one Euler step, by part.

    H = ``cfg.action_horizon`` query rows, P = ``prefix_tokens`` prefix keys.

    - ``linears``: Q/K/V, output and MLP products, ``2 H params`` FLOPs; weights read once.
    - ``attention``: ``QK^T`` and ``PV`` over P + H keys; the prefix K/V read.
    - guided, ``linears_input_grad``: ``W^T dy`` per linear, the forward's FLOPs and weights.
    - guided, ``attention_backward``: dq and dP over the P + H keys, dK and dV of the H suffix
      rows; the prefix K/V read again.
    - guided and ``concatenated`` (the form before the split, for comparison):
      ``prefix_kv_grad``, the dK and dV of the P prefix rows that attending
      ``cat(prefix, suffix)`` forms and discards, and that concatenation's copy (P rows read,
      P + H written, keys and values) plus the P gradient rows written.

    With ``fp8_weights`` the linears read one byte per weight and run as FP8 GEMMs; their
    input gradients (``model/fp8.py``: ``W_q s`` dequantized) read the same bytes and run in
    the model dtype.

    :returns: ``{part: CallCost}`` in the order above.
    """
    e, h, p = cfg.expert, cfg.action_horizon, prefix_tokens
    params = gemma_layer_linear_params(e)
    kv_row = 2 * e.num_kv_heads * e.head_dim * dtype_bytes         # one key and one value
    weight_bytes = float(params * (1 if fp8_weights else dtype_bytes))
    linears = CallCost(2.0 * h * params, weight_bytes, 2.0 * h * params if fp8_weights else 0.0)
    attention = CallCost(_attention_flops(e, h * (p + h)) / e.depth, float(p * kv_row))
    parts = {'linears': linears, 'attention': attention}
    if guided:
        suffix_kv_grad = 4.0 * e.num_heads * e.head_dim * h * h
        parts['linears_input_grad'] = CallCost(linears.flops, weight_bytes)
        parts['attention_backward'] = CallCost(attention.flops + suffix_kv_grad,
                                               attention.num_bytes)
        if concatenated:
            parts['prefix_kv_grad'] = CallCost(4.0 * e.num_heads * e.head_dim * h * p,
                                               float((2 * p + h) * kv_row + p * kv_row))
    return parts


def _denoise_io(cfg: ModelConfig, dtype_bytes: int) -> CallCost:
    """Return ``action_in_proj`` and ``action_out_proj`` of one step (H rows)."""
    io = 2 * cfg.action_dim * cfg.expert.width
    return CallCost(2.0 * cfg.action_horizon * io, float(io * dtype_bytes))


def denoise_cost(cfg: ModelConfig, prefix_tokens: int, *, num_steps: int | None = None,
                 guided: bool = False, dtype_bytes: int = 2,
                 fp8_weights: bool = False) -> CallCost:
    """
    Return the cost of a whole denoise (N Euler steps) on a ``prefix_tokens`` prefix.

    :param guided: RTC's guided denoise (the split attention): per step
        :func:`denoise_layer_step_costs` with ``guided`` over every layer, and the action
        projections forward and backward (their weights read twice).
    :param fp8_weights: the expert's linears in FP8 (``denoise_layer_step_costs``); the
        action projections stay in the model dtype.
    """
    n = cfg.num_denoise_steps if num_steps is None else num_steps
    layer = denoise_layer_step_costs(cfg, prefix_tokens, guided=guided, dtype_bytes=dtype_bytes,
                                     fp8_weights=fp8_weights)
    step = _scaled(_denoise_io(cfg, dtype_bytes), 2 if guided else 1)
    for part in layer.values():
        step = step + _scaled(part, cfg.expert.depth)
    return _scaled(step, n)


def _scaled(cost: CallCost, times: int) -> CallCost:
    return CallCost(times * cost.flops, times * cost.num_bytes, times * cost.fp8_flops)


def decode_cost(cfg: ModelConfig, batch: int, context_tokens: int, *,
                dtype_bytes: int = 2, fp8_weights: bool = False) -> CallCost:
    """Return the cost of one greedy decode step of ``batch`` rows (LM head included)."""
    g = cfg.vlm
    layers = g.depth * gemma_layer_linear_params(g)
    head = cfg.vocab_size * g.width
    flops = 2.0 * batch * (layers + head) + _attention_flops(g, batch * (context_tokens + 1))
    kv = batch * (context_tokens + 1) * cfg.kv_bytes_per_token(dtype_bytes)
    weights = layers * (1 if fp8_weights else dtype_bytes) + head * dtype_bytes
    return CallCost(flops, float(weights + kv), 2.0 * batch * layers if fp8_weights else 0.0)


def seed_cost(cfg: ModelConfig, batch: int, dtype_bytes: int = 2) -> CallCost:
    """Return the cost of the LM head over ``batch`` hidden states (the first token)."""
    head = cfg.vocab_size * cfg.vlm.width
    return CallCost(2.0 * batch * head, float(head * dtype_bytes))


__all__ = ['CallCost', 'decode_cost', 'denoise_cost',
           'denoise_layer_step_costs', 'gemma_layer_linear_params', 'prefill_cost',
           'seed_cost', 'vision_cost']
