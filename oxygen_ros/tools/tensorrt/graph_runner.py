"""
``Pi05Model``'s backend entry points, executed by exported graphs over the shared KV pool.

``TorchBackend`` talks to its model through exactly ``encode_images``, ``prefill``,
``prefill_suffix``, ``denoise``, ``lm_logits`` and ``decode_step``. :class:`GraphRunner` has
the same methods with the same shapes and semantics (``PrefixKV`` with packed slots into the same
``KVCache``), so ``TorchBackend(GraphRunner(...), ...)`` runs the whole job program
unchanged on TensorRT engines (or on onnxruntime, which is how CI checks all of it on a CPU).

Shared KV binding: the pool tensors are allocated once by torch (one allocator, one stream)
and handed to the graphs by address on every call; a graph outputs only the new tokens'
K/V, which the runner writes into the pool with one ``index_copy_`` per tensor on the same
stream. Executors bind torch-owned buffers (``data_ptr``) for inputs and outputs; nothing
is copied in or out and no pycuda is needed.
"""

from __future__ import annotations

from typing import Iterator, Mapping, Protocol

from oxygen_ros.config import ModelConfig, PrefixAttention
from oxygen_ros.model.flow import euler_times
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.model.pi05 import check_image_batch
from oxygen_ros.tools.tensorrt.onnx_graphs import GraphName
import torch


class GraphExecutor(Protocol):
    """Runs one exported graph on caller-owned buffers."""

    def run(self, name: GraphName, inputs: Mapping[str, torch.Tensor],
            outputs: Mapping[str, torch.Tensor]) -> None:
        """
        Run graph ``name`` reading ``inputs`` and writing ``outputs`` in place.

        All tensors are contiguous, on the runner's device, with the manifest's dtypes;
        output shapes are the ones the graph produces for these input shapes.
        """


