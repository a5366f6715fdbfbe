"""
The fused denoise (``fast_path/denoise_fused.py``, ``kernels/adarms.py``) equals the gathered one.

On the CPU the Triton kernels run in Triton's interpreter (float32 and float16; its bfloat16
``tl.dot`` is wrong: ``test/gpu``). The references: the adaRMS norm and gated residual of
``layers.py`` eagerly; ``DenoiseCall`` with the gathered prefix (the code before the fused
path) and ``Pi05Model.denoise``, on the tiny preset and at π0.5's attention shape (8 query
heads on 1 kv head, head dim 256). What the fusion is for: compiled, a layer-step launches
fewer kernels (counted in the code Inductor generates) and, traced for Hopper, reads the pool
in place and builds without spills.
"""

import os
from pathlib import Path
import subprocess
import sys
import textwrap

from oxygen_ros.backends.config import Step
from oxygen_ros.backends.fast_path.graph_builder import GraphBuilder, Kernels
from oxygen_ros.backends.fast_path.paged_attention import (
    denoise_attention, load_kernel, paged_kernel, PAGED_MAX_QUERIES)
from oxygen_ros.backends.fast_path.static_calls import DenoiseCall
from oxygen_ros.config import GemmaConfig, get_preset
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.model.layers import AdaRMSNorm, gated_residual, matmul_short_queries
from oxygen_ros.model.pi05 import build_model
from paged_cases import interpreted_kernel
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

interpreted_kernel()
load_kernel()
norms = pytest.importorskip('oxygen_ros.backends.fast_path.kernels.adarms')
ROOT = Path(__file__).resolve().parents[3]
TOL = {'atol': 1e-5, 'rtol': 0}
PI05_HEADS = GemmaConfig(width=64, depth=2, num_heads=8, num_kv_heads=1, head_dim=256,
                         mlp_dim=128)
"""π0.5's attention (8 query heads on one kv head of 256 dims) at a small width and depth."""


def _bound(got, want, eager):
    """Assert a 16-bit result no further from float32 than the eager 16-bit one (x2)."""
    err = (got.float() - want.float()).abs().max().item()
    assert err <= 2 * (eager.float() - want.float()).abs().max().item() + 1e-3, err


# ------------------------------------------------------------------ the norm kernel

@pytest.mark.parametrize('dtype', [torch.float32, torch.float16], ids=['fp32', 'fp16'])
@pytest.mark.parametrize('width,per_row', [(16, False), (48, True), (1024, False)],
                         ids=['tiny', 'not_a_power_of_two_per_row', 'pi05_expert'])
def test_the_norm_kernels_equal_the_eager_norm_and_gated_residual(dtype, width, per_row):
    gen = torch.Generator().manual_seed(width)
    norm = AdaRMSNorm(width, width, 1e-6)
    x, delta = (torch.randn(2, 5, width, generator=gen).to(dtype) for _ in range(2))
    mod = torch.randn(2 if per_row else 1, 3 * width, generator=gen)  # float32, as openpi's
    gate_mod = torch.randn(3 * width, generator=gen)
    mod = mod if per_row else mod[0]
    y = norms.ada_rms_norm(x, mod, 1e-6)
    x_new, y_new = norms.gated_ada_rms_norm(x, delta, gate_mod, mod, 1e-6)

    def eager(x):
        _, gate = norm(x, gate_mod)
        x_new = gated_residual(x, delta, gate)
        return norm(x, mod)[0], x_new, norm(x_new, mod)[0]
    want = eager(x)
    if dtype is torch.float32:
        for got, ref in zip((y, x_new, y_new), want):
            torch.testing.assert_close(got, ref, **TOL)
    else:
        ref32 = eager(x.float())
        for got, ref, ref_32 in zip((y, x_new, y_new), want, ref32):
            assert got.dtype == dtype
            _bound(got, ref_32, ref)


