"""
The fast path: every per-cycle model call at static shapes, in CUDA graphs, parity-gated.

Why CUDA graphs, captured by us (``torch.cuda.CUDAGraph``), around Inductor kernels: eager π0.5
leaves the GPU idle between its hundreds of kernel launches per call; Inductor without graphs did
not pay, Inductor with graphs did (the H100 timings: ``docs/gpu.md#the-fast-path``, "Why CUDA
graphs"). So the graph is what matters, and capturing it ourselves (as vLLM does) rather than
through ``mode='reduce-overhead'`` lets one graph hold a whole call: the model call, its K/V writes
into the pool, the 10 Euler steps of a chunk, the LM head and greedy argmax, on buffers we own (no
copy of outputs per replay, no re-recording because a pool is mutated or an address moved). The
kernels inside come from Inductor (``CompileMode.REDUCE_OVERHEAD``) or are PyTorch's own
(``CUDA_GRAPHS``, no compiler: what is left where Triton fails, e.g. builds that reject Jetson
Thor's ``sm_110a``).

Shapes (``buckets.py``): vision per image count (a robot batch of frames x their cameras),
prefill per robot batch, camera count and prompt bucket, text prefill on image prefixes
(CAUSAL_TEXT) likewise, causal suffixes on action
prefixes per batch bucket (2 up to ``MAX_SUFFIX_BATCH``), suffix bucket and root context
bucket, denoise (and RTC's guided denoise when asked) per prefix length of those prefill
buckets, decode per batch bucket (2 up to ``max_running_requests``; batch 1 runs padded to
2) and context bucket, and where k > 1 the decode of a job's k steps in one graph per batch,
context bucket and k (``decode_steps.py``), seed per batch bucket. With a suffix LoRA (the
memory adapter) the suffix and decode graphs carry it, active on the rows a per-row mask
selects (an input of the graph). Padding is masked, so results equal eager on the valid
part (float32 1e-5 in the tests). A robot batch (the frames of several robots in one cycle,
``frame_batch.py``) pads to its bucket with rows that write to the null block. Graph
simplifications: Q/K/V is one fused projection in the
model itself; the time MLP and every adaRMS ``Dense`` are evaluated once per load for the fixed
Euler times (``DenoiseCall``); RMSNorm scales folded into the next linear
(``folding.py``) with eager kernels only (Inductor fuses the multiply into the norm
anyway, and folding costs 2.6 GB of weights at full size), and not into FP8 weights
(``model/fp8.py``, whose gate reference is the unquantized float32 copy
``engine/loading.py`` hands in).

Warm-up (``warmup.py``) compiles, captures and gates every graph (``parity.py``, probes in
``parity_probe.py``), with a progress bar and a log line per step; the compiled steps are
kept on disk ahead of time (``precompile.py``: a warm start loads them, nothing traced),
Inductor's artifacts too (``compile_cache.py``). A step whose graphs fail (compiler error,
capture error, failed gate) is compiled again without the optional feature the failure names
(``features.py``: the paged attention kernel, FlexAttention, the FP8 product; ``dropped``,
``without``), then tries eager kernels in graphs, then runs eagerly: an ERROR log with the
reason and the measured error, and ``fallbacks`` (step -> reason), which the engine exposes,
the node shows on ``/diagnostics`` and ``oxygen_bench gpu`` fails on. A call
outside the compiled shapes (a longer context, a batch > ``max_running_requests``) runs
eagerly with a warning. Inputs reach a graph's buffers in place, padded there
(``StaticCall``): no padded copy per call.
"""

from __future__ import annotations

import logging
from typing import Callable, Collection, Iterator

