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

Shapes (``buckets.py``): vision per camera count, prefill per camera count and prompt
bucket, text prefill on an image prefix (CAUSAL_TEXT) likewise, causal suffixes on action
prefixes per batch bucket (2 up to ``MAX_SUFFIX_BATCH``), suffix bucket and root context
bucket, denoise (and RTC's guided denoise when asked) per prefix length of those prefill
buckets, decode per batch bucket (2 up to ``max_running_requests``; batch 1 runs padded to
2) and context bucket, seed per batch bucket. With a suffix LoRA (the memory adapter) the
suffix and decode graphs carry it, active on the rows a per-row mask selects (an input of the
graph). Padding is masked, so results
equal eager on the valid part (float32 1e-5 in the tests). Graph simplifications: Q/K/V is
one fused projection in the model itself; the time MLP and every adaRMS ``Dense`` are
evaluated once per load for the fixed Euler times (``DenoiseCall``); RMSNorm scales folded
into the next linear (``model/folding.py``) with eager kernels only (Inductor fuses the
multiply into the norm anyway, and folding costs 2.6 GB of weights at full size), and not
into FP8 weights (``model/fp8.py``, whose gate reference is the unquantized float32 copy
``engine/loading.py`` hands in).

Warm-up compiles, captures and gates every graph (``parity.py``, probes in
``parity_probe.py``), with a progress bar and a log line per step; Inductor's artifacts are
cached on disk (``compile_cache.py``). A step whose graphs fail (compiler error, capture
error, failed gate) tries eager kernels in graphs, then runs eagerly: an ERROR log with the
reason and the measured error, and ``fallbacks`` (step -> reason), which the engine exposes,
the node shows on ``/diagnostics`` and ``oxygen_bench gpu`` fails on. A call outside the
compiled shapes (a longer context, a batch > ``max_running_requests``) runs eagerly with a
warning.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Collection, Iterator

from oxygen_ros.backends.buckets import bucket_for, EngineLimits, StaticShapes
from oxygen_ros.backends.compile_cache import CompileCache
from oxygen_ros.backends.config import CompileMode
from oxygen_ros.backends.graph_builder import GraphBuilder, Kernels, Step
from oxygen_ros.backends.guided_fast import GuidedDenoise
from oxygen_ros.backends.parity import ParityResult
from oxygen_ros.backends.parity_probe import float32_copy, ParityProbe
from oxygen_ros.backends.static_graph import GraphCapture, StaticCall
from oxygen_ros.backends.warmup import warm_step
from oxygen_ros.config import PrefixAttention
from oxygen_ros.kv.block_pool import NULL_BLOCK_ID
from oxygen_ros.model.folding import fold_adapter, fold_layers
from oxygen_ros.model.fp8 import describe_quantization, fp8_kernel_of
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.model.lora import AdapterRows, SuffixLoRA
from oxygen_ros.model.pi05 import Pi05Model
import torch
import torch.nn.functional as F  # noqa: N812

_LOG = logging.getLogger(__name__)


class CompiledModel(GuidedDenoise):
    """
    ``Pi05Model``'s calls for ``TorchBackend``, on the fast path where a graph fits.

    Same signatures and results as the model (``encode_images``, ``prefill``,
    ``prefill_suffix``, ``denoise``, ``decode_step``, ``lm_logits``) plus ``decode_greedy`` /
    ``lm_greedy`` (token ids from the graph's argmax) and ``guided_denoise`` (real-time
    chunking, ``guided_fast.py``). A call takes a graph when it has a compiled shape, batch 1
    where the graph has one, masks None (every token valid) and the KV pool given to
    :meth:`warmup`; else the eager model runs it. Graph outputs are copied before return.

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
    :raises ValueError: a mode that compiles nothing here (NONE, or AUTO on the CPU).
    """

    def __init__(self, model: Pi05Model, mode: CompileMode, limits: EngineLimits, *,
                 backend: str | Callable = 'inductor', block_size: int = 16,
                 fold_norms: bool | None = None, only: Collection[Step] | None = None,
                 camera_counts: tuple[int, ...] | None = None,
                 adapter: SuffixLoRA | None = None, guided: bool = False) -> None:
        mode = mode.resolve(model.device.type)
        if mode is CompileMode.NONE:
            raise ValueError('CompiledModel needs a compile mode other than NONE')
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
                                             camera_counts=camera_counts)
        self.compile_seconds = 0.0
        self.fallbacks: dict[str, str] = {}
        """Compiled steps that run eagerly instead: step name -> reason."""
        self.parity: dict[str, ParityResult] = {}
        """The gate's closest call (largest error / tolerance) per step that passed."""
        self.compiles: dict[str, int] = {}
        """Dynamo graphs compiled per step at the last warm-up (recompiles included)."""
        self.cache: CompileCache | None = None
        self._backend = backend
        self._only = frozenset(Step) if only is None else frozenset(only)
        self._graphs: dict[Step, dict[tuple[int, ...], StaticCall]] = {}
        self._pool: KVCache | None = None
        self._warned: set[str] = set()
        self.guided = guided

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
        cams_prompts = [(n, t) for n in s.camera_counts for t in s.prompt]
        steps = {Step.VISION: [(n,) for n in s.camera_counts], Step.PREFILL: cams_prompts}
        if self.cfg.prefix_attention is PrefixAttention.CAUSAL_TEXT:
            steps[Step.TEXT_PREFILL] = cams_prompts
        steps.update({
            Step.SUFFIX: [(b, t, c) for b in s.suffix_batch for t in s.suffix
                          for c in s.suffix_ctx],
            Step.DENOISE: [(c,) for c in s.denoise],
            Step.DECODE: [(b, c) for b in s.batch for c in s.ctx],
            Step.SEED: [(b,) for b in s.batch]})
        if self.guided:
            steps[Step.GUIDED_DENOISE] = [(c,) for c in s.denoise]
        return {step: keys for step, keys in steps.items() if step in self._only}

    def graph_counts(self) -> dict[str, int]:
        """Return the graphs built per step (``Step`` value -> shapes); eager steps absent."""
        return {step.value: len(graphs) for step, graphs in self._graphs.items()}

    # ---------------------------------------------------------------- warm-up
    def warmup(self, pool: KVCache, *, progress: bool = True,
               reference: Pi05Model | None = None) -> float:
        """
        Compile, capture and gate every graph on ``pool``; fall back step by step.

        Errors writing the compile cache are logged (ERROR), never raised: they cost the
        next start its cache, not this one its fast path.

        :param pool: the backend's KV pool (graphs read and write it by address; zeroed
            after the gate's probes).
        :param progress: draw a tqdm bar (one tick per graph).
        :param reference: the gate's float32 copy of the model when the caller holds one
            already (``parity_probe.float32_copy``; a full-size copy is 13.4 GB); default:
            one is made for the warm-up and dropped after it.
        :returns: seconds spent, also in ``compile_seconds``.
        """
        from tqdm import tqdm

        t0 = time.perf_counter()
        self._pool, self.fallbacks, self._graphs, self.parity = pool, {}, {}, {}
        self.compiles = {}
        if self.kernels is Kernels.INDUCTOR and self._backend == 'inductor':
            self.cache = CompileCache(f'{self.cfg!r}|{self.dtype}|'
                                      f'{describe_quantization(self.model)}|{self.device}|'
                                      f'{_device_name(self.device)}|{self.mode}|{self.shapes}|'
                                      f'{self.fold_norms}|adapter rank '
                                      f'{self.adapter.rank if self.adapter else 0}')
            self.cache.activate()
        steps = self.steps()
        try:
            if reference is None:
                reference = float32_copy(self.model)
            layers, adapter = self.model.vlm.layers, self.adapter
            if self.fold_norms:
                layers = fold_layers(self.model.vlm.layers)
                if adapter is not None:
                    adapter = fold_adapter(adapter, self.model.vlm.layers)
            builder = GraphBuilder(self.model, layers, pool, compiler=self._backend,
                                   adapter=adapter)
            probe = ParityProbe(self, self.model, reference, pool, self.shapes, self.block_size,
                                adapter=self.adapter)
            capture = GraphCapture() if self.cuda_graphs else None   # one stream, one pool
        except Exception as exc:  # noqa: B902 - no fast path is no reason to stop the robot
            reason = f'fast path set-up failed: {type(exc).__name__}: {exc}; running EAGERLY'
            _LOG.error('%s', reason)
            self.fallbacks = {step.value: reason for step in steps}
            pool.k.zero_()
            pool.v.zero_()
            return time.perf_counter() - t0
        bar = tqdm(total=sum(len(keys) for keys in steps.values()), unit='graph',
                   desc=f'fast path ({self.mode.value})', disable=not progress)
        try:
            with torch.inference_mode(), torch._dynamo.config.patch(
                    recompile_limit=512, accumulated_recompile_limit=8192):
                for step, keys in steps.items():
                    self._warm_step(step, keys, builder, probe, capture, bar)
        finally:
            bar.close()
            pool.k.zero_()
            pool.v.zero_()
            del reference, probe
        if self.cache is not None:
            try:
                self.cache.save()
            except Exception as exc:  # noqa: B902 - torch raises more than OSError here
                _LOG.error('cannot write the compile cache (the next start compiles afresh): '
                           '%s: %s', type(exc).__name__, exc)
        self.compile_seconds = time.perf_counter() - t0
        counts = self.cache.counts() if self.cache is not None else None
        _LOG.info('fast path (%s, %s kernels%s) ready in %.1f s: %d graphs%s%s',
                  self.mode.value, self._kernel_name(self.kernels),
                  ', CUDA graphs' if self.cuda_graphs else '', self.compile_seconds,
                  sum(len(g) for g in self._graphs.values()),
                  f'; compile cache {counts.hits} hits, {counts.misses} misses'
                  if counts else '',
                  f'; EAGER: {", ".join(self.fallbacks)}' if self.fallbacks else '')
        return self.compile_seconds

    def _warm_step(self, step: Step, keys: list[tuple[int, ...]], builder: GraphBuilder,
                   probe: ParityProbe, capture: GraphCapture | None, bar: Any) -> None:
        attempts = [self.kernels]
        if self.kernels is Kernels.INDUCTOR and self.cuda_graphs:
            attempts.append(Kernels.EAGER)         # graphs of eager kernels still pay
        out = warm_step(step, keys, attempts, probe=probe, graphs=self._graphs, bar=bar,
                        build=lambda key, k: builder.build(step, key, k, capture=capture),
                        name=self._kernel_name)
        self.compiles[step.value] = out.compiles
        if out.worst is not None:
            self.parity[step.value] = out.worst
        if out.kernels is None:
            self.fallbacks[step.value] = '; '.join(out.reasons) + '; running EAGERLY'
            _LOG.error('fast path: %s runs EAGERLY (slow): %s', step.value,
                       self.fallbacks[step.value])
        elif out.kernels is not self.kernels:
            self.fallbacks[step.value] = f'{out.reasons[0]}; running eager kernels in graphs'

    def _kernel_name(self, kernels: Kernels) -> str:
        """Return ``eager`` or the compiler's name (``inductor``; tests: ``aot_eager``)."""
        if kernels is Kernels.EAGER:
            return kernels.value
        return self._backend if isinstance(self._backend, str) else \
            getattr(self._backend, '__name__', 'custom')

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
        """See ``Pi05Model.encode_images``."""
        graph = self._graph(Step.VISION, (images.shape[1],) if images.shape[0] == 1 else None,
                            self._pool)
        if graph is None or tuple(images.shape[2:]) != tuple(graph.inputs[0].shape[1:]):
            return self.model.encode_images(images)
        return graph(images[0]).clone()[None]

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
        logits, ids = graph(F.pad(hidden, (0, 0, 0, bucket - b)))
        return logits[:b], ids[:b]

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, token_mask: torch.Tensor | None, *,
                image_embeds: torch.Tensor | None = None, image_mask: torch.Tensor | None = None,
                context: PrefixKV | None = None, cache: KVCache | None = None,
                slots: torch.Tensor | None = None, reserve: int = 0) -> PrefixKV:
        """
        See ``Pi05Model.prefill``; the graph path skips its slot checks (host syncs).

        Graphs serve batch 1 with masks None (every camera and token valid), slots given, in
        the warm-up pool: a whole prefix (images + prompt) or, in CAUSAL_TEXT, a prompt on an
        image prefix.
        """
        plain = token_mask is None and image_mask is None and slots is not None and \
            tokens.shape[0] == 1 and reserve == 0
        t = tokens.shape[1]
        if plain and context is None and image_embeds is not None:
            n = image_embeds.shape[1]
            bucket = bucket_for(t, self.shapes.prompt)
            graph = self._graph(Step.PREFILL, (n, bucket) if bucket else None, cache)
            if graph is not None:
                return self._prefill_graph(graph, tokens, image_embeds, cache, slots, bucket)
        if plain and context is not None and image_embeds is None and t > 0:
            ti = self.cfg.image_tokens_per_camera
            n, rest = divmod(context.slots.shape[1], ti)
            bucket = bucket_for(t, self.shapes.prompt)
            graph = self._graph(Step.TEXT_PREFILL, (n, bucket) if bucket and not rest else None,
                                context.cache if cache is None else cache)
            if graph is not None and context.batch_size == 1:
                return self._text_graph(graph, tokens, context, slots, bucket)
        return self.model.prefill(tokens, token_mask, image_embeds=image_embeds,
                                  image_mask=image_mask, context=context, cache=cache,
                                  slots=slots, reserve=reserve)

    def _prefill_graph(self, graph: StaticCall, tokens: torch.Tensor, embeds: torch.Tensor,
                       cache: KVCache, slots: torch.Tensor, bucket: int) -> PrefixKV:
        dev, t = tokens.device, tokens.shape[1]
        count = embeds.shape[1] * self.cfg.image_tokens_per_camera + t
        p = count + bucket - t
        used = slots[:, :count].to(torch.int64)
        hidden = graph(embeds, F.pad(tokens, (0, bucket - t)),
                       (torch.arange(p, device=dev) < count)[None],
                       F.pad(used[0], (0, p - count), value=self.null_slot),
                       torch.full((1,), count - 1, dtype=torch.int64, device=dev))
        return PrefixKV(cache, used, torch.ones(1, count, dtype=torch.bool, device=dev),
                        torch.full((1,), count, dtype=torch.int64, device=dev), hidden.clone())

    def _text_graph(self, graph: StaticCall, tokens: torch.Tensor, context: PrefixKV,
                    slots: torch.Tensor, bucket: int) -> PrefixKV:
        dev, t = tokens.device, tokens.shape[1]
        used = slots[:, :t].to(torch.int64)
        hidden = graph(F.pad(tokens, (0, bucket - t)),
                       (torch.arange(bucket, device=dev) < t)[None], context.num_tokens,
                       context.slots.to(torch.int64), context.mask,
                       F.pad(used[0], (0, bucket - t), value=self.null_slot))
        return PrefixKV(context.cache, torch.cat([context.slots, used], 1),
                        torch.cat([context.mask, torch.ones(1, t, dtype=torch.bool,
                                                            device=dev)], 1),
                        context.num_tokens + t, hidden.clone())

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
        dev, null = tokens.device, self.null_slot
        valid = (torch.ones(b, t, dtype=torch.bool, device=dev) if token_mask is None
                 else token_mask)
        rows, cols = bb - b, tb - t
        write = torch.where(valid, slots[:, :t].to(torch.int64), null)
        extra = ()
        if self.adapter is not None:
            mask = (adapter.mask if adapter is not None
                    else torch.zeros(b, dtype=torch.bool, device=dev))
            extra = (F.pad(mask, (0, rows)),)
        hidden = graph(F.pad(tokens, (0, cols, 0, rows)), F.pad(valid, (0, cols, 0, rows)),
                       F.pad(context.num_tokens, (0, rows)),
                       F.pad(context.slots.to(torch.int64), (0, cb - c, 0, rows), value=null),
                       F.pad(context.mask, (0, cb - c, 0, rows)),
                       F.pad(write, (0, cols, 0, rows), value=null).reshape(-1), *extra)
        counts = valid.sum(1)
        return PrefixKV(context.cache, torch.cat([context.slots, slots[:, :t]], 1),
                        torch.cat([context.mask, valid], 1), context.num_tokens + counts,
                        torch.where((counts > 0)[:, None], hidden[:b], context.last_hidden))

    @torch.inference_mode()
    def denoise(self, prefix: PrefixKV, noise: torch.Tensor, *,
                num_steps: int | None = None) -> torch.Tensor:
        """See ``Pi05Model.denoise``: the whole Euler loop is one graph replay."""
        p = prefix.slots.shape[1]
        c = bucket_for(p, self.shapes.denoise)
        graph = self._graph(Step.DENOISE, (c,) if c else None, prefix.cache, (p,))
        if (graph is None or prefix.batch_size != 1
                or num_steps not in (None, self.cfg.num_denoise_steps)
                or tuple(noise.shape) != tuple(graph.inputs[3].shape)):
            return self.model.denoise(prefix, noise, num_steps=num_steps)
        pad = c - p
        return graph(F.pad(prefix.slots.to(torch.int64), (0, pad), value=self.null_slot),
                     F.pad(prefix.mask, (0, pad)), prefix.num_tokens, noise).clone()

    def _decode(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                write_slots: torch.Tensor, ctx_slots: torch.Tensor, ctx_mask: torch.Tensor,
                adapter: AdapterRows | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        b, c = ctx_slots.shape
        bb, cb = bucket_for(b, self.shapes.batch), bucket_for(c, self.shapes.ctx)
        graph = self._graph(Step.DECODE, (bb, cb) if bb and cb else None, cache, (b, c))
        if graph is None:
            return None
        rows, cols, null = bb - b, cb - c, self.null_slot
        extra = ()
        if self.adapter is not None:
            mask = (adapter.mask if adapter is not None
                    else torch.zeros(b, dtype=torch.bool, device=tokens.device))
            extra = (F.pad(mask, (0, rows)),)
        logits, ids = graph(F.pad(tokens, (0, rows)), F.pad(positions, (0, rows)),
                            F.pad(write_slots, (0, rows), value=null),
                            F.pad(ctx_slots.to(torch.int64), (0, cols, 0, rows), value=null),
                            F.pad(ctx_mask, (0, cols, 0, rows)), *extra)
        return logits[:b], ids[:b]

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


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'


__all__ = ['CompiledModel']
