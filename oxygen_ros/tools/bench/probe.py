"""
Component times of the model, measured standalone, and the speedup they predict.

``ideal_speedup`` is the isolated / OxyGen frame-time ratio that these forward passes alone
would give, with no bookkeeping at all. Per frame, with n text requests per frame (n = 1/
``text_every`` + 1/``memory_every``), decode budget M, k tokens per cycle, decode batch B:

    isolated = V + P_a + D + n (V + P_t + S + (M - 1) d(1))
    oxygen   = V + P_share + D + n S + k d(B)

V vision tower, P_a / P_t prefill of the images with the action / text prompt, D denoise
(10 Euler steps), S seed (LM head of the last prefix token), d(b) one decode step of b rows.
The guided denoise of real-time chunking (G: D plus a vector-Jacobian product per step) is
timed beside D on the same prefix, through the same model (its graph where the fast path
compiled one, else eagerly); it is not part of the frame models above.
P_share is what OxyGen prefills: P_a + n P_t' in causal-prompt mode, where the image part is
computed once (P_img) and each prompt alone on top of it (P_t'), i.e. P_img + P_ta' + n P_t';
in bidirectional mode P_a + n P_t (jobs with different prompts cannot share K/V, only V).

Text on the action prefix (OxyGen's root + causal suffix X, one row): isolated prefills a copy
of the root per request, P_t = P_a + X; OxyGen prefills only the suffixes, P_share = P_a + n X.

``ComponentProbe.measure_frames`` times the action path of several robots' frames as the
backend batches it, one call per stage (``oxygen_bench engine --robots``, ``robots.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
import statistics
import time
from typing import Callable

from oxygen_ros.backends.greedy import greedy_calls
from oxygen_ros.config import PrefixAttention
from oxygen_ros.model.guidance import guided_denoise, RtcGuidance
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.lora import AdapterRows, SuffixLoRA
from oxygen_ros.model.pi05 import Pi05Model
import torch


@dataclass(frozen=True, slots=True)
class Components:
    """Median seconds of each component (see module docstring)."""

    vision: float
    prefill_action: float
    prefill_text: float
    prefill_image: float
    prefill_action_text: float
    prefill_text_only: float
    denoise: float
    seed: float
    decode_1: float
    decode_b: float
    batch: int
    suffix: float = 0.0
    decode_b_adapter: float = 0.0
    guided_denoise: float = float('nan')
    """RTC's guided denoise (NaN where the model cannot guide: TensorRT)."""
    guided_denoise_exact: float = float('nan')
    """RTC's guided denoise with the Jacobian at every step, where ``guided_denoise`` takes
    it at fewer (``RtcGuidance.jacobian_steps``; else NaN)."""

    def isolated_frame(self, n_text: float, budget: int, on_root: bool = False) -> float:
        text = self.prefill_action + self.suffix if on_root else self.prefill_text
        return self.vision + self.prefill_action + self.denoise + n_text * (
            self.vision + text + self.seed + (budget - 1) * self.decode_1)

    def oxygen_frame(self, n_text: float, k: int, mode: PrefixAttention,
                     on_root: bool = False) -> float:
        if on_root:
            prefill = (self.prefill_image + self.prefill_action_text
                       if mode is PrefixAttention.CAUSAL_TEXT else self.prefill_action) + \
                n_text * self.suffix
        elif mode is PrefixAttention.CAUSAL_TEXT:
            prefill = self.prefill_image + self.prefill_action_text + \
                n_text * self.prefill_text_only
        else:
            prefill = self.prefill_action + n_text * self.prefill_text
        return self.vision + prefill + self.denoise + n_text * self.seed + k * self.decode_b


