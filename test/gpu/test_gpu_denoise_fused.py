"""
The fused denoise as the GPU runs it, its body checked on the CPU too.

``cuda`` cases (``pytest -m gpu``; skipped without CUDA), what the CPU interpreter cannot show: the
kernels of ``backends/fast_path/denoise_fused.py`` built by Triton for this GPU equal their eager
references in float32 and bfloat16 at π0.5's shapes (8 query heads on 1 kv head, head dim 256, 15
and 50 action tokens, expert width 1024), and the fast path's denoise with them (AUTO, compiled for
CUDA) is one CUDA graph per prefix bucket that passes the parity gate and equals eager. ``cpu``
cases (``make test``, ``test/devices.py``): the same calls in Triton's interpreter (float16 for
bfloat16; π0.5's contexts cut to 130 slots), the fast path's denoise with ``aot_eager`` and
``AttentionBackend.TRITON`` on a narrow float32 model with π0.5's 8 query heads on 1 kv head (head
dim 32, 2 Euler steps, one prefix bucket: the interpreter runs every kernel launch of every step in
Python), no capture. Timing: ``oxygen_bench gpu
--session 3`` (``ms.denoise_10_steps``, ``warmup.denoise_attention``).
"""

from dataclasses import replace

from devices import compiler, DEVICES, half, triton_kernels
from oxygen_ros.backends.attention import sdpa_context
from oxygen_ros.backends.config import AttentionBackend, CompileMode, Step
from oxygen_ros.backends.fast_path.buckets import EngineLimits
from oxygen_ros.backends.fast_path.model import FastPathModel
from oxygen_ros.backends.fast_path.paged_attention import denoise_attention
from oxygen_ros.backends.parity import check_parity, float32_copy
from oxygen_ros.config import GemmaConfig, get_preset
from oxygen_ros.model.kv_cache import KVCache, PrefixKV
from oxygen_ros.model.layers import AdaRMSNorm, gated_residual
from oxygen_ros.model.pi05 import build_model
from paged_cases import gathered_attention, make_inputs
import pytest
import torch

CPU_CONTEXT = 130
"""The longest context of a ``cpu`` kernel case (the interpreter's time grows with it)."""


def _kernels(device):
    paged_decode = triton_kernels(device)
    from oxygen_ros.backends.fast_path.kernels import adarms
    return paged_decode.paged_attention, adarms


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('shape', [(1, 15, 8, 1, 256, 832), (1, 50, 8, 1, 256, 832),
                                   (1, 4, 2, 1, 8, 150)],
                         ids=['pi05_droid', 'pi05_base', 'tiny'])
@pytest.mark.parametrize('precision', ['fp32', 'half'])
def test_the_compiled_attention_with_rope_on_load_equals_rope_then_attention(
        shape, precision, device):
    attention, _ = _kernels(device)
    b, t, hq, hkv, d, c = shape
    c = c if device == 'cuda' else min(c, CPU_CONTEXT)
    dtype = torch.float32 if precision == 'fp32' else half(device)
    x = make_inputs(b, t, hq, hkv, d, c, dtype, device=device, slots=2048, rope=True)
    every = torch.arange(t, device=device).expand(b, t)
    got = attention(x['q'], every, x['k_pool'], x['v_pool'], x['ctx_slots'], x['ctx_mask'],
                    x['k_new'], x['v_new'], x['new_valid'], x['cos'], x['sin'],
                    causal=False).float().flatten(2)
    want = gathered_attention(x, every, causal=False)
    if dtype is torch.float32:
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    else:
        eager = gathered_attention(x, every, dtype, causal=False).float()
        assert (got - want).abs().max() <= 2 * (eager - want).abs().max() + 1e-3


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('precision', ['fp32', 'half'])
def test_the_compiled_norm_kernels_equal_the_eager_norm(precision, device):
    _, norms = _kernels(device)
    w = 1024
    dtype = torch.float32 if precision == 'fp32' else half(device)
    gen = torch.Generator(device=device).manual_seed(0)
    norm = AdaRMSNorm(w, w, 1e-6).to(device)
    x, delta = (torch.randn(1, 15, w, generator=gen, device=device).to(dtype)
                for _ in range(2))
    mod, gate_mod = (torch.randn(3 * w, generator=gen, device=device) for _ in range(2))
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


@pytest.mark.parametrize('device', DEVICES)
def test_the_fused_denoise_is_one_cuda_graph_that_passes_the_gate(device):
    _kernels(device)
    cuda = device == 'cuda'
    if cuda:
        heads = GemmaConfig(width=1024, depth=4, num_heads=8, num_kv_heads=1, head_dim=256,
                            mlp_dim=4096)
        cfg = get_preset('tiny').model.with_overrides(vlm=heads, expert=heads, action_horizon=15)
    else:       # π0.5's 8 query heads on 1 kv head, narrow, 2 Euler steps: the interpreter
        heads = GemmaConfig(width=64, depth=2, num_heads=8, num_kv_heads=1, head_dim=32,
                            mlp_dim=128)
        cfg = get_preset('tiny').model.with_overrides(vlm=heads, expert=heads, action_horizon=15,
                                                      num_denoise_steps=2)
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    model = build_model(cfg, dtype=dtype, device=device)
    limits = EngineLimits.for_model(cfg, num_slots=2048, max_batch=2,
                                    max_decode_tokens=8, max_cameras=2)
    attention = AttentionBackend.AUTO if cuda else AttentionBackend.TRITON
    fast = FastPathModel(model, CompileMode.REDUCE_OVERHEAD, limits, backend=compiler(device),
                         only=[Step.DENOISE], camera_counts=(1,), attention=attention)
    if not cuda:                                  # one prefix bucket: the interpreter's time
        fast.shapes = replace(fast.shapes, denoise=fast.shapes.denoise[:1])
    pool = KVCache(cfg.vlm, 2048, dtype=dtype, device=device)
    with sdpa_context(attention):                 # as the backend warms up and runs
        fast.warmup(pool, progress=False)
        assert denoise_attention(device, True, cfg.action_horizon) == 'fused'
    assert fast.fallbacks == {}, fast.fallbacks
    assert fast.parity['denoise'].passed
    graphs = fast._graphs[Step.DENOISE]
    assert graphs and all(g.captured == cuda for g in graphs.values())
    gen = torch.Generator(device=device).manual_seed(1)
    pool.k.normal_(generator=gen)
    pool.v.normal_(generator=gen)
    p = fast.shapes.denoise[-1] - 3
    prefix = PrefixKV(pool, torch.arange(16, 16 + p, device=device)[None],
                      torch.ones(1, p, dtype=torch.bool, device=device),
                      torch.tensor([p], device=device),
                      torch.zeros(1, cfg.vlm.width, device=device))
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=gen, device=device)
    reference = float32_copy(model)
    ref = None
    if reference is not None:
        pool32 = KVCache(cfg.vlm, 2048, device=device)
        pool32.k.copy_(pool.k)
        pool32.v.copy_(pool.v)
    with torch.inference_mode():
        with sdpa_context(attention):
            got = fast.denoise(prefix, noise)
        want = model.denoise(prefix, noise)           # eager: the gathered context
        if reference is not None:
            ref = [reference.denoise(PrefixKV(pool32, prefix.slots, prefix.mask,
                                              prefix.num_tokens, prefix.last_hidden.float()),
                                     noise)]
    assert sum(g.num_calls for g in graphs.values()) > 0
    result = check_parity('denoise', [got], [want], ref)
    assert result.passed, result.describe()
