"""
The static-shape calls and graph simplifications equal the eager model (float32, 1e-5).

Padding (prompt to a bucket, context and batch to buckets) is masked and exact; the one-call
denoise loop equals the model's loop and a loop of the public ``velocity``; folded norm
weights, the fused Q/K/V and the precomputed time conditioning change nothing beyond
rounding; ``velocity`` is differentiable (guided denoising takes its gradient).
"""

from oxygen_ros.backends.fast_path.folding import fold_layers, FoldedGemmaLayer
from oxygen_ros.backends.fast_path.static_calls import (
    DecodeCall, DenoiseCall, ExtendCall, PrefillCall, SeedCall, VisionCall)
from oxygen_ros.config import get_preset, PrefixAttention
from oxygen_ros.model.denoise import euler_modulations
from oxygen_ros.model.flow import euler_times
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

TOL = {'atol': 1e-5, 'rtol': 0}


def _model(mode=PrefixAttention.BIDIRECTIONAL, dtype=torch.float32):
    torch.manual_seed(0)
    return build_model(get_preset('tiny').model.with_overrides(prefix_attention=mode), dtype=dtype)


def _prefix(model, cams=2, t=7, base=16):
    """Prefill ``cams`` cameras and ``t`` prompt tokens eagerly at slots base, base + 1, ..."""
    gen = torch.Generator().manual_seed(1)
    size, ti = model.cfg.vision.image_size, model.cfg.image_tokens_per_camera
    images = (torch.rand(1, cams, 3, size, size, generator=gen) * 2 - 1).to(model.dtype)
    embeds = model.encode_images(images)
    tokens = torch.randint(3, 1000, (1, t), generator=gen)
    cache = KVCache(model.cfg.vlm, 1024, dtype=model.dtype)
    cache.k.normal_(generator=gen)
    cache.v.normal_(generator=gen)
    slots = torch.arange(base, base + cams * ti + t)[None]
    prefix = model.prefill(tokens, None, image_embeds=embeds, cache=cache, slots=slots)
    return images, embeds, tokens, cache, prefix


@pytest.fixture(scope='module', params=list(PrefixAttention), ids=lambda m: m.value)
def model(request):
    return _model(request.param)


@pytest.mark.parametrize('cams,t,bucket', [(1, 7, 16), (2, 7, 16), (2, 16, 16), (2, 1, 64)])
def test_padded_prefill_equals_unpadded(model, cams, t, bucket):
    _, embeds, tokens, cache, prefix = _prefix(model, cams, t)
    count = cams * model.cfg.image_tokens_per_camera + t
    p = count + bucket - t
    valid = (torch.arange(p) < count)[None]
    for layers in (model.vlm.layers, fold_layers(model.vlm.layers)):
        hidden, k, v = PrefillCall(model, layers)(embeds, F.pad(tokens, (0, bucket - t)), valid,
                                                  torch.tensor([count - 1]))
        torch.testing.assert_close(hidden, prefix.last_hidden, **TOL)
        torch.testing.assert_close(k[:, :count], cache.k[:, prefix.slots[0]], **TOL)
        torch.testing.assert_close(v[:, :count], cache.v[:, prefix.slots[0]], **TOL)


def test_vision_and_seed_equal_eager(model):
    images, embeds, _, _, prefix = _prefix(model)
    torch.testing.assert_close(VisionCall(model)(images[0])[None], embeds, atol=0, rtol=0)
    hidden = prefix.last_hidden.expand(3, -1) + torch.randn(3, model.cfg.vlm.width)
    logits, ids = SeedCall(model)(hidden)
    torch.testing.assert_close(logits, model.lm_logits(hidden), atol=0, rtol=0)
    assert torch.equal(ids, logits.argmax(-1))


def test_decode_with_padded_batch_and_context_equals_decode_step(model):
    _, _, _, cache, prefix = _prefix(model)
    p = prefix.slots.shape[1]
    b, bucket_b, bucket_c = 3, 4, p + 37
    ctx = prefix.slots.expand(b, p)
    mask = torch.arange(p)[None] < torch.tensor([p, p - 4, 9])[:, None]
    tokens, positions = torch.randint(3, 1000, (b,)), mask.sum(1)
    write = torch.tensor([700, 701, 702])
    want_cache = KVCache(model.cfg.vlm, 1024)
    want_cache.k.copy_(cache.k)
    want_cache.v.copy_(cache.v)
    want = model.decode_step(tokens, positions, want_cache, write, ctx, mask)
    for layers in (model.vlm.layers, fold_layers(model.vlm.layers)):
        logits, ids, k, v = DecodeCall(model, layers)(
            cache.k, cache.v, F.pad(tokens, (0, bucket_b - b)),
            F.pad(positions, (0, bucket_b - b)),
            F.pad(ctx, (0, bucket_c - p, 0, bucket_b - b)),
            F.pad(mask, (0, bucket_c - p, 0, bucket_b - b)))
        torch.testing.assert_close(logits[:b], want, **TOL)
        assert torch.equal(ids, logits.argmax(-1))
        torch.testing.assert_close(k[:, :b], want_cache.k[:, write], **TOL)
        torch.testing.assert_close(v[:, :b], want_cache.v[:, write], **TOL)
        assert torch.isfinite(logits).all()                  # padded rows too


