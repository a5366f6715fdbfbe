"""
``oxygen_bench gpu`` on the CPU: the dry run of the lease's two commands, failures, the budget.

The dry run is ``make gpu-session`` on the tiny preset, as a GPU machine runs it: every phase in
its own process, with ROS, rosbags, MuJoCo and simplejpeg made unimportable (a GPU machine's
python has none of them). Each session must fill every key the GPU run fills.
"""

import json
import os
from pathlib import Path
import subprocess
import sys
import time

from oxygen_ros.tools.bench import gpu_robots, gpu_session
from oxygen_ros.tools.bench.gpu_phases import parse_test_outcomes
from oxygen_ros.tools.bench.roofline import show, TARGETS_MS
from oxygen_ros.tools.bench.warmup_summary import dropped_features, warmup_summary
import pytest

REPO = Path(__file__).resolve().parents[2]
ABSENT_ON_GPU_MACHINE = ('rclpy', 'rosbags', 'mujoco', 'simplejpeg', 'ament_index_python',
                         'rosidl_runtime_py', 'sensor_msgs', 'std_msgs')
BLOCKER = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in BLOCKED:
            raise ModuleNotFoundError(f'No module named {{name!r}} (absent on a GPU machine)')
        return None
sys.meta_path.insert(0, _Absent())
"""


def _env(tmp_path: Path, blocked=ABSENT_ON_GPU_MACHINE) -> dict:
    """Return an environment in which ``blocked`` top-level packages cannot be imported."""
    site = tmp_path / 'site'
    site.mkdir(exist_ok=True)
    (site / 'sitecustomize.py').write_text(BLOCKER.format(blocked=tuple(blocked)))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(('TORCHINDUCTOR_', 'TRITON_'))}
    env['PYTHONPATH'] = str(site)
    return env


@pytest.mark.slow
def test_dry_run_of_the_leases_two_commands_fills_every_key(tmp_path):
    out, cache = tmp_path / 'out', tmp_path / 'cache'
    t0 = time.perf_counter()
    proc = subprocess.run(['make', '--no-print-directory', 'gpu-session', 'GPU_DEVICE=cpu',
                           'GPU_PRESET=tiny', f'GPU_OUT={out}', f'GPU_PYTHON={sys.executable}',
                           f'GPU_CACHE={cache}', f'GPU_COMPILE_CACHE={tmp_path / "compile"}'],
                          cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=900)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (cache / 'paligemma_tokenizer.model').stat().st_size > 1_000_000   # gpu-carry
    # gpu-carry says what to run on a lent GPU: the two calls, the tokenizer carried
    assert '--session 1", carry=["' in proc.stdout and 'timeout_s=570' in proc.stdout
    assert '--session 2", carry=["' in proc.stdout and 'timeout_s=270' in proc.stdout
    sessions = {n: json.loads((out / f'session{n}.json').read_text())
                for n in gpu_session.LEASE}
    assert list(sessions) == [1, 2] and not (out / 'session3.json').exists()
    for n, s in sessions.items():
        phases = gpu_session.SESSIONS[n][1]
        assert list(s['phases']) == list(phases)
        assert all(p['status'] == 'ok' for p in s['phases'].values()), s['phases']
        assert s['missing_keys'] == [] and s['exit_code'] == 0
        assert s['verdict'] == {'passed': True, 'problems': [], 'fallbacks': {}, 'dropped': {}}
        assert s['budget_s'] == gpu_session.BUDGET_S[n] >= s['estimate_s']['total']
        assert s['config']['device'] == 'cpu'
        for phase in phases:                              # each phase kept its own file too
            assert (out / f'session{n}_{phase}.json').is_file()
        log = (out / f'session{n}.log').read_text()
        assert all(f'{phase}: OK in' in log for phase in phases)
        assert f'session {n} done in' in log and 'exit code 0: PASSED' in log
    print(f'dry run of the two commands: {seconds:.0f} s')        # docs/gpu.md

    r1, r2 = (sessions[n]['results'] for n in (1, 2))
    assert r1['environment']['environment']['tokenizer']['bytes'] > 1_000_000
    warm = r1['bench']['warmup']                   # the cold warm-up, saved before the frames
    assert warm['fallbacks'] == {} and warm['dropped'] == {}
    assert warm['warmup_s'] == warm['compile_seconds'] > 0
    steps = {'vision', 'prefill', 'suffix', 'denoise', 'decode', 'seed', 'decode_steps'}
    assert steps <= set(warm['phases']) and set(warm['graphs']) == steps
    assert set(warm['gate']) == steps and all(warm['graphs'].values())
    bench = r1['bench']['result']
    assert bench['text_equal'] and bench['fallbacks'] == {} and bench['dropped'] == {}
    assert bench['shared_backend'] and bench['compile_backend'] == 'aot_eager'
    assert bench['text_context'] == 'action_prefix'              # one full prefill per frame
    assert bench['oxygen']['full_prefills_per_frame'] == 1.0
    assert bench['isolated']['full_prefills_per_frame'] == 2.0
    assert set(bench['oxygen']['seconds_by_job_mean_ms']) >= {'vision', 'prefill', 'suffix',
                                                              'denoise', 'decode'}
    assert bench['compile_seconds'] == warm['compile_seconds']
    start = r2['second_start']['second_start']                     # the caches of session 1
    assert start['fallbacks'] == {} and start['dropped'] == {}
    assert 0 < start['fast_path_warmup_s'] < start['first_chunk_s']
    assert set(start['compiles'].values()) == {0} and all(start['loaded'].values())  # no trace
    assert 'recorded for these weights' in start['gate'] and 'reference' not in start['phases']
    tests = r2['gpu_tests']['gpu_tests']
    assert tests['skipped'] == len(tests['tests']) >= 10            # no CUDA: all skipped
    assert all(t.endswith(']') or '[' not in t for t in tests['tests'])
    assert not [t for t in tests['tests'] if '[cpu' in t]          # -m gpu: CUDA cases only
    assert tests['workers'] == 1 and tests['unfinished'] == []      # pytest-xdist, 2 cores

    merged = json.loads(gpu_session.merge(out).read_text())
    assert merged['device_name'] == 'cpu' and merged['backends']['compiled']['bench']
    measured = {k: row['measured'] for k, row in merged['show'].items()}
    lease = ('no_fallback', 'no_dropped_feature', 'text_equal_oxygen_vs_isolated',
             'action_latency_ms_p50', 'frames_per_s', 'tokens_per_s', 'speedup_over_ideal',
             'cold_warmup_s', 'second_start_first_chunk_s')
    assert None not in [measured[k] for k in lease], measured       # the lease's figures
    later = {k for k, v in measured.items() if v is None}            # session 3's components
    assert later == {'actions_within_gate_of_eager', 'guided_vs_plain_denoise',
                     'robots_aggregate_vs_one', 'robots_latency_p50_vs_one',
                     *(f'{name}_ms' for name in TARGETS_MS)}, later


def _dry_run(tmp_path: Path, session: int) -> dict:
    """Run one optional session on the CPU (tiny preset) as a GPU machine would; return it."""
    out = tmp_path / 'out'
    proc = subprocess.run([sys.executable, '-m', 'oxygen_ros.tools.bench', 'gpu', '--session',
                           str(session), '--out', str(out), '--device', 'cpu', '--preset',
                           'tiny', '--compile-cache', str(tmp_path / 'compile')],
                          cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / f'session{session}.json').read_text())


@pytest.mark.slow
def test_dry_run_of_the_optional_components_session_fills_every_key(tmp_path):
    """Session 3 on the CPU: the compiled components, RTC's guided denoise, parity."""
    session = _dry_run(tmp_path, 3)
    assert session['missing_keys'] == [] and session['verdict']['passed']
    r3 = session['results']['compiled_components']
    warm = r3['warmup']
    assert warm['fallbacks'] == {} and warm['dropped'] == {}
    assert warm['compile_backend'] == 'aot_eager'
    assert set(warm['compiles']) == {'vision', 'prefill', 'suffix', 'denoise', 'decode',
                                     'decode_steps', 'seed', 'guided_denoise'}
    assert warm['compiles'].pop('decode_steps') == 0        # it runs decode's function
    assert all(n == 1 for n in warm['compiles'].values()), warm['compiles']
    assert r3['ms']['decode_k_steps_b8'] > 0                # 5 steps, 1 replay
    assert warm['camera_counts'] == [3] and warm['graphs']['vision'] == 1
    assert r3['pipeline_parity']['passed'] is True
    # RTC's guided denoise: compiled, gated, timed beside the plain one, held against eager
    assert 'guided denoise (RTC)' in warm['gate']['guided_denoise']
    assert r3['ms']['guided_denoise_10_steps'] > 0
    assert r3['pipeline_parity']['outputs']['guided_actions']['passed']
    assert session['show']['guided_vs_plain_denoise']['measured'] > 0   # filled, not judged


