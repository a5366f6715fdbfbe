"""
``torch.compile`` of the denoise step and the decode step, static shapes, eager fallback.

gpt-fast style (style.md §1): compile the step functions, not the model; keep shapes
static so that compiled kernels and CUDA graphs (``mode='reduce-overhead'``) are reused;
compile and capture at warm-up, and report that time apart (``compile_seconds``).

The compiled functions are the pure step graphs of ``onnx_graphs.py`` (``DenoiseGraph``,
``DecodeGraph``): they read the KV pool by slot and return the new K/V, which the wrapper
writes with ``index_copy_`` (no pool mutation inside the graph, so CUDA-graph replays never
alias it). Shapes repeat: the denoise context is padded to the longest prefix (one static
shape); a decode batch is padded up to a power-of-two bucket and its context to the longest
decode context (masked columns), so every step of every cycle replays one of a few CUDA
graphs. The decode batch dim is compiled dynamic (two compilations: batch 1 and the rest).

Compilation is fragile (spec §3.8: CUDA graphs under changing shapes; on Thor a compiled
text decode gave invalid probabilities; some Triton builds reject Thor's ``sm_110a``), so
warm-up holds each compiled function against eager on the same inputs with the parity gate
(``parity.py``: relative to how far eager in the model dtype is from a float32 run) and
falls back to eager on an exception, non-finite output or a failed gate. A fallback is
never silent: an ERROR log with the measured error and tolerance, and ``fallbacks``
(step -> reason), which the engine exposes and the node reports on ``/diagnostics``.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterator

from oxygen_ros.backends.config import BackendConfig, CompileMode
from oxygen_ros.backends.onnx_graphs import DecodeGraph, DenoiseGraph
from oxygen_ros.backends.parity import check_parity
from oxygen_ros.backends.torch_backend import TorchBackend
from oxygen_ros.backends.trt_profiles import EngineLimits
from oxygen_ros.model.flow import euler_times
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.model.pi05 import Pi05Model
import torch
import torch.nn.functional as F  # noqa: N812

_LOG = logging.getLogger(__name__)

DEFAULT_COMPILE_BACKEND = 'inductor'
"""``torch.compile`` backend of ``CompiledTorchBackend.create`` (tests swap in aot_eager)."""


def batch_buckets(max_batch: int) -> tuple[int, ...]:
    """Return the decode batch sizes compiled: powers of two below ``max_batch``, then it."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return tuple(sizes) + (max_batch,)


def float32_copy(model: Pi05Model) -> Pi05Model | None:
    """
    Return a float32 copy of a 16-bit model (same weights, upcast), or None for float32.

    The parity gate's reference. Built on the model's device; where that runs out of
    memory, on the CPU (slower, same numbers).
    """
    if model.dtype == torch.float32:
        return None
    for device in dict.fromkeys((model.device, torch.device('cpu'))):
        try:
            with torch.device('meta'):
                ref = Pi05Model(model.cfg)
            ref = ref.to_empty(device=device)
            ref.load_state_dict(model.state_dict())
            return ref.eval()
        except torch.OutOfMemoryError:
            _LOG.warning('no memory for a float32 copy of the model on %s', device)
    raise RuntimeError('no memory for the float32 reference model of the parity gate')


