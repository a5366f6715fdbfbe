"""
The static shapes of the fast path: which batch sizes and lengths get a compiled graph (pure).

A CUDA graph replays one shape, so variable sizes are padded up to a few buckets (vLLM's
CUDA-graph batch sizes, gpt-fast's static KV length): decode batches to powers of two from 2
up to ``max_running_requests``, decode contexts to multiples of ``CTX_BUCKET`` slots, prompts
to powers of two up to ``max_token_len``, the denoise context to the prefix length of its
prefill's bucket. Padding is masked (see ``static_calls.py``), so results equal the
unpadded call; it costs compute, at most 2x on the prompt (a few % of a prefix dominated by
image tokens), < ``CTX_BUCKET`` context slots per decode row, and one row for a decode batch
of 1. Several robots' frames in one cycle (``max_robots``) add a robot-batch dimension to
vision (images: frames x cameras), prefill and denoise: 1, then powers of two up to
``max_robots`` (:func:`robot_buckets`); a robot-batch row that pads a bucket is masked like
any padding (its K/V goes to the null block).

Why batch 1 is padded to 2: a decode step reads every weight whatever its batch (bound by
weight reads: 5.03 GB at batch 1, 5.05 at 2 over 900 slots for ``pi05_droid``, roofline), so a
second row is nearly free, while a batch dim of size 1 is specialized by Dynamo: one more
Inductor compile of the decode and the seed step, and their graphs. Contexts shorter than the
shortest possible prefix (one camera's image tokens and one prompt token) get no bucket.

``EngineLimits`` bounds them all (pool slots, longest prefix, decode context and batch); the
experimental TensorRT backend draws its optimization profiles from the same limits
(``tools/tensorrt/trt_profiles.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from oxygen_ros.config import CAMERA_SLOTS, ModelConfig

CTX_ALIGN = 64
"""``EngineLimits``' context lengths (prefix, decode context) are multiples of this."""
CTX_BUCKET = 256
"""Decode contexts are padded to a multiple of this many slots (a 3-camera prefix: ~820)."""
MIN_PROMPT_BUCKET = 16
MIN_BATCH_BUCKET = 2
"""The smallest decode batch compiled where ``max_batch`` allows it (batch 1 is padded)."""
MAX_SUFFIX_BATCH = 4
"""The largest batch of causal suffixes compiled; more new requests in a cycle go in turns."""
SUFFIX_BUCKET_STEP = 4
"""Suffix length buckets grow by this factor from ``MIN_PROMPT_BUCKET`` (16, 64, ...)."""


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """
    Return the decode batch sizes compiled: powers of two from 2 below ``max_batch``, then it.

    ``(1,)`` when ``max_batch`` is 1; batch 1 otherwise runs in the graph of batch 2.
    """
    if max_batch < 1:
        raise ValueError(f'max_batch must be >= 1, got {max_batch}')
    sizes, b = [], min(MIN_BATCH_BUCKET, max_batch)
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return tuple(sizes) + (max_batch,)


def robot_buckets(max_robots: int) -> tuple[int, ...]:
    """
    Return the robot batches compiled: 1, powers of two below ``max_robots``, then it.

    Unlike a decode batch, one robot is the common case and keeps its own graphs (no padded
    row): 4 robots compile 1, 2 and 4; 3 compile 1, 2 and 3.
    """
    if max_robots < 1:
        raise ValueError(f'max_robots must be >= 1, got {max_robots}')
    return (1,) if max_robots == 1 else (1,) + batch_buckets(max_robots)


