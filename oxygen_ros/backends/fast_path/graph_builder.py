"""
Building the fast path's graphs: compile, capture and gate one step at every static shape.

For each step (vision, prefill, text prefill, suffix, denoise, decode, the decode of k steps,
seed) and each shape (``buckets.StaticShapes``) :class:`GraphBuilder` makes the function a CUDA
graph will hold:
the static-shape model call (``static_calls.py``), compiled or not, followed by the
in-place write of its new K/V into the KV pool. ``StaticCall`` then captures it.

Kernels: Inductor (``torch.compile(fullgraph=True)``: one graph per call or it fails, never a
silent graph break), the same compiled ahead of time and kept on disk (``precompile.py``: a
warm start loads them, no Dynamo trace) or PyTorch's eager ones; decode steps and causal
suffixes attend the KV pool in place with the paged Triton kernel where the attention backend
chooses it (``paged_attention.py``; on CUDA the builder loads it for AUTO), the
prefill's prefix with FlexAttention where ``model/flex.py`` chooses it. One compiled function
serves every shape of a step: the bucketed dims are marked dynamic (``maybe_mark_dynamic``),
so Inductor compiles a step once or twice, not once per bucket (sizes 1 are specialized; the
suffix has two attention regimes, up to ``PAGED_MAX_QUERIES`` new tokens per row and beyond:
the paged kernel or folded queries, and the gathered context with a head-major mask); the
CUDA graphs are still one per shape. The denoise step compiles the velocity of ONE Euler step
(N times less Inductor work than the unrolled loop); the CUDA graph of the whole loop replays
all N. Where the paged kernel is chosen (``paged_attention.denoise_attention``) that velocity
is the fused one (``denoise_fused.py``: the prefix read in place, fused norms), else the
gathered one. The decode of k steps (``DECODE_STEPS``) likewise calls the decode step's
compiled function k times; its CUDA graph replays all k. The guided denoise (real-time
chunking, ``model.guidance.GuidedDenoiseCall``) compiles one guided step, the velocity and its
vector-Jacobian product in one graph, and, for the Euler steps past ``jacobian_steps``, one
step that guides by the error alone.
The steps ``$OXYGEN_ROS_MAX_AUTOTUNE`` names (``config.max_autotune_steps``) compile with
Inductor's ``max_autotune``.
"""

from __future__ import annotations

import enum
from typing import Callable

from oxygen_ros.backends.config import max_autotune_steps, Step
from oxygen_ros.backends.fast_path.features import Feature, features_off
from oxygen_ros.backends.fast_path.paged_attention import denoise_attention, load_kernel
from oxygen_ros.backends.fast_path.precompile import ArtifactStore, PrecompiledStep
from oxygen_ros.backends.fast_path.static_calls import (
    DecodeCall, DecodeLoopCall, DenoiseCall, ExtendCall, PrefillCall, SeedCall, VisionCall)
from oxygen_ros.backends.fast_path.static_graph import GraphCapture, StaticCall
from oxygen_ros.model.guidance import GuidedDenoiseCall
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.lora import SuffixLoRA
from oxygen_ros.model.pi05 import Pi05Model
import torch
from torch import nn


class Kernels(enum.Enum):
    """Where a graph's kernels come from."""

    PRECOMPILED = 'precompiled'
    """The compiler's kernels compiled ahead of time (loaded from disk, else compiled, saved)."""
    INDUCTOR = 'inductor'
    """``torch.compile`` (Triton on CUDA, C++ on the CPU), just in time."""
    EAGER = 'eager'
    """PyTorch's own kernels: no compiler needed (what still works where Triton does not)."""


