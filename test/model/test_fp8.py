"""
FP8 weights (``model/fp8.py``) against float64 references of their arithmetic, on the CPU.

The E4M3 rounding is re-derived here by hand in float64 (nearest even on a 3-bit mantissa,
subnormals below 2^-6), not through torch's cast, so that the quantization, its scales and
both kernels (the dequantizing reference path and ``torch._scaled_mm``, which runs on the CPU
in torch 2.13) are each held to an independent reference.
"""

from oxygen_ros.checkpoint.weights import save_checkpoint
from oxygen_ros.config import CAMERA_SLOTS, get_preset
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.loading import build_model
from oxygen_ros.model.fp8 import (
    describe_quantization, E4M3_MAX, fp8_kernel, fp8_kernel_of, fp8_linear_names, Fp8Kernel,
    Fp8Linear, Fp8Unsupported, MIN_ACTIVATION_SCALE, probe_scaled_mm, quantize_rows,
    quantize_weight, quantized_copy)
from oxygen_ros.model.pi05 import Pi05Model
import pytest
import torch
from torch import nn


def e4m3_reference(values: torch.Tensor) -> torch.Tensor:
    """Round float64 ``values`` (|v| <= 448) to E4M3 by hand: 3 mantissa bits, nearest even."""
    v = values.double()
    exponent = torch.floor(torch.log2(v.abs().clamp(min=2.0 ** -30))).clamp(min=-6)
    step = 2.0 ** (exponent - 3)                   # subnormals: the step of 2^-6, 2^-9
    return torch.round(v / step) * step             # torch.round: half to even


def test_weights_are_rounded_per_output_channel_as_the_float64_reference():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=gen) * torch.logspace(-3, 2, 48)[:, None]
    w[5] = 0.0                                      # an all-zero channel
    w[7, :4] = torch.tensor([1e-9, -3e-6, 2.0, -2.0])
    q, scale = quantize_weight(w)
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    amax = w.abs().amax(1)
    want_scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))   # float32
    assert torch.equal(scale, want_scale) and scale[5] == 1.0
    quotient = (w / scale[:, None]).double()        # the division is float32, by definition
    assert torch.equal(q.double(), e4m3_reference(quotient))
    assert (q.float()[5] == 0).all()
    rows = torch.arange(48) != 5
    assert (q.float().abs().amax(1)[rows] == E4M3_MAX).all()   # each channel uses the range
    rel = ((q.double() * scale[:, None].double() - w.double()).abs()
           / w.double().abs().clamp(min=1e-30))
    normal = (w / scale[:, None]).abs() >= 2.0 ** -6
    assert rel[normal].max() <= 2.0 ** -4           # half a unit of a 3-bit mantissa


def test_each_channel_has_its_own_scale():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(32, 48, generator=gen)
    q, scale = quantize_weight(w)
    w2 = w.clone()
    w2[3] *= 2.0 ** 5                               # a power of two: same mantissas
    w2[9] *= 3.0                                    # another scale: other mantissas
    q2, scale2 = quantize_weight(w2)
    others = torch.ones(32, dtype=torch.bool)
    others[[3, 9]] = False
    assert torch.equal(scale2[others], scale[others])
    assert torch.equal(q2.float()[others], q.float()[others])
    assert scale2[3] == scale[3] * 32 and torch.equal(q2.float()[3], q.float()[3])
    assert float(scale2[9]) == pytest.approx(3 * float(scale[9]), rel=1e-6)


def test_activations_are_rounded_per_token_with_a_floor():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(6, 64, generator=gen, dtype=torch.bfloat16) * 30
    x[2] = 0.0                                      # a padded token
    q, scale = quantize_rows(x)
    amax = x.float().abs().amax(1, keepdim=True)
    assert torch.equal(scale, (amax / 448.0).clamp(min=MIN_ACTIVATION_SCALE))
    assert scale[2, 0] == MIN_ACTIVATION_SCALE and (q.float()[2] == 0).all()
    assert torch.equal(q.double(), e4m3_reference((x.float() / scale).double()))


