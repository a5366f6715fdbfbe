"""Formulas of the π0.5 building blocks checked against hand computations."""

import math

from oxygen_ros.config import get_preset
from oxygen_ros.model.flow import euler_times, sincos_time_embedding
from oxygen_ros.model.layers import (AdaRMSNorm, apply_rope, attention, AttentionMask,
                                     MASK_ALIGN, matmul_short_queries, QueryLayout, RMSNorm,
                                     rope_cos_sin)
from oxygen_ros.model.masks import make_attn_mask
from oxygen_ros.model.pi05 import Pi05Model
import pytest
from reference import eager_attention, suffix_ar
import torch
import torch.nn.functional as F  # noqa: N812


def test_sincos_time_embedding_by_hand():
    # dim 4 -> two periods: min_period and max_period (fraction = linspace(0, 1, 2)).
    t = torch.tensor([0.5, 0.1])
    emb = sincos_time_embedding(t, 4, 4e-3, 4.0)
    for row, tv in enumerate((0.5, 0.1)):
        a0, a1 = 2 * math.pi * tv / 4e-3, 2 * math.pi * tv / 4.0
        want = [math.sin(a0), math.sin(a1), math.cos(a0), math.cos(a1)]
        assert emb[row].tolist() == pytest.approx(want, abs=2e-4)
    # dim 8: periods 4e-3 * 1000 ** (k / 3), k = 0..3.
    emb = sincos_time_embedding(torch.tensor([1.0]), 8, 4e-3, 4.0)
    periods = [4e-3 * 1000 ** (k / 3) for k in range(4)]
    want = [math.sin(2 * math.pi / p) for p in periods] + [math.cos(2 * math.pi / p)
                                                           for p in periods]
    assert emb[0].tolist() == pytest.approx(want, abs=1e-4)
    assert emb.dtype == torch.float32


def test_euler_times_accumulate_in_float32():
    times = euler_times(10)
    assert times.dtype == torch.float32 and times.shape == (10,)
    assert times[0].item() == 1.0
    assert times.tolist() == pytest.approx([1.0 - 0.1 * k for k in range(10)], abs=1e-6)
    t = torch.tensor(1.0)
    for k in range(10):  # openpi: time += dt in float32, not 1 - k / N
        assert times[k].item() == t.item()
        t = t + torch.tensor(-0.1, dtype=torch.float32)


def test_rope_rotates_half_split_pairs():
    # head_dim 4, base 10000: dim 0 pairs with dim 2 (angle p), dim 1 with dim 3 (angle p/100).
    p = 3
    cos, sin = rope_cos_sin(torch.tensor([[p]]), 4, 10_000.0)
    x = torch.tensor([[[[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]]])  # [B=1, S=1, H=2, 4]
    out = apply_rope(x, cos, sin)[0, 0]
    assert out[0].tolist() == pytest.approx([math.cos(p), 0, math.sin(p), 0], abs=1e-6)
    assert out[1].tolist() == pytest.approx([0, math.cos(p / 100), 0, math.sin(p / 100)],
                                            abs=1e-6)


def test_rope_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(pq: int, pk: int) -> float:
        cq, sq = rope_cos_sin(torch.tensor([[pq]]), 8, 10_000.0)
        ck, sk = rope_cos_sin(torch.tensor([[pk]]), 8, 10_000.0)
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum().item()

    assert score(7, 3) == pytest.approx(score(104, 100), abs=1e-4)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-3)


def test_rmsnorm_scales_by_one_plus_weight():
    norm = RMSNorm(2, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([0.5, -0.25]))
    y, gate = norm(torch.tensor([[3.0, 4.0]]))
    rms = math.sqrt((9 + 16) / 2 + 1e-6)
    assert y[0].tolist() == pytest.approx([3 / rms * 1.5, 4 / rms * 0.75], rel=1e-6)
    assert gate is None


def test_ada_rmsnorm_scale_shift_gate_order():
    norm = AdaRMSNorm(2, 3, eps=1e-6)
    mod = torch.tensor([[0.5, -0.5, 1.0, 2.0, 3.0, 4.0]])  # scale | shift | gate
    y, gate = norm(torch.tensor([[[3.0, 4.0]]]), mod)
    rms = math.sqrt(12.5 + 1e-6)
    assert y[0, 0].tolist() == pytest.approx([3 / rms * 1.5 + 1.0, 4 / rms * 0.5 + 2.0],
                                             rel=1e-6)
    assert gate[0, 0].tolist() == [3.0, 4.0]
    with pytest.raises(ValueError, match='modulation'):
        norm(torch.ones(1, 1, 2))