class ComponentProbe:
    """
    Times the model's entry points on one frame's shapes.

    By default in a private KV cache. A compiled model replays its graphs only on the pool it
    was warmed up on, so :meth:`measure_once` can be given that pool and free slots of it
    (``num_slots`` of them, e.g. blocks borrowed from the engine's block pool).

    :param images: ``[1, N, 3, S, S]`` a frame's valid cameras.
    :param action_ids, text_ids: the frame's action prompt and a text request's prompt.
    :param context_tokens: decode rows attend to this many tokens (prefix + half the budget).
    :param suffix_ids: a text request's causal suffix on the action prefix (timed as
        ``suffix``, one row), or empty.
    :param adapter: the memory adapter: a decode step with it on every row is timed as
        ``decode_b_adapter`` beside the plain ``decode_b``.
    :param jacobian_steps: the guided denoise's ``RtcGuidance.jacobian_steps`` (None: every
        Euler step).
    """

    def __init__(self, model: Pi05Model, images: torch.Tensor, action_ids: tuple[int, ...],
                 text_ids: tuple[int, ...], context_tokens: int, batch: int, *,
                 suffix_ids: tuple[int, ...] = (), adapter: SuffixLoRA | None = None,
                 jacobian_steps: int | None = None) -> None:
        self.model = model
        self.mode = model.cfg.prefix_attention
        dev, dtype = model.device, model.dtype
        self.images = images.to(device=dev, dtype=dtype)
        self.action = torch.tensor([action_ids], device=dev)
        self.text = torch.tensor([text_ids], device=dev)
        self.suffix = torch.tensor([suffix_ids], device=dev, dtype=torch.int64)
        self.adapter = adapter
        self.batch = max(batch, 1)
        self.context = context_tokens
        self._prefix_slots = 4 * (images.shape[1] * model.cfg.image_tokens_per_camera +
                                  len(action_ids) + len(text_ids)) + len(suffix_ids)
        self._frame_slots = images.shape[1] * model.cfg.image_tokens_per_camera + \
            len(action_ids) + len(suffix_ids)
        self.num_slots = self.slots_needed(self.batch)
        self.own_cache = KVCache(model.cfg.vlm, self.num_slots, dtype=dtype, device=dev)
        self.cache = self.own_cache
        self.slots = torch.arange(self.num_slots, device=dev)
        self.noise = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim,
                                 generator=torch.Generator().manual_seed(0)).to(dev)
        self.guidance = probe_guidance(model.cfg.action_horizon, model.cfg.action_dim, dev,
                                       jacobian_steps)
        self._samples: dict[str, list[float]] = {}

    def slots_needed(self, batch: int) -> int:
        """Return the KV slots a round (or a decode at ``batch`` rows) writes."""
        return max(batch * (self.context + 1), self._prefix_slots)

    def frame_slots_needed(self, frames: int) -> int:
        """Return the KV slots :meth:`measure_frames` of ``frames`` frames writes."""
        return frames * self._frame_slots

    def _use(self, cache: KVCache | None, slots: torch.Tensor | None, need: int) -> None:
        if cache is None:
            if self.own_cache.num_slots < need:
                self.own_cache = KVCache(self.model.cfg.vlm, need, dtype=self.model.dtype,
                                         device=self.model.device)
            self.cache = self.own_cache
            self.slots = torch.arange(need, device=self.own_cache.device)
        else:
            if slots is None or slots.numel() < need:
                raise ValueError(f'the probe needs {need} free slots')
            self.cache, self.slots = cache, slots.to(torch.int64)

    def _time(self, name: str, fn: Callable[[], object]) -> object:
        if self.model.device.type == 'cuda':
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if self.model.device.type == 'cuda':
            torch.cuda.synchronize()
        self._samples.setdefault(name, []).append(time.perf_counter() - t0)
        return out

    def _prefill(self, name: str, tokens: torch.Tensor, **kw: object):
        num = tokens.shape[1] + (kw['image_embeds'].shape[1] *
                                 kw['image_embeds'].shape[2] if 'image_embeds' in kw else 0)
        offset = kw.pop('offset', 0)
        slots = self.slots[offset:offset + num][None]
        # mask None: every token valid, as the backend calls it (the fast path needs that)
        return self._time(name, lambda: self.model.prefill(tokens, None, cache=self.cache,
                                                           slots=slots, **kw))

    @torch.inference_mode()
    def measure_once(self, cache: KVCache | None = None,
                     slots: torch.Tensor | None = None) -> None:
        """
        Time every component once (call it repeatedly, interleaved with the runs).

        :param cache: the KV pool to use (default: the probe's own).
        :param slots: ``int64 [>= num_slots]`` slots of ``cache`` free for the probe.
        :raises ValueError: too few slots.
        """
        self._use(cache, slots, self.num_slots)
        m = self.model
        embeds = self._time('vision', lambda: m.encode_images(self.images))
        full = self._prefill('prefill_action', self.action, image_embeds=embeds)
        self._prefill('prefill_text', self.text, image_embeds=embeds)
        if self.mode is PrefixAttention.CAUSAL_TEXT:
            empty = self.action[:, :0]
            image = self._prefill('prefill_image', empty, image_embeds=embeds)
            base = int(image.num_tokens[0])
            self._prefill('prefill_action_text', self.action, context=image, offset=base)
            self._prefill('prefill_text_only', self.text, context=image,
                          offset=base + self.action.shape[1])
        if self.suffix.shape[1]:
            offset = 4 * int(full.num_tokens[0])   # past every prefill above
            slots = self.slots[offset:offset + self.suffix.shape[1]][None]
            self._time('suffix', lambda: m.prefill_suffix(self.suffix, None, full, slots=slots))
        self._time('denoise', lambda: m.denoise(full, self.noise))
        guided = guided_call(m)
        if guided is not None:
            self._time('guided_denoise', lambda: guided(full, self.noise, self.guidance))
            if self.guidance.jacobian_steps is not None:
                exact = replace(self.guidance, jacobian_steps=None)
                self._time('guided_denoise_exact', lambda: guided(full, self.noise, exact))
        _, seed = greedy_calls(m)  # as the engine calls it
        self._time('seed', lambda: seed(full.last_hidden))
        for name, b in (('decode_1', 1), ('decode_b', self.batch)):
            self._decode(name, b)
        if self.adapter is not None:
            self._decode('decode_b_adapter', self.batch, adapter=True)

    @torch.inference_mode()
    def measure_frames(self, frames: int, cache: KVCache | None = None,
                       slots: torch.Tensor | None = None) -> None:
        """
        Time the action path of ``frames`` robots' frames as the backend batches it, once.

        One call per stage (``backends/frame_batch.py``): vision over ``frames`` x N images,
        the action prefill over ``frames`` rows (causal prompt mode: the image segments, then
        the prompts on them), a causal suffix on each root and the seed of its request (one
        batched call each, as ``SuffixJob`` and ``SeedJob``), the denoise of ``frames``
        chunks. Samples are named ``'<component>@<frames>'`` (:meth:`frames_result`).

        :param slots: ``int64 [>= frame_slots_needed(frames)]`` free slots of ``cache``.
        :raises ValueError: too few slots.
        """
        b, m = frames, self.model
        self._use(cache, slots, self.frame_slots_needed(b))
        rows = self.slots[:b * self._frame_slots].view(b, self._frame_slots)
        images = self.images.expand(b, *self.images.shape[1:]).contiguous()
        action = self.action.expand(b, -1).contiguous()
        embeds = self._time(f'vision@{b}', lambda: m.encode_images(images))
        image_tokens = embeds.shape[1] * embeds.shape[2]
        prefix_tokens = image_tokens + action.shape[1]
        if self.mode is PrefixAttention.CAUSAL_TEXT:
            image = self._time(f'prefill_image@{b}', lambda: m.prefill(
                action[:, :0], None, image_embeds=embeds, cache=self.cache,
                slots=rows[:, :image_tokens]))
            full = self._time(f'prefill_action_text@{b}', lambda: m.prefill(
                action, None, context=image, cache=self.cache,
                slots=rows[:, image_tokens:prefix_tokens]))
        else:
            full = self._time(f'prefill_action@{b}', lambda: m.prefill(
                action, None, image_embeds=embeds, cache=self.cache,
                slots=rows[:, :prefix_tokens]))
        if self.suffix.shape[1]:
            suffix = self.suffix.expand(b, -1).contiguous()
            self._time(f'suffix@{b}', lambda: m.prefill_suffix(
                suffix, None, full, slots=rows[:, prefix_tokens:]))
        _, seed = greedy_calls(m)
        self._time(f'seed@{b}', lambda: seed(full.last_hidden))
        noise = self.noise.expand(b, -1, -1).contiguous()
        self._time(f'denoise@{b}', lambda: m.denoise(full, noise))

    def frames_result(self, frames: int) -> dict[str, float]:
        """
        Return the median seconds of each stage timed by :meth:`measure_frames` at ``frames``.

        Keys: ``vision``, ``prefill`` (causal prompt mode: image and prompt segments
        together), ``suffix`` (0 without one), ``seed``, ``denoise``.
        :raises KeyError: ``frames`` was never measured.
        """
        med = {k.split('@')[0]: statistics.median(v) for k, v in self._samples.items()
               if k.endswith(f'@{frames}')}
        prefill = med['prefill_action'] if 'prefill_action' in med else \
            med['prefill_image'] + med['prefill_action_text']
        return {'vision': med['vision'], 'prefill': prefill, 'suffix': med.get('suffix', 0.0),
                'seed': med['seed'], 'denoise': med['denoise']}

    def median(self, name: str) -> float:
        """Return the median seconds of the samples named ``name`` (:meth:`measure_decode`)."""
        return statistics.median(self._samples[name])

    @torch.inference_mode()
    def measure_decode(self, name: str, batch: int, cache: KVCache | None = None,
                       slots: torch.Tensor | None = None) -> None:
        """
        Time one decode step of ``batch`` rows (``slots_needed(batch)`` free slots).

        With an adapter, ``decode_b`` is timed with it too (``decode_b_adapter``).
        """
        self._use(cache, slots, self.slots_needed(batch))
        self._decode(name, batch)
        if self.adapter is not None and name == 'decode_b':
            self._decode('decode_b_adapter', batch, adapter=True)

    def _decode(self, name: str, batch: int, adapter: bool = False) -> None:
        dev = self.cache.device
        ctx = self.context
        rows = self.slots[:batch * (ctx + 1)].view(batch, ctx + 1)
        ctx_slots, write = rows[:, :ctx], rows[:, ctx]
        ctx_mask = torch.ones(batch, ctx, dtype=torch.bool, device=dev)
        tokens = torch.full((batch,), 2, dtype=torch.int64, device=dev)
        pos = torch.full((batch,), ctx, dtype=torch.int64, device=dev)
        extra = (AdapterRows(self.adapter, torch.ones(batch, dtype=torch.bool, device=dev)),) \
            if adapter else ()
        greedy, _ = greedy_calls(self.model)   # as the engine calls it
        self._time(name, lambda: greedy(tokens, pos, self.cache, write, ctx_slots, ctx_mask,
                                        *extra))

    def result(self) -> Components:
        """Return the median of every component measured so far."""
        med = {k: statistics.median(v) for k, v in self._samples.items()}
        return Components(
            vision=med['vision'], prefill_action=med['prefill_action'],
            prefill_text=med['prefill_text'], prefill_image=med.get('prefill_image', 0.0),
            prefill_action_text=med.get('prefill_action_text', 0.0),
            prefill_text_only=med.get('prefill_text_only', 0.0), denoise=med['denoise'],
            seed=med['seed'], decode_1=med['decode_1'], decode_b=med['decode_b'],
            batch=self.batch, suffix=med.get('suffix', 0.0),
            decode_b_adapter=med.get('decode_b_adapter', 0.0),
            guided_denoise=med.get('guided_denoise', float('nan')),
            guided_denoise_exact=med.get('guided_denoise_exact', float('nan')))


def probe_guidance(horizon: int, action_dim: int, device: torch.device,
                   jacobian_steps: int | None = None) -> RtcGuidance:
    """Return a guidance as RTC gives in steady state: a third frozen, a third decaying."""
    third = max(horizon // 3, 1)
    soft_mask = torch.zeros(horizon)
    soft_mask[:third] = 1.0
    soft_mask[third:2 * third] = torch.linspace(1.0, 0.0, third + 2)[1:-1]
    target = torch.randn(1, horizon, action_dim, generator=torch.Generator().manual_seed(1))
    return RtcGuidance(target.to(device), soft_mask.to(device), jacobian_steps=jacobian_steps)


def guided_call(model: object) -> Callable[..., torch.Tensor] | None:
    """
    Return the guided denoise as the backend runs it: ``(prefix, noise, guidance)``.

    The fast path's ``guided_denoise`` (a graph where compiled), the eager reference for a
    ``Pi05Model``, None for a model that cannot guide (TensorRT's graph runner).
    """
    fast = getattr(model, 'guided_denoise', None)
    if fast is not None:
        return fast
    if hasattr(model, 'velocity'):
        return lambda prefix, noise, guidance: guided_denoise(model, prefix, noise, guidance)
    return None