def float32_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Return ``K 2^-24 |x| |w|^T``: what float32 products and sums of ``x w^T`` may round."""
    return x.shape[-1] * 2.0 ** -24 * (x.double().abs() @ w.double().abs().T)


def _layer(bias: bool, out: int = 48, inp: int = 64, seed: int = 3) -> nn.Linear:
    torch.manual_seed(seed)
    layer = nn.Linear(inp, out, bias=bias)
    with torch.no_grad():
        layer.weight.mul_(torch.logspace(-1, 1, out)[:, None])
    return layer


@pytest.mark.parametrize('bias', [False, True], ids=['no_bias', 'bias'])
def test_the_reference_path_is_the_product_with_the_dequantized_weight(bias):
    layer = _layer(bias)
    fp8 = Fp8Linear.from_linear(layer, Fp8Kernel.DEQUANT)
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(4))
    w64 = fp8.weight.double() * fp8.weight_scale.double()[:, None]   # exact: 4 x 24 bits
    want = x.double() @ w64.T + (layer.bias.double() if bias else 0)
    got = fp8(x)
    assert got.shape == (2, 5, 48) and got.dtype == torch.float32
    assert ((got.double() - want).abs() <= 2 * float32_bound(x, w64) + 1e-12).all()
    torch.testing.assert_close(fp8.dequantized_weight().double(), w64, rtol=2 ** -24, atol=0)
    assert fp8(x.bfloat16()).dtype == torch.bfloat16


@pytest.mark.parametrize('bias', [False, True], ids=['no_bias', 'bias'])
def test_scaled_mm_runs_on_the_cpu_and_equals_its_float64_reference(bias):
    """Check torch 2.13's CPU ``_scaled_mm``: (x_q s_m)(W_q s_n)^T in float32, as on CUDA."""
    layer = _layer(bias)
    fp8 = Fp8Linear.from_linear(layer, Fp8Kernel.SCALED_MM)
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(5)) * 4
    xq, xs = quantize_rows(x)
    want = (xq.double() * xs.double()) @ (fp8.weight.double()
                                          * fp8.weight_scale.double()[:, None]).T
    want = want + (layer.bias.double() if bias else 0)
    bound = float32_bound(xq.double() * xs.double(), fp8.dequantized_weight().double())
    assert ((fp8(x).double() - want).abs() <= bound + 1e-12).all()
    got16 = fp8(x.bfloat16())                       # the model dtype on CUDA: bf16 out
    assert got16.dtype == torch.bfloat16
    xq16, xs16 = quantize_rows(x.bfloat16())
    want16 = (xq16.double() * xs16.double()) @ (fp8.weight.double()
                                                * fp8.weight_scale.double()[:, None]).T
    want16 = want16 + (layer.bias.bfloat16().double() if bias else 0)
    torch.testing.assert_close(got16.double(), want16, rtol=2 ** -7, atol=1e-3)


def test_scaled_mm_differs_from_the_reference_path_by_the_activation_rounding_only():
    layer = _layer(False)
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(6)) * 3
    x[4] = 0.0
    fast = Fp8Linear.from_linear(layer, Fp8Kernel.SCALED_MM)
    ref = Fp8Linear.from_linear(layer, Fp8Kernel.DEQUANT)
    assert torch.equal(fast.weight.float(), ref.weight.float())
    diff = (fast(x).double() - ref(x).double()).abs()
    _, xs = quantize_rows(x)
    # E4M3: half an ulp is <= 2^-4 |x| for normals, 2^-10 s_m below 2^-6 s_m (subnormals)
    per_element = torch.maximum(2.0 ** -4 * x.abs(), 2.0 ** -10 * xs).double()
    bound = per_element @ ref.dequantized_weight().double().abs().T + 1e-5
    assert (diff <= bound).all() and diff.max() > 0 and (diff[4] == 0).all()


