"""
openpi's JAX parameter tree of π0.5 built from openpi-PyTorch tensors, written with orbax.

Written out by hand from openpi's ``models/{pi0,gemma,siglip}.py`` (tree paths, scanned layers
stacked on a leading axis, einsum kernel layouts) as the inverse of its
``examples/convert_jax_model_to_pytorch.py``, independently of ``oxygen_ros.checkpoint``.
"""

from pathlib import Path

import numpy as np
from oxygen_ros.checkpoint.keys import EXPERT, LANGUAGE, PROJECTOR, VISION
from oxygen_ros.config import ModelConfig


def jax_tree(t: dict[str, np.ndarray], cfg: ModelConfig) -> dict:
    """Return the nested π0.5 params of openpi (``PaliGemma/...`` and the four heads)."""
    v, g, e = cfg.vision, cfg.vlm, cfg.expert

    def stack(fmt, depth, fn=lambda x: x):
        return np.stack([fn(t[fmt.format(i)]) for i in range(depth)])

    layer = VISION + 'encoder.layers.{}.'
    attn = {}
    for name, proj in (('query', 'q'), ('key', 'k'), ('value', 'v')):
        attn[name] = {  # flax DenseGeneral: kernel [W, H, D], bias [H, D]
            'kernel': stack(layer + f'self_attn.{proj}_proj.weight', v.depth,
                            lambda w: w.T.reshape(v.width, v.num_heads, v.head_dim)),
            'bias': stack(layer + f'self_attn.{proj}_proj.bias', v.depth,
                          lambda b: b.reshape(v.num_heads, v.head_dim))}
    attn['out'] = {'kernel': stack(layer + 'self_attn.out_proj.weight', v.depth,
                                   lambda w: w.T.reshape(v.num_heads, v.head_dim, v.width)),
                   'bias': stack(layer + 'self_attn.out_proj.bias', v.depth)}
    block = {
        'LayerNorm_0': {'scale': stack(layer + 'layer_norm1.weight', v.depth),
                        'bias': stack(layer + 'layer_norm1.bias', v.depth)},
        'LayerNorm_1': {'scale': stack(layer + 'layer_norm2.weight', v.depth),
                        'bias': stack(layer + 'layer_norm2.bias', v.depth)},
        'MlpBlock_0': {f'Dense_{n}': {'kernel': stack(layer + f'mlp.fc{n + 1}.weight', v.depth,
                                                      np.transpose),
                                      'bias': stack(layer + f'mlp.fc{n + 1}.bias', v.depth)}
                       for n in (0, 1)},
        'MultiHeadDotProductAttention_0': attn}
    img = {
        'embedding': {'kernel': t[VISION + 'embeddings.patch_embedding.weight'].transpose(
            2, 3, 1, 0), 'bias': t[VISION + 'embeddings.patch_embedding.bias']},
        'pos_embedding': t[VISION + 'embeddings.position_embedding.weight'][None],
        'Transformer': {'encoderblock': block, 'encoder_norm': {
            'scale': t[VISION + 'post_layernorm.weight'],
            'bias': t[VISION + 'post_layernorm.bias']}},
        'head': {'kernel': t[PROJECTOR + 'weight'].T, 'bias': t[PROJECTOR + 'bias']}}

    def gemma(prefix, c, sfx):
        lay = prefix + 'layers.{}.'
        q = stack(lay + 'self_attn.q_proj.weight', c.depth,   # einsum [H, W, D]
                  lambda w: w.reshape(c.num_heads, c.head_dim, c.width).transpose(0, 2, 1))
        kv = np.stack([stack(lay + f'self_attn.{x}_proj.weight', c.depth, lambda w: w.reshape(
            c.num_kv_heads, c.head_dim, c.width).transpose(0, 2, 1)) for x in 'kv'], axis=1)
        o = stack(lay + 'self_attn.o_proj.weight', c.depth,
                  lambda w: w.T.reshape(c.num_heads, c.head_dim, c.width))
        gating = np.stack([stack(lay + f'mlp.{x}_proj.weight', c.depth, np.transpose)
                           for x in ('gate', 'up')], axis=1)
        layers = {'attn': {f'q_einsum{sfx}': {'w': q}, f'kv_einsum{sfx}': {'w': kv},
                           f'attn_vec_einsum{sfx}': {'w': o}},
                  f'mlp{sfx}': {'gating_einsum': gating,
                                'linear': stack(lay + 'mlp.down_proj.weight', c.depth,
                                                np.transpose)}}
        for norm, jax_norm in (('input_layernorm', 'pre_attention_norm'),
                               ('post_attention_layernorm', 'pre_ffw_norm')):
            if sfx:
                layers[jax_norm + sfx] = {'Dense_0': {
                    'kernel': stack(lay + norm + '.dense.weight', c.depth, np.transpose),
                    'bias': stack(lay + norm + '.dense.bias', c.depth)}}
            else:
                layers[jax_norm] = {'scale': stack(lay + norm + '.weight', c.depth)}
        return layers

    layers = gemma(LANGUAGE, g, '')
    for key, value in gemma(EXPERT, e, '_1').items():
        if key == 'attn':
            layers['attn'].update(value)
        else:
            layers[key] = value
    llm = {'embedder': {'input_embedding': t[LANGUAGE + 'embed_tokens.weight']},
           'layers': layers, 'final_norm': {'scale': t[LANGUAGE + 'norm.weight']},
           'final_norm_1': {'Dense_0': {'kernel': t[EXPERT + 'norm.dense.weight'].T,
                                        'bias': t[EXPERT + 'norm.dense.bias']}}}
    tree = {'PaliGemma': {'img': img, 'llm': llm}}
    for head in ('action_in_proj', 'action_out_proj', 'time_mlp_in', 'time_mlp_out'):
        tree[head] = {'kernel': t[f'{head}.weight'].T, 'bias': t[f'{head}.bias']}
    return tree


def with_value_leaves(tree):
    """Return the tree as openpi training saves it (``nnx.State``: every leaf under 'value')."""
    if isinstance(tree, dict):
        return {k: with_value_leaves(v) for k, v in tree.items()}
    return {'value': tree}


def write_orbax(folder: Path, tree: dict) -> Path:
    """Save ``{"params": tree}`` as openpi does (orbax PyTreeCheckpointer, jax arrays)."""
    import jax
    import orbax.checkpoint as ocp
    arrays = jax.tree_util.tree_map(jax.numpy.asarray, tree)
    with ocp.PyTreeCheckpointer() as checkpointer:
        checkpointer.save((folder / 'params').absolute(), {'params': arrays})
    return folder / 'params'