def test_the_norm_kernels_refuse_what_does_not_fit():
    x = torch.zeros(1, 3, 16)
    with pytest.raises(ValueError, match=r'mod must be \[3W\] or \[B, 3W\] with W = 16, got '
                                         r'\[32\]'):
        norms.ada_rms_norm(x, torch.zeros(32), 1e-6)
    with pytest.raises(ValueError, match=r'x must be \[B, S, W\], got \[3, 16\]'):
        norms.ada_rms_norm(x[0], torch.zeros(48), 1e-6)
    with pytest.raises(ValueError, match=r'delta must be \[1, 3, 16\] torch.float32 like x'):
        norms.gated_ada_rms_norm(x, x.half(), torch.zeros(48), torch.zeros(48), 1e-6)
    with pytest.raises(ValueError, match=r'gate_mod must be \[3W\]'):
        norms.gated_ada_rms_norm(x, x, torch.zeros(2, 48), torch.zeros(48), 1e-6)


# ------------------------------------------------------------------ the whole denoise

def _pool_prefix(model, c=150, valid=120, seed=1):
    """Return a random pool and a padded prefix of ``valid`` tokens in ``c`` scattered slots."""
    gen = torch.Generator().manual_seed(seed)
    cache = KVCache(model.cfg.vlm, 1024, dtype=model.dtype)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    slots = torch.randperm(1000, generator=gen)[:c][None] + 16
    mask = torch.arange(c)[None] < valid
    noise = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim, generator=gen)
    return cache, slots, mask, torch.tensor([valid]), noise


def _denoise(model, cache, slots, mask, num_tokens, noise, fused, num_steps=None):
    call = DenoiseCall(model, num_steps)
    call.use(fused)
    with torch.inference_mode():
        return call(cache.k, cache.v, slots, mask, num_tokens, noise)


def test_the_fused_denoise_equals_the_gathered_one_and_the_model():
    torch.manual_seed(0)
    model = build_model(get_preset('tiny').model, dtype=torch.float32)
    cache, slots, mask, num_tokens, noise = _pool_prefix(model)
    fused = _denoise(model, cache, slots, mask, num_tokens, noise, True)
    gathered = _denoise(model, cache, slots, mask, num_tokens, noise, False)
    torch.testing.assert_close(fused, gathered, **TOL)
    valid = mask[0]
    prefix = PrefixKV(cache, slots[:, valid], mask[:, valid], num_tokens,
                      torch.zeros(1, model.cfg.vlm.width))
    with torch.inference_mode():
        torch.testing.assert_close(fused, model.denoise(prefix, noise), **TOL)
    # per call (None): what paged_kernel chooses, as ExtendCall does
    with paged_kernel(True), torch.inference_mode():
        torch.testing.assert_close(DenoiseCall(model)(cache.k, cache.v, slots, mask,
                                                      num_tokens, noise), fused, atol=0, rtol=0)


def test_in_float16_the_fused_denoise_is_as_close_to_float32_as_the_gathered_one():
    torch.manual_seed(0)
    model = build_model(get_preset('tiny').model, dtype=torch.float16)
    cache, slots, mask, num_tokens, noise = _pool_prefix(model)
    torch.manual_seed(0)
    model32 = build_model(get_preset('tiny').model, dtype=torch.float32)
    cache32 = KVCache(model.cfg.vlm, 1024)
    cache32.k.copy_(cache.k)
    cache32.v.copy_(cache.v)
    want = _denoise(model32, cache32, slots, mask, num_tokens, noise, False, 4)
    fused = _denoise(model, cache, slots, mask, num_tokens, noise, True, 4)
    _bound(fused, want, _denoise(model, cache, slots, mask, num_tokens, noise, False, 4))


def test_at_pi05s_attention_shape_the_fused_denoise_equals_the_gathered_one():
    """8 query heads on 1 kv head of 256 dims, 15 action tokens: 120 query rows per layer."""
    cfg = get_preset('tiny').model.with_overrides(vlm=PI05_HEADS, expert=PI05_HEADS,
                                                  action_horizon=15)
    torch.manual_seed(0)
    model = build_model(cfg, dtype=torch.float32)
    cache, slots, mask, num_tokens, noise = _pool_prefix(model, c=100, valid=77)
    fused = _denoise(model, cache, slots, mask, num_tokens, noise, True, 2)
    torch.testing.assert_close(
        fused, _denoise(model, cache, slots, mask, num_tokens, noise, False, 2), **TOL)