def test_make_attn_mask_docstring_examples():
    valid = torch.ones(1, 6, dtype=torch.bool)
    causal = make_attn_mask(valid, torch.tensor([[1, 1, 1, 1, 1, 1]]))
    assert torch.equal(causal[0], torch.ones(6, 6, dtype=torch.bool).tril())
    prefix_lm = make_attn_mask(valid, torch.tensor([[0, 0, 0, 1, 1, 1]]))
    want = torch.tensor([[1, 1, 1, 0, 0, 0],
                         [1, 1, 1, 0, 0, 0],
                         [1, 1, 1, 0, 0, 0],
                         [1, 1, 1, 1, 0, 0],
                         [1, 1, 1, 1, 1, 0],
                         [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(prefix_lm[0], want)
    # first entry 1 instead of 0 changes nothing (openpi docstring)
    assert torch.equal(make_attn_mask(valid, torch.tensor([[1, 0, 0, 1, 1, 1]])), prefix_lm)
    blocks = make_attn_mask(torch.ones(1, 10, dtype=torch.bool),
                            torch.tensor([[1, 0, 1, 0, 1, 0, 0, 1, 0, 0]]))[0]
    block_id = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3, 3, 3])
    assert torch.equal(blocks, block_id[None, :] <= block_id[:, None])


def test_make_attn_mask_padding_and_suffix():
    valid = torch.tensor([[True, True, False, True, True, True]])
    ar = torch.cat([torch.zeros(3, dtype=torch.int64), suffix_ar(3)])
    mask = make_attn_mask(valid, ar)[0]
    assert not mask[:, 2].any() and not mask[2].any()
    assert mask[3:, [0, 1, 3, 4, 5]].all()  # actions: valid prefix + each other
    assert not mask[:3, 3:].any()  # the prefix never sees the suffix
    with pytest.raises(ValueError, match='valid must be'):
        make_attn_mask(torch.ones(6, dtype=torch.bool), ar)


@pytest.mark.parametrize('heads,kv_heads,queries', [(4, 1, 1), (4, 1, 10), (4, 2, 7),
                                                    (4, 1, 100), (2, 2, 5)])
def test_attention_layouts_match_eager(heads, kv_heads, queries):
    torch.manual_seed(heads * 100 + queries)
    b, p, d = 2, 30, 8
    q = torch.randn(b, queries, heads, d)
    k, v = torch.randn(b, p, kv_heads, d), torch.randn(b, p, kv_heads, d)
    mask = torch.rand(b, queries, p) > 0.3
    mask[..., 0] = True
    prepared = AttentionMask.build(mask, heads, kv_heads, torch.float32)
    want_layout = (QueryLayout.HEADS if queries > 64 or heads == kv_heads
                   else QueryLayout.FOLDED)
    assert prepared.layout is want_layout
    out = attention(q, k.transpose(1, 2), v.transpose(1, 2), prepared)
    assert torch.allclose(out, eager_attention(q, k, v, mask), atol=1e-6)


@pytest.mark.parametrize('queries,keys', [(1, 200), (50, 1074), (7, 968), (100, 129),
                                          (3, 256)])
def test_masks_are_16_aligned_views_with_the_unaligned_result(queries, keys):
    """A bias whose strides are not multiples of 16 is copied by CUDA's efficient SDPA."""
    torch.manual_seed(queries + keys)
    heads, kv_heads, d = 8, 1, 16
    q = torch.randn(1, queries, heads, d)
    k, v = torch.randn(1, kv_heads, keys, d), torch.randn(1, kv_heads, keys, d)
    mask = torch.rand(1, queries, keys) > 0.4
    mask[..., 0] = True
    aligned = AttentionMask.build(mask, heads, kv_heads, torch.float32)
    assert aligned.bias.shape[-1] == keys and aligned.bias.stride(-1) == 1
    assert all(s % MASK_ALIGN == 0 for s in aligned.bias.stride()[:-1]), aligned.bias.stride()
    unaligned = AttentionMask(torch.empty(aligned.bias.shape).copy_(aligned.bias),
                              aligned.layout)              # what an unaligned allocation gives
    assert keys % MASK_ALIGN == 0 or unaligned.bias.stride(-2) % MASK_ALIGN != 0
    assert torch.equal(aligned.bias, unaligned.bias)
    assert torch.equal(attention(q, k, v, aligned), attention(q, k, v, unaligned))


@pytest.mark.parametrize('queries', [1, 10, 64, 65])
def test_matmul_short_queries_equal_sdpa_and_leave_long_queries_to_it(queries, monkeypatch):
    """Folded attention as q k^T, float32 softmax, p v: SDPA's result without calling it."""
    torch.manual_seed(0)
    b, heads, kv_heads, d, keys = 2, 8, 1, 32, 83
    q = torch.randn(b, queries, heads, d, dtype=torch.bfloat16)
    k, v = (torch.randn(b, kv_heads, keys, d, dtype=torch.bfloat16) for _ in range(2))
    mask = torch.rand(b, queries, keys) < 0.6
    mask[..., 0] = True
    bias = AttentionMask.build(mask, heads, kv_heads, torch.bfloat16)
    want = attention(q, k, v, bias)
    exact = attention(q.float(), k.float(), v.float(),
                      AttentionMask.build(mask, heads, kv_heads, torch.float32))
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return sdpa(*args, **kwargs)
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, 'scaled_dot_product_attention', counted)
    with matmul_short_queries():
        got = attention(q, k, v, bias)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    assert len(calls) == (bias.layout is QueryLayout.HEADS)   # only long queries use SDPA
    # Both round the probabilities to bfloat16: each as far from float32 as the other.
    err_sdpa, err_matmul = ((x.float() - exact).abs().max().item() for x in (want, got))
    assert err_matmul <= 2 * err_sdpa + 1e-3, (err_matmul, err_sdpa)
    with matmul_short_queries(False):
        assert torch.equal(attention(q, k, v, bias), want)
    calls.clear()
    attention(q, k, v, bias)                        # default on the CPU: SDPA, not compiled
    assert len(calls) == 1


def test_text_embedding_scale_and_tied_logits():
    torch.manual_seed(0)
    model = Pi05Model(get_preset('tiny').model)
    ids = torch.tensor([[5, 7]])
    emb = model.embed_text(ids)
    assert torch.equal(emb, model.embedding[ids] * 4.0)  # sqrt(16)
    hidden = torch.randn(3, 16)
    normed, _ = model.vlm.final_norm(hidden)
    assert torch.allclose(model.lm_logits(hidden), normed @ model.embedding.T, atol=1e-5)
