"""
OxyGen's suffix-only LoRA of the VLM expert (textual memory), in our fused layout.

OxyGen (``language_adaptation/libero``; ``src/openpi/models/lora.py``, ``gemma_05.py``,
``pi05.py``) trains a rank-16 LoRA on the 18 layers of the VLM expert (Gemma 2B) that is
active only on a request's causal suffix (the ``Memory: `` seed and the decoded tokens): the
root prefix and the action path use the frozen base model, so the root K/V and the actions
stay bit-identical with the adapter loaded. Each layer adapts every projection:

=================  ===============================  ========================================
OxyGen parameter   shape (L layers leading)         delta (x the projection's input)
=================  ===============================  ========================================
``q_einsum``       a ``[N, W, r]``, b ``[N, r, D]``  ``dq_n = (x a_n) b_n * s``, per head
``kv_einsum``      a ``[2, K, W, r]``, b ``[2, K,   ``dk_j``, ``dv_j`` alike, per kv head
                   r, D]``
``attn_vec_        a ``[N, D, r]``, b ``[N, r,      ``do = (sum_n o_n a_n) (sum_n b_n) * s``
einsum``           W]``                             (openpi's einsum ``BTNH,NHL->BTL`` then
                                                    ``BTL,NLD->BTD`` sums over heads twice)
``gating_einsum``  a ``[2, W, r]``, b ``[2, r, M]``  gate and up: ``(x a_i) b_i``, no scale
``linear``         a ``[M, r]``, b ``[r, W]``        down: ``(h a) b``, no scale
=================  ===============================  ========================================

with ``s = alpha / r`` on the attention projections (``lora.Einsum``) and no scaling on the
MLP (``lora.FeedForward._dot`` adds ``(x a) b`` as is). The released adapter
(``huggingface.co/xxxxyu/oxygen-pi05-textual-memory-lora``) has r = 16 and was trained and
served with alpha 16 (``serve_adapter.py`` defaults), so s = 1.

Here the deltas of one layer become four low-rank pairs on our fused projections (Q/K/V one
matrix, gate/up one matrix): ``A`` stacks the per-group down-projections, ``B`` is block
diagonal (zeros elsewhere add exact zeros), the scale is folded into ``B``. A per-row mask
multiplies ``x A``: rows without the adapter get an exact zero delta, so one batch mixes
adapter rows and plain rows at static shapes (inside the fast path's CUDA graphs).
"""

from __future__ import annotations

from dataclasses import dataclass
import logging
import math
from pathlib import Path
import zipfile

import numpy as np

from oxygen_ros.config import ModelConfig

import torch
from torch import nn
import torch.nn.functional as F  # noqa: N812

_LOG = logging.getLogger(__name__)

DEFAULT_ALPHA = 16.0
"""OxyGen's ``language_lora_alpha`` (``pi05_config.py``) and ``serve_adapter.py --alpha``."""

OXYGEN_PREFIX = 'PaliGemma/llm/layers/'
"""Where OxyGen's adapter arrays live: the flax nnx state path joined with ``/``."""

OXYGEN_KEYS = ('attn/q_einsum/lora_a', 'attn/q_einsum/lora_b', 'attn/kv_einsum/lora_a',
               'attn/kv_einsum/lora_b', 'attn/attn_vec_einsum/lora_a',
               'attn/attn_vec_einsum/lora_b', 'mlp/gating_einsum_lora_a',
               'mlp/gating_einsum_lora_b', 'mlp/linear_lora_a', 'mlp/linear_lora_b')
"""The ten arrays of OxyGen's ``adapter.save`` (``PARAM_FILTER``: ``lora`` params, no bias)."""


class AdapterFormatError(ValueError):
    """A file that is not OxyGen's textual-memory adapter for this model."""


def oxygen_shapes(cfg: ModelConfig, rank: int) -> dict[str, tuple[int, ...]]:
    """
    Return the shape of every array of an OxyGen adapter for ``cfg``'s VLM expert.

    :param rank: the LoRA rank r.
    :returns: full key (``OXYGEN_PREFIX`` + name) -> shape, L layers leading.
    """
    v = cfg.vlm
    n, k, w, d, m, r, depth = (v.num_heads, v.num_kv_heads, v.width, v.head_dim, v.mlp_dim,
                               rank, v.depth)
    shapes = {
        'attn/q_einsum/lora_a': (n, w, r), 'attn/q_einsum/lora_b': (n, r, d),
        'attn/kv_einsum/lora_a': (2, k, w, r), 'attn/kv_einsum/lora_b': (2, k, r, d),
        'attn/attn_vec_einsum/lora_a': (n, d, r), 'attn/attn_vec_einsum/lora_b': (n, r, w),
        'mlp/gating_einsum_lora_a': (2, w, r), 'mlp/gating_einsum_lora_b': (2, r, m),
        'mlp/linear_lora_a': (m, r), 'mlp/linear_lora_b': (r, w)}
    return {OXYGEN_PREFIX + name: (depth,) + shape for name, shape in shapes.items()}


