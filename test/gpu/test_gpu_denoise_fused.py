"""
The fused denoise compiled for the GPU (``pytest -m gpu``; skipped without CUDA).

What the CPU interpreter cannot show: the kernels of ``model/denoise_fused.py`` built by
Triton for this GPU equal their eager references in float32 and bfloat16 at π0.5's shapes
(8 query heads on 1 kv head, head dim 256, 15 and 50 action tokens, expert width 1024), and
the fast path's denoise with them (AUTO, compiled for CUDA) is one CUDA graph per prefix
bucket that passes the parity gate and equals eager. Timing: ``oxygen_bench gpu --session
2`` (``ms.denoise_10_steps``, ``warmup.denoise_attention``).
"""

from oxygen_ros.backends.buckets import EngineLimits
from oxygen_ros.backends.compiled import CompiledModel
from oxygen_ros.backends.config import CompileMode, Step
from oxygen_ros.backends.parity import check_parity
from oxygen_ros.backends.parity_probe import float32_copy
from oxygen_ros.config import GemmaConfig, get_preset
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.model.layers import AdaRMSNorm, gated_residual
from oxygen_ros.model.paged_attention import denoise_attention, load_kernel
from oxygen_ros.model.pi05 import build_model
from paged_cases import gathered_attention, make_inputs
import pytest
import torch

CUDA = torch.cuda.is_available()
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not CUDA, reason='needs a CUDA GPU (torch.cuda.is_available() is False)'),
]


def _kernels():
    pytest.importorskip('triton', reason='the fused denoise needs triton')
    load_kernel()
    from oxygen_ros.model.kernels import adarms, paged_decode
    return paged_decode.paged_attention, adarms


@pytest.mark.parametrize('shape', [(1, 15, 8, 1, 256, 832), (1, 50, 8, 1, 256, 832),
                                   (1, 4, 2, 1, 8, 150)],
                         ids=['pi05_droid', 'pi05_base', 'tiny'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=['fp32', 'bf16'])
def test_the_compiled_attention_with_rope_on_load_equals_rope_then_attention(shape, dtype):
    attention, _ = _kernels()
    b, t, hq, hkv, d, c = shape
    x = make_inputs(b, t, hq, hkv, d, c, dtype, device='cuda', slots=2048, rope=True)
    every = torch.arange(t, device='cuda').expand(b, t)
    got = attention(x['q'], every, x['k_pool'], x['v_pool'], x['ctx_slots'], x['ctx_mask'],
                    x['k_new'], x['v_new'], x['new_valid'], x['cos'], x['sin'],
                    causal=False).float().flatten(2)
    want = gathered_attention(x, every, causal=False)
    if dtype is torch.float32:
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    else:
        eager = gathered_attention(x, every, torch.bfloat16, causal=False).float()
        assert (got - want).abs().max() <= 2 * (eager - want).abs().max() + 1e-3


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=['fp32', 'bf16'])
def test_the_compiled_norm_kernels_equal_the_eager_norm(dtype):
    _, norms = _kernels()
    w = 1024
    gen = torch.Generator(device='cuda').manual_seed(0)
    norm = AdaRMSNorm(w, w, 1e-6).cuda()
    x, delta = (torch.randn(1, 15, w, generator=gen, device='cuda').to(dtype)
                for _ in range(2))
    mod, gate_mod = (torch.randn(3 * w, generator=gen, device='cuda') for _ in range(2))
    x_new, y = norms.gated_ada_rms_norm(x, delta, gate_mod, mod, 1e-6)

    def eager(x):
        x_new = gated_residual(x, delta.to(x.dtype), norm(x, gate_mod)[1])
        return x_new, norm(x_new, mod)[0]
    if dtype is torch.float32:
        for got, want in zip((x_new, y), eager(x)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    else:
        for got, want, ref in zip((x_new, y), eager(x), eager(x.float())):
            err = (got.float() - ref).abs().max()
            assert err <= 2 * (want.float() - ref).abs().max() + 1e-3


def test_the_fused_denoise_is_one_cuda_graph_that_passes_the_gate():
    _kernels()
    heads = GemmaConfig(width=1024, depth=4, num_heads=8, num_kv_heads=1, head_dim=256,
                        mlp_dim=4096)
    cfg = get_preset('tiny').with_overrides(vlm=heads, expert=heads, action_horizon=15)
    torch.manual_seed(0)
    model = build_model(cfg, dtype=torch.bfloat16, device='cuda')
    limits = EngineLimits.for_model(cfg, num_slots=2048, max_batch=2,
                                    max_decode_tokens=cfg.decode_budget)
    fast = CompiledModel(model, CompileMode.REDUCE_OVERHEAD, limits, only=[Step.DENOISE],
                         camera_counts=(1,))
    pool = KVCache(cfg.vlm, 2048, dtype=torch.bfloat16, device='cuda')
    fast.warmup(pool, progress=False)
    assert fast.fallbacks == {}, fast.fallbacks
    assert fast.parity['denoise'].passed
    assert denoise_attention('cuda', True, cfg.action_horizon) == 'fused'
    graphs = fast._graphs[Step.DENOISE]
    assert graphs and all(g.captured for g in graphs.values())
    gen = torch.Generator(device='cuda').manual_seed(1)
    pool.k.normal_(generator=gen)
    pool.v.normal_(generator=gen)
    p = fast.shapes.denoise[-1] - 3
    prefix = PrefixKV(pool, torch.arange(16, 16 + p, device='cuda')[None],
                      torch.ones(1, p, dtype=torch.bool, device='cuda'),
                      torch.tensor([p], device='cuda'),
                      torch.zeros(1, cfg.vlm.width, device='cuda'))
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=gen, device='cuda')
    reference = float32_copy(model)
    pool32 = KVCache(cfg.vlm, 2048, device='cuda')
    pool32.k.copy_(pool.k)
    pool32.v.copy_(pool.v)
    with torch.inference_mode():
        got = fast.denoise(prefix, noise)
        want = model.denoise(prefix, noise)
        ref = reference.denoise(PrefixKV(pool32, prefix.slots, prefix.mask, prefix.num_tokens,
                                         prefix.last_hidden.float()), noise)
    assert sum(g.num_calls for g in graphs.values()) > 0
    result = check_parity('denoise', [got], [want], [ref])
    assert result.passed, result.describe()
