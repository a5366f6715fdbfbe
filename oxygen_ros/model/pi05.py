"""
π0.5 in PyTorch with explicit KV caching: prefill, denoise and decode-step entry points.

The model owns no cache: ``prefill`` writes the VLM expert's K/V of a prefix into the slots of
a :class:`KVCache` it is given (or allocates), ``denoise`` and ``decode_step`` read them by
slot. Packed tokens: invalid tokens are dropped before the VLM, so positions = index among the
valid tokens (``docs/model.md#mixture-of-transformers-attention-and-masks``,
``docs/model.md#the-kv-cache``). The layers of a prefill and of a decode step run in
``vlm_passes.py``, the action expert's in ``denoise.py``; embeddings and heads are methods here.
Uncached ground truth for the tests: ``test/reference.py``.
"""

from __future__ import annotations

import math

from oxygen_ros.config import ModelConfig
from oxygen_ros.model.denoise import (
    denoise_context, DenoiseContext, euler_loop, euler_modulations, velocity)
from oxygen_ros.model.flow import sincos_time_embedding
from oxygen_ros.model.gemma import GemmaExpert, NormKind
from oxygen_ros.model.init import init_parameters
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.model.layers import AdaRMSNorm, RMSNorm
from oxygen_ros.model.lora import AdapterRows
from oxygen_ros.model.prefix import check_context, check_new_slots, pack_prefix, suffix_tokens
from oxygen_ros.model.siglip import SiglipTower
from oxygen_ros.model.vlm_passes import run_decode_step, run_prefill

import torch
from torch import nn
import torch.nn.functional as F  # noqa: N812


FLOAT32_HEADS = ('action_in_proj', 'action_out_proj', 'time_mlp_in', 'time_mlp_out')
"""The π0.5 heads outside ``paligemma_with_expert``: float32 in a 16-bit model (openpi)."""