class LayerLoRA(nn.Module):
    """
    The low-rank deltas of one VLM layer on our fused projections (``F.linear`` layout).

    ``qkv_a [G r, W]``, ``qkv_b [(H + 2 Hkv) D, G r]`` (G = H + 2 Hkv groups, block
    diagonal); ``o_a [r, H D]``, ``o_b [W, r]``; ``gate_up_a [2 r, W]``,
    ``gate_up_b [2 M, 2 r]`` (block diagonal); ``down_a [r, M]``, ``down_b [W, r]``.
    """

    NAMES = ('qkv_a', 'qkv_b', 'o_a', 'o_b', 'gate_up_a', 'gate_up_b', 'down_a', 'down_b')

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        for name in self.NAMES:
            self.register_buffer(name, tensors[name])


@dataclass(frozen=True, slots=True)
class RowLoRA:
    """
    One layer's deltas applied to the rows of a batch where ``rows`` is 1.

    :ivar layer: the layer's low-rank pairs.
    :ivar rows: ``[B, 1, 1]`` 1 (adapter on) or 0 (off) in the activation dtype.
    """

    layer: LayerLoRA
    rows: torch.Tensor

    def _delta(self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(x, a) * self.rows, b)

    def qkv(self, y: torch.Tensor) -> torch.Tensor:
        """Return the delta of the fused Q/K/V projection of ``y [B, S, W]``."""
        return self._delta(y, self.layer.qkv_a, self.layer.qkv_b)

    def o(self, attn: torch.Tensor) -> torch.Tensor:
        """Return the delta of the output projection of ``attn [B, S, H D]``."""
        return self._delta(attn, self.layer.o_a, self.layer.o_b)

    def gate_up(self, y: torch.Tensor) -> torch.Tensor:
        """Return the delta of the fused gate/up projection of ``y [B, S, W]``."""
        return self._delta(y, self.layer.gate_up_a, self.layer.gate_up_b)

    def down(self, h: torch.Tensor) -> torch.Tensor:
        """Return the delta of the down projection of ``h [B, S, M]``."""
        return self._delta(h, self.layer.down_a, self.layer.down_b)


@dataclass(frozen=True, slots=True)
class AdapterRows:
    """
    A suffix LoRA and the rows of a batch it is active on (the model calls take one).

    :ivar adapter: the adapter (for the layers being run: folded ones need ``fold_adapter``).
    :ivar mask: ``bool [B]`` True where the row's request uses the adapter.
    """

    adapter: SuffixLoRA
    mask: torch.Tensor

    def layers(self, dtype: torch.dtype) -> list[RowLoRA]:
        """Return every layer's deltas on the selected rows, activations in ``dtype``."""
        rows = self.mask.to(dtype)[:, None, None]
        return [RowLoRA(layer, rows) for layer in self.adapter.layers]