def _upcast(args: tuple[torch.Tensor, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    return tuple((a.float() if a.is_floating_point() else a).to(device) for a in args)


def _batch_dynamic(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """
    Mark dim 0 (the decode batch) dynamic when > 1.

    One compiled decode serves every bucket above 1 (batch 1 is specialized by dynamo) where
    static batches would compile once per bucket (minutes at full size, and dynamo's
    per-function recompile limit); CUDA graphs are still recorded per bucket.
    """
    if tensors[0].shape[0] > 1:
        for t in tensors:
            torch._dynamo.mark_dynamic(t, 0)
    return tensors


class CompiledModel:
    """
    ``Pi05Model`` for ``TorchBackend`` with compiled ``denoise`` and ``decode_step``.

    ``encode_images``, ``prefill`` and ``lm_logits`` stay eager (variable shapes, once per
    frame or request).

    :param model: the eager model (also the fallback).
    :param mode: DEFAULT (Inductor) or REDUCE_OVERHEAD (Inductor + CUDA graphs).
    :param limits: longest prefix (denoise padding), decode context and batch.
    :param backend: ``torch.compile`` backend (``'inductor'``; tests use ``'aot_eager'``).
    :raises ValueError: ``mode`` NONE.
    """

    def __init__(self, model: Pi05Model, mode: CompileMode, limits: EngineLimits, *,
                 backend: str | Callable = 'inductor') -> None:
        if mode is CompileMode.NONE:
            raise ValueError('CompiledModel needs a compile mode other than NONE')
        self.model = model
        self.cfg = model.cfg
        self.mode = mode
        self.limits = limits
        self.buckets = batch_buckets(limits.max_batch)
        self.compile_seconds = 0.0
        self._backend = backend
        self._cuda_graphs = mode is CompileMode.REDUCE_OVERHEAD and model.device.type == 'cuda'
        self._denoise: Callable | None = None
        self._decode: Callable | None = None
        self._warned_ctx = False
        self.fallbacks: dict[str, str] = {}
        """Compiled steps that run eagerly instead: step name -> reason."""

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.encode_images(images)

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_logits(hidden)

    def prefill(self, *args, **kwargs) -> PrefixKV:
        return self.model.prefill(*args, **kwargs)

    def _compile(self, fn: torch.nn.Module) -> Callable:
        mode = 'reduce-overhead' if self.mode is CompileMode.REDUCE_OVERHEAD else 'default'
        return torch.compile(fn, backend=self._backend, mode=mode if self._backend ==
                             'inductor' else None, fullgraph=True, dynamic=None)

    def _call(self, fn: Callable, *args: torch.Tensor):
        if self._cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        out = fn(*args)
        if self._cuda_graphs:  # CUDA-graph outputs are overwritten by the next replay
            out = tuple(o.clone() for o in out) if isinstance(out, tuple) else out.clone()
        return out

    # ---------------------------------------------------------------- warm-up
    @torch.inference_mode()
    def warmup(self, cache: KVCache) -> float:
        """
        Compile (and capture) every static shape; keep each function only if it equals eager.

        :param cache: the backend's KV pool (read only; marked static for CUDA graphs).
        :returns: seconds spent, also in ``compile_seconds``.
        """
        t0 = time.perf_counter()
        if self._cuda_graphs:
            torch._dynamo.mark_static_address(cache.k)
            torch._dynamo.mark_static_address(cache.v)
        gen = torch.Generator().manual_seed(0)
        dev, cfg, lim = self.model.device, self.cfg, self.limits
        self.fallbacks = {}
        reference = float32_copy(self.model)
        for pool in (cache.k, cache.v):  # realistic K/V for the gate; zeroed again below
            pool.normal_(generator=torch.Generator(pool.device).manual_seed(1))

        def ints(high: int, *shape: int) -> torch.Tensor:
            return torch.randint(0, high, shape, generator=gen).to(dev)
        n = cache.num_slots
        eager_dn = DenoiseGraph(self.model)
        dn_args = (cache.k, cache.v, ints(n, 1, lim.denoise_ctx_len),
                   torch.ones(1, lim.denoise_ctx_len, dtype=torch.bool, device=dev),
                   torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=gen).to(dev),
                   torch.full((1,), 0.5, device=dev), ints(lim.max_prefix, 1))
        self._denoise = self._checked('denoise', eager_dn, [dn_args],
                                      reference and DenoiseGraph(reference))
        eager_dc = DecodeGraph(self.model)
        dc_args = [(cache.k, cache.v) + _batch_dynamic((
                    ints(1000, b, 1), torch.ones(b, 1, dtype=torch.bool, device=dev),
                    ints(lim.max_prefix, b), ints(n, b, lim.max_ctx),
                    torch.ones(b, lim.max_ctx, dtype=torch.bool, device=dev)))
                   for b in self.buckets]
        self._decode = self._checked('decode', eager_dc, dc_args,
                                     reference and DecodeGraph(reference))
        cache.k.zero_()
        cache.v.zero_()
        self.compile_seconds = time.perf_counter() - t0
        _LOG.info('torch.compile (%s, %s): %.1f s; denoise %s, decode %s (batch buckets %s)',
                  self.mode.value, self._backend, self.compile_seconds,
                  'compiled' if self._denoise is not None else 'EAGER',
                  'compiled' if self._decode is not None else 'EAGER', self.buckets)
        return self.compile_seconds

    def _checked(self, what: str, eager: torch.nn.Module, cases: list[tuple[torch.Tensor, ...]],
                 reference: torch.nn.Module | None) -> Callable | None:
        """
        Compile ``eager``; return it if every case passes the parity gate, else None.

        :param reference: ``eager``'s computation on the float32 copy (None: float32 model).
        """
        try:
            compiled = self._compile(eager)
            for args in cases:
                for _ in range(2 if self._cuda_graphs else 1):  # record, then replay
                    got = self._call(compiled, *args)
                want = eager(*args)
                ref = None
                if reference is not None:
                    ref_dev = next(reference.parameters()).device
                    ref = reference(*_upcast(args, ref_dev))
                got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
                if ref is not None and not isinstance(ref, tuple):
                    ref = (ref,)
                name = f'{what} step, shapes {[tuple(a.shape) for a in args[2:]]}'
                result = check_parity(name, got, want, ref)
                if not result.passed:
                    raise RuntimeError(f'parity gate failed: {result.describe()}')
                _LOG.info('parity gate passed: %s', result.describe())
        except Exception as exc:  # noqa: B902 - any compiler failure means: run eager
            reason = f'{type(exc).__name__}: {exc}'
            _LOG.error('torch.compile of the %s step failed, running it EAGERLY (slow): %s',
                       what, reason)
            self.fallbacks[what] = reason
            return None
        return compiled

    # ---------------------------------------------------------------- steps
    @torch.no_grad()
    def denoise(self, prefix: PrefixKV, noise: torch.Tensor, *,
                num_steps: int | None = None) -> torch.Tensor:
        """Run ``Pi05Model.denoise`` with the step function compiled (one static shape)."""
        pad = self.limits.denoise_ctx_len - prefix.slots.shape[1]
        if (self._denoise is None or pad < 0 or prefix.batch_size != 1
                or noise.shape[1:] != (self.cfg.action_horizon, self.cfg.action_dim)):
            return self.model.denoise(prefix, noise, num_steps=num_steps)
        n = self.cfg.num_denoise_steps if num_steps is None else num_steps
        if n < 1:
            raise ValueError(f'num_steps must be >= 1, got {n}')
        dev = self.model.device
        slots = F.pad(prefix.slots.to(torch.int64), (0, pad))
        mask = F.pad(prefix.mask, (0, pad))
        times = euler_times(n).to(dev)[:, None].contiguous()
        dt = torch.tensor(-1.0 / n, dtype=torch.float32).item()
        cache = prefix.cache
        x = noise.to(torch.float32)
        for step in range(n):
            v = self._call(self._denoise, cache.k, cache.v, slots, mask, x, times[step],
                           prefix.num_tokens)
            x = x + dt * v
        return x

    @torch.no_grad()
    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                    write_slots: torch.Tensor, ctx_slots: torch.Tensor,
                    ctx_mask: torch.Tensor) -> torch.Tensor:
        """
        Run ``Pi05Model.decode_step`` compiled: batch padded to a bucket, context to max_ctx.

        Padded rows feed token 0 at position 0 with an all-masked context; their outputs are
        dropped and nothing of theirs is written. A context beyond ``max_ctx`` runs eagerly.
        """
        b, c = ctx_slots.shape
        if self._decode is None or b > self.buckets[-1] or c > self.limits.max_ctx:
            if self._decode is not None and not self._warned_ctx:
                self._warned_ctx = True
                _LOG.warning('decode batch %d / context %d beyond the compiled shapes (%d, %d):'
                             ' eager', b, c, self.buckets[-1], self.limits.max_ctx)
            return self.model.decode_step(tokens, positions, cache, write_slots, ctx_slots,
                                          ctx_mask)
        bucket = next(s for s in self.buckets if s >= b)
        rows, cols = bucket - b, self.limits.max_ctx - c
        padded = (F.pad(tokens, (0, rows))[:, None],
                  torch.ones(bucket, 1, dtype=torch.bool, device=tokens.device),
                  F.pad(positions, (0, rows)),
                  F.pad(ctx_slots.to(torch.int64), (0, cols, 0, rows)),
                  F.pad(ctx_mask, (0, cols, 0, rows)))
        logits, _, k, v = self._call(self._decode, cache.k, cache.v, *_batch_dynamic(padded))
        cache.k.index_copy_(1, write_slots, k[:, :b, 0])
        cache.v.index_copy_(1, write_slots, v[:, :b, 0])
        return logits[:b]


class CompiledTorchBackend(TorchBackend):
    """``TorchBackend`` on a :class:`CompiledModel`; ``compile_seconds`` = its warm-up."""

    compile_seconds: float

    @classmethod
    def create(cls, config: BackendConfig, model: Pi05Model, num_blocks: int, *,
               backend: str | Callable | None = None) -> CompiledTorchBackend:
        """
        Build the backend and warm it up (compile + capture every static shape).

        :param backend: ``torch.compile`` backend (default ``DEFAULT_COMPILE_BACKEND``).
        :raises ValueError: ``config.compile_mode`` NONE.
        """
        cfg = model.cfg
        limits = EngineLimits.for_model(
            cfg, num_slots=num_blocks * config.block_size, max_batch=config.max_running_requests,
            max_decode_tokens=max(cfg.decode_budget, config.decode_budget or 0))
        compiled = CompiledModel(model, config.compile_mode, limits,
                                 backend=backend or DEFAULT_COMPILE_BACKEND)
        out = cls(compiled, num_blocks, config.block_size)  # type: ignore[arg-type]
        out.compile_seconds = compiled.warmup(out.cache)
        return out


__all__ = ['CompiledModel', 'CompiledTorchBackend', 'DEFAULT_COMPILE_BACKEND', 'batch_buckets']
