"""
The paged attention kernel (Triton, ``fast_path/kernels/paged_decode.py``) against eager attention.

On the CPU the kernels run in Triton's interpreter, whose ``tl.dot`` is exact in float32 and
float16 (bfloat16 is GPU only: ``test/gpu``). The reference is what ``ExtendCall`` computed
before the kernel: the context gathered from the pool, the new tokens' K/V appended, and
``layers.attention`` under the causal mask of the new tokens. Two checks need the compiled
kernels and run in a subprocess without the interpreter: traced for a CUDA target, the
kernels write only their workspace and output (the pool is read in place, never copied), and
both kernels build for Hopper (sm_90) with Triton's own ptxas.
"""

import os
from pathlib import Path
import subprocess
import sys
import textwrap

from paged_cases import gathered_attention, interpreted_kernel, make_inputs
import pytest
import torch

kernel = interpreted_kernel()
ROOT = Path(__file__).resolve().parents[3]


def _args(x, q_index):
    return (x['q'], q_index, x['k_pool'], x['v_pool'], x['ctx_slots'], x['ctx_mask'],
            x['k_new'], x['v_new'], x['new_valid'])


def _run(x, q_index):
    return kernel.paged_attention(*_args(x, q_index))


CASES = {
    # b, t, Hq, Hkv, D, C: pi05's GQA (8 query heads on 1 kv head) at decode, a context
    # neither a multiple of the split nor of the tile
    'decode_gqa8': (3, 1, 8, 1, 64, 150),
    'decode_long_context': (2, 1, 8, 1, 32, 2 * kernel.SPLIT_LEN * 3 + 5),
    'decode_head_dim_8': (4, 1, 2, 1, 8, 40),            # the tiny preset: D padded to 16
    'suffix_two_kv_heads': (2, 5, 4, 2, 16, 70),          # 5 new tokens, 2 groups of 2
    'suffix_rows_span_blocks': (2, 9, 8, 1, 16, 33),      # 72 query rows: 5 row blocks
}


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16], ids=['fp32', 'fp16'])
@pytest.mark.parametrize('case', list(CASES))
def test_kernel_equals_eager_attention_over_the_gathered_context(case, dtype):
    b, t, hq, hkv, d, c = CASES[case]
    valid = torch.arange(t)[None] < torch.tensor([t, max(t - 2, 1), 0, t])[:b, None]
    x = make_inputs(b, t, hq, hkv, d, c, dtype, valid=valid)
    every = torch.arange(t).expand(b, t)
    got = _run(x, every)
    assert got.shape == (b, t, hq, d) and got.dtype == dtype
    want = gathered_attention(x, every).view(b, t, hq, d)
    if dtype is torch.float32:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    else:     # float16 probabilities and output: no further from float32 than eager float16
        eager = gathered_attention(x, every, torch.float16).view(b, t, hq, d).float()
        bound = 2 * (eager - want).abs().max().item() + 1e-3
        assert (got.float() - want).abs().max().item() <= bound


DENOISE_CASES = {
    # b, H action tokens, Hq, Hkv, D, C: the tiny preset (D 8), pi05's heads at a short
    # context and 15 action tokens (120 query rows: 8 row blocks), two kv heads
    'tiny': (1, 4, 2, 1, 8, 90),
    'pi05_heads': (1, 15, 8, 1, 256, 70),
    'two_kv_heads_two_rows': (2, 5, 4, 2, 16, 40),
}


