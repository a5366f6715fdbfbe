"""
FlexAttention for the prefix and SigLIP equals today's attention (float32, 1e-5).

The prefix's block mask is openpi's ``make_attn_mask`` rule plus "every query attends itself"
(padding), built from per-row vectors inside the graph: one compiled function serves every
length and pattern (Dynamo compiles once), ``PrefillCall`` and ``VisionCall`` with it equal
the eager model. The compiler here is ``aot_eager`` (Dynamo's graph, FlexAttention run by
PyTorch's reference of it) and, in the slow tests, Inductor's C++ flash-style template at
static shapes (torch 2.13's template does not build at the prefill's symbolic lengths:
docs/limits.md).
"""

from oxygen_ros.backends.fast_path.static_calls import PrefillCall, VisionCall
from oxygen_ros.config import get_preset, PrefixAttention
from oxygen_ros.model.flex import (
    flex_kernels, prefill_attention, prefix_attention, prefix_block_mask, prefix_row_mask)
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.layers import attention, AttentionMask
from oxygen_ros.model.masks import make_attn_mask
from oxygen_ros.model.pi05 import build_model
import pytest
import torch
from torch._dynamo.backends.registry import lookup_backend
import torch.nn.functional as F  # noqa: N812

TOL = {'atol': 1e-5, 'rtol': 0}
FLEX = 'flex_attention'
"""The name of PyTorch's FlexAttention operator in a Dynamo graph."""


pytestmark = pytest.mark.usefixtures('fresh_dynamo')


def _inputs(p, count, images, text_ar, heads=(8, 1, 32), holes=(), seed=0):
    """Return q, k, v of a prefix of ``p`` slots, the first ``count`` valid, and its vectors."""
    h, hkv, d = heads
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, p, h, d, generator=gen)
    k = torch.randn(1, p, hkv, d, generator=gen).transpose(1, 2)    # as PrefillCall's views
    v = torch.randn(1, p, hkv, d, generator=gen).transpose(1, 2)
    valid = (torch.arange(p) < count)[None]
    valid[0, list(holes)] = False
    ar = torch.cat([torch.zeros(1, images, dtype=torch.int64),
                    torch.full((1, p - images), text_ar)], 1)
    return q, k, v, valid, ar


def _dense(q, k, v, valid, ar):
    """Today's attention: ``make_attn_mask | eye`` as a 16-aligned bias, fused SDPA."""
    mask = make_attn_mask(valid, ar) | torch.eye(valid.shape[1], dtype=torch.bool)
    return attention(q, k, v, AttentionMask.build(mask, q.shape[2], k.shape[1], q.dtype))


def _flex(q, k, v, valid, ar):
    return prefix_attention(q, k, v, prefix_block_mask(valid, ar))


@pytest.mark.parametrize('text_ar', [0, 1], ids=['bidirectional', 'causal_text'])
@pytest.mark.parametrize('p,count,images,holes', [
    (208, 208, 128, ()), (208, 150, 128, ()), (272, 261, 256, ()), (300, 290, 128, (5, 140))],
    ids=['no-padding', 'padded', 'short-prompt', 'holes'])
@pytest.mark.parametrize('heads', [(8, 1, 32), (2, 1, 8)], ids=['8x1x32', 'tiny-padded'])
def test_flex_prefix_attention_equals_the_dense_bias(text_ar, p, count, images, holes, heads):
    """Head dims below 16 (tiny) run zero-padded to 16 with the true scale: still equal."""
    q, k, v, valid, ar = _inputs(p, count, images, text_ar, heads, holes=holes)
    torch.testing.assert_close(_flex(q, k, v, valid, ar), _dense(q, k, v, valid, ar), **TOL)
    mask = make_attn_mask(valid, ar) | torch.eye(p, dtype=torch.bool)
    last = torch.tensor([count - 1])
    assert torch.equal(prefix_row_mask(valid, ar, last), mask[:, count - 1][:, None])


def test_the_block_mask_skips_masked_tiles_and_the_mask_on_full_ones():
    """
    Causal text after 256 image tokens, 4 padding slots, 128 x 128 tiles.

    Image queries: both image tiles full (no mask evaluated), the text tile empty (skipped).
    Text queries: every tile partial (the causal diagonal; padding rows attend themselves).
    """
    _, _, _, valid, ar = _inputs(384, 380, 256, 1)
    block = prefix_block_mask(valid, ar)

    def tiles(num, index, row):
        return sorted(index[0, 0, row, :num[0, 0, row]].tolist())
    assert tiles(block.full_kv_num_blocks, block.full_kv_indices, 0) == [0, 1]
    assert tiles(block.kv_num_blocks, block.kv_indices, 0) == []
    assert tiles(block.full_kv_num_blocks, block.full_kv_indices, 2) == []
    assert tiles(block.kv_num_blocks, block.kv_indices, 2) == [0, 1, 2]


def test_one_compiled_function_serves_every_length_and_pattern_without_recompiling():
    """Dims marked dynamic as the graph builder marks them: one Dynamo graph for all."""
    graphs, aot_eager = [], lookup_backend('aot_eager')

    def record(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)
    fn = torch.compile(_flex, backend=record, fullgraph=True)
    for p, count, images, text_ar in ((208, 200, 128, 0), (272, 261, 256, 1),
                                      (336, 300, 256, 0), (528, 520, 512, 1)):
        q, k, v, valid, ar = _inputs(p, count, images, text_ar, seed=p)
        for t, dim in ((q, 1), (k, 2), (v, 2), (valid, 1), (ar, 1)):
            torch._dynamo.maybe_mark_dynamic(t, dim)
        with torch.inference_mode():
            got = fn(q, k, v, valid, ar)
        torch.testing.assert_close(got, _dense(q, k, v, valid, ar), **TOL)
    assert len(graphs) == 1
    calls = [str(n.target) for n in graphs[0].graph.nodes if n.op == 'call_function']
    assert FLEX in calls and not [c for c in calls if 'scaled_dot_product' in c]


