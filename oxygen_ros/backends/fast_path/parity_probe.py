"""
Probe inputs for the parity gate: every compiled graph against eager, and eager in float32.

Each probe runs one step at one static shape three ways on the same inputs: through the fast
path (which must pick that very graph: the probe's sizes fall inside the bucket, below its top
when there is room, so padding is exercised), through the eager model in its dtype, and
through the eager float32 copy (``parity.float32_copy``; None for a float32 model). Outputs
that a step writes into the KV pool are compared too. The pool is filled with random K/V
first (an all-zero pool would hide a wrong attention), probes write only the probe region
``[block_size, block_size + probe_slots)`` and the caller zeroes the pool afterwards.

:meth:`ParityProbe.run` seeds the inputs of each probe by its step and shape (eager writes
the probe's K/V last, whatever the compiled call wrote), so a probe sees the same inputs and
pool at every start and after a retry: the tolerance a full gate measured for it
(``gate_record.py``) is the one the same weights give again. Given ``tolerances`` instead of
a reference, the probes run compiled and eager only and hold the error to those.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping
import zlib

from oxygen_ros.backends.fast_path.buckets import StaticShapes
from oxygen_ros.backends.frame_batch import stack_prefixes
from oxygen_ros.backends.parity import check_parity, ParityResult
from oxygen_ros.model.guidance import guided_denoise, RtcGuidance
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.model.lora import AdapterRows, SuffixLoRA
from oxygen_ros.model.pi05 import Pi05Model
import torch


def _inside(size: int, buckets: tuple[int, ...], room: int) -> int:
    """Return a size that falls into bucket ``size``: up to ``room`` below it, above the last."""
    below = max([b for b in buckets if b < size], default=0)
    return max(below + 1, size - room)


def _fed(model: Any, pool: KVCache, tokens: torch.Tensor, base: torch.Tensor,
         steps: torch.Tensor, all_slots: torch.Tensor, ids: torch.Tensor, null: int,
         adapter: AdapterRows | None) -> torch.Tensor:
    """
    Return the logits ``[B, k, V]`` of ``TorchBackend._decode``'s eager steps fed ``ids``.

    Step ``s`` feeds ``ids[:, s - 1]`` (``tokens`` first) instead of its own argmax: the
    steps the graph of ``decode_greedy_steps`` ran, with the model's ``decode_step``.
    """
    b, w = all_slots.shape
    cols, rows = torch.arange(w, device=pool.device), torch.arange(b, device=pool.device)
    longest, out = int(base.max()), []
    for s in range(ids.shape[1]):
        pos = base + s
        write = torch.where(s < steps, all_slots[rows, pos.clamp(max=w - 1)], null)
        out.append(model.decode_step(tokens if s == 0 else ids[:, s - 1], pos, pool, write,
                                     all_slots[:, :longest + s],
                                     cols[None, :longest + s] < pos[:, None], adapter))
    return torch.stack(out, 1)


class ParityProbe:
    """
    Gate probes over one KV pool.

    :param fast: the fast model (``FastPathModel``: Pi05Model-like calls that use the graphs).
    :param model: the eager model.
    :param reference: its float32 copy, or None.
    :param pool: the KV pool the graphs were captured on.
    :param shapes: the compiled shapes.
    :param base: first probe slot (after the null block).
    :param adapter: the suffix LoRA (unfolded, the model's dtype): the suffix and decode
        probes then run half of their rows with it.
    :param tolerances: ``{label: (tolerance, reference error)}`` recorded by a full gate for
        these weights (``gate_record.py``), used instead of a float32 reference (which must
        then be None).
    :ivar measured: ``{label: (tolerance, reference error)}`` of every probe run so far.
    :raises ValueError: the pool is too small for the probes.
    """

    def __init__(self, fast: Any, model: Pi05Model, reference: Pi05Model | None,
                 pool: KVCache, shapes: StaticShapes, base: int, *,
                 adapter: SuffixLoRA | None = None,
                 tolerances: Mapping[str, tuple[float, float]] | None = None) -> None:
        self.fast, self.model, self.ref, self.pool, self.shapes = (
            fast, model, reference, pool, shapes)
        self.base = base
        self.tolerances = tolerances
        self.measured: dict[str, tuple[float, float]] = {}
        self._label = ''
        suffix = (shapes.suffix_ctx[-1] + shapes.suffix_batch[-1] * shapes.suffix[-1]
                  if shapes.suffix else 0)
        self.size = base + max(shapes.ctx[-1], shapes.robots[-1] * shapes.denoise[-1],
                               suffix) + shapes.batch[-1] * max((1, *shapes.tokens_per_cycle))
        if self.size > pool.num_slots:
            raise ValueError(f'the KV pool ({pool.num_slots} slots) is smaller than the parity '
                             f'probes need ({self.size})')
        self.gen = torch.Generator().manual_seed(0)
        dev = pool.device
        for k in (pool.k, pool.v):      # the probe region only: the same for any pool size
            k[:, :self.size].normal_(generator=torch.Generator(dev).manual_seed(1))
        self.ref_dev = next(reference.parameters()).device if reference is not None else None
        self.adapter = adapter
        self.ref_adapter = (adapter.converted(torch.float32, self.ref_dev)
                            if adapter is not None and reference is not None else None)
        self.ref_pool = (KVCache(model.cfg.vlm, self.size, device=self.ref_dev)
                         if reference is not None else None)
        cfg = model.cfg
        size = cfg.vision.image_size
        self.images = (torch.rand(shapes.robots[-1], max(shapes.camera_counts), 3, size, size,
                                  generator=self.gen) * 2 - 1).to(dev, model.dtype)
        """One frame's images per robot of the largest robot batch."""
        with torch.inference_mode():
            self.embeds = model.encode_images(self.images)
        self.prefix: PrefixKV | None = None

    # -- helpers -------------------------------------------------------------------------
    def _ints(self, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(3, high, shape, generator=self.gen).to(self.pool.device)

    def _slots(self, start: int, count: int) -> torch.Tensor:
        return torch.arange(self.base + start, self.base + start + count,
                            device=self.pool.device)

    def _r(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() if x.is_floating_point() else x).to(self.ref_dev)

    def _sync_ref_pool(self) -> None:
        """Copy the probe region of the pool into the float32 pool (the same K/V, upcast)."""
        if self.ref_pool is not None:
            self.ref_pool.k.copy_(self.pool.k[:, :self.size].float())
            self.ref_pool.v.copy_(self.pool.v[:, :self.size].float())

    def _ref_prefix(self, prefix: PrefixKV) -> PrefixKV:
        return PrefixKV(self.ref_pool, prefix.slots.to(self.ref_dev), prefix.mask.to(self.ref_dev),
                        prefix.num_tokens.to(self.ref_dev), self._r(prefix.last_hidden))

    def _kv(self, pool: KVCache, slots: torch.Tensor) -> list[torch.Tensor]:
        idx = slots.reshape(-1).to(pool.device)
        return [pool.k[:, idx].clone(), pool.v[:, idx].clone()]

    @staticmethod
    def label(step: str, key: tuple[int, ...]) -> str:
        """Return the name of the probe of ``step`` at shape ``key`` (a gate record's key)."""
        return f'{step} {key}'

    def run(self, step: str, key: tuple[int, ...]) -> ParityResult:
        """Gate ``step`` at shape ``key`` on inputs seeded by both."""
        self._label = self.label(step, key)
        self.gen.manual_seed(zlib.crc32(self._label.encode()))
        return getattr(self, step)(*key)

    def _gate(self, name: str, fast: list, eager: list, ref: list | None) -> ParityResult:
        result = check_parity(name, fast, eager, ref)
        if self.tolerances is not None:
            tolerance, ref_error = self.tolerances[self._label]
            result = replace(result, tolerance=tolerance, reference_error=ref_error)
        self.measured[self._label] = (result.tolerance, result.reference_error)
        return result

    def _adapter_rows(self, b: int) -> tuple[AdapterRows | None, AdapterRows | None]:
        """Return the adapter on every other row of ``b`` (and its float32 copy), or None."""
        if self.adapter is None:
            return None, None
        mask = torch.arange(b, device=self.pool.device) % 2 == 0
        ref = (AdapterRows(self.ref_adapter, mask.to(self.ref_dev))
               if self.ref_adapter is not None else None)
        return AdapterRows(self.adapter, mask), ref

    # -- probes --------------------------------------------------------------------------
    def _robots_of(self, images: int) -> tuple[int, int]:
        """Return (robots, cameras) of a vision graph's image count (the most cameras)."""
        return next((images // n, n) for n in sorted(self.shapes.camera_counts, reverse=True)
                    if images % n == 0 and images // n in self.shapes.robots)

    def _row_lengths(self, r: int, t: int) -> list[int]:
        """Return prompt lengths of ``r`` rows: the first ``t`` (the bucket), then shorter."""
        return [max(1, t - 2 * i) for i in range(r)]

    @torch.inference_mode()
    def vision(self, images: int) -> ParityResult:
        r, n = self._robots_of(images)
        frames = self.images[:r, :n]
        fast = [self.fast.encode_images(frames)]
        eager = [self.model.encode_images(frames)]
        ref = [self.ref.encode_images(self._r(frames))] if self.ref is not None else None
        return self._gate(f'vision {r} x {n} camera(s)', fast, eager, ref)

    def _batch(self, r: int, t: int, start: int, width: int
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """
        Return a robot batch's prompts, their mask, slots and the slots written.

        Row ``i`` holds ``width - t`` tokens before its prompt (images, or an image prefix)
        and a prompt of ``_row_lengths`` tokens, padded at its end; its slots start at
        ``start + i * width``, padding at the null slot.
        """
        lengths = self._row_lengths(r, t)
        dev = self.pool.device
        tokens = self._ints(1000, r, t)
        mask = None if r == 1 else torch.arange(t, device=dev)[None] < torch.tensor(
            lengths, device=dev)[:, None]
        slots = torch.stack([self._slots(start + i * width, width) for i in range(r)])
        keep = torch.ones(r, width, dtype=torch.bool, device=dev)
        if mask is not None:
            keep[:, width - t:] = mask
        slots = torch.where(keep, slots, self.fast.null_slot)
        return tokens, mask, slots, slots[keep]

    @torch.inference_mode()
    def prefill(self, r: int, n: int, bucket: int) -> ParityResult:
        t = _inside(bucket, self.shapes.prompt, 3)
        count = n * self.model.cfg.image_tokens_per_camera + t
        tokens, mask, slots, written = self._batch(r, t, 0, count)
        embeds = self.embeds[:r, :n]
        runs = []
        for model, pool in ((self.fast, self.pool), (self.model, self.pool)):
            p = model.prefill(tokens, mask, image_embeds=embeds, cache=pool, slots=slots)
            runs.append([p.last_hidden] + self._kv(pool, written))
        ref = None
        if self.ref is not None:
            p = self.ref.prefill(self._r(tokens), None if mask is None else self._r(mask),
                                 image_embeds=self._r(embeds), cache=self.ref_pool,
                                 slots=self._r(slots))
            ref = [p.last_hidden] + self._kv(self.ref_pool, written)
        return self._gate(f'prefill {r} x {n} camera(s) + {t} tokens (bucket {bucket})',
                          *runs, ref)

    @torch.inference_mode()
    def text_prefill(self, r: int, n: int, bucket: int) -> ParityResult:
        ti = self.model.cfg.image_tokens_per_camera
        t = _inside(bucket, self.shapes.prompt, 3)
        width = n * ti + t
        image = self.model.prefill(self._ints(1000, r, 0), None, image_embeds=self.embeds[:r, :n],
                                   cache=self.pool,
                                   slots=torch.stack([self._slots(i * width, n * ti)
                                                      for i in range(r)]))
        self._sync_ref_pool()
        tokens, mask, slots, _ = self._batch(r, t, 0, width)
        slots = slots[:, n * ti:]
        written = slots[slots != self.fast.null_slot]
        runs = []
        for model in (self.fast, self.model):
            p = model.prefill(tokens, mask, context=image, cache=self.pool, slots=slots)
            runs.append([p.last_hidden] + self._kv(self.pool, written))
        ref = None
        if self.ref is not None:
            p = self.ref.prefill(self._r(tokens), None if mask is None else self._r(mask),
                                 context=self._ref_prefix(image), cache=self.ref_pool,
                                 slots=self._r(slots))
            ref = [p.last_hidden] + self._kv(self.ref_pool, written)
        return self._gate(f'text prefill {r} x {t} tokens on {n} camera(s) (bucket {bucket})',
                          *runs, ref)

    def _prefix_of(self, p: int, start: int = 0) -> PrefixKV:
        """Return an eager prefix of ``p`` tokens (cameras + a prompt) at probe slot ``start``."""
        ti = self.model.cfg.image_tokens_per_camera
        n = max(n for n in self.shapes.camera_counts if n * ti < p)
        tokens = self._ints(1000, 1, p - n * ti)
        prefix = self.model.prefill(tokens, None, image_embeds=self.embeds[:1, :n],
                                    cache=self.pool, slots=self._slots(start, p)[None])
        self._sync_ref_pool()
        self.prefix = None                              # the pool's probe region changed
        return prefix

    @torch.inference_mode()
    def suffix(self, bucket_b: int, bucket_t: int, bucket_c: int) -> ParityResult:
        b = _inside(bucket_b, self.shapes.suffix_batch, 1)
        t = _inside(bucket_t, self.shapes.suffix, 3)
        c = _inside(bucket_c, self.shapes.suffix_ctx, 5)
        root = self._prefix_of(c)
        dev = self.pool.device
        context = PrefixKV(self.pool, root.slots.expand(b, c), root.mask.expand(b, c),
                           root.num_tokens.expand(b), root.last_hidden.expand(b, -1))
        tokens = self._ints(1000, b, t)
        lengths = torch.tensor([max(1, t - r) for r in range(b)], device=dev)
        mask = torch.arange(t, device=dev)[None] < lengths[:, None]
        slots = self._slots(c, b * t).view(b, t)
        written = slots[mask]
        adapter, ref_adapter = self._adapter_rows(b)
        runs = []
        for model in (self.fast, self.model):
            out = model.prefill_suffix(tokens, mask, context, slots=slots, adapter=adapter)
            runs.append([out.last_hidden] + self._kv(self.pool, written))
        ref = None
        if self.ref is not None:
            out = self.ref.prefill_suffix(self._r(tokens), self._r(mask),
                                          self._ref_prefix(context), slots=self._r(slots),
                                          adapter=ref_adapter)
            ref = [out.last_hidden] + self._kv(self.ref_pool, written)
        return self._gate(f'suffix batch {b} x {t} tokens on {c} (bucket {bucket_b} x '
                          f'{bucket_t} x {bucket_c})', *runs, ref)

    def _main_prefix(self) -> PrefixKV:
        """Return the eager prefix the denoise, decode and seed probes read (all cameras)."""
        if self.prefix is None:
            n = max(self.shapes.camera_counts)
            tokens = torch.randint(3, 1000, (1, 8), generator=torch.Generator().manual_seed(2))
            tokens = tokens.to(self.pool.device)
            count = n * self.model.cfg.image_tokens_per_camera + 8
            self.prefix = self.model.prefill(tokens, None, image_embeds=self.embeds[:1, :n],
                                             cache=self.pool,
                                             slots=self._slots(0, count)[None])
            self._sync_ref_pool()
        return self.prefix

    def _denoise_inputs(self, bucket: int, r: int = 1) -> tuple[PrefixKV, torch.Tensor, int]:
        """
        Return ``r`` prefixes that fall into denoise ``bucket`` (one batch), noise, the length.

        Row ``i`` is ``i`` tokens shorter than the first (a robot batch of unequal prompts,
        padded at its end as ``frame_batch.stack_prefixes`` pads it).
        """
        cfg = self.model.cfg
        p = _inside(bucket, self.shapes.denoise, 3)     # a prefix of n cameras + t tokens
        rows = [self._prefix_of(p - i, i * p) for i in range(r)]
        prefix = rows[0] if r == 1 else stack_prefixes(rows, self.fast.null_slot)
        noise = torch.randn(r, cfg.action_horizon, cfg.action_dim,
                            generator=self.gen).to(self.pool.device)
        return prefix, noise, p

    @torch.inference_mode()
    def guided_denoise(self, bucket: int, jacobian_steps: int) -> ParityResult:
        """Gate RTC's guided denoise: a random target, a mask frozen, decaying, then free."""
        cfg = self.model.cfg
        prefix, noise, p = self._denoise_inputs(bucket)
        h, k = cfg.action_horizon, jacobian_steps
        target = torch.randn(1, h, cfg.action_dim, generator=self.gen).to(self.pool.device)
        mask = (1.5 - 2 * torch.arange(h) / max(h - 1, 1)).clamp(0, 1).to(self.pool.device)
        fast = [self.fast.guided_denoise(prefix, noise, RtcGuidance(target, mask,
                                                                    jacobian_steps=k))]
        eager = [guided_denoise(self.model, prefix, noise,
                                RtcGuidance(target, mask, jacobian_steps=k))]
        ref = ([guided_denoise(self.ref, self._ref_prefix(prefix), self._r(noise),
                               RtcGuidance(self._r(target), self._r(mask), jacobian_steps=k))]
               if self.ref is not None else None)
        return self._gate(f'guided denoise (RTC), {cfg.num_denoise_steps} steps ({k} with the '
                          f'Jacobian), prefix {p} (bucket {bucket})', fast, eager, ref)

    @torch.inference_mode()
    def denoise(self, r: int, bucket: int) -> ParityResult:
        cfg = self.model.cfg
        prefix, noise, p = self._denoise_inputs(bucket, r)
        fast = [self.fast.denoise(prefix, noise)]
        eager = [self.model.denoise(prefix, noise)]
        ref = ([self.ref.denoise(self._ref_prefix(prefix), self._r(noise))]
               if self.ref is not None else None)
        return self._gate(f'denoise {r} chunk(s), {cfg.num_denoise_steps} steps, prefix {p} '
                          f'(bucket {bucket})', fast, eager, ref)

    @torch.inference_mode()
    def decode(self, bucket_b: int, bucket_c: int) -> ParityResult:
        self._main_prefix()
        b = _inside(bucket_b, self.shapes.batch, 1)
        c = _inside(bucket_c, self.shapes.ctx, 5)
        dev = self.pool.device
        ctx_slots = self._slots(0, c)[None].expand(b, c).contiguous()
        lengths = torch.tensor([max(1, c - r) for r in range(b)], device=dev)
        ctx_mask = torch.arange(c, device=dev)[None] < lengths[:, None]
        tokens = self._ints(1000, b)
        write = self._slots(self.size - self.base - b, b)
        adapter, ref_adapter = self._adapter_rows(b)
        runs = []
        for model in (self.fast, self.model):
            logits = model.decode_step(tokens, lengths, self.pool, write, ctx_slots, ctx_mask,
                                       adapter)
            runs.append([logits] + self._kv(self.pool, write))
        ref = None
        if self.ref is not None:
            logits = self.ref.decode_step(self._r(tokens), self._r(lengths), self.ref_pool,
                                          self._r(write), self._r(ctx_slots),
                                          self._r(ctx_mask), ref_adapter)
            ref = [logits] + self._kv(self.ref_pool, write)
        return self._gate(f'decode batch {b} context {c} (bucket {bucket_b} x {bucket_c})',
                          *runs, ref)

    @torch.inference_mode()
    def decode_steps(self, bucket_b: int, bucket_c: int, k: int) -> ParityResult:
        """
        Gate k decode steps in one graph against eager steps fed the graph's ids.

        Rows of unequal contexts and steps left (``k``, ``k - 1``, ... down to 0). Held to
        the gate: the K/V the graph wrote, and per valid step the eager logit of the graph's
        id against eager's largest logit (equal where the ids agree; a near tie may pick
        the other id within rounding, which the eager steps fed the graph's ids then follow).
        """
        self._main_prefix()
        b = _inside(bucket_b, self.shapes.batch, 1)
        w = _inside(bucket_c, self.shapes.ctx, 5)
        dev, null = self.pool.device, self.fast.null_slot
        steps = torch.tensor([max(0, k - r) for r in range(b)], device=dev)
        base = torch.tensor([max(1, w - k - r) for r in range(b)], device=dev)
        own = self._slots(self.shapes.ctx[-1], b * k).view(b, k)
        all_slots = torch.full((b, w), null, dtype=torch.int64, device=dev)
        for r, n in enumerate(base.tolist()):
            all_slots[r, :n + k] = torch.cat([self._slots(0, n), own[r]])
        active = torch.arange(k, device=dev)[None] < steps[:, None]
        written = own[active]
        tokens = self._ints(1000, b)
        adapter, ref_adapter = self._adapter_rows(b)
        ids = self.fast.decode_greedy_steps(tokens, base, steps, all_slots, null, self.pool, k,
                                            adapter)
        if ids is None:
            raise RuntimeError(f'no decode graph of {k} steps for batch {b}, width {w}')
        fast = self._kv(self.pool, written)
        logits = _fed(self.model, self.pool, tokens, base, steps, all_slots, ids, null, adapter)
        best = logits.max(-1).values[active]
        fast.append(logits.gather(-1, ids[..., None])[..., 0][active])
        eager = self._kv(self.pool, written) + [best]
        ref = None
        if self.ref is not None:
            inputs = [self._r(x) for x in (tokens, base, steps, all_slots, ids)]
            logits = _fed(self.ref, self.ref_pool, *inputs, null, ref_adapter)
            ref = self._kv(self.ref_pool, written) + [logits.max(-1).values[self._r(active)]]
        return self._gate(f'decode of {k} steps, batch {b}, width {w} (bucket {bucket_b} x '
                          f'{bucket_c})', fast, eager, ref)

    @torch.inference_mode()
    def seed(self, bucket: int) -> ParityResult:
        prefix = self._main_prefix()
        b = _inside(bucket, self.shapes.batch, 1)
        noise = torch.randn(b, prefix.last_hidden.shape[1], generator=self.gen)
        hidden = (prefix.last_hidden + 0.1 * noise.to(self.pool.device)).to(self.model.dtype)
        fast = [self.fast.lm_logits(hidden)]
        eager = [self.model.lm_logits(hidden)]
        ref = [self.ref.lm_logits(self._r(hidden))] if self.ref is not None else None
        return self._gate(f'seed batch {b} (bucket {bucket})', fast, eager, ref)


__all__ = ['ParityProbe']