def test_the_scaled_mm_backward_is_straight_through():
    """Real-time chunking differentiates the denoiser: dL/dx = dL/dy (W_q s)."""
    fp8 = Fp8Linear.from_linear(_layer(True), Fp8Kernel.SCALED_MM)
    x = torch.randn(3, 4, 64, generator=torch.Generator().manual_seed(7), requires_grad=True)
    grad = torch.randn(3, 4, 48, generator=torch.Generator().manual_seed(8))
    (g,) = torch.autograd.grad(fp8(x), x, grad)
    torch.testing.assert_close(g, grad @ fp8.dequantized_weight(), rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        torch.testing.assert_close(fp8(x), fp8(x.detach()), rtol=0, atol=0)


@pytest.mark.parametrize('capability', [(8, 9), (9, 0), (10, 0), (11, 0), (12, 0)])
def test_fp8_tensor_core_gpus_run_scaled_mm_where_the_probe_passes(capability):
    assert fp8_kernel('cuda', capability, scaled_mm=None) == (Fp8Kernel.SCALED_MM, None)


def test_a_capable_gpu_whose_scaled_mm_fails_the_probe_is_refused_with_the_probes_reason():
    """Thor (sm_110): FP8 tensor cores, but no row-wise scaled product in cuBLAS."""
    why = 'RuntimeError: CUDA error: no kernel image is available for execution on the device'
    with pytest.raises(Fp8Unsupported) as err:
        fp8_kernel('cuda:0', (11, 0), scaled_mm=why)
    msg = str(err.value)
    assert 'torch._scaled_mm with per-row scales, which does not run on cuda:0' in msg
    assert 'compute capability 11.0' in msg and msg.endswith(why)


def test_the_probe_answers_on_the_cpu_without_raising():
    assert probe_scaled_mm('cpu') == 'cpu: no FP8 tensor cores (torch._scaled_mm runs on ' \
        'CUDA only)'


def test_a_refused_device_loads_the_unquantized_weights_loudly(monkeypatch, caplog):
    """FP8 never aborts the load: the unquantized weights run, a named fallback says why."""
    from oxygen_ros.engine import loading
    from oxygen_ros.engine.config import EngineConfig, QUANTIZATION_FALLBACK
    from oxygen_ros.model import fp8

    def refused(device, capability=None, **kw):
        raise Fp8Unsupported('no row-wise scaled FP8 product here')
    monkeypatch.setattr(fp8, 'fp8_kernel', refused)
    config = EngineConfig(preset='tiny', quantization='fp8')
    loaded = loading.load_model(config, config.model_config())
    assert fp8.fp8_kernel_of(loaded.model) is None and loaded.reference is None
    assert loaded.fallbacks == {QUANTIZATION_FALLBACK: 'no row-wise scaled FP8 product here; '
                                                       'running the unquantized float32 weights'}
    assert 'no row-wise scaled FP8 product here' in caplog.text


@pytest.mark.parametrize('capability', [(7, 5), (8, 0), (8, 6)])
def test_older_gpus_are_refused_with_the_reason(capability):
    with pytest.raises(Fp8Unsupported) as err:
        fp8_kernel('cuda:0', capability)
    msg = str(err.value)
    assert f'has {capability[0]}.{capability[1]}' in msg and '>= 8.9' in msg
    assert "quantization 'none'" in msg and 'slower and less accurate than bf16' in msg


def test_the_cpu_runs_the_reference_path_and_says_so():
    kernel, why = fp8_kernel('cpu')
    assert kernel is Fp8Kernel.DEQUANT
    assert why.startswith('cpu: no FP8 tensor cores') and 'compute capability >= 8.9' in why


def test_the_quantized_sites_are_the_large_linears_not_openpis_float32_ones():
    cfg = get_preset('pi05_droid').model
    with torch.device('meta'):
        model = Pi05Model(cfg)
    names = fp8_linear_names(model)
    per_layer = {'vision.blocks': ('qkv', 'out', 'fc1', 'fc2'),
                 'vlm.layers': ('qkv', 'o', 'mlp.gate_up', 'mlp.down'),
                 'expert.layers': ('qkv', 'o', 'mlp.gate_up', 'mlp.down')}
    depth = {'vision.blocks': cfg.vision.depth, 'vlm.layers': cfg.vlm.depth,
             'expert.layers': cfg.expert.depth}
    want = ['projector'] + [f'{stack}.{i}.{n}' for stack, sites in per_layer.items()
                            for i in range(depth[stack]) for n in sites]
    assert sorted(names) == sorted(want) and len(names) == 253
    assert not [n for n in names if 'norm' in n or n.startswith(
        ('action_', 'time_mlp', 'embedding', 'lm_head'))]


def test_a_quantized_copy_shares_everything_else_and_leaves_the_model_alone(tmp_path):
    cfg = EngineConfig(preset='tiny', cameras=CAMERA_SLOTS[:2], seed=3)
    model = build_model(cfg, cfg.model_config())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fp8 = quantized_copy(model, Fp8Kernel.SCALED_MM)
    assert fp8_kernel_of(fp8) is Fp8Kernel.SCALED_MM and fp8_kernel_of(model) is None
    assert describe_quantization(fp8) == 'fp8 e4m3, per-channel scales, scaled_mm: 25 linears'
    assert describe_quantization(model) == 'none'
    assert fp8.embedding is model.embedding and fp8.vision.blocks[0].qkv.bias is \
        model.vision.blocks[0].qkv.bias
    assert fp8.expert.layers[0].input_norm.dense is not model.expert.layers[0].input_norm.dense
    assert fp8.expert.layers[0].input_norm.dense.weight is \
        model.expert.layers[0].input_norm.dense.weight
    assert isinstance(model.vlm.layers[0].qkv, nn.Linear)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert fp8.count_parameters() == model.count_parameters()
    with pytest.raises(ValueError, match='has FP8 weights .* save the unquantized model'):
        save_checkpoint(fp8, tmp_path)


def test_the_reference_path_shows_exactly_the_weights_rounding():
    """An FP8 float32 model on the CPU = the float32 model with W := W_q * s, bit for bit."""
    cfg = EngineConfig(preset='tiny', cameras=CAMERA_SLOTS[:2], seed=3)
    model = build_model(cfg, cfg.model_config())
    fp8 = quantized_copy(model, Fp8Kernel.DEQUANT)
    rounded = quantized_copy(model, Fp8Kernel.DEQUANT)
    for name in fp8_linear_names(model):
        parent, _, child = name.rpartition('.')
        owner = rounded.get_submodule(parent)
        quantized = getattr(owner, child)
        plain = nn.Linear(quantized.in_features, quantized.out_features,
                          bias=quantized.bias is not None)
        with torch.no_grad():
            plain.weight.copy_(quantized.dequantized_weight())
        plain.bias = quantized.bias
        setattr(owner, child, plain)
    gen = torch.Generator().manual_seed(9)
    images = torch.rand(1, 2, 3, 224, 224, generator=gen) * 2 - 1
    tokens = torch.randint(3, 1000, (1, 9), generator=gen)
    noise = torch.randn(1, cfg.model_config().action_horizon, 32, generator=gen)
    outs = []
    for m in (fp8, rounded, model):
        with torch.inference_mode():
            prefix = m.prefill(tokens, None, image_embeds=m.encode_images(images))
            outs.append(m.denoise(prefix, noise))
    assert torch.equal(outs[0], outs[1])
    assert (outs[0] - outs[2]).abs().max() > 1e-4      # and that rounding is visible