@pytest.mark.slow
@pytest.mark.parametrize('text_ar', [0, 1], ids=['bidirectional', 'causal_text'])
def test_inductor_flex_kernel_equals_the_dense_bias(text_ar):
    """Inductor's C++ flash-style template (static shapes), π0.5's 8 query heads on 1."""
    q, k, v, valid, ar = _inputs(272, 261, 256, text_ar)
    fn = torch.compile(_flex, backend='inductor', fullgraph=True, dynamic=False)
    with torch.inference_mode():
        torch.testing.assert_close(fn(q, k, v, valid, ar), _dense(q, k, v, valid, ar), **TOL)


def test_the_prefix_attention_is_flex_where_compiled_and_chosen():
    assert prefill_attention('cuda', compiled=True) == 'flex'            # AUTO on CUDA
    for device, compiled in (('cpu', True), ('cuda', False), ('cpu', False)):
        assert prefill_attention(device, compiled) == 'sdpa'
    with flex_kernels(True):
        assert prefill_attention('cpu', True) == 'flex'
        assert prefill_attention('cuda', False) == 'sdpa'                 # never eagerly
    with flex_kernels(False):
        assert prefill_attention('cuda', True) == 'sdpa'


def _model(mode):
    torch.manual_seed(0)
    return build_model(get_preset('tiny').model.with_overrides(prefix_attention=mode))


def _prefill_case(model, t, bucket, seed=1):
    gen = torch.Generator().manual_seed(seed)
    cfg = model.cfg
    embeds = torch.randn(1, 2, cfg.image_tokens_per_camera, cfg.vlm.width, generator=gen)
    tokens = torch.randint(3, 1000, (1, t), generator=gen)
    count = 2 * cfg.image_tokens_per_camera + t
    valid = (torch.arange(count + bucket - t) < count)[None]
    return embeds, tokens, F.pad(tokens, (0, bucket - t)), valid, torch.tensor([count - 1])


@pytest.mark.parametrize('mode', list(PrefixAttention), ids=lambda m: m.value)
def test_prefill_call_with_flex_equals_the_eager_model(mode):
    """Every prompt bucket through one compiled PrefillCall: K/V and the last hidden state."""
    model = _model(mode)
    graphs, aot_eager = [], lookup_backend('aot_eager')

    def record(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)
    call = torch.compile(PrefillCall(model, model.vlm.layers), backend=record, fullgraph=True)
    ti = model.cfg.image_tokens_per_camera
    for t, bucket in ((7, 16), (30, 32), (64, 64), (1, 16)):
        embeds, tokens, padded, valid, last = _prefill_case(model, t, bucket, seed=t)
        for x, dim in ((embeds, 1), (padded, 1), (valid, 1)):
            torch._dynamo.maybe_mark_dynamic(x, dim)
        count, slots = 2 * ti + t, torch.arange(16, 16 + 2 * ti + t)
        with torch.inference_mode():
            want = model.prefill(tokens, None, image_embeds=embeds, slots=slots[None],
                                 cache=KVCache(model.cfg.vlm, 512))
            with flex_kernels(True):
                hidden, k, v = call(embeds, padded, valid, last)
        torch.testing.assert_close(hidden, want.last_hidden, **TOL)
        torch.testing.assert_close(k[:, :count], want.cache.k[:, slots], **TOL)
        torch.testing.assert_close(v[:, :count], want.cache.v[:, slots], **TOL)
    assert len(graphs) == 1
    calls = [str(n.target) for n in graphs[0].graph.nodes if n.op == 'call_function']
    assert calls.count(FLEX) == model.cfg.vlm.depth - 1       # the last layer: one query row


@pytest.mark.slow
def test_inductor_prefill_call_with_flex_equals_the_eager_one():
    """
    The C++ template inside the prefill's graph (static shapes): K/V equal, CAUSAL_TEXT.

    Its V is the Q/K/V projection's strided view, which the template misread until
    ``prefix_attention`` passed it contiguous on the CPU (errors ~1 before).
    """
    model = _model(PrefixAttention.CAUSAL_TEXT)
    eager = PrefillCall(model, model.vlm.layers)
    call = torch.compile(eager, backend='inductor', fullgraph=True, dynamic=False)
    _, _, padded, valid, last = case = _prefill_case(model, 9, 16)
    with torch.inference_mode():
        want = eager(case[0], padded, valid, last)
        with flex_kernels(True):
            got = call(case[0], padded, valid, last)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)


def test_vision_with_flex_equals_eager():
    """The unmasked attention of SigLIP as FlexAttention in the compiled VisionCall."""
    model = _model(PrefixAttention.BIDIRECTIONAL)
    graphs, aot_eager = [], lookup_backend('aot_eager')

    def record(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)
    call = torch.compile(VisionCall(model), backend=record, fullgraph=True)
    size = model.cfg.vision.image_size
    images = torch.rand(3, 3, size, size, generator=torch.Generator().manual_seed(4)) * 2 - 1
    with torch.inference_mode():
        want = VisionCall(model)(images)
        with flex_kernels(True):
            got = call(images)
    torch.testing.assert_close(got, want, **TOL)
    calls = [str(n.target) for n in graphs[0].graph.nodes if n.op == 'call_function']
    assert calls.count(FLEX) == model.cfg.vision.depth
    assert not [c for c in calls if 'scaled_dot_product' in c]