class GraphBuilder:
    """
    Makes the capturable function of each step and shape.

    :param model: the eager model (weights shared).
    :param layers: the VLM layers to run (the model's or norm-folded ones).
    :param pool: the KV pool every graph reads and writes by address.
    :param compiler: ``torch.compile`` backend for INDUCTOR kernels (``'inductor'``; tests
        pass ``'aot_eager'`` or a callable).
    :param adapter: the suffix LoRA for ``layers`` (folded ones: ``fold_adapter``): the
        suffix and decode graphs then take one more input, ``adapter_rows bool [B]``.
    :ivar store: where PRECOMPILED kernels are loaded from and saved to (set before
        building any; ``compiler`` must then be a name in ``precompile.AOT_BACKENDS``).
    """

    def __init__(self, model: Pi05Model, layers: nn.ModuleList, pool: KVCache, *,
                 compiler: str | Callable = 'inductor',
                 adapter: SuffixLoRA | None = None) -> None:
        self.model = model
        self.pool = pool
        self.compiler = compiler
        self.adapter = adapter
        self.store: ArtifactStore | None = None
        for t in (pool.k, pool.v):   # the pool's size stays symbolic: a start with another
            torch._dynamo.maybe_mark_dynamic(t, 1)   # pool size reuses the compiled code
        if pool.device.type == 'cuda':   # AUTO's paged decode attention, where Triton imports
            load_kernel(required=False)
        self.calls: dict[Step, nn.Module] = {
            Step.VISION: VisionCall(model), Step.PREFILL: PrefillCall(model, layers),
            Step.TEXT_PREFILL: ExtendCall(model, layers),
            Step.SUFFIX: ExtendCall(model, layers, adapter),
            Step.DECODE: DecodeCall(model, layers, adapter), Step.SEED: SeedCall(model)}
        self.denoise = DenoiseCall(model)
        self._guided: dict[tuple[Kernels, int], GuidedDenoiseCall] = {}
        """The guided denoise per kernels and ``jacobian_steps`` (compiled steps shared)."""
        self._guided_template: GuidedDenoiseCall | None = None
        self.autotune = max_autotune_steps()
        """Steps compiled with Inductor's ``max_autotune`` (``$OXYGEN_ROS_MAX_AUTOTUNE``)."""
        self._compiled: dict[tuple[Step, Kernels, bool, frozenset[Feature]], Callable] = {}
        """Compiled step functions by step, kernels, a variant (denoise: fused or gathered;
        the guided denoise's error-only step) and the features left out."""
        self._off: frozenset[Feature] = frozenset()
        """The features the step being built runs without (:meth:`build`)."""

    def forget(self, step: Step) -> None:
        """Drop the step's compiled functions (the next build compiles or loads afresh)."""
        for key in [k for k in self._compiled if k[0] is step]:
            del self._compiled[key]
        if step is Step.GUIDED_DENOISE:
            self._guided.clear()

    def _kernel(self, step: Step, kernels: Kernels) -> Callable:
        if step is Step.DECODE_STEPS:   # the decode step's compiled function, k times
            decode = self._kernel(Step.DECODE, kernels)
            return decode if kernels is Kernels.EAGER else _decode_dynamic(decode)
        if step is Step.DENOISE:
            return self._denoise_kernel(kernels)
        if step is Step.GUIDED_DENOISE:
            return self._guided_kernel(kernels)
        if kernels is Kernels.EAGER:
            return self.calls[step]
        return self._compile(step, kernels, self.calls[step])

    def _guided_kernel(self, kernels: Kernels) -> Callable[[int], GuidedDenoiseCall]:
        """
        Return ``k -> GuidedDenoiseCall`` with ``k`` Jacobian steps, its steps compiled.

        The guided step (velocity and vector-Jacobian product) and the error-only step of the
        later Euler steps compile once each and serve every k.
        """
        if kernels is Kernels.PRECOMPILED:   # the two steps would share one ArtifactStore name
            raise RuntimeError('the guided denoise is compiled just in time only '
                               '(warmup.JUST_IN_TIME)')
        if self._guided_template is None:
            self._guided_template = GuidedDenoiseCall(self.model)
        template = self._guided_template
        if kernels is Kernels.EAGER:
            fns = (template.guided_step, template.error_guided_step)
        else:
            fns = (self._compile(Step.GUIDED_DENOISE, kernels, template.guided_step,
                                 _context_dynamic),
                   self._compile(Step.GUIDED_DENOISE, kernels, template.error_guided_step,
                                 _context_dynamic, variant=True))

        def call(k: int) -> GuidedDenoiseCall:
            if (kernels, k) not in self._guided:
                guided = GuidedDenoiseCall(self.model, jacobian_steps=k)
                guided.step, guided.error_step = fns
                self._guided[kernels, k] = guided
            return self._guided[kernels, k]
        return call

    def compile_options(self, step: Step) -> dict | None:
        """Return Inductor's options for ``step``: ``max_autotune`` where asked, else None."""
        if step in self.autotune and self.compiler == 'inductor':
            return {'max_autotune': True}
        return None     # other compilers take no Inductor options

    def _denoise_kernel(self, kernels: Kernels) -> Callable:
        """Return the denoise loop with one velocity step (fused or gathered) inside."""
        compiled = kernels is not Kernels.EAGER
        fused = denoise_attention(self.pool.device, compiled,
                                  self.model.cfg.action_horizon) == 'fused'
        if not compiled:
            self.denoise.use(fused)
            return self.denoise
        target = self.denoise.fused_step if fused else self.denoise.velocity_step
        self.denoise.use(fused, self._compile(Step.DENOISE, kernels, target,
                                              _slots_dynamic if fused else _context_dynamic,
                                              fused))
        return self.denoise

    def _compile(self, step: Step, kernels: Kernels, target: Callable,
                 wrap: Callable[[Callable], Callable] | None = None,
                 variant: bool = False) -> Callable:
        """Return ``target`` compiled with ``kernels`` (once; ``wrap`` marks dynamic dims)."""
        key = (step, kernels, variant, self._off)
        if key not in self._compiled:
            if kernels is Kernels.PRECOMPILED:
                assert self.store is not None and isinstance(self.compiler, str)
                name = step.value + ''.join(f'-no-{f.value}' for f in sorted(self._off))
                fn = PrecompiledStep(target, self.compiler, self.store, name,
                                     options=self.compile_options(step))
            else:
                fn = torch.compile(target, backend=self.compiler, fullgraph=True,
                                   options=self.compile_options(step))
            self._compiled[key] = wrap(fn) if wrap is not None else fn
        return self._compiled[key]

    def build(self, step: Step, key: tuple[int, ...], kernels: Kernels, *,
              capture: GraphCapture | None = None,
              off: frozenset[Feature] = frozenset()) -> StaticCall:
        """
        Return the step at shape ``key`` on its own buffers, captured with ``capture``.

        Keys: VISION ``(images,)`` (a robot batch's frames x cameras); PREFILL and
        TEXT_PREFILL ``(robots, cameras, prompt bucket)``; SUFFIX ``(batch, suffix bucket,
        context)``; DENOISE ``(robots, context slots)``;
        GUIDED_DENOISE ``(context slots, Jacobian steps)`` (``RtcGuidance.jacobian_steps``);
        DECODE ``(batch, context)``; DECODE_STEPS ``(batch, context, k)``; SEED ``(batch,)``.

        :param off: features the step runs without (``features.py``): its functions are
            compiled, captured and called inside ``features_off(off)``.
        :raises Exception: whatever compiling or capturing raised (the caller falls back).
        """
        self._off = frozenset(off)
        try:
            with features_off(off):
                fn, example, dynamic = getattr(self, f'_{step.value}')(
                    self._kernel(step, kernels), key)
                if off:
                    fn = _without(fn, self._off)
                return StaticCall(fn, (self.pool.k, self.pool.v), example, capture=capture,
                                  dynamic=dynamic)
        finally:
            self._off = frozenset()

    # -- one function per step: (fn(k_pool, v_pool, *inputs), example inputs, dynamic dims)
    def _empty(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype or self.model.dtype, device=self.pool.device)

    def _vision(self, call: Callable, key: tuple[int, ...]):
        size = self.model.cfg.vision.image_size

        def fn(k_pool, v_pool, images):
            return call(images)
        return fn, (self._empty(key[0], 3, size, size),), {0: (0,)}

    def _prefill(self, call: Callable, key: tuple[int, ...]):
        cfg = self.model.cfg
        r, n, t = key
        p = n * cfg.image_tokens_per_camera + t

        def fn(k_pool, v_pool, embeds, tokens, valid, slots, last):
            hidden, k, v = call(embeds, tokens, valid, last)
            k_pool.index_copy_(1, slots.reshape(-1), k.to(k_pool.dtype))
            v_pool.index_copy_(1, slots.reshape(-1), v.to(v_pool.dtype))
            return hidden
        i64 = torch.int64
        example = (self._empty(r, n, cfg.image_tokens_per_camera, cfg.vlm.width),
                   self._empty(r, t, dtype=i64), self._empty(r, p, dtype=torch.bool),
                   self._empty(r, p, dtype=i64), self._empty(r, dtype=i64))
        return fn, example, {0: (0, 1), 1: (0, 1), 2: (0, 1), 3: (0, 1), 4: (0,)}

    def _text_prefill(self, call: Callable, key: tuple[int, ...]):
        r, n, t = key
        c = n * self.model.cfg.image_tokens_per_camera

        def fn(k_pool, v_pool, tokens, valid, positions, ctx_slots, ctx_mask, slots):
            hidden, k, v = call(k_pool, v_pool, tokens, valid, positions, ctx_slots, ctx_mask)
            k_pool.index_copy_(1, slots.reshape(-1), k.flatten(1, 2).to(k_pool.dtype))
            v_pool.index_copy_(1, slots.reshape(-1), v.flatten(1, 2).to(v_pool.dtype))
            return hidden
        i64 = torch.int64
        example = (self._empty(r, t, dtype=i64), self._empty(r, t, dtype=torch.bool),
                   self._empty(r, dtype=i64), self._empty(r, c, dtype=i64),
                   self._empty(r, c, dtype=torch.bool), self._empty(r, t, dtype=i64))
        return fn, example, {0: (0, 1), 1: (0, 1), 2: (0,), 3: (0, 1), 4: (0, 1), 5: (0, 1)}

    def _suffix(self, call: Callable, key: tuple[int, ...]):
        b, t, c = key
        rows = self.adapter is not None

        def fn(k_pool, v_pool, tokens, valid, positions, ctx_slots, ctx_mask, slots, *adapter):
            hidden, k, v = call(k_pool, v_pool, tokens, valid, positions, ctx_slots, ctx_mask,
                                *adapter)
            k_pool.index_copy_(1, slots.reshape(-1), k.flatten(1, 2).to(k_pool.dtype))
            v_pool.index_copy_(1, slots.reshape(-1), v.flatten(1, 2).to(v_pool.dtype))
            return hidden
        i64 = torch.int64
        example = (self._empty(b, t, dtype=i64), self._empty(b, t, dtype=torch.bool),
                   self._empty(b, dtype=i64), self._empty(b, c, dtype=i64),
                   self._empty(b, c, dtype=torch.bool), self._empty(b, t, dtype=i64)) + \
            ((self._empty(b, dtype=torch.bool),) if rows else ())
        dynamic = {0: (0, 1), 1: (0, 1), 2: (0,), 3: (0, 1), 4: (0, 1), 5: (0, 1)}
        return fn, example, {**dynamic, 6: (0,)} if rows else dynamic

    def _denoise(self, call: Callable, key: tuple[int, ...]):
        cfg = self.model.cfg
        r, c = key

        def fn(k_pool, v_pool, ctx_slots, ctx_mask, num_tokens, noise):
            return call(k_pool, v_pool, ctx_slots, ctx_mask, num_tokens, noise)
        i64 = torch.int64
        example = (self._empty(r, c, dtype=i64), self._empty(r, c, dtype=torch.bool),
                   self._empty(r, dtype=i64),
                   self._empty(r, cfg.action_horizon, cfg.action_dim, dtype=torch.float32))
        return fn, example, {}

    def _guided_denoise(self, calls: Callable[[int], GuidedDenoiseCall], key: tuple[int, ...]):
        cfg = self.model.cfg
        (c, k), h, a = key, cfg.action_horizon, cfg.action_dim
        call = calls(k)

        def fn(k_pool, v_pool, ctx_slots, ctx_mask, num_tokens, noise, target, soft_mask,
               step_weights):
            return call(k_pool, v_pool, ctx_slots, ctx_mask, num_tokens, noise, target,
                        soft_mask, step_weights)
        f32 = torch.float32
        example = (self._empty(1, c, dtype=torch.int64), self._empty(1, c, dtype=torch.bool),
                   self._empty(1, dtype=torch.int64), self._empty(1, h, a, dtype=f32),
                   self._empty(1, h, a, dtype=f32), self._empty(h, dtype=f32),
                   self._empty(cfg.num_denoise_steps, dtype=f32))
        return fn, example, {}

    def _decode(self, call: Callable, key: tuple[int, ...]):
        b, c = key
        rows = self.adapter is not None

        def fn(k_pool, v_pool, tokens, positions, write, ctx_slots, ctx_mask, *adapter):
            logits, ids, k, v = call(k_pool, v_pool, tokens, positions, ctx_slots, ctx_mask,
                                     *adapter)
            k_pool.index_copy_(1, write, k.to(k_pool.dtype))
            v_pool.index_copy_(1, write, v.to(v_pool.dtype))
            return logits, ids
        i64 = torch.int64
        example = (self._empty(b, dtype=i64), self._empty(b, dtype=i64),
                   self._empty(b, dtype=i64), self._empty(b, c, dtype=i64),
                   self._empty(b, c, dtype=torch.bool)) + \
            ((self._empty(b, dtype=torch.bool),) if rows else ())
        dynamic = {0: (0,), 1: (0,), 2: (0,), 3: (0, 1), 4: (0, 1)}
        return fn, example, {**dynamic, 5: (0,)} if rows else dynamic

    def _decode_steps(self, call: Callable, key: tuple[int, ...]):
        b, c, k = key
        loop = DecodeLoopCall(call, k)
        i64 = torch.int64
        example = (self._empty(b, dtype=i64), self._empty(b, dtype=i64),
                   self._empty(b, dtype=i64), self._empty(b, c, dtype=i64),
                   self._empty(dtype=i64)) + \
            ((self._empty(b, dtype=torch.bool),) if self.adapter is not None else ())
        return loop, example, {}

    def _seed(self, call: Callable, key: tuple[int, ...]):
        def fn(k_pool, v_pool, hidden):
            return call(hidden)
        return fn, (self._empty(key[0], self.model.cfg.vlm.width),), {0: (0,)}