class Pi05Model(nn.Module):
    """
    π0.5: SigLIP + projector, Gemma VLM expert (RMSNorm), action expert (adaRMSNorm).

    Parameters are random (``init.init_parameters``) and deterministic under
    ``torch.manual_seed``; load real weights with ``checkpoint.weights.load_checkpoint``.
    Built inside ``with torch.device('meta')`` it allocates nothing (parameter counts, meta
    loading).

    :param untied_lm_head: give the LM head its own ``[V, W]`` weight (``lm_head``) instead of
        the token embedding (π0.5 ties them; some fine-tunes do not).
    """

    def __init__(self, cfg: ModelConfig, *, untied_lm_head: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        target = torch.get_default_device()
        with torch.device('meta'):
            vlm_w, exp_w = cfg.vlm.width, cfg.expert.width
            self.vision = SiglipTower(cfg.vision)
            self.projector = nn.Linear(cfg.vision.width, vlm_w)
            self.embedding = nn.Parameter(torch.empty(cfg.vocab_size, vlm_w))
            self.lm_head = nn.Parameter(torch.empty(cfg.vocab_size, vlm_w)) \
                if untied_lm_head else None
            self.vlm = GemmaExpert(cfg.vlm, NormKind.RMS, cfg.norm_eps)
            self.expert = GemmaExpert(cfg.expert, NormKind.ADAPTIVE, cfg.norm_eps)
            self.action_in_proj = nn.Linear(cfg.action_dim, exp_w)
            self.action_out_proj = nn.Linear(exp_w, cfg.action_dim)
            self.time_mlp_in = nn.Linear(exp_w, exp_w)
            self.time_mlp_out = nn.Linear(exp_w, exp_w)
        # sqrt(W) rounded to each activation dtype, as plain floats (no tensor per call).
        root = math.sqrt(cfg.vlm.width)
        self._embed_scale = {dt: torch.tensor(root, dtype=dt, device='cpu').item()
                             for dt in (torch.float32, torch.bfloat16, torch.float16,
                                        torch.float64)}
        if target.type != 'meta':
            self.to_empty(device=target)
            init_parameters(self)

    @property
    def dtype(self) -> torch.dtype:
        """Return the activation and KV cache dtype: the token embedding's (fp32 norms aside)."""
        return self.embedding.dtype

    def float32_parameters(self) -> set[str]:
        """
        Return the names of the parameters kept in float32 when the model runs in 16 bits.

        As openpi-PyTorch (``models_pytorch/gemma_pytorch.py``,
        ``to_bfloat16_for_selected_params``): the SigLIP patch and position embeddings, and
        every RMSNorm of both Gemma experts, which in the action expert is the adaRMS
        ``Dense`` (``docs/model.md#precision``). SigLIP's LayerNorms stay in the model dtype,
        as there. Also ``action_in_proj``, ``action_out_proj``, ``time_mlp_in`` and
        ``time_mlp_out`` (:data:`FLOAT32_HEADS`): openpi builds them outside
        ``paligemma_with_expert`` and never casts them (``models_pytorch/pi0_pytorch.py``), so
        they run in float32 there.
        """
        names = {f'vision.patch_embed.{n}' for n, _ in self.vision.patch_embed.named_parameters()}
        names.add('vision.pos_embed')
        for head in FLOAT32_HEADS:
            names.update(f'{head}.{n}' for n, _ in getattr(self, head).named_parameters())
        for prefix, module in self.named_modules():
            if isinstance(module, (RMSNorm, AdaRMSNorm)):
                names.update(f'{prefix}.{n}' for n, _ in module.named_parameters())
        return names

    def parameter_dtypes(self, dtype: torch.dtype) -> dict[str, torch.dtype]:
        """
        Return the dtype of every parameter when the model runs in ``dtype``.

        ``dtype`` for all, except :meth:`float32_parameters` in float32 when ``dtype`` has
        16 bits (bfloat16, float16).
        """
        keep = self.float32_parameters() if dtype.itemsize < 4 else set()
        return {name: torch.float32 if name in keep else dtype
                for name, _ in self.named_parameters()}

    @torch.no_grad()
    def set_precision(self, dtype: torch.dtype) -> Pi05Model:
        """Cast the parameters in place to :meth:`parameter_dtypes` of ``dtype``; return self."""
        dtypes = self.parameter_dtypes(dtype)
        for name, param in self.named_parameters():
            param.data = param.data.to(dtypes[name])
        return self

    @property
    def device(self) -> torch.device:
        return self.embedding.device

    def count_parameters(self) -> int:
        """Return the number of parameters (the tied LM head counted once)."""
        return sum(p.numel() for p in self.parameters())

    # ---------------------------------------------------------------- embeddings
    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """
        Encode camera images into VLM-width image tokens (SigLIP + linear projector).

        Image tokens are not scaled by sqrt(W) (``docs/model.md#vision-tower``).

        :param images: ``float [B, N, 3, S, S]`` in [-1, 1], S = ``cfg.vision.image_size``.
        :returns: ``[B, N, Ti, W_vlm]`` in the model dtype.
        :raises ValueError: on a wrong shape.
        """
        check_image_batch(images, self.cfg)
        size = self.cfg.vision.image_size
        b, n = images.shape[:2]
        tokens = self.vision(images.reshape(b * n, 3, size, size))
        return self.projector(tokens).view(b, n, tokens.shape[1], -1)

    def embed_text(self, tokens: torch.Tensor) -> torch.Tensor:
        """Return ``E[tokens] * sqrt(W)``, sqrt(W) cast to the model dtype (openpi gemma.py)."""
        return F.embedding(tokens, self.embedding) * self._embed_scale[self.dtype]

    def time_condition(self, t: torch.Tensor) -> torch.Tensor:
        """
        Return the adaRMS condition ``swish(mlp_out(swish(mlp_in(sincos(t)))))``.

        openpi ``src/openpi/models/pi0.py`` ``embed_suffix``; ``docs/model.md#π05-specifics``.

        Runs in the dtype of the time MLP: float32 also in a 16-bit model, as openpi
        (:meth:`float32_parameters`); the adaRMS ``Dense`` reads it in its own dtype.

        :param t: ``float32 [M]`` flow-matching times.
        :returns: ``[M, W_expert]`` in the time MLP's dtype.
        """
        emb = sincos_time_embedding(t, self.cfg.expert.width, self.cfg.min_period,
                                    self.cfg.max_period).to(self.time_mlp_in.weight.dtype)
        return F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(emb))))

    def embed_actions(self, x_t: torch.Tensor) -> torch.Tensor:
        """
        Return the action tokens ``action_in_proj(x_t)`` for the action expert (openpi ``pi0.py``).

        The projection runs in its own dtype (float32 also in a 16-bit model, as openpi); the
        tokens are then cast to the model dtype, where the expert's layers start.

        :param x_t: ``float [B, H, A]`` noisy actions.
        :returns: ``[B, H, W_expert]`` in the model dtype.
        """
        proj = self.action_in_proj
        return proj(x_t.to(proj.weight.dtype)).to(self.dtype)

    def project_actions(self, hidden: torch.Tensor) -> torch.Tensor:
        """
        Return the velocity ``action_out_proj(hidden)`` in float32 (``docs/model.md#precision``).

        openpi casts the expert's output to float32 before this projection, whose weights are
        float32 (:meth:`float32_parameters`).

        :param hidden: ``[B, H, W_expert]`` after the expert's final norm.
        :returns: ``float32 [B, H, A]``.
        """
        out = self.action_out_proj
        return F.linear(hidden.float(), out.weight.float(), out.bias.float())

    @torch.no_grad()
    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """
        Return LM logits: final RMSNorm then the LM head (the tied embedding: openpi ``gemma.py``).

        The matmul runs in the model dtype (bf16 logits are then rounded, as openpi-PyTorch).

        :param hidden: ``[..., W]`` VLM hidden states before the final norm.
        :returns: ``float32 [..., V]``.
        """
        y, _ = self.vlm.final_norm(hidden)
        return F.linear(y, self.lm_head_weight).float()

    @property
    def lm_head_weight(self) -> torch.Tensor:
        """Return the LM head ``[V, W]``: ``lm_head`` if untied, else the token embedding."""
        return self.embedding if self.lm_head is None else self.lm_head

    # ---------------------------------------------------------------- prefill
    @torch.no_grad()
    def prefill(self, tokens: torch.Tensor, token_mask: torch.Tensor | None, *,
                image_embeds: torch.Tensor | None = None, image_mask: torch.Tensor | None = None,
                context: PrefixKV | None = None, cache: KVCache | None = None,
                slots: torch.Tensor | None = None, reserve: int = 0) -> PrefixKV:
        """
        Run the VLM expert over a prefix segment and store its K/V.

        New tokens = [the Ti tokens of every valid camera, slot order] + [valid text tokens],
        packed to the left; ``P_new`` = max valid count over the batch. Positions continue
        from ``context.num_tokens``. ar flags: images 0, text 0 (BIDIRECTIONAL) or 1
        (CAUSAL_TEXT) (``docs/model.md#mixture-of-transformers-attention-and-masks``).

        :param tokens: ``int64 [B, T]`` prompt ids (T may be 0).
        :param token_mask: ``bool [B, T]`` True for real prompt tokens; None: all real.
        :param image_embeds: ``[B, N, Ti, W]`` from :meth:`encode_images`, or None.
        :param image_mask: ``bool [B, N]`` valid cameras (default all valid).
        :param context: a prefix already in the cache that the new tokens attend to; only
            when the first new token has ar=1 (CAUSAL_TEXT, text-only new tokens).
        :param cache: where to write; default ``context.cache``, else a new
            ``KVCache`` of ``B * (P_new + reserve)`` slots, sample b at
            ``b * (P_new + reserve) + [0, P_new)``.
        :param slots: ``int64 [B, >= P_new]`` slots of the new tokens (first P_new columns
            used; padding entries may be any in-range slot and are never written). Required
            with ``cache`` or ``context``.
        :param reserve: free slots left after each sample's prefix in a new cache.
        :returns: the prefix over context + new tokens, ``last_hidden`` at its last token.
        :raises ValueError: on bad shapes, slots, or a context that cannot be extended.
        """
        if reserve < 0:
            raise ValueError(f'reserve must be >= 0, got {reserve}')
        if token_mask is None:
            token_mask = torch.ones(tokens.shape, dtype=torch.bool, device=tokens.device)
        packed = pack_prefix(self, tokens, token_mask, image_embeds, image_mask)
        b, p = packed.valid.shape
        if context is not None:
            check_context(context, packed, self.cfg.prefix_attention)
            if cache is None:
                cache = context.cache
            elif cache is not context.cache:
                raise ValueError('context must live in the cache being written')
        base = (context.num_tokens if context is not None
                else torch.zeros(b, dtype=torch.int64, device=self.device))
        if slots is not None and cache is None:
            raise ValueError('slots given without a cache or context to write into')
        if p == 0:
            if context is None:
                raise ValueError('prefill got no valid token (all cameras and prompt masked)')
            return context
        if cache is None:
            stride = p + reserve
            cache = KVCache(self.cfg.vlm, b * stride, dtype=self.dtype, device=self.device)
            slots = (torch.arange(b, device=self.device)[:, None] * stride
                     + torch.arange(p, device=self.device))
        else:
            slots = check_new_slots(slots, cache, packed, context)
        last_hidden = run_prefill(self, packed, cache, slots, base, context)
        last_hidden = torch.where((packed.counts > 0)[:, None], last_hidden,
                                  0.0 if context is None else context.last_hidden)
        if context is None:
            return PrefixKV(cache, slots, packed.valid, base + packed.counts, last_hidden)
        return PrefixKV(cache, torch.cat([context.slots, slots], 1),
                        torch.cat([context.mask, packed.valid], 1),
                        base + packed.counts, last_hidden)

    @torch.no_grad()
    def prefill_suffix(self, tokens: torch.Tensor, token_mask: torch.Tensor | None,
                       context: PrefixKV, *, slots: torch.Tensor,
                       adapter: AdapterRows | None = None) -> PrefixKV:
        """
        Run causal suffixes on cached roots: B rows of text tokens after B prefixes.

        OxyGen's language suffix (``pi05.py`` ``forward_language_suffix`` /
        ``append_language_suffix_block``): each row's new tokens attend every valid token of
        its context (``context.mask``, e.g. a bidirectional action prefix, whose K/V they do
        not change) and each other causally (ar = 1); positions continue from
        ``context.num_tokens``. Their K/V go to ``slots`` in the context's cache.

        :param tokens: ``int64 [B, T]`` suffix ids, left-aligned.
        :param token_mask: ``bool [B, T]`` True for the first ``n_b`` ids of row b (None: all);
            ``n_b`` may be 0 (the row is returned unchanged).
        :param context: the B roots, in one cache.
        :param slots: ``int64 [B, >= T]`` slots of the new tokens (padding entries unused).
        :param adapter: a suffix LoRA active on the rows it selects (``model/lora.py``).
        :returns: the prefixes context + suffix, ``last_hidden`` at each row's last token.
        :raises ValueError: bad shapes, a mask with holes, slots out of range or overlapping
            the context.
        """
        packed = suffix_tokens(self, tokens, token_mask, context.batch_size)
        cache = context.cache
        slots = check_new_slots(slots, cache, packed, context)
        if packed.valid.shape[1] == 0:
            return context
        last_hidden = run_prefill(self, packed, cache, slots, context.num_tokens, context,
                                  adapter)
        last_hidden = torch.where((packed.counts > 0)[:, None], last_hidden,
                                  context.last_hidden)
        return PrefixKV(cache, torch.cat([context.slots, slots], 1),
                        torch.cat([context.mask, packed.valid], 1),
                        context.num_tokens + packed.counts, last_hidden)

    # ---------------------------------------------------------------- denoise
    def denoise_context(self, prefix: PrefixKV, horizon: int | None = None) -> DenoiseContext:
        """
        Gather a cached prefix for :meth:`velocity` (see ``denoise.denoise_context``).

        :param horizon: action tokens H (default ``cfg.action_horizon``).
        """
        h = self.cfg.action_horizon if horizon is None else horizon
        return denoise_context(self, prefix.cache.k, prefix.cache.v, prefix.slots, prefix.mask,
                               prefix.num_tokens, h)

    def velocity(self, ctx: DenoiseContext, x_t: torch.Tensor,
                 t: torch.Tensor | float) -> torch.Tensor:
        """
        Return the flow-matching velocity ``v(x_t, t)`` on a prefix, eager and differentiable.

        One Euler step of :meth:`denoise` is ``x + dt * velocity(ctx, x, t)``; guided
        denoising (e.g. real-time chunking) calls it under ``torch.enable_grad()`` and takes
        ``torch.autograd.grad`` w.r.t. ``x_t`` (see ``denoise.velocity``).

        :param ctx: from :meth:`denoise_context` (built outside ``torch.inference_mode``
            when gradients are wanted).
        :param x_t: ``float [B, H, A]``.
        :param t: a float or ``float32 [B]``; 1 = noise, 0 = data.
        :returns: ``float32 [B, H, A]``.
        :raises ValueError: ``x_t`` does not fit ``ctx``.
        """
        return velocity(self, ctx, x_t, t)

    @torch.no_grad()
    def denoise(self, prefix: PrefixKV, noise: torch.Tensor, *,
                num_steps: int | None = None) -> torch.Tensor:
        """
        Flow-matching sampling of an action chunk on a cached prefix.

        ``docs/model.md#flow-matching``; openpi ``src/openpi/models/pi0.py`` ``sample_actions``.

        Euler from t=1 (noise) to t=0 in ``num_steps`` steps, ``x += dt * v`` with
        ``dt = -1/N``; x and t float32. Only the action expert runs, on the H suffix tokens
        (ar ``[1, 0, ...]``: they see the valid prefix and each other; positions
        ``num_tokens + arange(H)``). The prefix K/V is gathered once per call into buffers
        whose suffix part each step overwrites; the cache is never written. The adaRMS
        modulations depend only on t and are computed for all steps before the loop.

        :param prefix: the cached prefix (e.g. from :meth:`prefill`).
        :param noise: ``float [B, H, A]`` x at t=1, A = ``cfg.action_dim``.
        :param num_steps: Euler steps (default ``cfg.num_denoise_steps``).
        :returns: ``float32 [B, H, A]`` actions in normalized, padded action space.
        :raises ValueError: on a wrong shape or step count.
        """
        n = self.cfg.num_denoise_steps if num_steps is None else num_steps
        if n < 1:
            raise ValueError(f'num_steps must be >= 1, got {n}')
        if (noise.dim() != 3 or noise.shape[0] != prefix.batch_size
                or noise.shape[2] != self.cfg.action_dim or noise.shape[1] < 1):
            raise ValueError(f'noise must be [{prefix.batch_size}, H, {self.cfg.action_dim}], '
                             f'got {tuple(noise.shape)}')
        ctx = self.denoise_context(prefix, noise.shape[1])
        return euler_loop(self, ctx, noise, euler_modulations(self, n, self.device))

    # ---------------------------------------------------------------- decode
    @torch.no_grad()
    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                    write_slots: torch.Tensor, ctx_slots: torch.Tensor,
                    ctx_mask: torch.Tensor, adapter: AdapterRows | None = None
                    ) -> torch.Tensor:
        """
        Feed one token per row through the VLM expert and return the next-token logits.

        Rows may belong to different prefixes and have different lengths
        (``docs/model.md#the-kv-cache``). Each token's K/V is written at ``write_slots`` first;
        then, per layer, ONE ``index_select`` gathers ``[ctx_slots, write_slots]`` and the
        token attends ctx (where ``ctx_mask``) and itself. No host sync.

        :param tokens: ``int64 [B]`` token fed.
        :param positions: ``int64 [B]`` its rope position.
        :param cache: the KV storage holding the context.
        :param write_slots: ``int64 [B]`` distinct slots for the new K/V.
        :param ctx_slots: ``int64 [B, C]`` slots the token attends besides itself.
        :param ctx_mask: ``bool [B, C]`` True for real context entries.
        :param adapter: a suffix LoRA active on the rows it selects (``model/lora.py``).
        :returns: ``float32 [B, V]`` logits (final RMSNorm, tied embedding).
        """
        return run_decode_step(self, tokens, positions, cache, write_slots, ctx_slots, ctx_mask,
                               adapter)


