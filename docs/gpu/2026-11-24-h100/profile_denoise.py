"""One-off GPU profile: denoise kernels eager vs compiled, SDPA variants on the real shapes."""
import os, sys, time, torch
from torch.profiler import profile, ProfilerActivity
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F
from oxygen_ros.tools.bench.gpu_components import Workload
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.backends.config import BackendConfig, CompileMode, AttentionBackend
from oxygen_ros.backends.fast_backend import CompiledTorchBackend
from oxygen_ros.backends.config import Step

def bench(fn, n=20):
    fn(); sync(); t=time.perf_counter()
    for _ in range(n): fn()
    sync(); return 1e3*(time.perf_counter()-t)/n

dev=os.environ.get('DEV','cuda'); dt=torch.bfloat16
sync = torch.cuda.synchronize if dev=='cuda' else (lambda: None)
print('== SDPA microbench', flush=True)
for name, S, P, fold in [] if dev!='cuda' else [('prefill', 818, 832, False), ('denoise', 15, 976, True), ('denoise_heads', 15, 976, False)]:
    q = torch.randn(1, 8, S, 256, device=dev, dtype=dt); k = torch.randn(1, 1, P, 256, device=dev, dtype=dt); v = torch.randn_like(k)
    bias = torch.zeros(1, 1, (8*S if fold else S), P, device=dev, dtype=dt)
    qf = q.reshape(1, 1, 8*S, 256)
    for bk in [None, SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]:
        for variant in ['gqa', 'expand', 'fold']:
            if variant == 'fold' and not fold: continue
            def call():
                if variant == 'gqa': return F.scaled_dot_product_attention(q, k, v, attn_mask=bias if not fold else bias[:, :, :S], enable_gqa=True)
                if variant == 'expand': return F.scaled_dot_product_attention(q, k.expand(1, 8, P, 256), v.expand(1, 8, P, 256), attn_mask=bias if not fold else bias[:, :, :S])
                return F.scaled_dot_product_attention(qf, k, v, attn_mask=bias)
            try:
                if bk is None: ms = bench(call)
                else:
                    with sdpa_kernel([bk]): ms = bench(call)
                print(f'{name:14s} {str(bk):36s} {variant:7s} {ms*1000:8.1f} us', flush=True)
            except Exception as e:
                print(f'{name:14s} {str(bk):36s} {variant:7s} ERR {str(e)[:80]}', flush=True)

work = Workload(preset=os.environ.get('PRESET','pi05_droid'), device=dev)
model = work.build_model()
cache = KVCache(model.cfg.vlm, work.num_blocks() * 16, dtype=model.dtype, device=model.device)
gen = torch.Generator().manual_seed(0)
size = model.cfg.vision.image_size
images = (torch.rand(1, 3, 3, size, size, generator=gen) * 2 - 1).to(dev, model.dtype)
tokens = torch.randint(3, 1000, (1, work.prompt_tokens), generator=gen).to(dev)
slots = torch.arange(16, 16 + work.prefix_tokens, device=dev)[None]
noise = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim, generator=gen).to(dev)

def prof(label, fn, rows=25):
    fn(); sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(3): fn()
        sync()
    print(f'== {label}', flush=True)
    print(p.key_averages().table(sort_by='cuda_time_total', row_limit=rows, max_name_column_width=70), flush=True)

with torch.inference_mode():
    embeds = model.encode_images(images)
    prefix = model.prefill(tokens, None, image_embeds=embeds, cache=cache, slots=slots)
    print('eager denoise ms', bench(lambda: model.denoise(prefix, noise), 5), flush=True)
    prof('eager denoise x3', lambda: model.denoise(prefix, noise))
    prof('eager prefill x3', lambda: model.prefill(tokens, None, image_embeds=embeds, cache=cache, slots=slots), 15)
mode = sys.argv[1] if len(sys.argv) > 1 else 'reduce-overhead'
config = BackendConfig(compile_mode=CompileMode(mode), device=dev, max_running_requests=8, decode_budget=30)
t = time.perf_counter()
backend = CompiledTorchBackend.create(config, model, work.num_blocks(), progress=False, camera_counts=(3,), only=[Step.DENOISE])
print('warmup denoise only s', time.perf_counter() - t, backend.model.fallbacks, flush=True)
fast = backend.model
with torch.inference_mode():
    prefix = fast.prefill(tokens, None, image_embeds=embeds, cache=backend.cache, slots=slots)
    print('compiled denoise ms', bench(lambda: fast.denoise(prefix, noise), 20), flush=True)
    prof('compiled denoise x3', lambda: fast.denoise(prefix, noise), 30)
