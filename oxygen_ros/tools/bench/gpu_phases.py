"""
The phases of the GPU session (``oxygen_bench gpu``), each run in a fresh process.

A phase gets a :class:`PhaseContext` (the session's options, its deadline) and saves its
figures through ``ctx.save(key, value)`` as soon as each is measured: the file
``<out>/session<N>_<phase>.json`` is rewritten at once, so a phase killed at its deadline keeps
what it had. It returns True when something failed or fell back (the figures are kept).

==================== =====================================================================
phase                what it measures
==================== =====================================================================
environment          GPU, driver, torch, CUDA, cuDNN, Triton, Python, CPU, the tokenizer
bench                the fast path warmed up cold (saved the moment it is warm: seconds per
                     step, graphs, fallbacks, the features dropped, the gate), then
                     ``oxygen_bench engine``: OxyGen vs isolated on it (one shared warm-up),
                     the paper workload
second_start         a fresh process starting the same engine: the compile caches at work
gpu_tests            ``pytest -m gpu test/gpu`` on the tiny model (a subprocess; on several
                     worker processes with pytest-xdist), per test, as they finish
compiled_components  the fast path's cold warm-up (compiles and recompiles per step, the
                     gate, fallbacks, features dropped, compile cache, the decode attention
                     used; RTC's guided denoise included), each call (the guided denoise
                     too), the action path's parity, the decode attention alone (paged vs
                     gather), the prefill's and SigLIP's attention alone, kernel by kernel
fp8_components       FP8 weights (``model/fp8.py``): the action check against bf16 and
                     float32, then as ``compiled_components`` on the FP8 model (the gate
                     against the unquantized float32 copy), rooflines with FP8 bytes and
                     FLOPs, Thor's projection
autotune_components  vision and prefill compiled with Inductor's defaults, then with
                     ``max_autotune``: compile time, gate, each call
eager_components     each model call, eager, with every attention kernel; rooflines
robots               ``oxygen_bench engine --robots 1 2 4`` on the fast path's robot-batch
                     graphs, against the GPU target of several robots (``gpu_robots.py``)
==================== =====================================================================
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
import datetime
import json
import logging
import os
from pathlib import Path
import platform
import re
import shutil
import subprocess
import sys
import time
from typing import Any, Callable

from oxygen_ros.tools.bench.bench_run import run_engine_bench
from oxygen_ros.tools.bench.gpu_autotune import autotune_components
from oxygen_ros.tools.bench.gpu_components import Workload
from oxygen_ros.tools.bench.gpu_robots import several_robots

REPO = Path(__file__).resolve().parents[3]
"""The checkout (``test/gpu`` runs from here)."""
BENCH_MAX_RUNNING = 8
"""Decode batch limit of the bench and the start (the paper workload runs ~6 rows)."""


@dataclass
class PhaseContext:
    """What a phase works with: the options, where to save, when to stop."""

    args: argparse.Namespace
    path: Path
    deadline: float
    results: dict

    def save(self, key: str, value: Any) -> None:
        """Store ``value`` under ``key`` and rewrite the phase's file now (atomically)."""
        self.results[key] = value
        write_json(self.path, self.results)

    def seconds_left(self) -> float:
        return self.deadline - time.time()

    def workload(self) -> Workload:
        a = self.args
        return Workload(preset=a.preset, dtype=a.dtype, device=a.device, cameras=a.cameras,
                        prompt_tokens=a.prompt_tokens, decode_ctx=a.decode_ctx,
                        repeats=a.repeats)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file (never half written)."""
    tmp = path.with_name(path.name + '.tmp')
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)


def _version(package: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def environment(ctx: PhaseContext) -> bool:
    """Record the machine and software; fail when the device asked for is not there."""
    import torch

    from oxygen_ros.tools.common.machine import cpu_name
    from oxygen_ros.transforms.tokenizer import default_tokenizer_path

    dev = ctx.args.device
    env = {'device': dev, 'device_name': 'cpu', 'driver': None, 'gpu_memory_gib': None,
           'compute_capability': None, 'multiprocessors': None, 'torch': torch.__version__,
           'cuda': torch.version.cuda, 'cudnn': torch.backends.cudnn.version(),
           'triton': _version('triton'), 'python': sys.version.split()[0],
           'platform': platform.platform(), 'cpu': cpu_name(), 'cpu_count': os.cpu_count(),
           'date': datetime.date.today().isoformat(), 'cuda_available': torch.cuda.is_available()}
    tok = default_tokenizer_path()
    env['tokenizer'] = {'path': str(tok), 'bytes': tok.stat().st_size if tok.is_file() else None}
    if dev.startswith('cuda') and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(dev)
        env.update(device_name=props.name, gpu_memory_gib=props.total_memory / 2**30,
                   compute_capability=f'{props.major}.{props.minor}',
                   multiprocessors=props.multi_processor_count)
        if shutil.which('nvidia-smi'):
            smi = subprocess.run(['nvidia-smi', '--query-gpu=driver_version,clocks.max.sm,'
                                  'power.limit', '--format=csv,noheader'],
                                 capture_output=True, text=True, timeout=30)
            fields = smi.stdout.strip().splitlines()[0].split(', ') if smi.returncode == 0 \
                else []
            env['driver'] = fields[0] if fields else None
            env['nvidia_smi'] = smi.stdout.strip() or smi.stderr.strip()
    ctx.save('environment', env)
    print(json.dumps(env, indent=1))
    return dev.startswith('cuda') and not torch.cuda.is_available()


_OUTCOMES = 'PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS'
_OUTCOME = re.compile(rf'^(test/\S+::\S+) ({_OUTCOMES})')
"""A test's line of ``pytest -v``."""
_OUTCOME_XDIST = re.compile(rf'^\[gw\d+\] \[ *\d+%\] ({_OUTCOMES}) (test/\S+::\S+)')
"""A finished test's line of ``pytest -v -n N`` (pytest-xdist)."""
_STARTED = re.compile(r'^(test/\S+::\S+) ?$')
"""A test started (``-v -n N``), or cut off before its outcome (``-v``)."""
MAX_TEST_WORKERS = 8