from oxygen_ros.backends.config import AttentionBackend, CompileMode
from oxygen_ros.backends.fast_path.buckets import bucket_for, EngineLimits, StaticShapes
from oxygen_ros.backends.fast_path.compile_cache import CompileCache
from oxygen_ros.backends.fast_path.decode_steps import DecodeSteps
from oxygen_ros.backends.fast_path.graph_builder import Kernels, Step
from oxygen_ros.backends.fast_path.guided_denoise import GuidedDenoise
from oxygen_ros.backends.fast_path.precompile import AOT_BACKENDS, ArtifactStore
from oxygen_ros.backends.fast_path.static_graph import StaticCall
from oxygen_ros.backends.fast_path.warmup import FastPathWarmup
from oxygen_ros.backends.parity import ParityResult
from oxygen_ros.config import PrefixAttention
from oxygen_ros.kv.block_pool import NULL_BLOCK_ID
from oxygen_ros.model.fp8 import fp8_kernel_of
from oxygen_ros.model.guidance import jacobian_step_count
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.model.lora import AdapterRows, SuffixLoRA
from oxygen_ros.model.pi05 import Pi05Model
import torch

_LOG = logging.getLogger(__name__)


class FastPathModel(GuidedDenoise, DecodeSteps, FastPathWarmup):
    """
    ``Pi05Model``'s calls for ``TorchBackend``, on the fast path where a graph fits.

    Same signatures and results as the model (``encode_images``, ``prefill``,
    ``prefill_suffix``, ``denoise``, ``decode_step``, ``lm_logits``) plus ``decode_greedy`` /
    ``lm_greedy`` (token ids from the graph's argmax), ``decode_greedy_steps`` (k decode
    steps in one graph, ``decode_steps.py``) and ``guided_denoise`` (real-time chunking,
    ``guided_denoise.py``). A call takes a graph when it has a compiled shape (a batch of
    several robots' frames where ``limits.max_robots`` compiled one), no camera mask, the
    prompts valid from their start (a batch padded at its end, as ``frame_batch`` pads) and
    the KV pool given to :meth:`warmup`; else the eager model runs it. Graph outputs are
    copied before return.

    :param model: the eager model (weights shared; also the fallback).
    :param mode: DEFAULT, REDUCE_OVERHEAD or CUDA_GRAPHS (AUTO is resolved for the device).
    :param limits: longest prefix, decode context and batch.
    :param backend: ``torch.compile`` backend for Inductor kernels.
    :param block_size: KV block size (block 0 is the null block padded tokens write to).
    :param fold_norms: fold RMSNorm scales into the linears; default: with eager kernels,
        unless the model has FP8 weights (``model/fp8.py``: nothing to fold them into).
    :param only: put only these steps on the fast path (default: all); the others run
        eagerly (not a fallback: nothing was asked).
    :param camera_counts: numbers of valid cameras to compile vision and prefixes for
        (default: 1 to all; ``StaticShapes.for_model``).
    :param adapter: the suffix LoRA the backend passes (``AdapterRows`` of it) to
        ``prefill_suffix`` and the decode calls; the graphs hold it (folded with the norms
        where those are folded).
    :param guided: compile the guided denoise of real-time chunking too (``guided_denoise``);
        without it a guided chunk runs eagerly (a warning once).
    :param jacobian_steps: the guided denoise's ``RtcGuidance.jacobian_steps`` values it
        compiles graphs for (None: every step); a guidance asking another runs eagerly (a
        warning once).
    :param precompile: compile the steps ahead of time and keep them on disk
        (``precompile.py``; backends ``inductor`` and ``aot_eager``); default: with
        ``inductor``.
    :param attention: the attention backend the warm-up runs in (``sdpa_context``): part of
        the compile caches' key.
    :param tokens_per_cycle: values of k whose k decode steps compile as one graph each
        (``decode_greedy_steps``, the ``decode_steps`` step; the engine's k); default none.
    :raises ValueError: a mode that compiles nothing here (NONE, or AUTO on the CPU).
    """

    def __init__(self, model: Pi05Model, mode: CompileMode, limits: EngineLimits, *,
                 backend: str | Callable = 'inductor', block_size: int = 16,
                 fold_norms: bool | None = None, only: Collection[Step] | None = None,
                 camera_counts: tuple[int, ...] | None = None,
                 adapter: SuffixLoRA | None = None, guided: bool = False,
                 jacobian_steps: Collection[int | None] = (None,),
                 precompile: bool | None = None,
                 attention: AttentionBackend = AttentionBackend.AUTO,
                 tokens_per_cycle: tuple[int, ...] = ()) -> None:
        mode = mode.resolve(model.device.type)
        if mode is CompileMode.NONE:
            raise ValueError('FastPathModel needs a compile mode other than NONE')
        self.model = model
        self.adapter = adapter
        self.cfg = model.cfg
        self.mode = mode
        self.limits = limits
        self.block_size = block_size
        self.null_slot = NULL_BLOCK_ID * block_size
        self.cuda_graphs = mode is not CompileMode.DEFAULT and model.device.type == 'cuda'
        self.kernels = Kernels.EAGER if mode is CompileMode.CUDA_GRAPHS else Kernels.INDUCTOR
        if fold_norms is None:
            fold_norms = self.kernels is Kernels.EAGER and fp8_kernel_of(model) is None
        self.fold_norms = fold_norms
        self.shapes = StaticShapes.for_model(model.cfg, max_batch=limits.max_batch,
                                             max_ctx=limits.max_ctx,
                                             max_cameras=limits.max_cameras,
                                             camera_counts=camera_counts,
                                             tokens_per_cycle=tokens_per_cycle,
                                             max_robots=limits.max_robots)
        self.compile_seconds = 0.0
        self.fallbacks: dict[str, str] = {}
        """Compiled steps that run eagerly instead: step name -> reason."""
        self.dropped: dict[str, str] = {}
        """Optional features left out at the last warm-up (``features.Feature`` value ->
        the first reason); the steps stay compiled without them."""
        self.without: dict[str, tuple[str, ...]] = {}
        """Per step, the features its graphs run without."""
        self._in_use: set = set()
        self._global_off: set = set()
        self.parity: dict[str, ParityResult] = {}
        """The gate's closest call (largest error / tolerance) per step that passed."""
        self.compiles: dict[str, int] = {}
        """Dynamo graphs traced per step at the last warm-up (recompiles included)."""
        self.loaded: dict[str, int] = {}
        """Functions compiled ahead of time loaded from disk per step (no trace)."""
        self.seconds: dict[str, float] = {}
        """Seconds of the last warm-up per step, and of the gate's ``reference`` copy or the
        weights' ``fingerprint``."""
        self.gate = ''
        """What the gate held the graphs to at the last warm-up (float32 or recorded)."""
        self.cache: CompileCache | None = None
        self.store: ArtifactStore | None = None
        self.precompile = self.kernels is Kernels.INDUCTOR and backend in AOT_BACKENDS and \
            (backend == 'inductor' if precompile is None else precompile)
        self.attention = attention
        self._backend = backend
        self._only = frozenset(Step) if only is None else frozenset(only)
        self._graphs: dict[Step, dict[tuple[int, ...], StaticCall]] = {}
        self._pool: KVCache | None = None
        self._warned: set[str] = set()
        self.guided = guided
        self.jacobian_steps = tuple(sorted({jacobian_step_count(k, model.cfg.num_denoise_steps)
                                            for k in jacobian_steps}))
        self._no_rows = torch.zeros(0, dtype=torch.bool, device=model.device)
        self._true = torch.ones((), dtype=torch.bool, device=model.device)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()

    def steps(self) -> dict[Step, list[tuple[int, ...]]]:
        """Return every step and the shape keys it compiles, in warm-up order."""
        s = self.shapes
        cams_prompts = [(r, n, t) for r in s.robots for n in s.camera_counts for t in s.prompt]
        steps = {Step.VISION: [(m,) for m in s.images], Step.PREFILL: cams_prompts}
        if self.cfg.prefix_attention is PrefixAttention.CAUSAL_TEXT:
            steps[Step.TEXT_PREFILL] = cams_prompts
        steps.update({
            Step.SUFFIX: [(b, t, c) for b in s.suffix_batch for t in s.suffix
                          for c in s.suffix_ctx],
            Step.DENOISE: [(r, c) for r in s.robots for c in s.denoise],
            Step.DECODE: [(b, c) for b in s.batch for c in s.ctx],
            Step.SEED: [(b,) for b in s.batch]})
        if s.tokens_per_cycle:
            steps[Step.DECODE_STEPS] = [(b, c, k) for b in s.batch for c in s.ctx
                                        for k in s.tokens_per_cycle]
        if self.guided:
            steps[Step.GUIDED_DENOISE] = [(c, k) for c in s.denoise
                                          for k in self.jacobian_steps]
        return {step: keys for step, keys in steps.items() if step in self._only}

    def graph_counts(self) -> dict[str, int]:
        """Return the graphs built per step (``Step`` value -> shapes); eager steps absent."""
        return {step.value: len(graphs) for step, graphs in self._graphs.items()}

    def _graph(self, step: Step, key: tuple[int, ...] | None, cache: KVCache | None,
               shape: object = None) -> StaticCall | None:
        """Return the graph of ``key`` (None: eager), warning once per step for a misfit."""
        if cache is not self._pool or step not in self._graphs:
            return None
        graph = self._graphs[step].get(key) if key is not None else None
        if graph is None and step.value not in self._warned:
            self._warned.add(step.value)
            _LOG.warning('%s of shape %s is outside the compiled ones (largest %s): eager',
                         step.value, shape if key is None else key, list(self._graphs[step])[-1])
        return graph

    # ---------------------------------------------------------------- calls
    @torch.inference_mode()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """See ``Pi05Model.encode_images``: ``images [B, N, ...]`` in the graph of B x N."""
        b, n = images.shape[:2]
        graph = self._graph(Step.VISION, (b * n,), self._pool)
        if graph is None or tuple(images.shape[2:]) != tuple(graph.inputs[0].shape[1:]):
            return self.model.encode_images(images)
        out = graph(images.flatten(0, 1)).clone()
        return out.view(b, n, *out.shape[1:])

    @torch.inference_mode()
    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """See ``Pi05Model.lm_logits``."""
        out = self._seed(hidden)
        return self.model.lm_logits(hidden) if out is None else out[0].clone()

    @torch.inference_mode()
    def lm_greedy(self, hidden: torch.Tensor) -> torch.Tensor:
        """Return ``lm_logits(hidden).argmax(-1)``: ``int64 [B]`` (argmax in the graph)."""
        out = self._seed(hidden)
        return self.model.lm_logits(hidden).argmax(-1) if out is None else out[1].clone()

    def _seed(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        b = hidden.shape[0]
        bucket = bucket_for(b, self.shapes.batch)
        graph = self._graph(Step.SEED, (bucket,) if bucket else None, self._pool, (b,))
        if graph is None:
            return None
        logits, ids = graph(hidden, pad=(0,))
        return logits[:b], ids[:b]

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, token_mask: torch.Tensor | None, *,
                image_embeds: torch.Tensor | None = None, image_mask: torch.Tensor | None = None,
                context: PrefixKV | None = None, cache: KVCache | None = None,
                slots: torch.Tensor | None = None, reserve: int = 0) -> PrefixKV:
        """
        See ``Pi05Model.prefill``; the graph path skips its slot checks (host syncs).

        Graphs serve a robot batch of B prefixes with no camera mask, slots given, in the
        warm-up pool: a whole prefix (images + prompt) or, in CAUSAL_TEXT, a prompt on an
        image prefix. ``token_mask`` must then be valid from each row's start (prompts padded
        at their end, as ``frame_batch.prefill_rows`` pads them); None: every token valid.
        """
        b, t = tokens.shape
        robots = bucket_for(b, self.shapes.robots)
        plain = image_mask is None and slots is not None and reserve == 0 and \
            robots is not None
        if plain and context is None and image_embeds is not None:
            n = image_embeds.shape[1]
            bucket = bucket_for(t, self.shapes.prompt)
            graph = self._graph(Step.PREFILL, (robots, n, bucket) if bucket else None, cache)
            if graph is not None:
                return self._prefill_graph(graph, tokens, token_mask, image_embeds, cache,
                                           slots)
        if plain and context is not None and image_embeds is None and t > 0:
            ti = self.cfg.image_tokens_per_camera
            n, rest = divmod(context.slots.shape[1], ti)
            bucket = bucket_for(t, self.shapes.prompt)
            graph = self._graph(Step.TEXT_PREFILL,
                                (robots, n, bucket) if bucket and not rest else None,
                                context.cache if cache is None else cache)
            if graph is not None:
                return self._text_graph(graph, tokens, token_mask, context, slots)
        return self.model.prefill(tokens, token_mask, image_embeds=image_embeds,
                                  image_mask=image_mask, context=context, cache=cache,
                                  slots=slots, reserve=reserve)

    def _prefill_graph(self, graph: StaticCall, tokens: torch.Tensor,
                       token_mask: torch.Tensor | None, embeds: torch.Tensor, cache: KVCache,
                       slots: torch.Tensor) -> PrefixKV:
        """Run a robot batch of whole prefixes; padded tokens and rows write the null slot."""
        (b, t), dev, null = tokens.shape, tokens.device, self.null_slot
        images = embeds.shape[1] * self.cfg.image_tokens_per_camera
        count = images + t
        if token_mask is None:
            valid = self._true.expand(b, count)
        else:
            valid = torch.cat([self._true.expand(b, images), token_mask], 1)
        used = slots[:, :count].to(torch.int64)
        write = used if token_mask is None else torch.where(valid, used, null)
        counts = valid.sum(1)
        hidden = graph(embeds, tokens, valid, write, counts - 1,
                       pad=(0, 0, False, null, 0))
        return PrefixKV(cache, used, valid if token_mask is not None else
                        torch.ones(b, count, dtype=torch.bool, device=dev), counts,
                        hidden[:b].clone())

    def _text_graph(self, graph: StaticCall, tokens: torch.Tensor,
                    token_mask: torch.Tensor | None, context: PrefixKV,
                    slots: torch.Tensor) -> PrefixKV:
        """Run a robot batch of prompts on image prefixes (CAUSAL_TEXT)."""
        (b, t), null = tokens.shape, self.null_slot
        valid = self._true.expand(b, t) if token_mask is None else token_mask
        used = slots[:, :t].to(torch.int64)
        write = used if token_mask is None else torch.where(valid, used, null)
        hidden = graph(tokens, valid, context.num_tokens, context.slots, context.mask, write,
                       pad=(0, False, 0, null, False, null))
        counts = valid.sum(1)
        return PrefixKV(context.cache, torch.cat([context.slots, used], 1),
                        torch.cat([context.mask, valid], 1), context.num_tokens + counts,
                        torch.where((counts > 0)[:, None], hidden[:b], context.last_hidden))

    @torch.inference_mode()
    def prefill_suffix(self, tokens: torch.Tensor, token_mask: torch.Tensor | None,
                       context: PrefixKV, *, slots: torch.Tensor,
                       adapter: AdapterRows | None = None) -> PrefixKV:
        """
        See ``Pi05Model.prefill_suffix``; more rows than the largest suffix batch go in turns.

        The graph path skips the model's slot checks (host syncs); slots of padding tokens are
        replaced by the null slot (never written by the caller's rows).
        """
        b, t = tokens.shape
        most = self.shapes.suffix_batch[-1] if self.shapes.suffix_batch else b
        if b > most and Step.SUFFIX in self._graphs and context.cache is self._pool:
            parts = []
            for i in range(0, b, most):
                rows = slice(i, i + most)
                part = None if adapter is None else AdapterRows(adapter.adapter,
                                                                adapter.mask[rows])
                parts.append(self.prefill_suffix(
                    tokens[rows], None if token_mask is None else token_mask[rows],
                    _rows_of(context, rows), slots=slots[rows], adapter=part))
            return PrefixKV(context.cache, torch.cat([p.slots for p in parts]),
                            torch.cat([p.mask for p in parts]),
                            torch.cat([p.num_tokens for p in parts]),
                            torch.cat([p.last_hidden for p in parts]))
        c = context.slots.shape[1]
        bb, tb = bucket_for(b, self.shapes.suffix_batch), bucket_for(t, self.shapes.suffix)
        cb = bucket_for(c, self.shapes.suffix_ctx)
        graph = self._graph(Step.SUFFIX, (bb, tb, cb) if bb and tb and cb else None,
                            context.cache, (b, t, c))
        if graph is None or t == 0:
            return self.model.prefill_suffix(tokens, token_mask, context, slots=slots,
                                             adapter=adapter)
        null = self.null_slot
        valid = self._true.expand(b, t) if token_mask is None else token_mask
        write = slots[:, :t] if token_mask is None else torch.where(valid, slots[:, :t], null)
        hidden = graph(tokens, valid, context.num_tokens, context.slots, context.mask, write,
                       *self._rows(adapter), pad=(0, False, 0, null, False, null, False))
        counts = valid.sum(1)
        return PrefixKV(context.cache, torch.cat([context.slots, slots[:, :t]], 1),
                        torch.cat([context.mask, valid], 1), context.num_tokens + counts,
                        torch.where((counts > 0)[:, None], hidden[:b], context.last_hidden))

    @torch.inference_mode()
    def denoise(self, prefix: PrefixKV, noise: torch.Tensor, *,
                num_steps: int | None = None) -> torch.Tensor:
        """
        See ``Pi05Model.denoise``: the whole Euler loop is one graph replay.

        A robot batch of B prefixes (``frame_batch.stack_prefixes``) runs in the graph of its
        bucket, padded with masked rows.
        """
        b, p = prefix.slots.shape
        r, c = bucket_for(b, self.shapes.robots), bucket_for(p, self.shapes.denoise)
        graph = self._graph(Step.DENOISE, (r, c) if r and c else None, prefix.cache, (b, p))
        if (graph is None or num_steps not in (None, self.cfg.num_denoise_steps)
                or tuple(noise.shape[1:]) != tuple(graph.inputs[3].shape[1:])):
            return self.model.denoise(prefix, noise, num_steps=num_steps)
        return graph(prefix.slots, prefix.mask, prefix.num_tokens, noise,
                     pad=(self.null_slot, False, 0, 0.0))[:b].clone()

    def _decode(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                write_slots: torch.Tensor, ctx_slots: torch.Tensor, ctx_mask: torch.Tensor,
                adapter: AdapterRows | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        b, c = ctx_slots.shape
        bb, cb = bucket_for(b, self.shapes.batch), bucket_for(c, self.shapes.ctx)
        graph = self._graph(Step.DECODE, (bb, cb) if bb and cb else None, cache, (b, c))
        if graph is None:
            return None
        null = self.null_slot
        logits, ids = graph(tokens, positions, write_slots, ctx_slots, ctx_mask,
                            *self._rows(adapter), pad=(0, 0, null, null, False, False))
        return logits[:b], ids[:b]

    def _rows(self, adapter: AdapterRows | None) -> tuple[torch.Tensor, ...]:
        """Return the adapter-rows input of the suffix and decode graphs (none: no LoRA)."""
        if self.adapter is None:
            return ()
        return (self._no_rows if adapter is None else adapter.mask,)

    @torch.inference_mode()
    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                    write_slots: torch.Tensor, ctx_slots: torch.Tensor,
                    ctx_mask: torch.Tensor, adapter: AdapterRows | None = None
                    ) -> torch.Tensor:
        """See ``Pi05Model.decode_step`` (batch padded to a bucket, context to a bucket)."""
        out = self._decode(tokens, positions, cache, write_slots, ctx_slots, ctx_mask, adapter)
        if out is None:
            return self.model.decode_step(tokens, positions, cache, write_slots, ctx_slots,
                                          ctx_mask, adapter)
        return out[0].clone()

    @torch.inference_mode()
    def decode_greedy(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                      write_slots: torch.Tensor, ctx_slots: torch.Tensor,
                      ctx_mask: torch.Tensor, adapter: AdapterRows | None = None
                      ) -> torch.Tensor:
        """Return ``decode_step(...).argmax(-1)``: ``int64 [B]`` (LM head + argmax in graph)."""
        out = self._decode(tokens, positions, cache, write_slots, ctx_slots, ctx_mask, adapter)
        if out is None:
            return self.model.decode_step(tokens, positions, cache, write_slots, ctx_slots,
                                          ctx_mask, adapter).argmax(-1)
        return out[1].clone()


def _rows_of(prefix: PrefixKV, rows: slice) -> PrefixKV:
    """Return some rows of a batched prefix."""
    return PrefixKV(prefix.cache, prefix.slots[rows], prefix.mask[rows],
                    prefix.num_tokens[rows], prefix.last_hidden[rows])


__all__ = ['FastPathModel']
