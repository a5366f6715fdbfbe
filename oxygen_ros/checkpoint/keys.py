"""
The table from our parameter names to openpi-PyTorch checkpoint keys and shapes.

The layout is openpi's ``examples/convert_jax_model_to_pytorch.py`` output
(``docs/checkpoints.md#key-layouts``).

PyTorch ``Linear`` weights are ``[out, in]``. Attention heads are flattened head-major
(``q_proj[h * D + d, :]``). Our fused parameters (SigLIP ``qkv``, Gemma ``qkv`` and
``gate_up``) are the concatenation along dim 0 of the checkpoint tensors listed, in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
import re

from oxygen_ros.config import GemmaConfig, ModelConfig

VISION = 'paligemma_with_expert.paligemma.model.vision_tower.vision_model.'
PROJECTOR = 'paligemma_with_expert.paligemma.model.multi_modal_projector.linear.'
LANGUAGE = 'paligemma_with_expert.paligemma.model.language_model.'
EXPERT = 'paligemma_with_expert.gemma_expert.model.'

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """
    One of our parameters and the checkpoint tensor(s) it is made of.

    :ivar ours: our ``state_dict`` key.
    :ivar theirs: openpi keys, concatenated along dim 0 in this order.
    :ivar shapes: expected shape of each checkpoint tensor.
    """

    ours: str
    theirs: tuple[str, ...]
    shapes: tuple[Shape, ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        """Split sizes along dim 0 (one per checkpoint tensor)."""
        return tuple(s[0] for s in self.shapes)


LM_HEAD = 'paligemma_with_expert.paligemma.lm_head.weight'
"""The LM head's key: the tied embedding's alias, or an untied head of its own."""


def key_map(cfg: ModelConfig, *, untied_lm_head: bool = False) -> tuple[KeyEntry, ...]:
    """
    Return every parameter of ``Pi05Model(cfg)`` with its checkpoint key(s) and shape(s).

    :param untied_lm_head: the model has its own ``lm_head`` (``LM_HEAD``).
    """
    entries: list[KeyEntry] = []

    def add(ours: str, theirs: str | list[str], *shapes: Shape) -> None:
        names = (theirs,) if isinstance(theirs, str) else tuple(theirs)
        entries.append(KeyEntry(ours, names, shapes))

    v = cfg.vision
    w, m = v.width, v.mlp_dim
    add('vision.patch_embed.weight', VISION + 'embeddings.patch_embedding.weight',
        (w, 3, v.patch_size, v.patch_size))
    add('vision.patch_embed.bias', VISION + 'embeddings.patch_embedding.bias', (w,))
    add('vision.pos_embed', VISION + 'embeddings.position_embedding.weight', (v.num_tokens, w))
    for i in range(v.depth):
        ours, theirs = f'vision.blocks.{i}.', f'{VISION}encoder.layers.{i}.'
        for our_norm, their_norm in (('norm1', 'layer_norm1'), ('norm2', 'layer_norm2')):
            add(f'{ours}{our_norm}.weight', f'{theirs}{their_norm}.weight', (w,))
            add(f'{ours}{our_norm}.bias', f'{theirs}{their_norm}.bias', (w,))
        add(ours + 'qkv.weight', [f'{theirs}self_attn.{x}_proj.weight' for x in 'qkv'],
            (w, w), (w, w), (w, w))
        add(ours + 'qkv.bias', [f'{theirs}self_attn.{x}_proj.bias' for x in 'qkv'],
            (w,), (w,), (w,))
        add(ours + 'out.weight', theirs + 'self_attn.out_proj.weight', (w, w))
        add(ours + 'out.bias', theirs + 'self_attn.out_proj.bias', (w,))
        add(ours + 'fc1.weight', theirs + 'mlp.fc1.weight', (m, w))
        add(ours + 'fc1.bias', theirs + 'mlp.fc1.bias', (m,))
        add(ours + 'fc2.weight', theirs + 'mlp.fc2.weight', (w, m))
        add(ours + 'fc2.bias', theirs + 'mlp.fc2.bias', (w,))
    add('vision.final_norm.weight', VISION + 'post_layernorm.weight', (w,))
    add('vision.final_norm.bias', VISION + 'post_layernorm.bias', (w,))
    add('projector.weight', PROJECTOR + 'weight', (cfg.vlm.width, w))
    add('projector.bias', PROJECTOR + 'bias', (cfg.vlm.width,))
    add('embedding', LANGUAGE + 'embed_tokens.weight', (cfg.vocab_size, cfg.vlm.width))
    if untied_lm_head:
        add('lm_head', LM_HEAD, (cfg.vocab_size, cfg.vlm.width))
    _gemma_entries(add, 'vlm', LANGUAGE, cfg.vlm, adaptive=False)
    _gemma_entries(add, 'expert', EXPERT, cfg.expert, adaptive=True)
    we, a = cfg.expert.width, cfg.action_dim
    for name, shape in (('action_in_proj', (we, a)), ('action_out_proj', (a, we)),
                        ('time_mlp_in', (we, we)), ('time_mlp_out', (we, we))):
        add(f'{name}.weight', f'{name}.weight', shape)
        add(f'{name}.bias', f'{name}.bias', shape[:1])
    return tuple(entries)


def _gemma_entries(add: Callable[..., None], ours: str, theirs: str, g: GemmaConfig, *,
                   adaptive: bool) -> None:
    w, m = g.width, g.mlp_dim
    hd, kd = g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim
    norms = [(f'{ours}.layers.{i}.{our}', f'{theirs}layers.{i}.{their}')
             for i in range(g.depth)
             for our, their in (('input_norm', 'input_layernorm'),
                                ('post_norm', 'post_attention_layernorm'))]
    norms.append((f'{ours}.final_norm', f'{theirs}norm'))
    for i in range(g.depth):
        o, t = f'{ours}.layers.{i}.', f'{theirs}layers.{i}.'
        add(o + 'qkv.weight', [f'{t}self_attn.{x}_proj.weight' for x in 'qkv'],
            (hd, w), (kd, w), (kd, w))
        add(o + 'o.weight', t + 'self_attn.o_proj.weight', (w, hd))
        add(o + 'mlp.gate_up.weight', [t + 'mlp.gate_proj.weight', t + 'mlp.up_proj.weight'],
            (m, w), (m, w))
        add(o + 'mlp.down.weight', t + 'mlp.down_proj.weight', (w, m))
    for o, t in norms:
        if adaptive:
            add(o + '.dense.weight', t + '.dense.weight', (3 * w, w))
            add(o + '.dense.bias', t + '.dense.bias', (3 * w,))
        else:
            add(o + '.weight', t + '.weight', (w,))


def checkpoint_dims(shapes: dict[str, Shape]) -> dict[str, int]:
    """
    Infer model dimensions from checkpoint tensor shapes (openpi key names).

    :param shapes: openpi key -> shape.
    :returns: dimension name (as in :func:`config_dims`) -> value, for the dims found.
    """
    dims: dict[str, int] = {}

    def put(name: str, key: str, axis: int) -> None:
        if key in shapes and len(shapes[key]) > axis:
            dims[name] = shapes[key][axis]

    patch = VISION + 'embeddings.patch_embedding.weight'
    put('vision.width', patch, 0)
    put('vision.patch_size', patch, 2)
    put('vision.num_tokens', VISION + 'embeddings.position_embedding.weight', 0)
    put('vision.mlp_dim', VISION + 'encoder.layers.0.mlp.fc1.weight', 0)
    put('vocab_size', LANGUAGE + 'embed_tokens.weight', 0)
    put('vlm.width', LANGUAGE + 'embed_tokens.weight', 1)
    for name, prefix in (('vlm', LANGUAGE), ('expert', EXPERT)):
        layer0 = prefix + 'layers.0.'
        put(f'{name}.width', layer0 + 'self_attn.q_proj.weight', 1)
        put(f'{name}.num_heads*head_dim', layer0 + 'self_attn.q_proj.weight', 0)
        put(f'{name}.num_kv_heads*head_dim', layer0 + 'self_attn.k_proj.weight', 0)
        put(f'{name}.mlp_dim', layer0 + 'mlp.gate_proj.weight', 0)
    put('action_dim', 'action_in_proj.weight', 1)
    for name, prefix in (('vision.depth', VISION + 'encoder.layers.'),
                         ('vlm.depth', LANGUAGE + 'layers.'),
                         ('expert.depth', EXPERT + 'layers.')):
        pattern = re.compile(re.escape(prefix) + r'(\d+)\.')
        found = {int(mt.group(1)) for key in shapes if (mt := pattern.match(key))}
        if found:
            dims[name] = max(found) + 1
    return dims


def config_dims(cfg: ModelConfig) -> dict[str, int]:
    """Return the dimensions of a preset under the names used by :func:`checkpoint_dims`."""
    v = cfg.vision
    dims = {'vision.width': v.width, 'vision.patch_size': v.patch_size,
            'vision.num_tokens': v.num_tokens, 'vision.mlp_dim': v.mlp_dim,
            'vision.depth': v.depth, 'vocab_size': cfg.vocab_size, 'action_dim': cfg.action_dim}
    for name, g in (('vlm', cfg.vlm), ('expert', cfg.expert)):
        dims.update({f'{name}.width': g.width, f'{name}.depth': g.depth,
                     f'{name}.num_heads*head_dim': g.num_heads * g.head_dim,
                     f'{name}.num_kv_heads*head_dim': g.num_kv_heads * g.head_dim,
                     f'{name}.mlp_dim': g.mlp_dim})
    return dims


__all__ = ['KeyEntry', 'LM_HEAD', 'checkpoint_dims', 'config_dims', 'key_map']