def _aligned(n: int) -> int:
    """Return ``n`` rounded up to a multiple of ``MIN_PROMPT_BUCKET`` (16)."""
    return -(-n // MIN_PROMPT_BUCKET) * MIN_PROMPT_BUCKET


def prompt_buckets(max_token_len: int) -> tuple[int, ...]:
    """
    Return the prompt lengths compiled: 16, 32, ... below ``max_token_len``, then it.

    The last bucket is rounded up to a multiple of 16 (200 -> 208): every bucket then keeps
    the attention bias 16-aligned (``layers.MASK_ALIGN``), where an unaligned one made
    Dynamo guard on it and compile the prefill a second time. The padded prompt positions
    write their K/V to the null block, like every other padding.
    """
    if max_token_len < 1:
        raise ValueError(f'max_token_len must be >= 1, got {max_token_len}')
    sizes, t = [], MIN_PROMPT_BUCKET
    while t < max_token_len:
        sizes.append(t)
        t *= 2
    return tuple(sizes) + (_aligned(max_token_len),)


def suffix_buckets(max_tokens: int) -> tuple[int, ...]:
    """
    Return the suffix lengths compiled: 16, 64, ... below ``max_tokens``, then it (aligned).

    Suffixes are short (a ``Memory: `` seed is 3 tokens, a question a few dozen), so the
    buckets grow by ``SUFFIX_BUCKET_STEP``: fewer graphs, at most 4x padding of a few tokens.
    """
    if max_tokens < 1:
        raise ValueError(f'max_tokens must be >= 1, got {max_tokens}')
    sizes, t = [], MIN_PROMPT_BUCKET
    while t < max_tokens:
        sizes.append(t)
        t *= SUFFIX_BUCKET_STEP
    return tuple(sizes) + (_aligned(max_tokens),)


def ctx_buckets(max_ctx: int, step: int = CTX_BUCKET, min_ctx: int = 1) -> tuple[int, ...]:
    """
    Return the decode context lengths compiled: ``step, 2 step, ...`` up to ``max_ctx``.

    Buckets below ``min_ctx`` (contexts that never occur) are left out.
    """
    if max_ctx < 1 or step < 1:
        raise ValueError(f'max_ctx and step must be >= 1, got {max_ctx}, {step}')
    return tuple(c for c in range(step, max_ctx, step) if c >= min_ctx) + (max_ctx,)


def denoise_buckets(camera_counts: tuple[int, ...], tokens_per_camera: int,
                    prompt: tuple[int, ...]) -> tuple[int, ...]:
    """
    Return the denoise context lengths compiled: every prefill bucket's prefix length.

    A prefix of ``n`` cameras and ``t`` prompt tokens is denoised in the graph of
    ``n * tokens_per_camera + bucket_for(t, prompt)`` slots or the next longer one: it is never
    padded by more than its prompt was (an 818-token 3-camera ``pi05_droid`` prefix: 832).
    """
    return tuple(sorted({n * tokens_per_camera + t for n in camera_counts for t in prompt}))


def bucket_for(size: int, buckets: tuple[int, ...]) -> int | None:
    """Return the smallest bucket >= ``size``, or None when ``size`` exceeds them all."""
    return next((b for b in buckets if b >= size), None)


def _round_up(n: int, align: int = CTX_ALIGN) -> int:
    return -(-n // align) * align


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """
    The largest shapes a compiled backend must take (the fast path; TensorRT's profiles).

    :ivar num_slots: KV pool slots (fixed).
    :ivar max_batch: largest decode batch (``max_running_requests``).
    :ivar max_cameras: most valid cameras of a frame (the robot's, ``RobotPolicy.cameras``).
    :ivar max_prefix: longest prefix: all camera slots' tokens + ``max_token_len``, rounded up
        to a multiple of ``CTX_ALIGN``.
    :ivar max_ctx: longest decode context: ``max_prefix`` + decode budget, rounded up.
    :ivar max_token_len: longest prompt (the preset's).
    :ivar max_robots: most robots' frames in one cycle (``SchedulerConfig.max_robots``):
        the robot batch of vision, prefill and denoise.
    """

    num_slots: int
    max_batch: int
    max_prefix: int
    max_ctx: int
    max_token_len: int
    max_cameras: int
    max_robots: int

    @classmethod
    def for_model(cls, cfg: ModelConfig, *, num_slots: int, max_batch: int,
                  max_decode_tokens: int, max_cameras: int,
                  max_robots: int = 1) -> EngineLimits:
        """
        Return the limits for ``cfg`` with a pool of ``num_slots`` slots.

        :param max_decode_tokens: the most tokens a text request decodes (the decode budget).
        :param max_cameras: the most valid cameras of a frame (the robot's).
        :param max_robots: the most robots' frames in one cycle.
        :raises ValueError: a count < 1, or more cameras than ``CAMERA_SLOTS``.
        """
        for name, value in (('num_slots', num_slots), ('max_batch', max_batch),
                            ('max_decode_tokens', max_decode_tokens),
                            ('max_cameras', max_cameras), ('max_robots', max_robots)):
            if value < 1:
                raise ValueError(f'{name} must be >= 1, got {value}')
        if max_cameras > len(CAMERA_SLOTS):
            raise ValueError(f'max_cameras must be <= {len(CAMERA_SLOTS)}, got {max_cameras}')
        prefix = len(CAMERA_SLOTS) * cfg.image_tokens_per_camera + cfg.max_token_len
        return cls(num_slots, max_batch, _round_up(prefix),
                   _round_up(prefix + max_decode_tokens), cfg.max_token_len, max_cameras,
                   max_robots)


@dataclass(frozen=True, slots=True)
class StaticShapes:
    """
    Every shape the fast path compiles for one model and engine configuration.

    :ivar camera_counts: vision and prefill graphs per number of valid cameras.
    :ivar prompt: prompt length buckets (prefill, and text prefill on an image prefix).
    :ivar batch: decode and seed batch buckets.
    :ivar ctx: decode context buckets.
    :ivar denoise: denoise context buckets (prefix slots, padding included).
    :ivar suffix: causal-suffix length buckets (text requests on the action prefix).
    :ivar suffix_batch: suffix batch buckets (new requests of a cycle).
    :ivar suffix_ctx: the decode context buckets that hold an action prefix (the root).
    :ivar tokens_per_cycle: the values of k (``tokens_per_cycle``) whose k decode steps are
        compiled as one graph (the ``decode_steps`` step; each > 1).
    :ivar robots: robot batches of the prefill and denoise graphs (:func:`robot_buckets`).
    """

    camera_counts: tuple[int, ...]
    prompt: tuple[int, ...]
    batch: tuple[int, ...]
    ctx: tuple[int, ...]
    denoise: tuple[int, ...]
    suffix: tuple[int, ...] = ()
    suffix_batch: tuple[int, ...] = ()
    suffix_ctx: tuple[int, ...] = ()
    tokens_per_cycle: tuple[int, ...] = ()
    robots: tuple[int, ...] = (1,)

    @property
    def images(self) -> tuple[int, ...]:
        """Return the image counts of the vision graphs: robot batch x valid cameras."""
        return tuple(sorted({r * n for r in self.robots for n in self.camera_counts}))

    @classmethod
    def for_model(cls, cfg: ModelConfig, *, max_batch: int, max_ctx: int, max_cameras: int,
                  camera_counts: tuple[int, ...] | None = None,
                  tokens_per_cycle: tuple[int, ...] = (), max_robots: int = 1
                  ) -> StaticShapes:
        """
        Return the shapes for ``max_cameras`` cameras, ``max_batch`` rows, ``max_ctx`` slots.

        :param max_cameras: the robot's cameras (``EngineLimits.max_cameras``).
        :param camera_counts: numbers of valid cameras to compile (default: 1 to
            ``max_cameras``, as a node needs when a camera drops out; a benchmark whose
            cameras are all valid compiles only their number). A prefix of another count
            runs eagerly, with a warning.
        :param tokens_per_cycle: values of k to compile k decode steps as one graph for (1 is
            the plain decode step: dropped).
        :param max_robots: the most robots' frames in one cycle (:func:`robot_buckets`).
        :raises ValueError: a limit below 1, a camera count outside ``1..max_cameras``, or
            ``max_ctx`` shorter than the longest prefix.
        """
        cams = max_cameras
        counts = tuple(range(1, cams + 1)) if camera_counts is None else \
            tuple(sorted(set(camera_counts)))
        if not counts or counts[0] < 1 or counts[-1] > cams:
            raise ValueError(f'camera_counts must lie in 1..{cams}, got {camera_counts}')
        ti = cfg.image_tokens_per_camera
        longest = counts[-1] * ti + cfg.max_token_len
        if max_ctx < longest:
            raise ValueError(f'max_ctx {max_ctx} < the longest prefix {longest}')
        prompt = prompt_buckets(cfg.max_token_len)
        ctx = ctx_buckets(max_ctx, min_ctx=counts[0] * ti + 1)
        roots = {bucket_for(n * ti + t, ctx) for n in counts
                 for t in range(1, cfg.max_token_len + 1)}
        return cls(counts, prompt, batch_buckets(max_batch), ctx,
                   denoise_buckets(counts, ti, prompt), suffix_buckets(cfg.max_token_len),
                   batch_buckets(min(max_batch, MAX_SUFFIX_BATCH)), tuple(sorted(roots)),
                   tuple(sorted({k for k in tokens_per_cycle if k > 1})),
                   robot_buckets(max_robots))


__all__ = ['CTX_ALIGN', 'CTX_BUCKET', 'EngineLimits', 'MAX_SUFFIX_BATCH', 'MIN_BATCH_BUCKET',
           'StaticShapes', 'batch_buckets', 'bucket_for', 'ctx_buckets', 'denoise_buckets',
           'prompt_buckets', 'robot_buckets', 'suffix_buckets']
