"""
The paged attention kernel compiled for the GPU (``pytest -m gpu``; skipped without CUDA).

What the CPU interpreter cannot show: the kernels built by Triton for this GPU equal the
gathered attention in float32 (IEEE products) and bfloat16 (within what eager bfloat16
attention is from float32), at π0.5's shapes (8 query heads on 1 kv head, head dim 256) and
the tiny preset's (head dim 8, padded); Inductor compiles the operator at symbolic batch and
context into one CUDA graph that equals the eager call. The fast path's decode graphs use it
by default (AUTO) and pass the gate: ``test_gpu_backends.py``.
"""

from oxygen_ros.model.paged_attention import load_kernel
from paged_cases import gathered_attention, make_inputs
import pytest
import torch

CUDA = torch.cuda.is_available()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not CUDA, reason='needs a CUDA GPU (torch.cuda.is_available() is False)'),
]


def _kernel():
    pytest.importorskip('triton', reason='the paged attention kernel needs triton')
    load_kernel()
    from oxygen_ros.model.kernels import paged_decode
    return paged_decode.paged_attention


def _call(kernel, x, q_index):
    return kernel(x['q'], q_index, x['k_pool'], x['v_pool'], x['ctx_slots'], x['ctx_mask'],
                  x['k_new'], x['v_new'], x['new_valid'])


@pytest.mark.parametrize('shape', [(8, 1, 8, 1, 256, 900), (3, 1, 2, 1, 8, 300),
                                   (2, 16, 8, 1, 256, 832), (4, 5, 4, 2, 64, 129)],
                         ids=['pi05_decode', 'tiny_decode', 'pi05_suffix', 'two_kv_heads'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=['fp32', 'bf16'])
def test_the_compiled_kernel_equals_the_gathered_attention(shape, dtype):
    kernel = _kernel()
    b, t, hq, hkv, d, c = shape
    valid = torch.arange(t)[None] < torch.tensor([t, max(t - 3, 1), 1, t])[:b, None]
    x = make_inputs(b, t, hq, hkv, d, c, dtype, device='cuda', slots=2048, valid=valid)
    every = torch.arange(t, device='cuda').expand(b, t)
    got = _call(kernel, x, every).float().flatten(2)
    want = gathered_attention(x, every)
    if dtype is torch.float32:
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    else:
        eager = gathered_attention(x, every, torch.bfloat16).float()
        assert (got - want).abs().max() <= 2 * (eager - want).abs().max() + 1e-3


def test_inductor_compiles_it_at_symbolic_shapes_into_one_cuda_graph():
    kernel = _kernel()
    outs, wants = [], []

    def step(q, index, k_pool, v_pool, slots, mask, k_new, v_new, valid):
        return _call(kernel, {'q': q * 1.0, 'k_pool': k_pool, 'v_pool': v_pool,
                              'ctx_slots': slots, 'ctx_mask': mask, 'k_new': k_new,
                              'v_new': v_new, 'new_valid': valid}, index) + 0.0
    compiled = torch.compile(step, fullgraph=True)
    for b, c in ((2, 256), (4, 512), (8, 768)):
        x = make_inputs(b, 1, 8, 1, 256, c, torch.bfloat16, device='cuda', slots=2048, seed=b)
        index = torch.zeros(b, 1, dtype=torch.int64, device='cuda')
        args = (x['q'], index, x['k_pool'], x['v_pool'], x['ctx_slots'].contiguous(),
                x['ctx_mask'], x['k_new'], x['v_new'], x['new_valid'])
        for a, dims in zip(args, ((0,), (0,), (), (), (0, 1), (0, 1), (0,), (0,), (0,))):
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(a, dim)
        compiled(*args)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = compiled(*args)
        graph.replay()
        torch.cuda.synchronize()
        outs.append(out.clone())
        wants.append(step(*args))
    for out, want in zip(outs, wants):
        torch.testing.assert_close(out, want, atol=0, rtol=0)