@pytest.mark.parametrize('dtype', [torch.float32, torch.float16], ids=['fp32', 'fp16'])
@pytest.mark.parametrize('case', list(DENOISE_CASES))
def test_bidirectional_tokens_rotated_on_load_equal_rope_then_attention(case, dtype):
    """Denoise's call: q/k/v views of one Q/K/V row, RoPE on load, action tokens see all."""
    b, t, hq, hkv, d, c = DENOISE_CASES[case]
    valid = torch.ones(b, t, dtype=torch.bool)
    if b > 1:
        valid[1, -2:] = False                    # padding tokens in the second row
    x = make_inputs(b, t, hq, hkv, d, c, dtype, valid=valid, rope=True)
    assert not x['q'].is_contiguous()            # read in place from the fused row
    every = torch.arange(t).expand(b, t)
    got = kernel.paged_attention(x['q'], every, x['k_pool'], x['v_pool'], x['ctx_slots'],
                                 x['ctx_mask'], x['k_new'], x['v_new'], x['new_valid'],
                                 x['cos'], x['sin'], causal=False)
    want = gathered_attention(x, every, causal=False).view(b, t, hq, d)
    if dtype is torch.float32:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    else:
        eager = gathered_attention(x, every, torch.float16, causal=False).view(b, t, hq, d)
        bound = 2 * (eager.float() - want).abs().max().item() + 1e-3
        assert (got.float() - want).abs().max().item() <= bound
    # the same rows attended causally differ: the flag is read
    causal = kernel.paged_attention(x['q'], every, x['k_pool'], x['v_pool'], x['ctx_slots'],
                                    x['ctx_mask'], x['k_new'], x['v_new'], x['new_valid'],
                                    x['cos'], x['sin'])
    assert (causal.float() - got.float()).abs().max() > 1e-2


def test_the_last_query_alone_equals_its_row_of_all_queries():
    """What ``ExtendCall`` asks after its last layer: each row's last valid token only."""
    b, t = 3, 6
    valid = torch.arange(t)[None] < torch.tensor([6, 2, 0])[:, None]
    x = make_inputs(b, t, 8, 1, 16, 90, torch.float32, valid=valid)
    last = (valid.sum(1) - 1).clamp(min=0)[:, None]
    alone = dict(x, q=torch.gather(x['q'], 1, last[..., None, None].expand(-1, -1, 8, 16)))
    got = _run(alone, last)
    every = _run(x, torch.arange(t).expand(b, t))
    torch.testing.assert_close(got, torch.gather(every, 1, last[..., None, None].expand(
        -1, -1, 8, 16)), atol=1e-6, rtol=0)
    torch.testing.assert_close(got.flatten(2), gathered_attention(x, last), atol=1e-5, rtol=0)


def test_without_any_context_a_token_attends_itself_and_its_valid_predecessors():
    b, t = 2, 4
    x = make_inputs(b, t, 4, 1, 16, 0, torch.float32,
                    valid=torch.tensor([[True] * 4, [True, False, True, True]]))
    every = torch.arange(t).expand(b, t)
    torch.testing.assert_close(_run(x, every).flatten(2), gathered_attention(x, every), atol=1e-5,
                               rtol=0)
    alone = dict(x, q=x['q'][:, :1], k_new=x['k_new'][:, :1], v_new=x['v_new'][:, :1],
                 new_valid=x['new_valid'][:, :1])
    out = _run(alone, torch.zeros(b, 1, dtype=torch.int64))
    torch.testing.assert_close(out, x['v_new'][:, :1].repeat_interleave(4, 2), atol=1e-6,
                               rtol=0)                    # softmax over one key: its value


def test_wrong_inputs_raise_naming_the_argument():
    x = make_inputs(2, 1, 8, 1, 16, 20, torch.float32)
    every = torch.zeros(2, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match=r'ctx_mask must be \[2, 20\], got \[2, 19\]'):
        _run(dict(x, ctx_mask=x['ctx_mask'][:, :19]), every)
    with pytest.raises(ValueError, match='ctx_mask and new_valid must be bool'):
        _run(dict(x, ctx_mask=x['ctx_mask'].long()), every)
    with pytest.raises(ValueError, match=r'q heads 8 x 8 do not fit kv heads 1 x 16'):
        _run(dict(x, q=x['q'][..., :8], k_new=x['k_new'][..., :8],
                  v_new=x['v_new'][..., :8]), every)
    with pytest.raises(ValueError, match=r'q_index must be \[2, 1\]'):
        _run(x, every[:1])
    cos = torch.zeros(2, 1, 8)
    with pytest.raises(ValueError, match='cos and sin go together'):
        kernel.paged_attention(*_args(x, every), cos)
    with pytest.raises(ValueError, match=r'sin must be \[2, 1, 8\], got \[2, 1, 4\]'):
        kernel.paged_attention(*_args(x, every), cos, cos[..., :4])
    with pytest.raises(ValueError, match='cos and sin must be float32'):
        kernel.paged_attention(*_args(x, every), cos.double(), cos.double())


