"""
The paged attention kernel's test cases: inputs, the gathered reference, the interpreter.

``interpreted_kernel`` gives the CPU tests the kernel in Triton's interpreter (or skips);
``make_inputs`` and ``gathered_attention`` serve them and ``test/gpu`` alike.
"""

import importlib

from oxygen_ros.model.layers import apply_rope, attention, AttentionMask, rope_cos_sin
from oxygen_ros.model.masks import make_attn_mask
import pytest
import torch


def interpreted_kernel():
    """
    Return ``paged_decode`` with its kernels in Triton's CPU interpreter, or skip.

    ``test/conftest.py`` sets ``TRITON_INTERPRET=1`` without CUDA; a process with a GPU runs
    the compiled kernels and skips these CPU checks (``test/gpu`` has its own).
    """
    pytest.importorskip('triton', reason='the paged attention kernel needs triton '
                                         '(requirements/test.txt)')
    module = importlib.import_module('oxygen_ros.backends.fast_path.kernels.paged_decode')
    if not module.INTERPRETED:
        pytest.skip('the kernels are compiled for the GPU in this process (TRITON_INTERPRET '
                    'unset: the CPU checks run in the interpreter)')
    return module


def make_inputs(b, t, hq, hkv, d, c, dtype, *, device='cpu', slots=512, layers=2, seed=0,
                valid=None, rope=False):
    """
    Return the kernel's arguments but ``q_index``: random, row 1 without context.

    With ``rope``: q, k_new and v_new are views of one fused Q/K/V row per token (as a
    projection returns them) and ``cos``/``sin`` the RoPE of positions ``40 + 3 b + i``.
    """
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)
    k_pool, v_pool = randn(layers, slots, hkv, d), randn(layers, slots, hkv, d)
    wide = torch.randint(0, slots, (b, c + 7), generator=gen)
    mask = torch.rand(b, c, generator=gen) < 0.75
    if b > 1:
        mask[1] = False                                   # a row with no context at all
    new_valid = torch.ones(b, t, dtype=torch.bool) if valid is None else valid
    wide, k_pool, v_pool = wide.to(device), k_pool.to(device), v_pool.to(device)
    out = {'q': randn(b, t, hq, d).to(device), 'k_pool': k_pool[1], 'v_pool': v_pool[1],
           'ctx_slots': wide[:, 3:3 + c],                # a strided view, as a slice is
           'ctx_mask': mask.to(device), 'k_new': randn(b, t, hkv, d).to(device),
           'v_new': randn(b, t, hkv, d).to(device), 'new_valid': new_valid.to(device)}
    if rope:
        qkv = randn(b, t, hq + 2 * hkv, d).to(device)
        out['q'], out['k_new'], out['v_new'] = qkv.split([hq, hkv, hkv], 2)
        positions = 40 + 3 * torch.arange(b)[:, None] + torch.arange(t)
        out['cos'], out['sin'] = (a.to(device) for a in rope_cos_sin(positions, d, 10_000.0))
    return out


def gathered_attention(x, q_index, dtype=None, causal=True):
    """
    Return the gathered attention of the queries ``q_index`` (float32 by default).

    ``ExtendCall``'s (``causal``) or ``denoise_context``'s (not: every valid new token sees
    every other); with ``cos``/``sin`` in ``x``, q and k_new rotated first
    (``layers.apply_rope``, in the inputs' dtype as the eager model does).
    """
    dtype = dtype or torch.float32
    b, t = x['new_valid'].shape
    dev = x['q'].device
    c = x['ctx_slots'].shape[1]
    hq, hkv, d = x['q'].shape[2], x['k_pool'].shape[1], x['q'].shape[3]
    q, k_new = x['q'], x['k_new']
    if 'cos' in x:
        q, k_new = (apply_rope(a, x['cos'], x['sin']) for a in (q, k_new))
    flat = x['ctx_slots'].reshape(-1)
    kk = torch.cat([x['k_pool'].index_select(0, flat).view(b, c, hkv, d), k_new], 1)
    vv = torch.cat([x['v_pool'].index_select(0, flat).view(b, c, hkv, d), x['v_new']], 1)
    ar = torch.ones(b, t, dtype=torch.int64, device=dev)
    if not causal:
        ar[:, 1:] = 0                                     # one block: the prefix-LM rule
    own = make_attn_mask(x['new_valid'], ar) | torch.eye(t, dtype=torch.bool, device=dev)
    mask = torch.cat([x['ctx_mask'][:, None, :].expand(b, t, c), own], 2)
    rows = q_index[:, :, None]
    mask = torch.gather(mask, 1, rows.expand(-1, -1, mask.shape[2]))
    q = torch.gather(q, 1, rows[..., None].expand(-1, -1, hq, x['q'].shape[3]))
    return attention(q.to(dtype), kk.to(dtype).transpose(1, 2), vv.to(dtype).transpose(1, 2),
                     AttentionMask.build(mask, hq, hkv, dtype))
