"""
FlexAttention as the GPU runs it, its body checked on the CPU too.

``cuda`` cases (``pytest -m gpu``; skipped without CUDA), what the CPU cannot show:
Inductor's Triton FlexAttention kernel at π0.5's prefix shapes (8 query heads on 1 kv head,
head dim 256, an 818-token prefix in its 832-slot bucket, both prefix modes through one
compiled function) and at SigLIP's (16 heads of 72 dims, 3 x 256 tokens) equals the dense
reference within bf16's own error; the fast path's prefill with it (AUTO, compiled for CUDA)
is one CUDA graph per bucket whose graph holds FlexAttention and passes the parity gate.
``cpu`` cases (``make test``, ``test/devices.py``): the same calls traced by Dynamo with
``aot_eager`` (PyTorch's reference FlexAttention: Inductor's C++ template fails at the fast
path's symbolic lengths, docs/gpu.md#prefill-and-vision), the fast path's prefill with
``AttentionBackend.FLEX``, no capture. Timing, kernel by kernel: ``oxygen_bench gpu
--session 3`` (``prefix_attention``).
"""

from devices import compiler, DEVICES
from oxygen_ros.backends.attention import sdpa_context
from oxygen_ros.backends.config import AttentionBackend, CompileMode, Step
from oxygen_ros.backends.fast_path.buckets import EngineLimits
from oxygen_ros.backends.fast_path.model import FastPathModel
from oxygen_ros.config import GemmaConfig, get_preset, PrefixAttention
from oxygen_ros.model.flex import prefill_attention, prefix_attention, prefix_block_mask
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.layers import attention, AttentionMask
from oxygen_ros.model.masks import make_attn_mask
from oxygen_ros.model.pi05 import build_model
import pytest
import torch
from torch._dynamo.backends.registry import lookup_backend


def _dense(q, k, v, valid, ar):
    mask = make_attn_mask(valid, ar) | torch.eye(valid.shape[1], dtype=torch.bool,
                                                 device=valid.device)
    return attention(q, k, v, AttentionMask.build(mask, q.shape[2], k.shape[1], q.dtype))


def _flex(q, k, v, valid, ar):
    return prefix_attention(q, k, v, prefix_block_mask(valid, ar))


@pytest.mark.parametrize('device', DEVICES)
def test_compiled_flex_prefix_attention_at_pi05_shapes_equals_the_dense_bias(device):
    """bf16 within 2x eager bf16's error of float32; float32 within 2e-5; one compile each."""
    gen = torch.Generator(device=device).manual_seed(0)
    p, count, images = 832, 818, 768
    q32 = torch.randn(1, p, 8, 256, generator=gen, device=device)
    k32, v32 = (torch.randn(1, p, 1, 256, generator=gen, device=device).transpose(1, 2)
                for _ in range(2))
    valid = (torch.arange(p, device=device) < count)[None]
    fn = torch.compile(_flex, fullgraph=True, backend=compiler(device))
    for text_ar in (0, 1):                          # both prefix modes: the same graph
        ar = torch.cat([torch.zeros(1, images, dtype=torch.int64, device=device),
                        torch.full((1, p - images), text_ar, device=device)], 1)
        with torch.inference_mode():
            ref = _dense(q32, k32, v32, valid, ar)
            torch.testing.assert_close(fn(q32, k32, v32, valid, ar), ref, atol=2e-5, rtol=0)
            q, k, v = (x.bfloat16() for x in (q32, k32, v32))
            got = fn(q, k, v, valid, ar).float()
            eager = _dense(q, k, v, valid, ar).float()
        assert (got - ref).abs().max() <= 2 * (eager - ref).abs().max() + 1e-3


@pytest.mark.parametrize('device', DEVICES)
def test_compiled_flex_vision_attention_at_siglip_shapes_equals_sdpa(device):
    """Head dim 72: FlexAttention's kernel rounds it to 128 in registers; still exact."""
    from torch.nn.attention.flex_attention import flex_attention

    gen = torch.Generator(device=device).manual_seed(1)
    qkv = torch.randn(3, 256, 3, 16, 72, generator=gen, device=device).permute(2, 0, 3, 1, 4)
    ref = torch.nn.functional.scaled_dot_product_attention(*qkv)
    fn = torch.compile(flex_attention, fullgraph=True, backend=compiler(device))
    with torch.inference_mode():
        got = fn(*qkv.bfloat16()).float()
        eager = torch.nn.functional.scaled_dot_product_attention(*qkv.bfloat16()).float()
    assert (got - ref).abs().max() <= 2 * (eager - ref).abs().max() + 1e-3


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('mode', list(PrefixAttention), ids=lambda m: m.value)
def test_the_fast_path_prefill_with_flex_is_captured_and_passes_the_gate(mode, device):
    """AUTO compiled for CUDA (FLEX on the CPU): π0.5's heads, bf16, one graph per bucket."""
    from torch._inductor.compile_fx import compile_fx

    cuda = device == 'cuda'
    width = 512 if cuda else 64                   # narrower on the CPU: its time
    heads = GemmaConfig(width=width, depth=3, num_heads=8, num_kv_heads=1, head_dim=256,
                        mlp_dim=2 * width)
    cfg = get_preset('tiny').model.with_overrides(vlm=heads, expert=heads, prefix_attention=mode)
    torch.manual_seed(0)
    model = build_model(cfg, dtype=torch.bfloat16, device=device)
    graphs, lower = [], compile_fx if cuda else lookup_backend('aot_eager')

    def record(gm, example_inputs):
        graphs.append(gm)
        return lower(gm, example_inputs)
    limits = EngineLimits.for_model(cfg, num_slots=2048, max_batch=2,
                                    max_decode_tokens=8, max_cameras=2)
    attention = AttentionBackend.AUTO if cuda else AttentionBackend.FLEX
    fast = FastPathModel(model, CompileMode.REDUCE_OVERHEAD, limits, backend=record,
                         only=[Step.PREFILL], camera_counts=(2,), attention=attention)
    with sdpa_context(attention):                 # as the backend warms up and runs
        fast.warmup(KVCache(cfg.vlm, 2048, dtype=torch.bfloat16, device=device),
                    progress=False)
        assert prefill_attention(device, compiled=True) == 'flex'
    assert fast.fallbacks == {}, fast.fallbacks
    assert fast.parity['prefill'].passed and fast.compiles == {'prefill': 1}
    prefill = fast._graphs[Step.PREFILL]
    assert len(prefill) == len(fast.shapes.prompt)
    assert all(g.captured == cuda for g in prefill.values())
    calls = [str(n.target) for n in graphs[0].graph.nodes if n.op == 'call_function']
    assert calls.count('flex_attention') == heads.depth - 1