def test_the_kernels_serve_the_denoise_where_chosen_and_auto_only_compiled_for_cuda():
    h = 15
    with paged_kernel(True):
        assert denoise_attention('cpu', False, h) == 'fused'
        assert denoise_attention('cpu', False, PAGED_MAX_QUERIES + 1) == 'gathered'
        with paged_kernel(False):
            assert denoise_attention('cuda', True, h) == 'gathered'
        with paged_kernel(None):            # AUTO: compiled for CUDA only
            assert denoise_attention('cuda', True, h) == 'fused'
            assert denoise_attention('cuda', False, h) == 'gathered'
            assert denoise_attention('cpu', True, h) == 'gathered'
    with pytest.raises(ValueError, match='a replacement step needs fused=True or False'):
        DenoiseCall(build_model(get_preset('tiny').model)).use(None, lambda *a: None)


# ------------------------------------------------------------------ kernels per layer-step

def _launches(code):
    """
    Count the kernels the ``call`` of Inductor's generated code launches, by kind.

    ``gemm``: ``extern_kernels`` (mm, addmm, bmm); ``generated``: Inductor's own fused
    kernels; ``ours``: the project's Triton operators, ``paged_attention`` counted as its
    two kernels.
    """
    body = code[code.index('def call('):]
    calls = [ln.strip() for ln in body.splitlines()
             if not ln.strip().startswith(('#', 'assert', 'del '))]
    gemm = sum(ln.startswith('extern_kernels.') for ln in calls)
    generated = sum(ln.startswith(('cpp_fused', 'triton_')) for ln in calls)
    ours = sum(2 if 'oxygen_ros.paged_attention' in ln else 1 for ln in calls
               if 'torch.ops.oxygen_ros.' in ln)
    return {'gemm': gemm, 'generated': generated, 'ours': ours,
            'total': gemm + generated + ours}


@pytest.mark.timeout(600)
def test_compiled_a_layer_step_launches_fewer_kernels_than_before():
    """
    Count the kernels of a compiled denoise step: the fused one against the gathered one.

    The step as the graph builder compiles it where the kernels are chosen, by Inductor (C++
    on the CPU: the same graph and fusion decisions, GEMMs as library calls), against the
    gathered step with matrix-product attention (what AUTO compiled for CUDA ran before:
    ``docs/gpu/2026-11-24-h100``). Per layer-step: 4 GEMMs, the attention's 2 kernels, 2
    fused residual + norm kernels and the GeGLU: 9 launches, against 12 before (6 GEMMs with
    attention's two batched products, 6 fused by Inductor).
    """
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    model = build_model(get_preset('tiny').model, dtype=torch.float32)
    cache, slots, mask, num_tokens, noise = _pool_prefix(model)
    depth = model.cfg.expert.depth
    outside = 3                       # action_in_proj, the first norm, action_out_proj

    def compiled_step(fused):
        torch._dynamo.reset()
        builder = GraphBuilder(model, model.vlm.layers, cache, compiler='inductor')
        with paged_kernel(fused), matmul_short_queries(True), torch.inference_mode():
            call = builder._kernel(Step.DENOISE, Kernels.INDUCTOR)
            call.mods = call.mods[:1]                              # one Euler step
            out, (code,) = run_and_get_code(call, cache.k, cache.v, slots, mask, num_tokens,
                                            noise)
        torch._dynamo.reset()
        return out, _launches(code), call.fused
    fused_out, after, fused = compiled_step(True)
    gathered_out, before, gathered = compiled_step(False)
    assert fused is True and gathered is False
    torch.testing.assert_close(fused_out, gathered_out, **TOL)
    per_layer_after = (after['total'] - outside) / depth
    per_layer_before = (before['total'] - outside) / depth
    assert per_layer_after <= 9, after
    assert after['generated'] == depth, after         # the GeGLU only: all else is ours
    assert after['gemm'] == 4 * depth + 2, after
    assert per_layer_before >= 12, before
    print(f'kernels per layer-step: {per_layer_before:g} -> {per_layer_after:g}')