def test_every_figure_the_gpu_run_brings_back_is_a_filled_key():
    """The schema the dry run is held to names every figure the GPU run must bring back."""
    keys = {f'{p}.{k}' for p, ks in gpu_session.FILLED_KEYS.items() for k in ks}
    for key in ('environment.environment.driver', 'environment.environment.triton',
                'bench.warmup.warmup_s', 'bench.warmup.phases', 'bench.warmup.graphs',
                'bench.warmup.fallbacks', 'bench.warmup.dropped',
                'bench.result.oxygen.action_latency_ms_p50',
                'bench.result.oxygen.action_hz', 'bench.result.oxygen.tokens_per_s',
                'bench.result.oxygen.seconds_by_job_mean_ms.decode',
                'bench.result.ideal_speedup', 'bench.result.dropped',
                'second_start.second_start.first_chunk_s', 'second_start.second_start.dropped',
                'gpu_tests.gpu_tests.failed', 'gpu_tests.gpu_tests.unfinished',
                'compiled_components.warmup.warmup_s', 'compiled_components.warmup.recompiles',
                'compiled_components.warmup.dropped',
                'compiled_components.ms.decode_step_b1', 'compiled_components.pipeline_parity.'
                'passed', 'compiled_components.ms.guided_denoise_10_steps',
                'compiled_components.warmup.gate.guided_denoise',
                'eager_components.attention_backends.cudnn', 'fp8_components.warmup.dropped'):
        assert key in keys, key
    assert set(gpu_session.FILLED_KEYS) == {p for _, ps in gpu_session.SESSIONS.values()
                                            for p in ps}
    for n, (_, phases) in gpu_session.SESSIONS.items():
        assert sum(gpu_session.ESTIMATE_S[p] for p in phases) <= gpu_session.BUDGET_S[n]
        assert gpu_session.BUDGET_S[n] <= 9 * 60        # under the 10 minutes of a command
    # one lease: the machine's start (up to 2 minutes), then the two commands, in 15 minutes
    assert gpu_session.LEASE == (1, 2)
    assert 2 * 60 + sum(gpu_session.BUDGET_S[n] for n in gpu_session.LEASE) <= 15 * 60
    assert gpu_session.BUDGET_S[1] == 9 * 60 and gpu_session.BUDGET_S[2] == 4 * 60