def gpu_test_workers() -> int:
    """Return the pytest-xdist worker processes for ``gpu_tests`` (0: xdist is missing)."""
    from importlib.util import find_spec

    if find_spec('xdist') is None:
        return 0
    return min(MAX_TEST_WORKERS, max(1, (os.cpu_count() or 2) // 2))


def parse_test_outcomes(lines: list[str]) -> tuple[dict[str, str], list[str]]:
    """
    Return each test's outcome and the tests started without one, from ``pytest -v`` output.

    :param lines: the output, with or without pytest-xdist (``-n N``); a run killed at its
        deadline leaves the tests it was running without an outcome.
    """
    tests, started = {}, []
    for line in lines:
        if m := _OUTCOME_XDIST.match(line):
            tests[m.group(2)] = m.group(1)
        elif m := _OUTCOME.match(line):
            tests[m.group(1)] = m.group(2)
        elif m := _STARTED.match(line):
            started.append(m.group(1))
    return tests, [t for t in dict.fromkeys(started) if t not in tests]


def gpu_tests(ctx: PhaseContext) -> bool:
    """
    Run ``pytest -m gpu test/gpu`` (a subprocess, killed at the deadline); per-test results.

    On ``gpu_test_workers()`` processes where pytest-xdist is installed (the GPU machine's
    image has it; each test's Inductor compiles are CPU work, the GPU is shared), each with
    its share of Inductor's compile threads; else in one. Tests that finished before the
    deadline keep their outcome; those it cut off are listed (``unfinished``).
    """
    workers = gpu_test_workers()
    cmd = [sys.executable, '-m', 'pytest', '-m', 'gpu', 'test/gpu', '-v', '-rfE',
           '-p', 'no:cacheprovider', '--durations=10']
    env = dict(os.environ)
    if workers:
        cmd += ['-n', str(workers), '--dist', 'load']
        env.setdefault('TORCHINDUCTOR_COMPILE_THREADS',
                       str(max(1, (os.cpu_count() or 2) // workers)))
    timeout = max(10.0, ctx.seconds_left() - 5)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env=env)
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        timed_out = True
    sys.stdout.write(out)
    lines = out.splitlines()
    tests, unfinished = parse_test_outcomes(lines)
    counts = {k.lower(): sum(v == k for v in tests.values())
              for k in ('PASSED', 'FAILED', 'SKIPPED', 'ERROR')}
    result = {'command': ' '.join(cmd[1:]), 'workers': workers,
              'returncode': None if timed_out else proc.returncode,
              'timed_out': timed_out, 'seconds': time.perf_counter() - t0, **counts,
              'tests': tests, 'unfinished': unfinished,
              'failures': [ln for ln in lines if ln.startswith(('FAILED ', 'ERROR '))],
              'summary': lines[-1] if lines else ''}
    ctx.save('gpu_tests', result)
    return timed_out or proc.returncode not in (0, 5)      # 5: no test collected


def eager_components(ctx: PhaseContext) -> bool:
    """Time each call eagerly, with every attention kernel; rooflines for the chosen one."""
    from oxygen_ros.backends.attention import sdpa_context
    from oxygen_ros.backends.config import AttentionBackend
    from oxygen_ros.model.kv_cache import KVCache
    from oxygen_ros.tools.bench.gpu_components import roofline_entry, run_components

    work = ctx.workload()
    t0 = time.perf_counter()
    model = work.build_model()
    cache = KVCache(model.cfg.vlm, work.num_blocks() * 16, dtype=model.dtype,
                    device=model.device)
    chosen = AttentionBackend.resolve(ctx.args.attention)
    kernels: dict = {}
    ctx.save('workload', {**work.as_dict(), 'model_build_s': time.perf_counter() - t0,
                          'attention_backend': chosen.value})
    # the eager model always gathers its decode context and never runs FlexAttention: TRITON
    # and FLEX time the same calls as AUTO
    others = [b for b in AttentionBackend
              if b not in (chosen, AttentionBackend.TRITON, AttentionBackend.FLEX)]
    for backend in [chosen] + others:
        try:
            with sdpa_context(backend):
                kernels[backend.value] = {'ms': run_components(model, cache, work)['ms']}
        except Exception as exc:  # noqa: B902 - a kernel that cannot run these calls
            kernels[backend.value] = {'error': f'{type(exc).__name__}: {exc}'[:600]}
        print(f'attention {backend.value}: {kernels[backend.value]}', flush=True)
        ctx.save('attention_backends', kernels)
        if backend is chosen and 'ms' in kernels[backend.value]:
            ms = kernels[backend.value]['ms']
            ctx.save('ms', ms)
            for key, value in roofline_entry(ms, work, _device_name(ctx)).items():
                ctx.save(key, value)
    return 'ms' not in kernels[chosen.value]


def _device_name(ctx: PhaseContext) -> str:
    import torch
    dev = ctx.args.device
    return torch.cuda.get_device_name(dev) if dev.startswith('cuda') else 'cpu'


class _Recompiles(logging.Handler):
    """Collects Dynamo's recompile messages (``torch._logging`` artifact ``recompiles``)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.messages) < 50:
            self.messages.append(record.getMessage()[:1500])

    def __enter__(self) -> _Recompiles:
        import torch
        torch._logging.set_logs(recompiles=True)
        logging.getLogger('torch._dynamo.guards.__recompiles').addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger('torch._dynamo.guards.__recompiles').removeHandler(self)


def compiled_components(ctx: PhaseContext) -> bool:
    """
    Warm the fast path up cold (timed, compiles logged), time each call, check parity.

    With real-time chunking on (``rtc``): the guided denoise is compiled, captured and gated
    with the rest, timed beside the plain one and held against eager's guided denoise.
    """
    from oxygen_ros.backends.parity import float32_copy
    from oxygen_ros.tools.bench.gpu_components import (
        time_decode_attention, time_prefix_attention)

    work = ctx.workload()
    model = work.build_model()
    reference = float32_copy(model)     # ONE float32 copy: the gate's and the parity's
    failed, paged = _fast_path_components(ctx, model, reference, work)
    try:
        ctx.save('decode_attention', {'used': paged, **time_decode_attention(work)})
    except Exception as exc:  # noqa: B902 - a figure lost, not the phase
        ctx.save('decode_attention', {'used': paged, 'error': f'{type(exc).__name__}: {exc}'})
    del model, reference
    try:
        ctx.save('prefix_attention', time_prefix_attention(work, ctx.args.compile_backend))
    except Exception as exc:  # noqa: B902 - a figure lost, not the phase
        ctx.save('prefix_attention', {'error': f'{type(exc).__name__}: {exc}'[:600]})
    return failed


def fp8_components(ctx: PhaseContext) -> bool:
    """
    FP8 weights: the action check at load, then the fast path with them, as ``compiled``.

    The weights are the session's random bf16 ones, quantized (``model/fp8.py``); the check
    (``backends/fp8_gate.py``) is recorded, not obeyed: random weights are expected to fail
    it (docs/gpu.md), and the FP8 calls are timed either way. Thor's projection beside them.
    """
    import torch

    from oxygen_ros.backends.fp8_gate import check_fp8_actions
    from oxygen_ros.backends.parity import float32_copy
    from oxygen_ros.model.fp8 import describe_quantization, fp8_kernel, quantized_copy

    work = ctx.workload()
    model = work.build_model()
    reference = float32_copy(model)
    kernel, why = fp8_kernel(model.device)          # raises below compute capability 8.9
    t0 = time.perf_counter()
    fp8 = quantized_copy(model, kernel)
    info = {'kernel': kernel.value, 'reference_path_reason': why,
            'linears': describe_quantization(fp8), 'quantize_s': time.perf_counter() - t0}
    ctx.save('quantization', info)
    bf16 = model if model.dtype == torch.bfloat16 else None
    if bf16 is not None:
        t0 = time.perf_counter()
        check = check_fp8_actions(fp8, bf16, reference if reference is not None else model,
                                  num_cameras=work.cameras)
        ctx.save('quantization', {**info, 'acceptance': check.as_dict(),
                                  'acceptance_s': time.perf_counter() - t0,
                                  'acceptance_rule': check.describe()})
    del model, bf16                 # the bf16 linears; the FP8 copy shares everything else
    failed, _ = _fast_path_components(ctx, fp8, reference, work, fp8_weights=True)
    return failed


def _fast_path_components(ctx: PhaseContext, model, reference, work: Workload, *,
                          fp8_weights: bool = False) -> tuple[bool, object]:
    """
    Warm the fast path up on ``model``, time each call, hold its outputs to eager's.

    :returns: (something failed or fell back, the decode attention the graphs use).
    """
    from oxygen_ros.backends.attention import sdpa_context
    from oxygen_ros.backends.config import AttentionBackend, BackendConfig, CompileMode
    from oxygen_ros.backends.fast_path.backend import FastPathBackend
    from oxygen_ros.backends.fast_path.graph_builder import Kernels
    from oxygen_ros.backends.fast_path.paged_attention import decode_attention, denoise_attention
    from oxygen_ros.config import get_preset
    from oxygen_ros.model.flex import prefill_attention
    from oxygen_ros.model.kv_cache import KVCache
    from oxygen_ros.parameters import declared_config
    from oxygen_ros.sched.scheduler import SchedulerConfig
    from oxygen_ros.tools.bench.gpu_components import (
        denoise_entry, K_STEPS, pipeline_parity, roofline_entry, run_components)
    from oxygen_ros.tools.bench.warmup_summary import warmup_summary

    a = ctx.args
    attention = AttentionBackend.resolve(a.attention)
    config = declared_config(BackendConfig, 'backend', compile_mode=CompileMode(a.compile_mode),
                             device=a.device, attention=attention, rtc=True)
    scheduler = declared_config(SchedulerConfig, 'scheduler',
                                max_running_requests=max(work.decode_batches),
                                tokens_per_cycle=K_STEPS)
    with _Recompiles() as recompiles:
        backend = FastPathBackend.create(
            config, model, work.num_blocks(), scheduler=scheduler,
            max_decode_tokens=max(get_preset(work.preset).decode_budget, 30),
            max_cameras=work.cameras, backend=a.compile_backend, progress=False,
            camera_counts=(work.cameras,), reference=reference)
    fast, report = backend.fast_path, backend.warmup_report
    compiled = fast.kernels is Kernels.INDUCTOR and 'decode' not in report.fallbacks
    with sdpa_context(attention):
        paged = decode_attention(fast.device, compiled)
        fused = denoise_attention(fast.device, fast.kernels is Kernels.INDUCTOR
                                  and 'denoise' not in report.fallbacks, model.cfg.action_horizon)
        prefix = prefill_attention(fast.device, fast.kernels is Kernels.INDUCTOR
                                   and 'prefill' not in report.fallbacks)
    warm = warmup_summary(backend)
    ctx.save('warmup', {
        **warm, 'compile_mode': fast.mode.value, 'compile_backend': a.compile_backend,
        'camera_counts': list(fast.shapes.camera_counts), 'attention_backend': attention.value,
        'decode_attention': paged, 'denoise_attention': fused, 'prefill_attention': prefix,
        'recompiles': recompiles.messages})
    with sdpa_context(attention):
        run = run_components(fast, backend.cache, work, guided=True)
        ctx.save('ms', run['ms'])
        ctx.save('denoise', denoise_entry(run['ms'], model.cfg, fused))
        for key, value in roofline_entry(run['ms'], work, _device_name(ctx),
                                         fp8_weights=fp8_weights).items():
            ctx.save(key, value)
        pool = KVCache(model.cfg.vlm, work.num_blocks() * 16, dtype=model.dtype,
                       device=model.device)
        eager = run_components(model, pool, work, timed=False, guided=True)['outputs']
        ref = None
        if reference is not None:
            ref_pool = KVCache(model.cfg.vlm, work.num_blocks() * 16, device=model.device)
            ref = run_components(reference, ref_pool, work, timed=False,
                                 guided=True)['outputs']
    parity = pipeline_parity(run['outputs'], eager, ref, work)
    ctx.save('pipeline_parity', parity)
    return bool(report.fallbacks or warm['dropped']) or not parity['passed'], paged


def _engine_args(ctx: PhaseContext) -> list[str]:
    """Return the options the bench and the start share (same shapes: one compile cache key)."""
    a = ctx.args
    out = ['--preset', a.preset, '--dtype', a.dtype, '--device', a.device,
           '--cameras', str(a.cameras), '--max-running', str(BENCH_MAX_RUNNING),
           '--decode-budget', '30', '--compile-backend', a.compile_backend,
           '--compile-cameras', str(a.cameras)]
    return out + (['--attention', a.attention] if a.attention else [])


def bench(ctx: PhaseContext) -> bool:
    """
    Warm the fast path up cold, then run ``oxygen_bench engine``: OxyGen vs isolated on it.

    One process, one warm-up (a second would cost what the second start measures): its
    figures are saved under ``warmup`` the moment both engines are warm
    (``warmup_summary``: seconds per step, graphs, fallbacks, dropped features, the gate),
    the bench's under ``result`` when it ends. Failed on a fallback, a dropped feature or
    texts that differ.
    """
    argv = _engine_args(ctx) + ['--tokens-per-cycle', '5', '--text-every', '1',
                                '--frames', str(ctx.args.frames), '--compile',
                                ctx.args.compile_mode]
    result = run_engine_bench(ctx, argv, on_warm=lambda warm: ctx.save('warmup', warm))
    if result is None:
        return True
    ctx.save('result', result)
    return bool(result.get('fallbacks') or result.get('dropped')) or \
        not result.get('text_equal')


def second_start(ctx: PhaseContext) -> bool:
    """Start the bench's engine in a fresh process: the compile caches on disk at work."""
    cmd = [sys.executable, '-m', 'oxygen_ros.tools.bench.start', *_engine_args(ctx),
           '--compile-mode', ctx.args.compile_mode]
    ctx.save('command', ' '.join(cmd[1:]))
    timeout = max(10.0, ctx.seconds_left() - 5)
    spawned = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)               # with its compile workers
        out, err = proc.communicate()
        sys.stdout.write(err[-20000:])
        ctx.save('error', f'no first action chunk within {timeout:.0f} s: killed (its log '
                          f'is in the session log)')
        return True
    sys.stdout.write(err[-20000:])
    if proc.returncode != 0:
        ctx.save('error', f'oxygen_ros.tools.bench.start exit code {proc.returncode}')
        return True
    run = json.loads(out.strip().splitlines()[-1])
    run['first_chunk_s'] = run['first_chunk_unix_s'] - spawned
    ctx.save('second_start', run)
    print(f"second start: first action chunk {run['first_chunk_s']:.1f} s after spawn "
          f"(fast-path warm-up {run['fast_path_warmup_s']:.1f} s, compile cache "
          f"{run['compile_cache_hits']} hits / {run['compile_cache_misses']} misses)")
    return bool(run['fallbacks'] or run.get('dropped'))


def robots(ctx: PhaseContext) -> bool:
    """Run several robots on the fast path (``gpu_robots.py``), the bench's shapes."""
    return several_robots(ctx, _engine_args(ctx))


PHASES: dict[str, Callable[[PhaseContext], bool]] = {
    'environment': environment, 'gpu_tests': gpu_tests, 'eager_components': eager_components,
    'compiled_components': compiled_components, 'bench': bench, 'second_start': second_start,
    'fp8_components': fp8_components, 'autotune_components': autotune_components,
    'robots': robots}

__all__ = ['PHASES', 'PhaseContext', 'REPO', 'gpu_test_workers', 'parse_test_outcomes',
           'write_json']
