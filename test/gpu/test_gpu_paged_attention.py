"""
The paged attention kernel as the GPU runs it, its body checked on the CPU too.

``cuda`` cases (``pytest -m gpu``; skipped without CUDA), what the CPU interpreter cannot
show: the kernels built by Triton for this GPU equal the gathered attention in float32 (IEEE
products) and bfloat16 (within what eager bfloat16 attention is from float32), at π0.5's
shapes (8 query heads on 1 kv head, head dim 256) and the tiny preset's (head dim 8,
padded); Inductor compiles the operator at symbolic batch and context once, into one CUDA
graph per shape that equals the eager call. ``cpu`` cases (``make test``,
``test/devices.py``): the same calls in Triton's interpreter (float16 for bfloat16, π0.5's
contexts cut to 130 slots: three splits, the last partial), traced by Dynamo with
``aot_eager``, no capture. The fast path's decode graphs use it by default (AUTO) and pass
the gate: ``test_gpu_backends.py``.
"""

from devices import compiler, DEVICES, half, triton_kernels
from paged_cases import gathered_attention, make_inputs
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

CPU_CONTEXT = 130
"""The longest context of a ``cpu`` case (the interpreter takes ~5 s for 900 slots)."""


def _call(kernels, x, q_index):
    return kernels.paged_attention(x['q'], q_index, x['k_pool'], x['v_pool'], x['ctx_slots'],
                                   x['ctx_mask'], x['k_new'], x['v_new'], x['new_valid'])


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('shape', [(8, 1, 8, 1, 256, 900), (3, 1, 2, 1, 8, 300),
                                   (2, 16, 8, 1, 256, 832), (4, 5, 4, 2, 64, 129)],
                         ids=['pi05_decode', 'tiny_decode', 'pi05_suffix', 'two_kv_heads'])
@pytest.mark.parametrize('precision', ['fp32', 'half'])
def test_the_compiled_kernel_equals_the_gathered_attention(shape, precision, device):
    kernels = triton_kernels(device)
    b, t, hq, hkv, d, c = shape
    c = c if device == 'cuda' else min(c, CPU_CONTEXT)
    dtype = torch.float32 if precision == 'fp32' else half(device)
    lengths = torch.tensor([t, max(t - 3, 1), 1, t])[torch.arange(b) % 4]   # one per row
    valid = torch.arange(t)[None] < lengths[:, None]
    x = make_inputs(b, t, hq, hkv, d, c, dtype, device=device, slots=2048, valid=valid)
    every = torch.arange(t, device=device).expand(b, t)
    got = _call(kernels, x, every).float().flatten(2)
    want = gathered_attention(x, every)
    if dtype is torch.float32:
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    else:
        eager = gathered_attention(x, every, dtype).float()
        assert (got - want).abs().max() <= 2 * (eager - want).abs().max() + 1e-3


@pytest.mark.parametrize('device', DEVICES)
def test_inductor_compiles_it_once_at_symbolic_shapes_into_one_cuda_graph(device):
    kernels = triton_kernels(device)
    cuda = device == 'cuda'
    dtype = half(device)
    outs, wants = [], []

    def step(q, index, k_pool, v_pool, slots, mask, k_new, v_new, valid):
        x = {'q': q * 1.0, 'k_pool': k_pool, 'v_pool': v_pool, 'ctx_slots': slots,
             'ctx_mask': mask, 'k_new': k_new, 'v_new': v_new, 'new_valid': valid}
        return _call(kernels, x, index) + 0.0
    counter = CompileCounterWithBackend(compiler(device))
    compiled = torch.compile(step, backend=counter, fullgraph=True)
    for b, c in (((2, 256), (4, 512), (8, 768)) if cuda else ((2, 32), (4, 64), (8, 96))):
        x = make_inputs(b, 1, 8, 1, 256, c, dtype, device=device, slots=2048, seed=b)
        index = torch.zeros(b, 1, dtype=torch.int64, device=device)
        args = (x['q'], index, x['k_pool'], x['v_pool'], x['ctx_slots'].contiguous(),
                x['ctx_mask'], x['k_new'], x['v_new'], x['new_valid'])
        for a, dims in zip(args, ((0,), (0,), (), (), (0, 1), (0, 1), (0,), (0,), (0,))):
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(a, dim)
        out = compiled(*args)
        if cuda:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = compiled(*args)
            graph.replay()
            torch.cuda.synchronize()
        outs.append(out.clone())
        wants.append(step(*args))
    assert counter.frame_count == 1            # one trace serves every batch and context
    for out, want in zip(outs, wants):
        torch.testing.assert_close(out, want, atol=0, rtol=0)
