"""
The static shapes of the fast path: which batch sizes and lengths get a compiled graph (pure).

A CUDA graph replays one shape, so variable sizes are padded up to a few buckets (vLLM's
CUDA-graph batch sizes, gpt-fast's static KV length): decode batches to powers of two up to
``max_running_requests``, decode contexts to multiples of ``CTX_BUCKET`` slots, prompts to
powers of two up to ``max_token_len``. Padding is masked (see ``model/static_calls.py``), so
results equal the unpadded call; it costs compute, at most 2x on the prompt (a few % of a
prefix dominated by image tokens) and < ``CTX_BUCKET`` context slots per decode row.
"""

from __future__ import annotations

from dataclasses import dataclass

from oxygen_ros.config import ModelConfig

CTX_BUCKET = 256
"""Decode contexts are padded to a multiple of this many slots (a 3-camera prefix: ~820)."""
MIN_PROMPT_BUCKET = 16


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Return the decode batch sizes compiled: powers of two below ``max_batch``, then it."""
    if max_batch < 1:
        raise ValueError(f'max_batch must be >= 1, got {max_batch}')
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return tuple(sizes) + (max_batch,)


def prompt_buckets(max_token_len: int) -> tuple[int, ...]:
    """Return the prompt lengths compiled: 16, 32, ... below ``max_token_len``, then it."""
    if max_token_len < 1:
        raise ValueError(f'max_token_len must be >= 1, got {max_token_len}')
    sizes, t = [], MIN_PROMPT_BUCKET
    while t < max_token_len:
        sizes.append(t)
        t *= 2
    return tuple(sizes) + (max_token_len,)


def ctx_buckets(max_ctx: int, step: int = CTX_BUCKET) -> tuple[int, ...]:
    """Return the decode context lengths compiled: ``step, 2 step, ...`` up to ``max_ctx``."""
    if max_ctx < 1 or step < 1:
        raise ValueError(f'max_ctx and step must be >= 1, got {max_ctx}, {step}')
    return tuple(range(step, max_ctx, step)) + (max_ctx,)


def bucket_for(size: int, buckets: tuple[int, ...]) -> int | None:
    """Return the smallest bucket >= ``size``, or None when ``size`` exceeds them all."""
    return next((b for b in buckets if b >= size), None)


@dataclass(frozen=True, slots=True)
class StaticShapes:
    """
    Every shape the fast path compiles for one model and engine configuration.

    :ivar camera_counts: vision and prefill graphs per number of valid cameras.
    :ivar prompt: prompt length buckets (prefill, and text prefill on an image prefix).
    :ivar batch: decode and seed batch buckets.
    :ivar ctx: decode context buckets.
    :ivar denoise_ctx: the one (padded) prefix length of the denoise graph.
    """

    camera_counts: tuple[int, ...]
    prompt: tuple[int, ...]
    batch: tuple[int, ...]
    ctx: tuple[int, ...]
    denoise_ctx: int

    @classmethod
    def for_model(cls, cfg: ModelConfig, *, max_batch: int, max_ctx: int,
                  denoise_ctx: int) -> StaticShapes:
        """
        Return the shapes for ``cfg``'s cameras, ``max_batch`` rows and ``max_ctx`` slots.

        ``denoise_ctx``: the padded prefix length of the denoise graph.

        :raises ValueError: a limit below 1 or a denoise context shorter than a prefix.
        """
        longest = len(cfg.cameras) * cfg.image_tokens_per_camera + cfg.max_token_len
        if denoise_ctx < longest:
            raise ValueError(f'denoise_ctx {denoise_ctx} < the longest prefix {longest}')
        return cls(tuple(range(1, len(cfg.cameras) + 1)), prompt_buckets(cfg.max_token_len),
                   batch_buckets(max_batch), ctx_buckets(max_ctx), denoise_ctx)


__all__ = ['CTX_BUCKET', 'StaticShapes', 'batch_buckets', 'bucket_for', 'ctx_buckets',
           'prompt_buckets']