def _python(code):
    """Run ``code`` in a fresh interpreter without ``TRITON_INTERPRET``; return its stdout."""
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = os.pathsep.join([str(ROOT), str(ROOT / 'test'),
                                         env.get('PYTHONPATH', '')])
    proc = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason='a GPU runs the compiled kernels')
def test_on_the_cpu_without_the_interpreter_the_kernel_refuses():
    out = _python("""
        import torch
        from oxygen_ros.backends.fast_path.kernels.paged_decode import paged_attention
        z = torch.zeros
        try:
            paged_attention(z(1, 1, 2, 16), z(1, 1, dtype=torch.int64), z(8, 1, 16),
                            z(8, 1, 16), z(1, 3, dtype=torch.int64), z(1, 3, dtype=torch.bool),
                            z(1, 1, 1, 16), z(1, 1, 1, 16), z(1, 1, dtype=torch.bool))
        except ValueError as exc:
            print(exc)
        """)
    assert 'runs on CUDA, or on the CPU under TRITON_INTERPRET=1' in out


TRACE_FOR_HOPPER = """
    import torch
    from torch._dynamo.backends.common import aot_autograd
    from oxygen_ros.backends.fast_path.kernels import paged_decode as pd
    from oxygen_ros.backends.fast_path.kernels.builds import active_target, HOPPER

    hopper = active_target(HOPPER)     # torch's analysis of the kernels asks for a target
    hopper.__enter__()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        def never(*args):
            raise StopIteration     # nothing runs: there is no GPU
        return never
    bf = torch.bfloat16
    pool = torch.zeros(2, 64, 1, 256, dtype=bf)
    q, new = torch.zeros(2, 1, 8, 256, dtype=bf), torch.zeros(2, 1, 1, 256, dtype=bf)
    slots, mask = torch.zeros(2, 40, dtype=torch.int64), torch.ones(2, 40, dtype=torch.bool)

    def step(pool, q, new, slots, mask):
        index = torch.zeros(q.shape[0], 1, dtype=torch.int64)
        valid = torch.ones(q.shape[0], 1, dtype=torch.bool)
        return pd.paged_attention(q, index, pool[0], pool[1], slots, mask, new, new, valid)
    for t, dims in ((q, (0,)), (new, (0,)), (slots, (0, 1)), (mask, (0, 1))):
        for dim in dims:
            torch._dynamo.mark_dynamic(t, dim)
    try:
        torch.compile(step, backend=aot_autograd(fw_compiler=record), fullgraph=True)(
            pool, q, new, slots, mask)
    except StopIteration:
        pass
    calls = [n for n in graphs[0].graph.nodes if n.op == 'call_function']
    kernels = [n for n in calls if 'triton_kernel_wrapper' in str(n.target)]
    print('KERNELS', len(kernels))
    print('CLONED', sorted(set(p for n in kernels for p in n.kwargs['tensors_to_clone'])))
    print('SYMBOLIC_GRID', all(not str(n.kwargs['grid'][0][0]).isdigit() for n in kernels))
    print('OTHER', sorted(str(n.target) for n in calls if n not in kernels))
"""


@pytest.mark.timeout(300)
def test_traced_for_hopper_the_kernels_read_the_pool_in_place():
    out = _python(TRACE_FOR_HOPPER)
    lines = dict(ln.split(' ', 1) for ln in out.splitlines() if ' ' in ln)
    assert lines['KERNELS'] == '2', out
    # the functional graph copies what a kernel writes: only the workspace and the output
    assert lines['CLONED'] == "['acc_ptr', 'l_ptr', 'm_ptr', 'out_ptr']", out
    assert lines['SYMBOLIC_GRID'] == 'True', out           # one compile for every bucket
    assert 'index_select' not in lines['OTHER'] and 'cat' not in lines['OTHER'], out
    # that they build for sm_90 and sm_110 as Inductor types them: test_kernel_builds.py
