"""
Decode steps and causal suffixes with the paged kernel equal the gathered calls (tiny preset).

``ExtendCall`` / ``DecodeCall`` under ``paged_kernel(True)`` (Triton's interpreter on the CPU,
float32) against the same calls gathering the context (``paged_kernel(False)``: the code
before the kernel) and against the eager model; and what the kernel is for: traced, the
decode step reads the pool only through it (no ``index_select``, no ``cat`` of the context).
"""

from oxygen_ros.backends.fast_path.folding import fold_layers
from oxygen_ros.backends.fast_path.paged_attention import (
    paged_kernel, PAGED_MAX_QUERIES, use_paged_kernel)
from oxygen_ros.backends.fast_path.static_calls import DecodeCall, ExtendCall
from oxygen_ros.config import get_preset
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model
from paged_cases import interpreted_kernel
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

interpreted_kernel()
TOL = {'atol': 1e-5, 'rtol': 0}


@pytest.fixture(scope='module')
def model():
    torch.manual_seed(0)
    return build_model(get_preset('tiny').model, dtype=torch.float32)


def _pool(model, seed=1):
    gen = torch.Generator().manual_seed(seed)
    cache = KVCache(model.cfg.vlm, 1024)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    return cache, gen


def _decode_inputs(gen, b=3, c=150, bucket_b=4, bucket_c=256):
    """Return a padded decode batch as the fast path feeds it: rows of different lengths."""
    ctx = torch.randint(16, 600, (b, c), generator=gen)          # 700 on: the new tokens
    mask = torch.arange(c)[None] < torch.tensor([c, c - 40, 9])[:b, None]
    tokens = torch.randint(3, 1000, (b,), generator=gen)
    rows, cols = bucket_b - b, bucket_c - c
    return (F.pad(tokens, (0, rows)), F.pad(mask.sum(1), (0, rows)),
            F.pad(ctx, (0, cols, 0, rows)), F.pad(mask, (0, cols, 0, rows)))


def test_the_decode_call_with_the_kernel_equals_the_gathered_one_and_the_model(model):
    cache, gen = _pool(model)
    tokens, positions, ctx, mask = _decode_inputs(gen)
    b = 3
    want_cache = KVCache(model.cfg.vlm, 1024)
    want_cache.k.copy_(cache.k)
    want_cache.v.copy_(cache.v)
    want = model.decode_step(tokens[:b], positions[:b], want_cache, torch.tensor([700, 701, 702]),
                             ctx[:b], mask[:b])
    for layers in (model.vlm.layers, fold_layers(model.vlm.layers)):
        call = DecodeCall(model, layers)
        with torch.inference_mode(), paged_kernel(False):
            gathered = call(cache.k, cache.v, tokens, positions, ctx, mask)
        with torch.inference_mode(), paged_kernel(True):
            paged = call(cache.k, cache.v, tokens, positions, ctx, mask)
        for got, old in zip(paged, gathered):
            torch.testing.assert_close(got, old, **TOL)
        assert torch.equal(paged[1], gathered[1])                # the same greedy tokens
        torch.testing.assert_close(paged[0][:b], want, **TOL)
        assert torch.isfinite(paged[0]).all()                    # the padded row too


def test_causal_suffixes_with_the_kernel_equal_the_gathered_ones(model):
    """Rows of 6, 3 and 0 new tokens (padding at the end) on contexts of different lengths."""
    cache, gen = _pool(model, seed=2)
    b, t, c = 3, 6, 90
    tokens = torch.randint(3, 1000, (b, t), generator=gen)
    valid = torch.arange(t)[None] < torch.tensor([6, 3, 0])[:, None]
    ctx = torch.randint(16, 1024, (b, c), generator=gen)
    mask = torch.arange(c)[None] < torch.tensor([90, 50, 70])[:, None]
    args = (cache.k, cache.v, tokens, valid, mask.sum(1), ctx, mask)
    call = ExtendCall(model, model.vlm.layers)
    with torch.inference_mode(), paged_kernel(False):
        gathered = call(*args)
    with torch.inference_mode(), paged_kernel(True):
        paged = call(*args)
    for got, old in zip(paged, gathered):
        torch.testing.assert_close(got, old, **TOL)


def _traced_decode(model, enabled):
    """Return the call targets of the Dynamo graph of one decode step and how it uses the pool."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    cache, gen = _pool(model)
    tokens, positions, ctx, mask = _decode_inputs(gen)
    call = torch.compile(DecodeCall(model, model.vlm.layers), backend=record, fullgraph=True)
    torch._dynamo.reset()
    with torch.inference_mode(), paged_kernel(enabled):
        call(cache.k, cache.v, tokens, positions, ctx, mask)
    torch._dynamo.reset()
    (gm,) = graphs
    pool = [n for n in gm.graph.nodes if n.op == 'placeholder' and 'pool' in n.name]
    layer_views = [u for p in pool for u in p.users]
    readers = {str(r.target) for v in layer_views for r in v.users}
    calls = [str(n.target) for n in gm.graph.nodes if n.op in ('call_function', 'call_method')]
    return calls, readers


def test_the_paged_decode_step_reads_the_pool_only_through_the_kernel(model):
    targets, readers = _traced_decode(model, True)
    assert not [t for t in targets if 'index_select' in t]
    assert readers == {'oxygen_ros.paged_attention.default'}
    assert targets.count('oxygen_ros.paged_attention.default') == model.cfg.vlm.depth
    # what the kernel replaced: per layer a gather and a concatenation of the context
    targets, readers = _traced_decode(model, False)
    assert readers and all('index_select' in r for r in readers)
    assert sum('index_select' in t for t in targets) == 2 * model.cfg.vlm.depth


def test_the_kernel_serves_short_calls_where_chosen_and_auto_only_compiled_for_cuda():
    x = torch.zeros(1)
    with paged_kernel(True):
        assert use_paged_kernel(x, 1) and use_paged_kernel(x, PAGED_MAX_QUERIES)
        assert not use_paged_kernel(x, PAGED_MAX_QUERIES + 1)    # a long text prefill
        with paged_kernel(False):
            assert not use_paged_kernel(x, 1)
        with paged_kernel(None):
            assert not use_paged_kernel(x, 1)                    # AUTO: CUDA, compiled