# ------------------------------------------------------------------ traced for Hopper

TRACE_FOR_HOPPER = """
    import torch
    from torch._dynamo.backends.common import aot_autograd
    from oxygen_ros.config import GemmaConfig, get_preset
    from oxygen_ros.backends.fast_path.kernels.builds import active_target, HOPPER
    from oxygen_ros.model.kv_cache import KVCache
    from oxygen_ros.backends.fast_path.paged_attention import load_kernel
    from oxygen_ros.model.pi05 import build_model
    from oxygen_ros.backends.fast_path.static_calls import DenoiseCall

    hopper = active_target(HOPPER)     # torch's analysis of the kernels asks for a target
    hopper.__enter__()
    load_kernel()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        def never(*args):
            raise StopIteration     # nothing runs: there is no GPU
        return never
    heads = GemmaConfig(width=64, depth=2, num_heads=8, num_kv_heads=1, head_dim=256,
                        mlp_dim=128)
    cfg = get_preset('tiny').model.with_overrides(vlm=heads, expert=heads, action_horizon=15)
    model = build_model(cfg, dtype=torch.bfloat16)
    call = DenoiseCall(model, 1)
    call.use(True)
    pool = KVCache(cfg.vlm, 256, dtype=torch.bfloat16)
    slots = torch.arange(16, 16 + 100)[None]
    mask = torch.ones(1, 100, dtype=torch.bool)
    torch._dynamo.mark_dynamic(slots, 1)
    torch._dynamo.mark_dynamic(mask, 1)
    step = torch.compile(call.fused_step, backend=aot_autograd(fw_compiler=record),
                         fullgraph=True)
    call.use(True, step)
    try:
        with torch.inference_mode():        # as the fast path's warm-up
            call(pool.k, pool.v, slots, mask, torch.tensor([100]),
                 torch.zeros(1, 15, cfg.action_dim))
    except StopIteration:
        pass
    calls = [n for n in graphs[0].graph.nodes if n.op == 'call_function']
    kernels = [n for n in calls if 'triton_kernel_wrapper' in str(n.target)]
    print('KERNELS', len(kernels))
    print('CLONED', sorted(set(p for n in kernels for p in n.kwargs['tensors_to_clone'])))
    print('OTHER', sorted(set(str(n.target) for n in calls if n not in kernels)))
"""


@pytest.mark.timeout(300)
def test_traced_for_hopper_the_fused_step_reads_the_pool_in_place():
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = os.pathsep.join([str(ROOT), str(ROOT / 'test'),
                                         env.get('PYTHONPATH', '')])
    proc = subprocess.run([sys.executable, '-c', textwrap.dedent(TRACE_FOR_HOPPER)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    lines = dict(ln.split(' ', 1) for ln in out.splitlines() if ' ' in ln)
    # per layer: attention's two kernels and two norms; the first norm before the layers
    assert lines['KERNELS'] == str(2 * 4 + 1), out
    # what the kernels write: their outputs and workspaces, never the pool or the Q/K/V
    assert lines['CLONED'] == "['acc_ptr', 'l_ptr', 'm_ptr', 'out_ptr', 'x_out_ptr', " \
                              "'y_ptr']", out
    for banned in ('index_select', 'cat', 'clone', 'copy', 'rsqrt', 'pow', 'cos'):
        assert f'aten.{banned}' not in lines['OTHER'], out
    # that they build for sm_90 and sm_110 as Inductor types them: test_kernel_builds.py


def test_padding_the_context_changes_nothing():
    """The padded tail of the context (masked slots) is never attended, as before."""
    torch.manual_seed(0)
    model = build_model(get_preset('tiny').model, dtype=torch.float32)
    cache, slots, mask, num_tokens, noise = _pool_prefix(model, c=130, valid=130)
    short = _denoise(model, cache, slots, mask, num_tokens, noise, True, 2)
    padded = _denoise(model, cache, F.pad(slots, (0, 70), value=3), F.pad(mask, (0, 70)),
                      num_tokens, noise, True, 2)
    torch.testing.assert_close(padded, short, **TOL)
