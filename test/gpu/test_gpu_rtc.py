"""
RTC's guided denoise as the GPU runs it, its body checked on the CPU too.

``cuda`` cases (``pytest -m gpu``; skipped without CUDA), what CPU CI cannot see: Inductor's
Triton kernels for the guided step (the velocity and its vector-Jacobian product,
``model.guidance.GuidedDenoiseCall``) inside a captured CUDA graph, equal to the eager reference
(``rtc.guided_denoise``, autograd) within the parity gate, in float32 and bfloat16, replayed
on a prefix and a guidance it never saw at the warm-up. ``cpu`` cases (``make test``,
``test/devices.py``): the same step traced with ``aot_eager``, called (not captured) on the
same new prefix and guidance, held to the same gate.
"""

from devices import compiler, DEVICES
from oxygen_ros.backends.config import CompileMode, Step
from oxygen_ros.backends.fast_path.buckets import EngineLimits
from oxygen_ros.backends.fast_path.model import FastPathModel
from oxygen_ros.backends.parity import check_parity, float32_copy
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.control.rtc import soft_mask
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.loading import build_model
from oxygen_ros.model.guidance import guided_denoise, RtcGuidance
from oxygen_ros.model.kv_cache import KVCache
import pytest
import torch

SLOTS = 1024


def _prefix(model, pool, num_tokens, seed):
    """Prefill two cameras and ``num_tokens`` prompt tokens into ``pool`` (slots from 16)."""
    gen = torch.Generator().manual_seed(seed)
    size, ti = model.cfg.vision.image_size, model.cfg.image_tokens_per_camera
    images = torch.rand(1, 2, 3, size, size, generator=gen) * 2 - 1
    images = images.to(model.device, model.dtype)
    tokens = torch.randint(3, 1000, (1, num_tokens), generator=gen).to(model.device)
    slots = torch.arange(16, 16 + 2 * ti + num_tokens, device=model.device)[None]
    return model.prefill(tokens, None, image_embeds=model.encode_images(images), cache=pool,
                         slots=slots)


def guided_graph_against_eager(dtype, device='cuda', compile_mode=CompileMode.REDUCE_OVERHEAD,
                               backend='inductor'):
    """Warm the guided denoise up alone; return (its graphs, the gate's result on new inputs)."""
    cfg = EngineConfig.create(preset='tiny', prefix_attention=PrefixAttention.BIDIRECTIONAL,
                              cameras=CAMERA_SLOTS[:2], device=device, dtype=dtype, seed=5)
    model = build_model(cfg, cfg.model_config())
    limits = EngineLimits.for_model(model.cfg, num_slots=SLOTS, max_batch=1,
                                    max_decode_tokens=8, max_cameras=2)
    comp = FastPathModel(model, compile_mode, limits, backend=backend,
                         only=[Step.GUIDED_DENOISE], guided=True)
    pool = KVCache(model.cfg.vlm, SLOTS, dtype=model.dtype, device=model.device)
    comp.warmup(pool, progress=False)
    assert comp.fallbacks == {}, comp.fallbacks
    assert comp.parity['guided_denoise'].passed, comp.parity['guided_denoise'].describe()
    graphs = comp._graphs[Step.GUIDED_DENOISE]
    h, a = model.cfg.action_horizon, model.cfg.action_dim
    gen = torch.Generator().manual_seed(11)
    noise = torch.randn(1, h, a, generator=gen).to(model.device)
    guidance = RtcGuidance(torch.randn(1, h, a, generator=gen).to(model.device),
                           torch.tensor(soft_mask(h, 1, h - 1)).to(model.device))
    reference = float32_copy(model)
    with torch.inference_mode():
        calls = sum(g.num_calls for g in graphs.values())
        got = comp.guided_denoise(_prefix(model, pool, 13, 3), noise, guidance)
        replays = sum(g.num_calls for g in graphs.values()) - calls
        want = guided_denoise(model, _prefix(model, pool, 13, 3), noise, guidance)
        ref = None
        if reference is not None:
            ref_pool = KVCache(model.cfg.vlm, SLOTS, device=model.device)
            ref = [guided_denoise(reference, _prefix(reference, ref_pool, 13, 3), noise,
                                  guidance)]
    assert replays == 1
    return graphs, check_parity('guided_denoise', [got], [want], ref)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
def test_the_guided_denoise_graph_captures_and_equals_eager_within_the_gate(dtype, device):
    graphs, result = guided_graph_against_eager(dtype, device, backend=compiler(device))
    assert graphs and all(g.captured == (device == 'cuda') for g in graphs.values())
    assert result.passed, result.describe()
    if dtype == 'bfloat16':
        assert result.reference_error > 0              # the gate took bf16's own rounding
