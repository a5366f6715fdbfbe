"""FLOPs and bytes per call from the config, checked against ``docs/model.md#sizes-and-costs``."""

from oxygen_ros.config import get_preset
from oxygen_ros.tools.bench.call_costs import (
    decode_cost, denoise_cost, denoise_layer_step_costs, gemma_layer_linear_params,
    prefill_cost, seed_cost, vision_cost)
from oxygen_ros.tools.bench.gpu_specs import JETSON_AGX_THOR, lookup_gpu
import pytest

PI05 = get_preset('pi05_droid').model
H100 = lookup_gpu('NVIDIA H100 80GB HBM3')


def test_parameter_and_kv_counts_match_the_spec():
    assert PI05.vlm.depth * gemma_layer_linear_params(PI05.vlm) == pytest.approx(1.98e9, 1e-3)
    assert PI05.expert.depth * gemma_layer_linear_params(PI05.expert) == 311_427_072
    assert PI05.kv_bytes_per_token(2) == 18_432                     # 18 KiB (docs/model.md)


def test_vision_is_0_22_tflop_per_image():
    assert vision_cost(PI05, 1).flops == pytest.approx(0.22e12, rel=0.01)
    assert vision_cost(PI05, 3).flops == pytest.approx(3 * 0.22e12, rel=0.01)
    assert vision_cost(PI05, 3).num_bytes == vision_cost(PI05, 1).num_bytes   # weights read once


def test_prefill_of_820_tokens_is_3_4_tflop():
    assert prefill_cost(PI05, 818).flops == pytest.approx(3.34e12, rel=0.01)
    assert prefill_cost(PI05, 306).flops == pytest.approx(1.23e12, rel=0.01)
    causal = prefill_cost(PI05, 50, context=768, causal=True)
    assert causal.flops < prefill_cost(PI05, 818).flops


def test_denoise_reads_0_6_gb_of_expert_weights_per_step():
    cost = denoise_cost(PI05, 818)
    weights = PI05.expert.depth * gemma_layer_linear_params(PI05.expert) * 2
    assert weights == pytest.approx(0.62e9, rel=0.01)
    assert cost.num_bytes == pytest.approx(10 * (weights + 818 * 18_432), rel=0.01)
    bound_ms = 1e3 * cost.bound_seconds(H100.bandwidth, H100.bf16_flops)
    assert bound_ms == pytest.approx(1.9, rel=0.05)            # "10 denoise steps ~ 2 ms"


def test_decode_step_reads_5_gb_at_batch_1():
    b1 = decode_cost(PI05, 1, 900)
    assert 4.9e9 < b1.num_bytes < 5.3e9            # 3.96 GB layers + 1.05 GB LM head
    b32 = decode_cost(PI05, 32, 900)
    assert b32.num_bytes - b1.num_bytes == pytest.approx(31 * 901 * 18_432, rel=1e-6)
    assert 1e3 * b1.bound_seconds(H100.bandwidth, H100.bf16_flops) >= 1.5
    thor = 1e3 * b1.bound_seconds(JETSON_AGX_THOR.bandwidth, JETSON_AGX_THOR.bf16_flops)
    assert thor == pytest.approx(18.4, rel=0.02)                 # ~18 ms/step on Thor
    assert seed_cost(PI05, 1).num_bytes == pytest.approx(1.05e9, rel=0.01)


def test_gpu_lookup_by_device_name():
    assert lookup_gpu('NVIDIA H100 80GB HBM3').bandwidth == 3.35e12
    assert lookup_gpu('NVIDIA H100 PCIe').name == 'H100 PCIe 80GB'
    assert lookup_gpu('NVIDIA H200').bandwidth == 4.8e12
    assert lookup_gpu('NVIDIA A100-SXM4-80GB').name == 'A100 SXM4 80GB'
    assert lookup_gpu('NVIDIA GeForce RTX 4090').bandwidth == 1.008e12
    assert lookup_gpu('NVIDIA L40S').name == 'L40S' and lookup_gpu('NVIDIA L4').name == 'L4'
    assert lookup_gpu('NVIDIA Thor') is JETSON_AGX_THOR and JETSON_AGX_THOR.bandwidth == 273e9
    assert lookup_gpu('Some Future GPU') is None


