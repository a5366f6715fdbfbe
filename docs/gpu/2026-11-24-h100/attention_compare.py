"""
One-off GPU probe (2026-11-24): compiled denoise + decode, SDPA (auto) vs matmul attention.

Run from the repository root: ``PYTHONPATH=$PWD python3 <this file>``; writes
``$OUT/attention_compare.json``. ``DEV=cpu PRESET=tiny`` runs it on the CPU (aot_eager).
"""
import gc
import json
import os
import time

from oxygen_ros.backends.attention import sdpa_context
from oxygen_ros.backends.config import AttentionBackend, BackendConfig, CompileMode, Step
from oxygen_ros.backends.fast_path.backend import FastPathBackend
from oxygen_ros.backends.fast_path.parity_probe import float32_copy
from oxygen_ros.tools.bench.gpu_components import run_components, Workload
import torch
from torch.profiler import profile, ProfilerActivity

dev = os.environ.get('DEV', 'cuda')
work = Workload(preset=os.environ.get('PRESET', 'pi05_droid'), device=dev, repeats=20)
model = work.build_model()
reference = float32_copy(model)
out = {}
for att in ('matmul', 'auto'):
    attention = AttentionBackend(att)
    mode = CompileMode.REDUCE_OVERHEAD if dev == 'cuda' else CompileMode.DEFAULT
    config = BackendConfig(compile_mode=mode, device=dev, max_running_requests=8,
                           decode_budget=30, attention=attention)
    t = time.perf_counter()
    backend = FastPathBackend.create(
        config, model, work.num_blocks(), progress=False, camera_counts=(3,),
        only=[Step.DENOISE, Step.DECODE], reference=reference,
        **({} if dev == 'cuda' else {'backend': 'aot_eager'}))
    fast = backend.model
    res = {'warmup_s': time.perf_counter() - t, 'fallbacks': fast.fallbacks,
           'gate': {s: r.describe() for s, r in fast.parity.items()}}
    with sdpa_context(attention):
        res['ms'] = run_components(fast, backend.cache, work)['ms']
        if dev == 'cuda':
            with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as p:
                run_components(fast, backend.cache, Workload(repeats=1))
            events = sorted(p.key_averages(), key=lambda e: -e.device_time_total)[:12]
            res['top_kernels'] = [(e.key[:60], round(e.device_time_total / 1e3, 2), e.count)
                                  for e in events]
    out[att] = res
    print(att, json.dumps(res, indent=1), flush=True)
    del backend, fast
    gc.collect()
    if dev == 'cuda':
        torch.cuda.empty_cache()
d, m = out['auto']['ms'], out['matmul']['ms']
print('ratio auto/matmul', {k: round(d[k] / m[k], 2) for k in d}, flush=True)
with open(os.path.join(os.environ.get('OUT', '/tmp'), 'attention_compare.json'), 'w') as f:
    json.dump(out, f, indent=1)