class SuffixLoRA(nn.Module):
    """
    A suffix LoRA of every VLM layer (see the module docstring), in the model's dtype.

    :ivar rank: r.
    :ivar alpha: the attention projections' scale is ``alpha / rank`` (folded into ``B``).
    """

    def __init__(self, layers: list[dict[str, torch.Tensor]], rank: int, alpha: float) -> None:
        super().__init__()
        self.rank = rank
        self.alpha = alpha
        self.layers = nn.ModuleList(LayerLoRA(t) for t in layers)

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].qkv_a.dtype

    @property
    def device(self) -> torch.device:
        return self.layers[0].qkv_a.device

    def converted(self, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> SuffixLoRA:
        """Return a copy in ``dtype`` on ``device`` (the parity gate's float32 reference)."""
        layers = [{n: getattr(layer, n).to(device=device, dtype=dtype) for n in LayerLoRA.NAMES}
                  for layer in self.layers]
        return SuffixLoRA(layers, self.rank, self.alpha)

    def folded(self, input_scales: list[torch.Tensor],
               post_scales: list[torch.Tensor]) -> SuffixLoRA:
        """
        Return the adapter for norm-folded layers (``backends/fast_path/folding.py``).

        A folded layer feeds the bare ``x̂`` to Q/K/V and gate/up; the adapter's ``A`` of those
        two then carries the norm scale: ``A diag(1 + w)`` (float32, rounded once).

        :param input_scales: per layer, ``1 + w`` of the input norm (float32 ``[W]``).
        :param post_scales: per layer, ``1 + w`` of the post-attention norm.
        """
        layers = []
        for layer, s_in, s_post in zip(self.layers, input_scales, post_scales):
            t = {n: getattr(layer, n) for n in LayerLoRA.NAMES}
            for name, scale in (('qkv_a', s_in), ('gate_up_a', s_post)):
                t[name] = (t[name].float() * scale[None, :]).to(t[name].dtype)
            layers.append(t)
        return SuffixLoRA(layers, self.rank, self.alpha)

    @torch.no_grad()
    def merged(self, base: nn.ModuleList) -> nn.ModuleList:
        """
        Return copies of the (unfolded) VLM layers with ``W + B A`` in their weights.

        The merged-weights model the adapter's deltas equal; for reference forwards (tests).
        """
        import copy
        out = copy.deepcopy(base)
        for layer, lora in zip(out, self.layers):
            for weight, a, b in ((layer.qkv.weight, lora.qkv_a, lora.qkv_b),
                                 (layer.o.weight, lora.o_a, lora.o_b),
                                 (layer.mlp.gate_up.weight, lora.gate_up_a, lora.gate_up_b),
                                 (layer.mlp.down.weight, lora.down_a, lora.down_b)):
                weight.copy_((weight.float() + b.float() @ a.float()).to(weight.dtype))
        return out


def _block_diagonal(blocks: list[np.ndarray]) -> np.ndarray:
    """Return the block-diagonal matrix of ``blocks`` (each ``[out_i, r]``), float32."""
    rows = sum(b.shape[0] for b in blocks)
    cols = sum(b.shape[1] for b in blocks)
    out = np.zeros((rows, cols), dtype=np.float32)
    i = j = 0
    for b in blocks:
        out[i:i + b.shape[0], j:j + b.shape[1]] = b
        i, j = i + b.shape[0], j + b.shape[1]
    return out


def from_oxygen_arrays(arrays: dict[str, np.ndarray], cfg: ModelConfig, *,
                       alpha: float = DEFAULT_ALPHA, dtype: torch.dtype = torch.float32,
                       device: torch.device | str = 'cpu') -> SuffixLoRA:
    """
    Map OxyGen's adapter arrays (``oxygen_shapes`` keys) to a :class:`SuffixLoRA`.

    :param arrays: every key of ``oxygen_shapes``, shapes checked by the caller.
    :param alpha: the LoRA alpha the adapter was trained with (scale ``alpha / r``).
    :raises AdapterFormatError: ``alpha`` not a positive finite number.
    """
    if not (math.isfinite(alpha) and alpha > 0):
        raise AdapterFormatError(f'memory adapter alpha must be a positive number, got {alpha}')
    a = {name: np.asarray(arrays[OXYGEN_PREFIX + name], dtype=np.float32) for name in OXYGEN_KEYS}
    rank = a['attn/q_einsum/lora_a'].shape[-1]
    scale = np.float32(alpha / rank)
    n, k = cfg.vlm.num_heads, cfg.vlm.num_kv_heads
    layers = []
    for i in range(cfg.vlm.depth):
        qa, qb = a['attn/q_einsum/lora_a'][i], a['attn/q_einsum/lora_b'][i]
        kva, kvb = a['attn/kv_einsum/lora_a'][i], a['attn/kv_einsum/lora_b'][i]
        # groups in the fused Q/K/V row order: the N query heads, the K keys, the K values
        groups_a = [qa[h] for h in range(n)] + [kva[0, j] for j in range(k)] + \
            [kva[1, j] for j in range(k)]
        groups_b = [qb[h] for h in range(n)] + [kvb[0, j] for j in range(k)] + \
            [kvb[1, j] for j in range(k)]
        oa, ob = a['attn/attn_vec_einsum/lora_a'][i], a['attn/attn_vec_einsum/lora_b'][i]
        ga, gb = a['mlp/gating_einsum_lora_a'][i], a['mlp/gating_einsum_lora_b'][i]
        la, lb = a['mlp/linear_lora_a'][i], a['mlp/linear_lora_b'][i]
        t = {'qkv_a': np.concatenate([g.T for g in groups_a], 0),
             'qkv_b': _block_diagonal([g.T * scale for g in groups_b]),
             'o_a': oa.reshape(-1, rank).T, 'o_b': ob.sum(0).T * scale,
             'gate_up_a': np.concatenate([ga[0].T, ga[1].T], 0),
             'gate_up_b': _block_diagonal([gb[0].T, gb[1].T]),
             'down_a': la.T, 'down_b': lb.T}
        layers.append({name: torch.from_numpy(np.ascontiguousarray(v)).to(
            device=device, dtype=dtype) for name, v in t.items()})
    return SuffixLoRA(layers, rank, alpha)


def _normalized(name: str) -> str:
    """Return an array name without a leading ``params/`` or a trailing nnx ``/value``."""
    name = name.removeprefix('params/')
    return name.removesuffix('/value')


def read_oxygen_adapter(path: str | Path, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """
    Read and check OxyGen's textual-memory adapter (``.npz``) for ``cfg``'s VLM expert.

    Never unpickles (``allow_pickle=False``). The rank comes from the arrays.

    :returns: ``oxygen_shapes`` key -> float32 array.
    :raises FileNotFoundError: no such file.
    :raises AdapterFormatError: not an ``.npz`` of OxyGen's format for this model (another
        adapter format, missing or unexpected arrays, wrong shapes, mixed ranks, NaN/Inf).
    """
    path = Path(path).expanduser()
    if path.is_dir():
        hint = (' (a Hugging Face PEFT adapter folder: adapter_config.json)'
                if (path / 'adapter_config.json').is_file() else '')
        raise AdapterFormatError(
            f"memory adapter {path} is a folder{hint}; oxygen_ros loads OxyGen's textual-memory "
            f'adapter, one .npz file as language_adaptation/libero/adapter.py saves it '
            f'(e.g. adapter_step_1500.npz)')
    if not path.is_file():
        raise FileNotFoundError(f'memory adapter {path}: no such file')
    try:
        with np.load(path, allow_pickle=False) as npz:
            raw = {name: npz[name] for name in npz.files}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise AdapterFormatError(
            f"memory adapter {path} is not an .npz archive of arrays (OxyGen's textual-memory "
            f'adapter format): {type(exc).__name__}: {exc}') from None
    arrays = {_normalized(name): value for name, value in raw.items()}
    expected_names = {OXYGEN_PREFIX + n for n in OXYGEN_KEYS}
    missing = sorted(expected_names - set(arrays))
    unexpected = sorted(set(arrays) - expected_names)
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f'missing {len(missing)}: {", ".join(missing)}')
        if unexpected:
            parts.append(f'unexpected {len(unexpected)}: {", ".join(unexpected[:8])}'
                         + (' ...' if len(unexpected) > 8 else ''))
        raise AdapterFormatError(
            f"memory adapter {path} is not OxyGen's suffix LoRA of the VLM expert (the ten "
            f'lora arrays under {OXYGEN_PREFIX}): {"; ".join(parts)}')
    q = arrays[OXYGEN_PREFIX + 'attn/q_einsum/lora_a']
    if q.ndim != 4 or q.shape[-1] < 1:
        raise AdapterFormatError(f'memory adapter {path}: {OXYGEN_PREFIX}attn/q_einsum/lora_a '
                                 f'has shape {q.shape}, expected [L, heads, width, rank]')
    rank = int(q.shape[-1])
    for name, want in oxygen_shapes(cfg, rank).items():
        got = arrays[name].shape
        if got != want:
            raise AdapterFormatError(
                f'memory adapter {path}: {name} has shape {tuple(got)}, expected {want} for '
                f'preset {cfg.name} (VLM: {cfg.vlm.depth} layers, width {cfg.vlm.width}, '
                f'{cfg.vlm.num_heads} heads x {cfg.vlm.head_dim}, MLP {cfg.vlm.mlp_dim}) at '
                f'rank {rank}')
    out = {}
    for name, value in arrays.items():
        if not np.issubdtype(value.dtype, np.floating):
            raise AdapterFormatError(f'memory adapter {path}: {name} has dtype {value.dtype}, '
                                     f'expected floating point')
        value = value.astype(np.float32)
        if not np.isfinite(value).all():
            raise AdapterFormatError(f'memory adapter {path}: {name} holds NaN or Inf')
        out[name] = value
    return out


def load_oxygen_adapter(path: str | Path, cfg: ModelConfig, *, alpha: float = DEFAULT_ALPHA,
                        dtype: torch.dtype = torch.float32,
                        device: torch.device | str = 'cpu') -> SuffixLoRA:
    """
    Load OxyGen's textual-memory adapter for ``cfg``'s VLM expert.

    :param path: the ``.npz`` (``language_adaptation/libero/adapter.py`` ``save``).
    :param alpha: the alpha it was trained with (OxyGen's default and release: 16).
    :param dtype: the model's activation dtype (OxyGen casts the adapter to it too).
    :raises FileNotFoundError, AdapterFormatError: see :func:`read_oxygen_adapter`.
    """
    arrays = read_oxygen_adapter(path, cfg)
    lora = from_oxygen_arrays(arrays, cfg, alpha=alpha, dtype=dtype, device=device)
    _LOG.info('memory adapter %s: rank %d, alpha %g, %d VLM layers, %d parameters', path,
              lora.rank, alpha, len(lora.layers), sum(a.size for a in arrays.values()))
    return lora


__all__ = ['AdapterFormatError', 'AdapterRows', 'DEFAULT_ALPHA', 'LayerLoRA', 'OXYGEN_KEYS',
           'OXYGEN_PREFIX', 'RowLoRA', 'SuffixLoRA', 'from_oxygen_arrays', 'load_oxygen_adapter',
           'oxygen_shapes', 'read_oxygen_adapter']
