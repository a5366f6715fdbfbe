"""
RTC's guided step attends the prefix apart from the suffix: same values, no prefix-sized work.

``denoise.split_prefix_attention`` against ``layers.attention`` over the concatenated K/V (both
query layouts, both attention kernels, values and vector-Jacobian products), and the graph
AOTAutograd lowers from the compiled guided step (``GuidedDenoiseCall.guided_step``, as the
fast path compiles it): no tensor with the prefix's rows is computed in it (no concatenation
of the prefix K/V, no key or value gradient of its rows, no per-step dtype conversion).
"""

from oxygen_ros.config import get_preset
from oxygen_ros.model.denoise import split_prefix_attention
from oxygen_ros.model.guidance import guidance_weights, GuidedDenoiseCall
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.layers import attention, AttentionMask, matmul_short_queries, QueryLayout
from oxygen_ros.model.pi05 import build_model
import pytest
import torch
from torch._dynamo.backends.common import aot_autograd


def _suffix_over_prefix(s, heads, kv_heads, prefix=37, d=16, seed=0):
    """Return random q, suffix k/v, prefix K/V and the mask ``denoise_context`` builds."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, s, heads, d, generator=gen)
    k, v = (torch.randn(2, s, kv_heads, d, generator=gen) for _ in range(2))
    pk, pv = (torch.randn(2, kv_heads, prefix, d, generator=gen) for _ in range(2))
    valid = torch.rand(2, prefix, generator=gen) > 0.3          # padded prefix slots
    allowed = torch.cat([valid[:, None].expand(2, s, prefix), torch.ones(2, s, s, dtype=bool)],
                        2)
    return q, k, v, pk, pv, AttentionMask.build(allowed, heads, kv_heads, torch.float32)


@pytest.mark.parametrize('s, heads, kv_heads, layout', [
    (10, 4, 1, QueryLayout.FOLDED), (70, 4, 2, QueryLayout.HEADS), (6, 2, 2, QueryLayout.HEADS)])
@pytest.mark.parametrize('matmul', [True, False])
def test_split_prefix_attention_equals_attention_over_the_concatenation(
        s, heads, kv_heads, layout, matmul):
    """Float32, 1e-6: the values and the vector-Jacobian product in the suffix's q, k, v."""
    q, k, v, pk, pv, mask = _suffix_over_prefix(s, heads, kv_heads)
    assert mask.layout is layout

    def concatenated(q, k, v):
        return attention(q, torch.cat([pk, k.transpose(1, 2)], 2),
                         torch.cat([pv, v.transpose(1, 2)], 2), mask)

    def split(q, k, v):
        return split_prefix_attention(q, k, v, pk, pv, mask)
    cot = torch.randn(2, s, heads * q.shape[-1], generator=torch.Generator().manual_seed(9))
    with matmul_short_queries(matmul):
        want, want_vjp = torch.func.vjp(concatenated, q, k, v)
        got, got_vjp = torch.func.vjp(split, q, k, v)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        for g, w in zip(got_vjp(cot), want_vjp(cot)):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=0)


def _prefix_sized(graph, rows, head_dim):
    """Return the computed nodes (not inputs, not views) shaped ``[..., r, head_dim]``."""
    out = []
    for node in graph.nodes:
        val = node.meta.get('val')
        if node.op != 'call_function' or getattr(node.target, 'is_view', False) or \
                not isinstance(val, torch.Tensor) or val.dim() < 2:
            continue
        assert all(isinstance(n, int) for n in val.shape), node   # static: sizes compare
        if tuple(val.shape[-2:]) in {(r, head_dim) for r in rows}:
            out.append(f'{node.target} {tuple(val.shape)} {val.dtype}')
    return out


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_the_compiled_guided_step_computes_nothing_of_the_prefix_size(dtype):
    """
    No concatenation, gradient or conversion of the prefix K/V in any step (lowered graph).

    The concatenated form copied the prefix K/V into ``[P + H, D]`` per layer and step and
    formed their ``[P + H, D]`` key and value gradients; in bfloat16 a float32 copy of the
    prefix keys per layer and step would show as well (the call converts them once).
    """
    torch.manual_seed(0)
    cfg = get_preset('tiny').model
    model = build_model(cfg, dtype=dtype, device='cpu')
    ex = cfg.expert
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm.graph)
        return gm
    call = GuidedDenoiseCall(model)
    torch._dynamo.reset()       # no sizes made dynamic by earlier compiles of the same step
    call.step = torch.compile(call.guided_step, backend=aot_autograd(fw_compiler=record),
                              fullgraph=True, dynamic=False)
    p, horizon = 137, 5         # P, P + H, H * G and the head dim all differ
    pool = KVCache(cfg.vlm, 256, dtype=dtype)
    pool.k.normal_()
    pool.v.normal_()
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():        # every input as the backend passes it
        noise, target = (torch.randn(1, horizon, cfg.action_dim, generator=gen)
                         for _ in range(2))
        args = (pool.k, pool.v, torch.arange(16, 16 + p)[None], torch.arange(p)[None] < 120,
                torch.tensor([120]), noise, target, torch.linspace(1, 0, horizon),
                guidance_weights(cfg.num_denoise_steps, 5.0))
        got = call(*args)
        call.step = call.guided_step
        want = call(*args)
    assert len(graphs) == 1 and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-5 if dtype == torch.float32 else 0.1, rtol=0)
    ops = {str(n.target) for n in graphs[0].nodes}
    assert any('bmm' in o or 'mm' in o for o in ops)            # the step and its backward
    assert _prefix_sized(graphs[0], (p, p + horizon), ex.head_dim) == []