def test_a_missing_tokenizer_stops_the_session_before_torch_loads(tmp_path):
    """With torch unimportable, the session stops on the tokenizer before it needs torch."""
    out = tmp_path / 'out'
    proc = subprocess.run([sys.executable, '-m', 'oxygen_ros.tools.bench', 'gpu', '--session',
                           '1', '--out', str(out), '--cache', str(tmp_path / 'empty'),
                           '--device', 'cpu', '--preset', 'tiny'], cwd=REPO,
                          env=_env(tmp_path, ABSENT_ON_GPU_MACHINE + ('torch',)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == gpu_session.SETUP_FAILED, proc.stderr[-2000:]
    assert 'make gpu-carry' in proc.stderr and '.oxygen_cache' in proc.stderr
    assert str(tmp_path / 'empty' / 'paligemma_tokenizer.model') in proc.stderr
    record = json.loads((out / 'session1.json').read_text())
    assert record['exit_code'] == 8 and 'make gpu-carry' in record['error']


def test_failed_phases_are_recorded_and_the_next_phases_still_run(tmp_path):
    """Session 1 asked for CUDA on a CPU-only machine: both phases fail, both are recorded."""
    out = tmp_path / 'out'
    proc = subprocess.run([sys.executable, '-m', 'oxygen_ros.tools.bench', 'gpu', '--session',
                           '1', '--out', str(out), '--device', 'cuda', '--preset', 'tiny'],
                          cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1 | 2, proc.stdout[-3000:]          # environment, bench
    record = json.loads((out / 'session1.json').read_text())
    statuses = {p: v['status'] for p, v in record['phases'].items()}
    assert statuses == {'environment': 'failed', 'bench': 'error'}
    assert record['results']['environment']['environment']['cuda_available'] is False
    assert 'Error' in record['phases']['bench']['error']
    assert record['exit_code'] == 3 and 'bench.result.speedup' in record['missing_keys']
    verdict = record['verdict']
    assert not verdict['passed'] and verdict['problems'][:2] == [
        'environment failed', f"bench error ({record['phases']['bench']['error'][:200]})"]
    assert 'FAILED: environment failed; bench error' in (out / 'session1.log').read_text()


def test_a_phase_past_its_deadline_is_killed_and_keeps_what_it_saved(tmp_path):
    args = gpu_session._parse(['--session', '2', '--out', str(tmp_path), '--device', 'cpu',
                               '--preset', 'tiny'])
    with open(tmp_path / 'log', 'w') as log:
        status, rc = gpu_session._run_phase(gpu_session._child_argv(args), 'second_start',
                                            4.0, log)
    assert (status, rc) == ('timeout', None)
    kept = json.loads((tmp_path / 'session2_second_start.json').read_text())
    assert 'oxygen_ros.tools.bench.start' in kept['command']      # saved before the kill
    assert 'second_start' not in kept


def test_show_holds_figures_against_the_targets():
    bench = {'fallbacks': {}, 'text_equal': True, 'speedup': 1.8, 'ideal_speedup': 1.9,
             'oxygen': {'action_latency_ms_p50': 11.0, 'action_hz': 41.0, 'tokens_per_s': 950.0}}
    compiled = {'fallbacks': {}, 'ms': {'vision': 2.0, 'prefill': 9.0, 'decode_step_b1': 2.4,
                                        'denoise_10_steps': 12.0,
                                        'guided_denoise_10_steps': 24.0},
                'bench': bench}
    report = {'backends': {'compiled': compiled}, 'pipeline_parity': {'passed': True},
              'second_start': {'first_chunk_s': 18.0}}
    s = show(report)
    assert s['vision_ms']['ok'] and not s['prefill_ms']['ok']
    assert s['decode_step_b8_ms']['ok'] is None
    assert s['frames_per_s']['ok'] and not s['tokens_per_s']['ok']
    assert s['action_latency_ms_p50'] == {'target': 12.0, 'measured': 11.0, 'ok': True}
    assert s['speedup_over_ideal']['measured'] == pytest.approx(1.8 / 1.9)
    assert s['speedup_over_ideal']['ok'] and s['second_start_first_chunk_s']['ok']
    assert s['no_fallback']['ok'] and s['text_equal_oxygen_vs_isolated']['ok']
    assert s['no_dropped_feature'] == {'target': True, 'measured': True, 'ok': True}
    assert s['guided_vs_plain_denoise'] == {'target': 1.6, 'measured': 2.0, 'ok': False}
    session6 = {'session': 6, 'phases': {}, 'exit_code': 0, 'config': {},
                'results': {'eager_components': {'ms': {'vision': 5.0}}}}
    nothing = gpu_session.show_of([session6])                          # nothing compiled
    assert nothing['no_fallback']['ok'] is None and nothing['no_dropped_feature']['ok'] is None
    # a second start that fell back is a fallback of the session too
    late = show({'second_start': {'first_chunk_s': 30.0, 'fallbacks': {'decode': 'x'}}})
    assert late['no_fallback']['ok'] is False and late['no_dropped_feature']['ok'] is True


def _lease_session(warmup: dict, status: str = 'ok') -> dict:
    """Return a session 1 record whose bench phase warmed up as ``warmup`` says."""
    return {'session': 1, 'exit_code': 0 if status == 'ok' else 2, 'config': {},
            'missing_keys': [],
            'phases': {'environment': {'status': 'ok'},
                       'bench': {'status': status, 'error': None}},
            'results': {'environment': {}, 'bench': {'warmup': warmup}}}


def test_a_dropped_feature_fails_the_sessions_verdict_and_show():
    """Dropped to stay compiled is not a fallback of a step, and still fails the session."""
    reason = 'CompilationError: Loop-carried variable m has initial type fp32'
    session = _lease_session({'fallbacks': {}, 'dropped': {'paged_attention': reason}},
                             status='failed')
    verdict = gpu_session.verdict_of(session)
    assert not verdict['passed'] and verdict['dropped'] == {'paged_attention': reason}
    assert verdict['problems'] == ['bench failed', 'dropped: paged_attention']
    shown = gpu_session.show_of([session])
    assert shown['no_dropped_feature'] == {'target': True, 'measured': False, 'ok': False}
    assert shown['no_fallback']['ok'] is True
    steps = {'suffix': 'eager kernels in CUDA graphs: InductorError'}
    both = gpu_session.verdict_of(_lease_session({'fallbacks': steps, 'dropped': {}}))
    assert both['problems'] == ['fallbacks: suffix'] and both['fallbacks'] == steps
    assert gpu_session.verdict_of(_lease_session({'fallbacks': {}, 'dropped': {}}))['passed']


def test_test_outcomes_are_read_with_and_without_xdist_and_when_cut_off():
    xdist = ['test/gpu/test_a.py::test_x[cuda] ', 'test/gpu/test_a.py::test_y[cuda] ',
             '[gw0] [ 50%] PASSED test/gpu/test_a.py::test_x[cuda] ',
             'test/gpu/test_b.py::test_z ',
             '[gw1] [100%] FAILED test/gpu/test_a.py::test_y[cuda] ']
    tests, unfinished = parse_test_outcomes(xdist)
    assert tests == {'test/gpu/test_a.py::test_x[cuda]': 'PASSED',
                     'test/gpu/test_a.py::test_y[cuda]': 'FAILED'}
    assert unfinished == ['test/gpu/test_b.py::test_z']              # killed at the deadline
    plain = ['test/gpu/test_a.py::test_x[cuda] SKIPPED (needs a CUDA GPU)      [ 50%]',
             'test/gpu/test_a.py::test_y[cuda] ']
    assert parse_test_outcomes(plain) == ({'test/gpu/test_a.py::test_x[cuda]': 'SKIPPED'},
                                          ['test/gpu/test_a.py::test_y[cuda]'])


def test_the_warmup_record_names_what_the_fast_path_dropped(tiny_models):
    """A fast path's ``dropped`` (feature -> reason) reaches the bench's and start's JSON."""
    from oxygen_ros.backends.config import CompileMode, Step
    from oxygen_ros.backends.torch_backend import TorchBackend
    from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
    from oxygen_ros.engine.config import EngineConfig
    from oxygen_ros.engine.loading import make_backend_for

    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERA_SLOTS[:1])
    config = EngineConfig.create(preset='tiny', compile_mode=CompileMode.DEFAULT,
                                 tokens_per_cycle=1)
    backend = make_backend_for(config, model, 64, backend='aot_eager', progress=False,
                               only=(Step.SEED,), precompile=False)
    record = warmup_summary(backend)
    assert set(record['graphs']) == {'seed'} and record['fallbacks'] == {}
    assert record['dropped'] == dropped_features(backend) == {}
    assert record['warmup_s'] > 0 and 'seed' in record['phases'] and record['gate']['seed']
    json.dumps(record)                                              # JSON as it is
    reason = 'CompilationError: Both operands must be same dtype. Got fp64 and fp32'
    backend.fast_path.dropped = {'paged_attention': reason}   # as a fast path that dropped it
    assert warmup_summary(backend)['dropped'] == {'paged_attention': reason}
    assert dropped_features(TorchBackend(model, 64, 16)) == {}      # eager: nothing to drop


@pytest.mark.slow
def test_dry_run_of_the_several_robots_session_fills_every_key(tmp_path):
    """Session 7 on the CPU: 1, 2 and 4 robots on the fast path's robot-batch graphs."""
    session = _dry_run(tmp_path, 7)
    assert list(session['phases']) == ['environment', 'robots']
    assert session['missing_keys'] == [] and session['verdict']['passed']
    result = session['results']['robots']['result']
    assert result['fallbacks'] == {} and result['dropped'] == {}
    assert [run['robots'] for run in result['runs']] == [1, 2, 4]
    assert all(run['outputs_equal'] for run in result['runs'])
    target = session['results']['robots']['gpu_target']
    assert target['robots'] == 4 and target['aggregate_vs_one'] > 0
    assert session['show']['robots_aggregate_vs_one']['measured'] == target['aggregate_vs_one']


def test_the_gpu_target_of_several_robots():
    def run(n, rate, p50):
        return {'robots': n, 'batched': {'chunks_per_s': rate, 'action_latency_ms_p50': p50,
                                         'action_latency_ms_p99': 2 * p50}}
    target = gpu_robots.gpu_target([run(1, 20.0, 30.0), run(2, 38.0, 33.0),
                                    run(4, 64.0, 42.0)])
    assert target['robots'] == 4 and target['aggregate_vs_one'] == pytest.approx(3.2)
    assert target['latency_p50_vs_one'] == pytest.approx(1.4) and target['passed']
    missed = gpu_robots.gpu_target([run(1, 20.0, 30.0), run(4, 50.0, 40.0)])
    assert missed['aggregate_vs_one'] == pytest.approx(2.5) and not missed['passed']
    with pytest.raises(ValueError, match='needs a run of one robot'):
        gpu_robots.gpu_target([run(4, 50.0, 40.0)])


@pytest.mark.slow
def test_dry_run_of_the_optional_fp8_session_fills_every_key(tmp_path):
    """Session 4 on the CPU: the reference path's FP8 weights, checked, compiled and timed."""
    session = _dry_run(tmp_path, 4)
    assert list(session['phases']) == ['environment', 'fp8_components']
    assert session['missing_keys'] == []
    assert session['estimate_s']['total'] <= session['budget_s'] == gpu_session.BUDGET_S[4]
    fp8 = session['results']['fp8_components']
    q = fp8['quantization']
    assert q['kernel'] == 'dequant' and q['reference_path_reason'].startswith('cpu: no FP8')
    assert q['linears'] == 'fp8 e4m3, per-channel scales, dequant: 25 linears'
    assert q['acceptance']['ratio'] > 1.5 and not q['acceptance']['passed']   # random weights
    assert fp8['warmup']['fallbacks'] == {} and fp8['warmup']['dropped'] == {}
    assert fp8['pipeline_parity']['passed'] is True
    thor = fp8['roofline']['denoise_10_steps']['thor']     # a GPU run projects it too
    assert thor['projected'] is True and thor['bound_ms'] > 0
    report = gpu_session.report_of([session])
    assert report['backends']['fp8']['fallbacks'] == {}
