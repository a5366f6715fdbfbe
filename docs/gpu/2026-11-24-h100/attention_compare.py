"""One-off GPU comparison: compiled denoise + decode with attention auto vs matmul."""
import gc, json, os, sys, time, torch
from torch.profiler import profile, ProfilerActivity
from oxygen_ros.tools.bench.gpu_components import Workload, run_components
from oxygen_ros.backends.attention import sdpa_context
from oxygen_ros.backends.config import BackendConfig, CompileMode, AttentionBackend, Step
from oxygen_ros.backends.fast_backend import CompiledTorchBackend
from oxygen_ros.backends.parity_probe import float32_copy

dev = os.environ.get('DEV', 'cuda')
work = Workload(preset=os.environ.get('PRESET', 'pi05_droid'), device=dev, repeats=20)
model = work.build_model()
reference = float32_copy(model)
out = {}
for att in ('matmul', 'auto'):
    attention = AttentionBackend(att)
    config = BackendConfig(compile_mode=CompileMode.REDUCE_OVERHEAD if dev == 'cuda' else CompileMode.DEFAULT,
                           device=dev, max_running_requests=8, decode_budget=30, attention=attention)
    t = time.perf_counter()
    backend = CompiledTorchBackend.create(config, model, work.num_blocks(), progress=False,
                                          camera_counts=(3,), only=[Step.DENOISE, Step.DECODE],
                                          reference=reference,
                                          **({} if dev == 'cuda' else {'backend': 'aot_eager'}))
    fast = backend.model
    res = {'warmup_s': time.perf_counter() - t, 'fallbacks': fast.fallbacks,
           'gate': {s: r.describe() for s, r in fast.parity.items()}}
    with sdpa_context(attention):
        res['ms'] = run_components(fast, backend.cache, work)['ms']
        if dev == 'cuda':
            with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as p:
                run_components(fast, backend.cache, Workload(repeats=1))
            res['top_kernels'] = [(e.key[:60], round(e.device_time_total / 1e3, 2), e.count)
                                  for e in sorted(p.key_averages(), key=lambda e: -e.device_time_total)[:12]]
    out[att] = res
    print(att, json.dumps(res, indent=1), flush=True)
    del backend, fast
    gc.collect()
    if dev == 'cuda':
        torch.cuda.empty_cache()
d, m = out['auto']['ms'], out['matmul']['ms']
print('ratio auto/matmul', {k: round(d[k] / m[k], 2) for k in d}, flush=True)
json.dump(out, open(os.path.join(os.environ.get('OUT', '/tmp'), 'attention_compare.json'), 'w'), indent=1)