def test_a_guided_step_costs_twice_a_plain_one_at_pi05_droid_sizes():
    """Per layer-step at P = 832 slots, H = 15 (docs/gpu.md's table); the floor near 2x."""
    plain = denoise_layer_step_costs(PI05, 832)
    guided = denoise_layer_step_costs(PI05, 832, guided=True)
    old = denoise_layer_step_costs(PI05, 832, guided=True, concatenated=True)
    assert list(plain) == ['linears', 'attention']
    assert list(old) == ['linears', 'attention', 'linears_input_grad', 'attention_backward',
                         'prefix_kv_grad']
    assert plain['linears'].flops == pytest.approx(519.0e6, rel=1e-3)     # 2 * 15 * 17.3 M
    assert plain['attention'].flops == pytest.approx(104.1e6, rel=1e-3)
    assert guided['linears_input_grad'] == plain['linears']            # W^T dy, weights again
    assert old['prefix_kv_grad'].flops == pytest.approx(102.2e6, rel=1e-3)
    ratio = (sum(c.flops for c in guided.values()) / sum(c.flops for c in plain.values()))
    assert 2.0 <= ratio < 2.01
    total = denoise_cost(PI05, 818, guided=True)
    assert total.num_bytes / denoise_cost(PI05, 818).num_bytes == pytest.approx(2.0, abs=1e-9)
    assert 1.99 < total.flops / denoise_cost(PI05, 818).flops < 2.01
    # what the fast path's denoise (10 steps) is bound by on an H100: weight reads
    assert 1e3 * total.bound_seconds(H100.bandwidth, H100.bf16_flops) == pytest.approx(3.8,
                                                                                       rel=0.02)


def test_fp8_weights_halve_the_large_linears_bytes_and_run_their_gemms_at_the_fp8_rate():
    layers = PI05.vlm.depth * gemma_layer_linear_params(PI05.vlm)
    head = PI05.vocab_size * PI05.vlm.width
    bf16, fp8 = decode_cost(PI05, 8, 900), decode_cost(PI05, 8, 900, fp8_weights=True)
    assert bf16.num_bytes - fp8.num_bytes == layers               # 2 -> 1 byte, head kept
    assert fp8.flops == bf16.flops and fp8.fp8_flops == 2.0 * 8 * layers
    assert bf16.fp8_flops == 0.0
    expert = PI05.expert.depth * gemma_layer_linear_params(PI05.expert)
    d16, d8 = denoise_cost(PI05, 818), denoise_cost(PI05, 818, fp8_weights=True)
    assert d16.num_bytes - d8.num_bytes == 10 * expert             # per Euler step
    assert d8.fp8_flops == 10 * 2.0 * PI05.action_horizon * expert
    v16, v8 = vision_cost(PI05, 3), vision_cost(PI05, 3, fp8_weights=True)
    v = PI05.vision
    linear = v.depth * (4 * v.width ** 2 + 2 * v.width * v.mlp_dim) + v.width * PI05.vlm.width
    assert v16.num_bytes - v8.num_bytes == linear and v8.fp8_flops == 3 * 2.0 * 256 * linear
    p16, p8 = prefill_cost(PI05, 818), prefill_cost(PI05, 818, fp8_weights=True)
    assert p16.num_bytes - p8.num_bytes == layers and p8.fp8_flops == 2.0 * 818 * layers
    assert seed_cost(PI05, 8).num_bytes == head * 2                # the LM head stays bf16


def test_fp8_flops_run_at_the_fp8_peak():
    h200 = lookup_gpu('NVIDIA H200')
    assert (H100.fp8_flops, h200.fp8_flops, JETSON_AGX_THOR.fp8_flops) == (1979e12, 1979e12,
                                                                           517.5e12)
    assert JETSON_AGX_THOR.bf16_flops == 2070e12 / 8                # FP4 sparse / 8
    assert lookup_gpu('NVIDIA A100-SXM4-80GB').fp8_flops is None
    p8 = prefill_cost(PI05, 818, fp8_weights=True)
    compute = (p8.flops - p8.fp8_flops) / H100.bf16_flops + p8.fp8_flops / H100.fp8_flops
    assert p8.compute_seconds(H100.bf16_flops, H100.fp8_flops) == pytest.approx(compute)
    assert p8.bound_seconds(H100.bandwidth, H100.bf16_flops, H100.fp8_flops) == \
        pytest.approx(compute)                                     # prefill: compute-bound
    assert p8.compute_seconds(H100.bf16_flops) == pytest.approx(p8.flops / H100.bf16_flops)