def check_image_batch(images: torch.Tensor, cfg: ModelConfig) -> None:
    """
    Check that ``images`` is a ``[B, N, 3, S, S]`` batch for the vision tower of ``cfg``.

    :raises ValueError: on any other shape.
    """
    size = cfg.vision.image_size
    if images.dim() != 5 or tuple(images.shape[2:]) != (3, size, size):
        raise ValueError(f'images must be [B, N, 3, {size}, {size}], got {tuple(images.shape)}')


def build_model(cfg: ModelConfig, *, dtype: torch.dtype = torch.float32,
                device: torch.device | str = 'cpu') -> Pi05Model:
    """
    Build a randomly initialised model directly in ``dtype`` on ``device``.

    Unlike ``Pi05Model(cfg).to(dtype)`` it never holds a float32 copy (the full-size model is
    13 GB in float32, 6.7 GB in bfloat16). In float32 it equals ``Pi05Model(cfg)`` under the
    same seed. In 16 bits the parameters of ``Pi05Model.float32_parameters`` stay float32.
    """
    with torch.device('meta'):
        model = Pi05Model(cfg)
    model = model.set_precision(dtype).to_empty(device=device)
    init_parameters(model)
    return model.eval()


__all__ = ['FLOAT32_HEADS', 'Pi05Model', 'build_model']
