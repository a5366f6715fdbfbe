"""
openpi's JAX parameter tree → openpi-PyTorch ``model.safetensors`` keys.

Both layouts: ``docs/checkpoints.md#key-layouts``.

Tree paths as openpi's ``models/pi0.py``, ``gemma.py`` (``Module`` with ``scan``: every layer
array has a leading depth axis) and ``siglip.py`` (``encoderblock`` scanned) create them,
reshapes as openpi's ``examples/convert_jax_model_to_pytorch.py`` applies them, written for
any head count (``[H, W, D]`` einsum kernels become head-major ``[H * D, W]`` Linear weights):

============================================  ==============================================
JAX (under ``PaliGemma/`` unless top level)   PyTorch
============================================  ==============================================
``img/embedding/kernel [P, P, 3, W]``          ``patch_embedding.weight [W, 3, P, P]``
``img/pos_embedding [1, T, W]``                ``position_embedding.weight [T, W]``
``…/query/kernel [L, W, H, D]``                ``q_proj.weight [H * D, W]`` (bias flattened)
``…/out/kernel [L, H, D, W]``                  ``out_proj.weight [W, H * D]``
``llm/layers/attn/q_einsum/w [L, H, W, D]``    ``q_proj.weight [H * D, W]``
``…/kv_einsum/w [L, 2, Hkv, W, D]``            ``k_proj`` (0), ``v_proj`` (1) ``[Hkv * D, W]``
``…/attn_vec_einsum/w [L, H, D, W]``           ``o_proj.weight [W, H * D]``
``llm/layers/mlp/gating_einsum [L, 2, W, M]``  ``gate_proj`` (0), ``up_proj`` (1) ``[M, W]``
Dense / einsum kernels ``[in, out]``           Linear weights ``[out, in]``
============================================  ==============================================

The action expert has the same names with suffix ``_1``; its adaRMS norms are
``pre_attention_norm_1/Dense_0``, ``pre_ffw_norm_1/Dense_0``, ``final_norm_1/Dense_0``
(a π0 tree has RMSNorm ``scale`` there, plus ``state_proj`` and ``action_time_mlp_*``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from oxygen_ros.checkpoint.keys import EXPERT, key_map, LANGUAGE, PROJECTOR, VISION
from oxygen_ros.config import ModelConfig

Path_ = tuple[str, ...]
Transform = Callable[[np.ndarray], np.ndarray]

PI0_MARKERS = (('state_proj', 'kernel'), ('action_time_mlp_in', 'kernel'),
               ('PaliGemma', 'llm', 'layers', 'pre_attention_norm_1', 'scale'))
"""Arrays only a π0 (not π0.5) tree has."""


@dataclass(frozen=True, slots=True)
class Source:
    """
    Where one PyTorch tensor comes from.

    :ivar path: the JAX tree path.
    :ivar index: leading indices into the source array (layer, then K/V or gate/up).
    :ivar transform: numpy reshape/transpose of ``array[index]``.
    """

    path: Path_
    index: tuple[int, ...] = ()
    transform: Transform | None = None

    def take(self, array: np.ndarray) -> np.ndarray:
        """Return the PyTorch tensor from the whole source array (C-contiguous)."""
        part = array[self.index] if self.index else array
        return np.ascontiguousarray(self.transform(part) if self.transform else part)


def _t(x: np.ndarray) -> np.ndarray:
    return x.T


def _heads_in(x: np.ndarray) -> np.ndarray:
    """``[H, W, D]`` einsum kernel → ``[H * D, W]`` (head-major rows)."""
    return x.transpose(0, 2, 1).reshape(-1, x.shape[1])


def _heads_out(x: np.ndarray) -> np.ndarray:
    """``[H, D, W]`` → ``[W, H * D]``."""
    return x.reshape(-1, x.shape[-1]).T


def _siglip_in(x: np.ndarray) -> np.ndarray:
    """``[W, H, D]`` (flax DenseGeneral) → ``[H * D, W]``."""
    return x.reshape(x.shape[0], -1).T


def _flat(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1)


def sources(cfg: ModelConfig) -> dict[str, Source]:
    """Return the JAX source of every openpi-PyTorch key of ``cfg`` (``key_map`` order)."""
    img, llm = ('PaliGemma', 'img'), ('PaliGemma', 'llm')
    enc = img + ('Transformer', 'encoderblock')
    attn = enc + ('MultiHeadDotProductAttention_0',)
    out: dict[str, Source] = {
        VISION + 'embeddings.patch_embedding.weight':
            Source(img + ('embedding', 'kernel'), (), lambda x: x.transpose(3, 2, 0, 1)),
        VISION + 'embeddings.patch_embedding.bias': Source(img + ('embedding', 'bias')),
        VISION + 'embeddings.position_embedding.weight':
            Source(img + ('pos_embedding',), (), lambda x: x.reshape(-1, x.shape[-1])),
        VISION + 'post_layernorm.weight': Source(img + ('Transformer', 'encoder_norm', 'scale')),
        VISION + 'post_layernorm.bias': Source(img + ('Transformer', 'encoder_norm', 'bias')),
        PROJECTOR + 'weight': Source(img + ('head', 'kernel'), (), _t),
        PROJECTOR + 'bias': Source(img + ('head', 'bias')),
        LANGUAGE + 'embed_tokens.weight': Source(llm + ('embedder', 'input_embedding')),
        LANGUAGE + 'norm.weight': Source(llm + ('final_norm', 'scale')),
        EXPERT + 'norm.dense.weight': Source(llm + ('final_norm_1', 'Dense_0', 'kernel'), (), _t),
        EXPERT + 'norm.dense.bias': Source(llm + ('final_norm_1', 'Dense_0', 'bias')),
    }
    for i in range(cfg.vision.depth):
        pt = f'{VISION}encoder.layers.{i}.'
        for n, ln in ((1, 'LayerNorm_0'), (2, 'LayerNorm_1')):
            out[f'{pt}layer_norm{n}.weight'] = Source(enc + (ln, 'scale'), (i,))
            out[f'{pt}layer_norm{n}.bias'] = Source(enc + (ln, 'bias'), (i,))
        for fc, dense in (('fc1', 'Dense_0'), ('fc2', 'Dense_1')):
            mlp = enc + ('MlpBlock_0', dense)
            out[f'{pt}mlp.{fc}.weight'] = Source(mlp + ('kernel',), (i,), _t)
            out[f'{pt}mlp.{fc}.bias'] = Source(mlp + ('bias',), (i,))
        for proj, name in (('q', 'query'), ('k', 'key'), ('v', 'value')):
            out[f'{pt}self_attn.{proj}_proj.weight'] = Source(attn + (name, 'kernel'), (i,),
                                                              _siglip_in)
            out[f'{pt}self_attn.{proj}_proj.bias'] = Source(attn + (name, 'bias'), (i,), _flat)
        out[f'{pt}self_attn.out_proj.weight'] = Source(attn + ('out', 'kernel'), (i,),
                                                       _heads_out)
        out[f'{pt}self_attn.out_proj.bias'] = Source(attn + ('out', 'bias'), (i,))
    for prefix, sfx, depth in ((LANGUAGE, '', cfg.vlm.depth), (EXPERT, '_1', cfg.expert.depth)):
        layers = llm + ('layers',)
        for i in range(depth):
            pt = f'{prefix}layers.{i}.'
            a = layers + ('attn',)
            out[pt + 'self_attn.q_proj.weight'] = Source(a + (f'q_einsum{sfx}', 'w'), (i,),
                                                         _heads_in)
            out[pt + 'self_attn.k_proj.weight'] = Source(a + (f'kv_einsum{sfx}', 'w'), (i, 0),
                                                         _heads_in)
            out[pt + 'self_attn.v_proj.weight'] = Source(a + (f'kv_einsum{sfx}', 'w'), (i, 1),
                                                         _heads_in)
            out[pt + 'self_attn.o_proj.weight'] = Source(a + (f'attn_vec_einsum{sfx}', 'w'),
                                                         (i,), _heads_out)
            mlp = layers + (f'mlp{sfx}',)
            out[pt + 'mlp.gate_proj.weight'] = Source(mlp + ('gating_einsum',), (i, 0), _t)
            out[pt + 'mlp.up_proj.weight'] = Source(mlp + ('gating_einsum',), (i, 1), _t)
            out[pt + 'mlp.down_proj.weight'] = Source(mlp + ('linear',), (i,), _t)
            for norm, jax_norm in (('input_layernorm', 'pre_attention_norm'),
                                   ('post_attention_layernorm', 'pre_ffw_norm')):
                if sfx:
                    dense = layers + (jax_norm + sfx, 'Dense_0')
                    out[f'{pt}{norm}.dense.weight'] = Source(dense + ('kernel',), (i,), _t)
                    out[f'{pt}{norm}.dense.bias'] = Source(dense + ('bias',), (i,))
                else:
                    out[f'{pt}{norm}.weight'] = Source(layers + (jax_norm, 'scale'), (i,))
    for head in ('action_in_proj', 'action_out_proj', 'time_mlp_in', 'time_mlp_out'):
        out[f'{head}.weight'] = Source((head, 'kernel'), (), _t)
        out[f'{head}.bias'] = Source((head, 'bias'))
    order = [name for entry in key_map(cfg) for name in entry.theirs]
    assert set(order) == set(out), set(order) ^ set(out)
    return {name: out[name] for name in order}


def jax_dims(shapes: dict[Path_, tuple[int, ...]]) -> dict[str, int]:
    """
    Infer model dimensions from JAX array shapes (the names of ``keys.config_dims``).

    :param shapes: tree path → shape.
    """
    dims: dict[str, int] = {}
    img, llm = ('PaliGemma', 'img'), ('PaliGemma', 'llm', 'layers')

    def put(name: str, path: Path_, value: Callable[[tuple[int, ...]], int]) -> None:
        if path in shapes:
            dims[name] = value(shapes[path])

    put('vision.width', img + ('embedding', 'kernel'), lambda s: s[3])
    put('vision.patch_size', img + ('embedding', 'kernel'), lambda s: s[0])
    put('vision.num_tokens', img + ('pos_embedding',), lambda s: s[-2])
    dense0 = img + ('Transformer', 'encoderblock', 'MlpBlock_0', 'Dense_0', 'kernel')
    put('vision.depth', dense0, lambda s: s[0])
    put('vision.mlp_dim', dense0, lambda s: s[2])
    put('vocab_size', ('PaliGemma', 'llm', 'embedder', 'input_embedding'), lambda s: s[0])
    for name, sfx in (('vlm', ''), ('expert', '_1')):
        q = llm + ('attn', f'q_einsum{sfx}', 'w')
        put(f'{name}.depth', q, lambda s: s[0])
        put(f'{name}.width', q, lambda s: s[2])
        put(f'{name}.num_heads*head_dim', q, lambda s: s[1] * s[3])
        put(f'{name}.num_kv_heads*head_dim', llm + ('attn', f'kv_einsum{sfx}', 'w'),
            lambda s: s[2] * s[4])
        put(f'{name}.mlp_dim', llm + (f'mlp{sfx}', 'gating_einsum'), lambda s: s[3])
    put('action_dim', ('action_in_proj', 'kernel'), lambda s: s[0])
    return dims


__all__ = ['PI0_MARKERS', 'Source', 'jax_dims', 'sources']
