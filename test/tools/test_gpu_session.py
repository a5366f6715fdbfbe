"""
``oxygen_bench gpu`` on the CPU: the dry run of the three GPU sessions, failures, the budget.

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

from oxygen_ros.tools.bench import gpu_session
from oxygen_ros.tools.bench.roofline import show
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
def test_dry_run_of_the_three_sessions_fills_every_key(tmp_path):
    out, cache = tmp_path / 'out', tmp_path / 'cache'
    t0 = time.perf_counter()
    proc = subprocess.run(['make', '--no-print-directory', 'gpu-session', 'GPU_DEVICE=cpu',
                           'GPU_PRESET=tiny', f'GPU_OUT={out}', f'GPU_PYTHON={sys.executable}',
                           f'GPU_CACHE={cache}'], cwd=REPO, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (cache / 'paligemma_tokenizer.model').stat().st_size > 1_000_000   # gpu-carry
    sessions = {n: json.loads((out / f'session{n}.json').read_text()) for n in (1, 2, 3)}
    for n, s in sessions.items():
        phases = gpu_session.SESSIONS[n][1]
        assert list(s['phases']) == list(phases)
        assert all(p['status'] == 'ok' for p in s['phases'].values()), s['phases']
        assert s['missing_keys'] == [] and s['exit_code'] == 0
        assert s['estimate_s']['total'] <= 480 and s['config']['device'] == 'cpu'
        for phase in phases:                              # each phase kept its own file too
            assert (out / f'session{n}_{phase}.json').is_file()
        log = (out / f'session{n}.log').read_text()
        assert all(f'{phase}: OK in' in log for phase in phases)
    print(f'dry run of the three sessions: {seconds:.0f} s')        # docs/gpu.md

    r1, r2, r3 = (sessions[n]['results'] for n in (1, 2, 3))
    tests = r1['gpu_tests']['gpu_tests']
    assert tests['skipped'] == len(tests['tests']) >= 10            # no CUDA: all skipped
    assert r1['environment']['environment']['tokenizer']['bytes'] > 1_000_000
    eager = r1['eager_components']
    assert all(v > 0 for v in eager['ms'].values())
    assert 'ms' in eager['attention_backends']['math']
    assert 'No viable backend' in eager['attention_backends']['efficient']['error']
    warm = r2['compiled_components']['warmup']
    assert warm['fallbacks'] == {} and warm['compile_backend'] == 'aot_eager'
    assert set(warm['compiles']) == {'vision', 'prefill', 'suffix', 'denoise', 'decode',
                                     'decode_steps', 'seed', 'guided_denoise'}
    assert warm['compiles'].pop('decode_steps') == 0        # it runs decode's function
    assert all(n == 1 for n in warm['compiles'].values()), warm['compiles']
    assert r2['compiled_components']['ms']['decode_k_steps_b8'] > 0     # 5 steps, 1 replay
    assert warm['camera_counts'] == [3] and warm['graphs']['vision'] == 1
    assert r2['compiled_components']['pipeline_parity']['passed'] is True
    # RTC's guided denoise: compiled, gated, timed beside the plain one, held against eager
    assert 'guided denoise (RTC)' in warm['gate']['guided_denoise']
    assert r2['compiled_components']['ms']['guided_denoise_10_steps'] > 0
    assert r2['compiled_components']['pipeline_parity']['outputs']['guided_actions']['passed']
    assert sessions[2]['show']['guided_vs_plain_denoise']['measured'] > 0   # filled, not judged
    bench = r3['bench']['result']
    assert bench['text_equal'] and bench['fallbacks'] == {} and bench['shared_backend']
    assert bench['text_context'] == 'action_prefix'              # one full prefill per frame
    assert bench['oxygen']['full_prefills_per_frame'] == 1.0
    assert bench['isolated']['full_prefills_per_frame'] == 2.0
    assert r3['bench']['warmup']['compile_seconds'] == bench['compile_seconds'] > 0
    start = r3['second_start']['second_start']
    assert start['fallbacks'] == {} and 0 < start['fast_path_warmup_s'] < start['first_chunk_s']
    assert set(start['compiles'].values()) == {0} and all(start['loaded'].values())  # no trace
    assert 'recorded for these weights' in start['gate'] and 'reference' not in start['phases']

    merged = json.loads(gpu_session.merge(out).read_text())
    assert merged['device_name'] == 'cpu' and merged['backends']['compiled']['bench']
    measured = {k: row['measured'] for k, row in merged['show'].items()}
    assert None not in measured.values(), measured     # every target has a figure


def test_every_figure_of_issue_10_is_a_filled_key():
    """The schema the dry run is held to names every figure the GPU run must bring back."""
    keys = {f'{p}.{k}' for p, ks in gpu_session.FILLED_KEYS.items() for k in ks}
    for key in ('environment.environment.driver', 'environment.environment.triton',
                'gpu_tests.gpu_tests.failed', 'eager_components.attention_backends.cudnn',
                'compiled_components.warmup.warmup_s', 'compiled_components.warmup.recompiles',
                'compiled_components.ms.decode_step_b1', 'compiled_components.pipeline_parity.'
                'passed', 'compiled_components.ms.guided_denoise_10_steps',
                'compiled_components.warmup.gate.guided_denoise',
                'bench.result.oxygen.action_latency_ms_p50',
                'bench.result.oxygen.tokens_per_s', 'bench.result.ideal_speedup',
                'second_start.second_start.first_chunk_s'):
        assert key in keys, key
    assert set(gpu_session.FILLED_KEYS) == {p for _, ps in gpu_session.SESSIONS.values()
                                            for p in ps}
    for _, phases in gpu_session.SESSIONS.values():
        assert sum(gpu_session.ESTIMATE_S[p] for p in phases) <= 8 * 60


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
    """Session 1 asked for CUDA on a CPU-only machine: 2 of 3 phases fail, all are recorded."""
    out = tmp_path / 'out'
    proc = subprocess.run([sys.executable, '-m', 'oxygen_ros.tools.bench', 'gpu', '--session',
                           '1', '--out', str(out), '--device', 'cuda', '--preset', 'tiny'],
                          cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 1 | 4, proc.stdout[-3000:]      # environment, eager_components
    record = json.loads((out / 'session1.json').read_text())
    statuses = {p: v['status'] for p, v in record['phases'].items()}
    assert statuses == {'environment': 'failed', 'gpu_tests': 'ok', 'eager_components': 'error'}
    assert record['results']['environment']['environment']['cuda_available'] is False
    assert 'Error' in record['phases']['eager_components']['error']
    assert record['exit_code'] == 5 and 'eager_components.ms.vision' in record['missing_keys']


def test_a_phase_past_its_deadline_is_killed_and_keeps_what_it_saved(tmp_path):
    args = gpu_session._parse(['--session', '3', '--out', str(tmp_path), '--device', 'cpu',
                               '--preset', 'tiny'])
    with open(tmp_path / 'log', 'w') as log:
        status, rc = gpu_session._run_phase(gpu_session._child_argv(args), 'second_start',
                                            4.0, log)
    assert (status, rc) == ('timeout', None)
    kept = json.loads((tmp_path / 'session3_second_start.json').read_text())
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
    assert s['guided_vs_plain_denoise'] == {'target': 1.6, 'measured': 2.0, 'ok': False}
    session1 = {'session': 1, 'phases': {}, 'exit_code': 0, 'config': {},
                'results': {'eager_components': {'ms': {'vision': 5.0}}}}
    assert gpu_session.show_of([session1])['no_fallback']['ok'] is None   # nothing compiled


@pytest.mark.slow
def test_dry_run_of_the_optional_fp8_session_fills_every_key(tmp_path):
    """Session 4 on the CPU: the reference path's FP8 weights, checked, compiled and timed."""
    out = tmp_path / 'out'
    proc = subprocess.run([sys.executable, '-m', 'oxygen_ros.tools.bench', 'gpu', '--session',
                           '4', '--out', str(out), '--device', 'cpu', '--preset', 'tiny',
                           '--compile-cache', str(tmp_path / 'compile')],
                          cwd=REPO, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    session = json.loads((out / 'session4.json').read_text())
    assert list(session['phases']) == ['environment', 'fp8_components']
    assert session['missing_keys'] == [] and session['estimate_s']['total'] <= 480
    fp8 = session['results']['fp8_components']
    q = fp8['quantization']
    assert q['kernel'] == 'dequant' and q['reference_path_reason'].startswith('cpu: no FP8')
    assert q['linears'] == 'fp8 e4m3, per-channel scales, dequant: 25 linears'
    assert q['acceptance']['ratio'] > 1.5 and not q['acceptance']['passed']   # random weights
    assert fp8['warmup']['fallbacks'] == {} and fp8['pipeline_parity']['passed'] is True
    thor = fp8['roofline']['denoise_10_steps']['thor']     # a GPU run projects it too
    assert thor['projected'] is True and thor['bound_ms'] > 0
    report = gpu_session.report_of([session])
    assert report['backends']['fp8']['fallbacks'] == {}