def _without(fn: Callable, off: frozenset[Feature]) -> Callable:
    """
    Return ``fn`` called inside ``features_off(off)``.

    A call without a CUDA graph would trace again where the switches Dynamo guards on differ.
    """
    def call(*args):
        with features_off(off):
            return fn(*args)
    return call


def _context_dynamic(velocity: Callable) -> Callable:
    """
    Return ``velocity`` with the context length of its K/V and mask marked dynamic.

    The denoise graphs differ in prefix length only (one per prefill bucket); marked, one
    Inductor compile serves them all instead of a static one and a dynamic recompile.
    """
    def step(keys, values, bias, *rest):
        for t in (*keys, *values):
            torch._dynamo.maybe_mark_dynamic(t, 2)
        torch._dynamo.maybe_mark_dynamic(bias, 3)
        _robots_dynamic(*keys, *values, bias, *rest)
        return velocity(keys, values, bias, *rest)
    return step


def _robots_dynamic(*tensors: torch.Tensor) -> None:
    """
    Mark the robot-batch dim (0) of a denoise step's batched inputs dynamic, where it is > 1.

    One robot's graphs keep batch 1 specialized, as before; the robot batches 2, 4, ...
    share one compile instead of one each. Inputs of no batch dim (the modulations) are left.
    """
    batch = tensors[0].shape[0]
    for t in tensors:
        if batch > 1 and t.dim() > 0 and t.shape[0] == batch:
            torch._dynamo.maybe_mark_dynamic(t, 0)