class GraphRunner:
    """
    The model-call interface of ``TorchBackend`` on exported graphs.

    :param cfg: the model config the graphs were exported from.
    :param dtype: their activation / KV dtype (the pool must have it).
    :param device: where the buffers live.
    :param executor: runs the graphs (``TrtExecutor``, ``OrtExecutor``).
    :param denoise_ctx_len: pad the denoise context to this many slots so that its shape
        never changes (CUDA-graph capture); None: no padding.
    """

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device | str,
                 executor: GraphExecutor, *, denoise_ctx_len: int | None = None) -> None:
        self.cfg = cfg
        self.dtype = dtype
        self.device = torch.device(device)
        self.executor = executor
        self.denoise_ctx_len = denoise_ctx_len
        self._anchor = torch.empty(0, dtype=dtype, device=self.device)

    def parameters(self) -> Iterator[torch.Tensor]:
        """Yield one empty tensor with the runner's dtype and device (what backends read)."""
        yield self._anchor

    def _run(self, name: GraphName, inputs: Mapping[str, torch.Tensor],
             outputs: Mapping[str, torch.Tensor]) -> None:
        self.executor.run(name, {k: v.contiguous() for k, v in inputs.items()}, outputs)

    def _empty(self, *shape: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype or self.dtype, device=self.device)

    # ---------------------------------------------------------------- vision, LM head
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """
        Encode camera images (the ``vision`` graph); see ``Pi05Model.encode_images``.

        :param images: ``float [B, N, 3, S, S]`` in [-1, 1].
        :returns: ``[B, N, Ti, W]`` in the runner dtype.
        :raises ValueError: on a wrong shape.
        """
        check_image_batch(images, self.cfg)
        size = self.cfg.vision.image_size
        b, n = images.shape[:2]
        out = self._empty(b * n, self.cfg.image_tokens_per_camera, self.cfg.vlm.width)
        flat = images.reshape(b * n, 3, size, size).to(self.device, torch.float32)
        self._run(GraphName.VISION, {'images': flat}, {'image_embeds': out})
        return out.view(b, n, *out.shape[1:])

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """
        Return LM logits of hidden states (the ``lm_head`` graph).

        :param hidden: ``[B, W]`` VLM hidden states before the final norm.
        :returns: ``float32 [B, V]``.
        """
        out = self._empty(hidden.shape[0], self.cfg.vocab_size, dtype=torch.float32)
        self._run(GraphName.LM_HEAD, {'hidden': hidden.to(self.dtype)}, {'logits': out})
        return out

    # ---------------------------------------------------------------- prefill
    def prefill(self, tokens: torch.Tensor, token_mask: torch.Tensor | None, *,
                image_embeds: torch.Tensor | None = None, image_mask: torch.Tensor | None = None,
                context: PrefixKV | None = None, cache: KVCache | None = None,
                slots: torch.Tensor | None = None) -> PrefixKV:
        """
        Store the K/V of a prefix segment in ``cache`` at ``slots``; see ``Pi05Model.prefill``.

        Without context: the ``prefill`` graph over [valid cameras | valid prompt tokens];
        its K/V come out in the padded layout and the valid rows are packed into the first
        slots. With a context (CAUSAL_TEXT text segment): the ``decode`` graph with the
        prompt as T new tokens. Batch 1 only (the backends' jobs).

        :param tokens: ``int64 [1, T]``.
        :param token_mask: ``bool [1, T]`` (None: all True).
        :param image_embeds: ``[1, N, Ti, W]`` (no context).
        :param image_mask: ``bool [1, N]`` (default all valid).
        :param context: a CAUSAL_TEXT prefix in ``cache`` the new tokens attend.
        :param cache: the pool written (default ``context.cache``).
        :param slots: ``int64 [1, >= P_new]`` slots of the packed new tokens.
        :returns: the prefix over context + new tokens.
        :raises ValueError: bad shapes or slots, no cache, or a context with BIDIRECTIONAL.
        """
        if token_mask is None:
            token_mask = torch.ones(tokens.shape, dtype=torch.bool, device=tokens.device)
        if tokens.dim() != 2 or tokens.shape != token_mask.shape or tokens.shape[0] != 1:
            raise ValueError(f'tokens and token_mask must both be [1, T], got '
                             f'{tuple(tokens.shape)} and {tuple(token_mask.shape)}')
        cache = cache if cache is not None else (context.cache if context else None)
        if cache is None or slots is None:
            raise ValueError('GraphRunner.prefill writes into a given cache: pass cache (or '
                             'context) and slots')
        if cache.dtype != self.dtype:
            raise ValueError(f'cache dtype {cache.dtype} != graph dtype {self.dtype}')
        if context is not None:
            return self._prefill_text(tokens, token_mask, context, cache, slots)
        if image_embeds is None:
            raise ValueError('a prefill without context needs image_embeds')
        n = image_embeds.shape[1]
        if image_mask is None:
            image_mask = torch.ones(1, n, dtype=torch.bool, device=self.device)
        if tokens.shape[1] == 0:  # graphs take no empty dims: one masked token instead
            tokens = torch.zeros(1, 1, dtype=torch.int64, device=self.device)
            token_mask = torch.zeros(1, 1, dtype=torch.bool, device=self.device)
        vlm = self.cfg.vlm
        p = n * image_embeds.shape[2] + tokens.shape[1]
        k = self._empty(vlm.depth, 1, p, vlm.num_kv_heads, vlm.head_dim)
        v = torch.empty_like(k)
        mask = self._empty(1, p, dtype=torch.bool)
        last_hidden = self._empty(1, vlm.width)
        self._run(GraphName.PREFILL,
                  {'image_embeds': image_embeds.to(self.dtype), 'image_mask': image_mask,
                   'tokens': tokens, 'token_mask': token_mask},
                  {'k_new': k, 'v_new': v, 'prefix_mask': mask, 'last_hidden': last_hidden})
        rows = mask[0].nonzero()[:, 0]
        count = rows.numel()
        if count == 0:
            raise ValueError('prefill got no valid token (all cameras and prompt masked)')
        dest = _check_slots(slots, count, cache)
        cache.k.index_copy_(1, dest, k[:, 0, rows])
        cache.v.index_copy_(1, dest, v[:, 0, rows])
        return PrefixKV(cache, dest[None], torch.ones(1, count, dtype=torch.bool,
                                                      device=self.device),
                        torch.full((1,), count, dtype=torch.int64, device=self.device),
                        last_hidden)

    def _prefill_text(self, tokens: torch.Tensor, token_mask: torch.Tensor, context: PrefixKV,
                      cache: KVCache, slots: torch.Tensor) -> PrefixKV:
        if self.cfg.prefix_attention is PrefixAttention.BIDIRECTIONAL:
            raise ValueError(
                'a prefix cannot be extended with prefix_attention=BIDIRECTIONAL: every '
                'prefix token attends the new ones (use CAUSAL_TEXT to share image K/V)')
        if context.cache is not cache:
            raise ValueError('context must live in the cache being written')
        count = int(token_mask.sum())
        if count == 0:
            return context
        rows = token_mask[0].nonzero()[:, 0]
        hidden = self._extend(tokens[:, rows], context, slots)
        dest = slots[:, :count].to(torch.int64)
        return PrefixKV(cache, torch.cat([context.slots, dest], 1),
                        torch.cat([context.mask, torch.ones(1, count, dtype=torch.bool,
                                                            device=self.device)], 1),
                        context.num_tokens + count, hidden)

    def prefill_suffix(self, tokens: torch.Tensor, token_mask: torch.Tensor | None,
                       context: PrefixKV, *, slots: torch.Tensor,
                       adapter: object = None) -> PrefixKV:
        """
        Run causal suffixes on cached roots; see ``Pi05Model.prefill_suffix``.

        The ``decode`` graph with a row's suffix as its new tokens, one row per call (its
        text-prefill profile takes batch 1): the tokens attend the row's context where
        ``context.mask`` and each other causally, whatever the prefix mode.

        :raises ValueError: an adapter (the exported graphs have no suffix LoRA), bad shapes or
            slots.
        """
        if adapter is not None:
            raise ValueError('the exported graphs have no suffix LoRA (memory adapter): run it '
                             'on the torch backend')
        b, t = tokens.shape
        if context.batch_size != b or tuple(slots.shape[:1]) != (b,):
            raise ValueError(f'suffix tokens and slots must have one row per context '
                             f'({context.batch_size}), got {tuple(tokens.shape)} and '
                             f'{tuple(slots.shape)}')
        if token_mask is None:
            token_mask = torch.ones(b, t, dtype=torch.bool, device=tokens.device)
        counts = token_mask.sum(1)
        hidden = context.last_hidden.clone()
        for row, n in enumerate(counts.tolist()):
            if n == 0:
                continue
            ctx = PrefixKV(context.cache, context.slots[row:row + 1], context.mask[row:row + 1],
                           context.num_tokens[row:row + 1], context.last_hidden[row:row + 1])
            hidden[row] = self._extend(tokens[row:row + 1, :n], ctx, slots[row:row + 1])[0]
        return PrefixKV(context.cache, torch.cat([context.slots, slots[:, :t]], 1),
                        torch.cat([context.mask, token_mask], 1), context.num_tokens + counts,
                        hidden)

    def _extend(self, tokens: torch.Tensor, context: PrefixKV,
                slots: torch.Tensor) -> torch.Tensor:
        """Run ``tokens [1, n]`` after ``context``, write their K/V; return the last hidden."""
        count = tokens.shape[1]
        _, hidden, k, v = self._decode(tokens, torch.ones_like(tokens, dtype=torch.bool),
                                       context.num_tokens, context.cache, context.slots,
                                       context.mask)
        dest = _check_slots(slots, count, context.cache, context)
        context.cache.k.index_copy_(1, dest, k[:, 0])
        context.cache.v.index_copy_(1, dest, v[:, 0])
        return hidden

    # ---------------------------------------------------------------- decode
    def _decode(self, tokens: torch.Tensor, token_mask: torch.Tensor, positions: torch.Tensor,
                cache: KVCache, ctx_slots: torch.Tensor, ctx_mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t = tokens.shape
        if ctx_slots.shape[1] == 0:  # no empty dims: one masked context entry instead
            ctx_slots = torch.zeros(b, 1, dtype=torch.int64, device=self.device)
            ctx_mask = torch.zeros(b, 1, dtype=torch.bool, device=self.device)
        vlm = self.cfg.vlm
        logits = self._empty(b, self.cfg.vocab_size, dtype=torch.float32)
        hidden = self._empty(b, vlm.width)
        k = self._empty(vlm.depth, b, t, vlm.num_kv_heads, vlm.head_dim)
        v = torch.empty_like(k)
        self._run(GraphName.DECODE,
                  {'k_pool': cache.k, 'v_pool': cache.v, 'tokens': tokens,
                   'token_mask': token_mask, 'positions': positions,
                   'ctx_slots': ctx_slots.to(torch.int64), 'ctx_mask': ctx_mask},
                  {'logits': logits, 'last_hidden': hidden, 'k_new': k, 'v_new': v})
        return logits, hidden, k, v

    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                    write_slots: torch.Tensor, ctx_slots: torch.Tensor,
                    ctx_mask: torch.Tensor) -> torch.Tensor:
        """
        Feed one token per row and return the next-token logits; see ``Pi05Model.decode_step``.

        The graph reads the pool before the new K/V are written, so ``ctx_slots`` must not
        hold a row's own ``write_slots`` unmasked (the backend never does: a row's context
        is its prefix and the tokens already fed).

        :param tokens: ``int64 [B]``.
        :param positions: ``int64 [B]`` rope positions.
        :param cache: the pool.
        :param write_slots: ``int64 [B]`` where each token's K/V goes.
        :param ctx_slots: ``int64 [B, C]``.
        :param ctx_mask: ``bool [B, C]``.
        :returns: ``float32 [B, V]``.
        """
        logits, _, k, v = self._decode(tokens[:, None], torch.ones_like(tokens[:, None],
                                                                        dtype=torch.bool),
                                       positions, cache, ctx_slots, ctx_mask)
        cache.k.index_copy_(1, write_slots, k[:, :, 0])
        cache.v.index_copy_(1, write_slots, v[:, :, 0])
        return logits

    # ---------------------------------------------------------------- denoise
    def denoise(self, prefix: PrefixKV, noise: torch.Tensor, *,
                num_steps: int | None = None) -> torch.Tensor:
        """
        Flow-matching sampling on a cached prefix; see ``Pi05Model.denoise``.

        The ``denoise`` graph gives v(x_t, t); the Euler update ``x += dt * v`` (float32,
        ``dt = -1/N``, t from 1 in float32 steps as openpi, ``docs/model.md#flow-matching``)
        runs here: one graph of one step instead of ten unrolled keeps the engine 10x smaller
        and its build 10x shorter, and serves any step count; a CUDA graph of the loop
        (``TrtExecutor``) removes the per-step launch cost an unrolled engine would save.

        :param prefix: the cached prefix.
        :param noise: ``float [B, H, A]`` x at t = 1.
        :param num_steps: Euler steps (default ``cfg.num_denoise_steps``).
        :returns: ``float32 [B, H, A]``.
        :raises ValueError: on a wrong shape or step count, or a prefix longer than
            ``denoise_ctx_len``.
        """
        n = self.cfg.num_denoise_steps if num_steps is None else num_steps
        if n < 1:
            raise ValueError(f'num_steps must be >= 1, got {n}')
        b = prefix.batch_size
        if (noise.dim() != 3 or noise.shape[0] != b or noise.shape[2] != self.cfg.action_dim
                or noise.shape[1] != self.cfg.action_horizon):
            raise ValueError(f'noise must be [{b}, {self.cfg.action_horizon}, '
                             f'{self.cfg.action_dim}], got {tuple(noise.shape)}')
        slots, mask = prefix.slots.to(torch.int64), prefix.mask
        if self.denoise_ctx_len is not None:
            pad = self.denoise_ctx_len - slots.shape[1]
            if pad < 0:
                raise ValueError(f'prefix of {slots.shape[1]} slots exceeds denoise_ctx_len '
                                 f'{self.denoise_ctx_len}')
            slots = torch.nn.functional.pad(slots, (0, pad))
            mask = torch.nn.functional.pad(mask, (0, pad))
        times = euler_times(n).to(self.device)[:, None].expand(n, b).contiguous()
        dt = torch.tensor(-1.0 / n, dtype=torch.float32).item()
        inputs = {'k_pool': prefix.cache.k, 'v_pool': prefix.cache.v, 'ctx_slots': slots,
                  'ctx_mask': mask, 'positions': prefix.num_tokens}
        run = getattr(self.executor, 'run_denoise', None)
        if run is not None:  # e.g. a CUDA graph of the whole loop
            return run(inputs, noise.to(torch.float32), times, dt)
        x = noise.to(torch.float32)
        velocity = torch.empty_like(x)
        for step in range(n):
            self._run(GraphName.DENOISE, {**inputs, 'x_t': x, 't': times[step]},
                      {'velocity': velocity})
            x = x + dt * velocity
        return x


def _check_slots(slots: torch.Tensor, count: int, cache: KVCache,
                 context: PrefixKV | None = None) -> torch.Tensor:
    """Return the first ``count`` slots (``int64 [count]``) after the model's checks."""
    if slots.dim() != 2 or slots.shape[0] != 1 or slots.shape[1] < count:
        raise ValueError(f'slots must be [1, >= {count}] (P_new = {count}), '
                         f'got {tuple(slots.shape)}')
    dest = slots[0, :count].to(torch.int64)
    if bool((dest < 0).any()) or bool((dest >= cache.num_slots).any()):
        raise ValueError(f'slots out of range [0, {cache.num_slots})')
    if dest.unique().numel() != count:
        raise ValueError('slots of valid new tokens must be distinct')
    if context is not None and bool(torch.isin(dest, context.slots[context.mask]).any()):
        raise ValueError('slots of new tokens overlap the context')
    return dest


__all__ = ['GraphExecutor', 'GraphRunner']
