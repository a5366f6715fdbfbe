"""
One-off GPU probe (2026-11-24): SDPA kernels on the real shapes; denoise and prefill profiles.

Run from the repository root: ``PYTHONPATH=$PWD python3 <this file>`` (output:
``profile_denoise.txt``). ``DEV=cpu PRESET=tiny`` runs it on the CPU.
"""
import os
import time

from oxygen_ros.backends.config import BackendConfig, CompileMode, Step
from oxygen_ros.backends.fast_path.backend import FastPathBackend
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.tools.bench.gpu_components import Workload
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F  # noqa: N812
from torch.profiler import profile, ProfilerActivity

dev = os.environ.get('DEV', 'cuda')
dt = torch.bfloat16


def sync():
    if dev == 'cuda':
        torch.cuda.synchronize()


def bench(fn, n=20):
    fn()
    sync()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return 1e3 * (time.perf_counter() - t) / n


def sdpa_call(q, k, v, bias, variant, fold):
    """SDPA with GQA, with K/V expanded to the query heads, or with heads folded into rows."""
    s, p = q.shape[2], k.shape[2]
    if variant == 'gqa':
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias[:, :, :s],
                                              enable_gqa=True)
    if variant == 'expand':
        return F.scaled_dot_product_attention(q, k.expand(1, 8, p, 256), v.expand(1, 8, p, 256),
                                              attn_mask=bias[:, :, :s])
    return F.scaled_dot_product_attention(q.reshape(1, 1, 8 * s, 256), k, v, attn_mask=bias)


print('== SDPA microbench', flush=True)
shapes = [('prefill', 818, 832, False), ('denoise', 15, 976, True),
          ('denoise_heads', 15, 976, False)] if dev == 'cuda' else []
kernels = [None, SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
           SDPBackend.FLASH_ATTENTION]
for name, s, p, fold in shapes:
    q = torch.randn(1, 8, s, 256, device=dev, dtype=dt)
    k = torch.randn(1, 1, p, 256, device=dev, dtype=dt)
    v = torch.randn_like(k)
    bias = torch.zeros(1, 1, (8 * s if fold else s), p, device=dev, dtype=dt)
    for kernel in kernels:
        for variant in ['gqa', 'expand'] + (['fold'] if fold else []):
            try:
                if kernel is None:
                    ms = bench(lambda: sdpa_call(q, k, v, bias, variant, fold))
                else:
                    with sdpa_kernel([kernel]):
                        ms = bench(lambda: sdpa_call(q, k, v, bias, variant, fold))
                print(f'{name:14s} {str(kernel):36s} {variant:7s} {ms * 1000:8.1f} us', flush=True)
            except RuntimeError as exc:
                print(f'{name:14s} {str(kernel):36s} {variant:7s} ERR {str(exc)[:80]}',
                      flush=True)

work = Workload(preset=os.environ.get('PRESET', 'pi05_droid'), device=dev)
model = work.build_model()
cache = KVCache(model.cfg.vlm, work.num_blocks() * 16, dtype=model.dtype, device=model.device)
gen = torch.Generator().manual_seed(0)
size = model.cfg.vision.image_size
images = (torch.rand(1, 3, 3, size, size, generator=gen) * 2 - 1).to(dev, model.dtype)
tokens = torch.randint(3, 1000, (1, work.prompt_tokens), generator=gen).to(dev)
slots = torch.arange(16, 16 + work.prefix_tokens, device=dev)[None]
noise = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim, generator=gen).to(dev)


def prof(label, fn, rows=25):
    fn()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(3):
            fn()
        sync()
    print(f'== {label}', flush=True)
    print(p.key_averages().table(sort_by='cuda_time_total', row_limit=rows,
                                 max_name_column_width=70), flush=True)


with torch.inference_mode():
    embeds = model.encode_images(images)
    prefix = model.prefill(tokens, None, image_embeds=embeds, cache=cache, slots=slots)
    print('eager denoise ms', bench(lambda: model.denoise(prefix, noise), 5), flush=True)
    prof('eager denoise x3', lambda: model.denoise(prefix, noise))
    prof('eager prefill x3', lambda: model.prefill(tokens, None, image_embeds=embeds,
                                                   cache=cache, slots=slots), 15)
config = BackendConfig(compile_mode=CompileMode.REDUCE_OVERHEAD, device=dev,
                       max_running_requests=8, decode_budget=30)
t = time.perf_counter()
backend = FastPathBackend.create(config, model, work.num_blocks(), progress=False,
                                 camera_counts=(3,), only=[Step.DENOISE])
print('warmup denoise only s', time.perf_counter() - t, backend.model.fallbacks, flush=True)
fast = backend.model
with torch.inference_mode():
    prefix = fast.prefill(tokens, None, image_embeds=embeds, cache=backend.cache, slots=slots)
    print('compiled denoise ms', bench(lambda: fast.denoise(prefix, noise), 20), flush=True)
    prof('compiled denoise x3', lambda: fast.denoise(prefix, noise), 30)
