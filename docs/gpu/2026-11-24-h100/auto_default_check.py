"""
One-off GPU probe (2026-11-24): the default attention (AUTO) on the CUDA fast path.

Compiles the denoise step alone with ``$OXYGEN_ROS_ATTENTION`` unset and checks that it runs
without any SDPA kernel (matmul short-query attention) within the parity gate. Run from the
repository root: ``PYTHONPATH=$PWD python3 <this file>`` (output: ``auto_default_check.txt``).
"""
import time

from oxygen_ros.backends.config import AttentionBackend, BackendConfig, CompileMode, Step
from oxygen_ros.backends.fast_path.backend import FastPathBackend
from oxygen_ros.tools.bench.gpu_components import Workload
import torch
from torch.profiler import profile, ProfilerActivity

work, dev = Workload(), 'cuda'
model = work.build_model()
config = BackendConfig(compile_mode=CompileMode.REDUCE_OVERHEAD, device=dev,
                       max_running_requests=8, decode_budget=30,
                       attention=AttentionBackend.resolve(None))
print('attention', config.attention, flush=True)
t = time.perf_counter()
backend = FastPathBackend.create(config, model, work.num_blocks(), progress=False,
                                 camera_counts=(3,), only=[Step.DENOISE])
print('warmup s', round(time.perf_counter() - t, 1), 'fallbacks', backend.model.fallbacks,
      {s: r.describe() for s, r in backend.model.parity.items()}, flush=True)
fast = backend.model
gen = torch.Generator().manual_seed(0)
size = model.cfg.vision.image_size
images = (torch.rand(1, 3, 3, size, size, generator=gen) * 2 - 1).to(dev, model.dtype)
tokens = torch.randint(3, 1000, (1, work.prompt_tokens), generator=gen).to(dev)
slots = torch.arange(16, 16 + work.prefix_tokens, device=dev)[None]
noise = torch.randn(1, model.cfg.action_horizon, model.cfg.action_dim, generator=gen).to(dev)
with torch.inference_mode():
    embeds = model.encode_images(images)
    prefix = fast.prefill(tokens, None, image_embeds=embeds, cache=backend.cache, slots=slots)
    fast.denoise(prefix, noise)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        fast.denoise(prefix, noise)
    torch.cuda.synchronize()
    print('compiled denoise ms (AUTO)', round((time.perf_counter() - t) / 20 * 1e3, 2),
          flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fast.denoise(prefix, noise)
        torch.cuda.synchronize()
    names = [e.key for e in p.key_averages()]
    print('sdpa-like kernels', [n[:60] for n in names if any(
        word in n.lower() for word in ('sdpa', 'attention', 'fmha'))], flush=True)