def test_text_prefill_on_an_image_prefix_equals_prefill_with_context():
    model = _model(PrefixAttention.CAUSAL_TEXT)
    _, embeds, _, cache, _ = _prefix(model, 2, 0)
    n_img = 2 * model.cfg.image_tokens_per_camera
    image = model.prefill(torch.zeros(1, 0, dtype=torch.int64), None, image_embeds=embeds,
                          cache=cache, slots=torch.arange(16, 16 + n_img)[None])
    tokens = torch.randint(3, 1000, (1, 9))
    slots = torch.arange(400, 409)[None]
    want = model.prefill(tokens, None, context=image, cache=cache, slots=slots)
    valid = (torch.arange(16) < 9)[None]
    hidden, k, v = ExtendCall(model, model.vlm.layers)(
        cache.k, cache.v, F.pad(tokens, (0, 7)), valid, image.num_tokens, image.slots,
        image.mask)
    torch.testing.assert_close(hidden, want.last_hidden, **TOL)
    torch.testing.assert_close(k[:, 0, :9], cache.k[:, slots[0]], **TOL)
    torch.testing.assert_close(v[:, 0, :9], cache.v[:, slots[0]], **TOL)


def test_one_call_denoise_equals_the_step_loop(model):
    _, _, _, cache, prefix = _prefix(model)
    noise = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim)
    want = model.denoise(prefix, noise)
    pad = 40
    got = DenoiseCall(model)(cache.k, cache.v, F.pad(prefix.slots, (0, pad)),
                             F.pad(prefix.mask, (0, pad)), prefix.num_tokens, noise)
    torch.testing.assert_close(got, want, **TOL)
    # the step loop through the public, eager velocity (what guided denoising calls)
    ctx = model.denoise_context(prefix)
    x, n = noise.clone(), model.cfg.num_denoise_steps
    dt = torch.tensor(-1.0 / n, dtype=torch.float32).item()
    with torch.no_grad():
        for t in euler_times(n):
            x = x + dt * model.velocity(ctx, x, t)
    torch.testing.assert_close(x, want, **TOL)


def test_time_conditioning_is_computed_once_and_kept_in_float32_in_bf16():
    model = _model(dtype=torch.bfloat16)
    call = DenoiseCall(model)
    mod_in, mod_post, mod_final = euler_modulations(model, model.cfg.num_denoise_steps, 'cpu')
    assert len(call.mods) == model.cfg.num_denoise_steps
    for s, (a, b, c) in enumerate(call.mods):
        assert a.dtype == torch.float32                     # openpi keeps the adaRMS Dense fp32
        assert torch.equal(a, mod_in[:, s]) and torch.equal(b, mod_post[:, s])
        assert torch.equal(c, mod_final[s])


def test_folded_norms_and_fused_qkv_equal_the_original(model):
    layer = model.vlm.layers[0]
    folded = FoldedGemmaLayer(layer)
    x = torch.randn(2, 5, model.cfg.vlm.width)
    cos, sin = torch.ones(2, 5, model.cfg.vlm.head_dim // 2), torch.zeros(2, 5, 4)
    for got, want in zip(folded.project_qkv(x, cos, sin)[:3], layer.project_qkv(x, cos, sin)):
        torch.testing.assert_close(got, want, **TOL)
    attn = torch.randn(2, 5, model.cfg.vlm.num_heads * model.cfg.vlm.head_dim)
    torch.testing.assert_close(folded.finish(x, attn), layer.finish(x, attn, None), **TOL)
    # Q, K, V as one projection = three separate ones (the checkpoint's q/k/v_proj)
    h, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    y, _ = layer.input_norm(x)
    wq, wk, wv = layer.qkv.weight.split([h * d, hkv * d, hkv * d])
    fused = layer.qkv(y)
    torch.testing.assert_close(fused, torch.cat([y @ wq.T, y @ wk.T, y @ wv.T], -1), **TOL)
    with pytest.raises(ValueError, match='only plain RMSNorm'):
        FoldedGemmaLayer(model.expert.layers[0])


def test_folding_in_bf16_uses_the_float32_norm_weight():
    model = _model(dtype=torch.bfloat16)
    layer = model.vlm.layers[0]
    assert layer.input_norm.weight.dtype == torch.float32
    folded = FoldedGemmaLayer(layer)
    assert folded.qkv_weight.dtype == torch.bfloat16
    want = (layer.qkv.weight.float() * (1 + layer.input_norm.weight)).to(torch.bfloat16)
    assert torch.equal(folded.qkv_weight, want)


def test_velocity_is_differentiable():
    model = _model()
    _, _, _, cache, prefix = _prefix(model)
    ctx = model.denoise_context(prefix)
    x = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim)
    x.requires_grad_(True)
    with torch.enable_grad():
        v = model.velocity(ctx, x, 0.4)
        (grad,) = torch.autograd.grad(v.pow(2).sum(), x)
    assert grad.abs().max() > 0
    eps = 1e-2                                         # central differences, float32
    for index in [(0, 0, 0), (0, 2, 5), (0, 3, 31)]:
        dx = torch.zeros_like(x)
        dx[index] = eps
        with torch.no_grad():
            up = model.velocity(ctx, x + dx, 0.4).pow(2).sum()
            down = model.velocity(ctx, x - dx, 0.4).pow(2).sum()
        numeric = float((up - down) / (2 * eps))
        assert numeric == pytest.approx(float(grad[index]), rel=2e-2, abs=1e-3)
    with pytest.raises(ValueError, match='x_t must be'):
        model.velocity(ctx, x[:, :2], 0.4)