def _decode_dynamic(decode: Callable) -> Callable:
    """
    Return the compiled decode step with the batch and context dims of its inputs dynamic.

    ``DecodeLoopCall`` makes them in the loop (unmarked): marked as the decode graphs' inputs
    are, the decode step's compiled code serves them without a recompile per shape.
    """
    def step(k_pool, v_pool, tokens, positions, ctx_slots, ctx_mask, *adapter):
        for t, dims in ((tokens, (0,)), (positions, (0,)), (ctx_slots, (0, 1)),
                        (ctx_mask, (0, 1)), *((a, (0,)) for a in adapter)):
            for d in dims:
                torch._dynamo.maybe_mark_dynamic(t, d)
        return decode(k_pool, v_pool, tokens, positions, ctx_slots, ctx_mask, *adapter)
    return step


def _slots_dynamic(velocity: Callable) -> Callable:
    """Return the fused ``velocity`` with the context length of its slots and mask dynamic."""
    def step(k_pool, v_pool, ctx_slots, ctx_mask, *rest):
        for t in (ctx_slots, ctx_mask):
            torch._dynamo.maybe_mark_dynamic(t, 1)
        _robots_dynamic(ctx_slots, ctx_mask, *rest)
        return velocity(k_pool, v_pool, ctx_slots, ctx_mask, *rest)
    return step


__all__ = ['GraphBuilder', 'Kernels', 'Step']
