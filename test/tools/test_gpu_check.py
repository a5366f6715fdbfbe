"""``oxygen_bench gpu`` on the CPU: every phase's plumbing, the JSON, the exit code."""

import json
import subprocess
import sys

from oxygen_ros.tools.bench.gpu_check import main as gpu_check
from oxygen_ros.tools.bench.roofline import show
import pytest

TINY = ['--preset', 'tiny', '--device', 'cpu', '--dtype', 'bfloat16', '--decode-batches', '1',
        '2', '--decode-ctx', '300', '--repeats', '1', '--compile-mode', 'default',
        '--gpu', 'NVIDIA H100 80GB HBM3']


@pytest.fixture(autouse=True)
def fresh_dynamo():
    import torch
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_components_with_rooflines_and_parity(tmp_path):
    path = tmp_path / 'gpu.json'
    rc = gpu_check(TINY + ['--compile-backend', 'aot_eager', '--json', str(path)])
    report = json.loads(path.read_text())
    assert rc == 0
    assert report['device_name'] == 'cpu' and report['torch'] and report['date']
    assert report['gpu_spec']['name'] == 'H100 SXM5 80GB HBM3'
    compiled = report['backends']['compiled']
    assert compiled['fallbacks'] == {} and compiled['warmup_s'] > 0
    assert set(compiled['gate']) == {'vision', 'prefill', 'denoise', 'decode', 'seed'}
    row = compiled['roofline']['decode_step_b1']
    assert row['ms'] > 0 and row['bound_ms'] > 0 and row['bound_by'] == 'memory'
    assert row['thor']['projected'] is True and row['thor']['projected_ms'] > row['ms']
    assert compiled['paper_cycle']['formula'].startswith('1 x vision + 2 x prefill')
    assert report['pipeline_parity']['passed']
    assert report['pipeline_parity']['outputs']['actions']['eager_vs_float32'] > 0
    assert report['show']['no_fallback']['ok'] is True
    assert report['show']['actions_within_gate_of_eager']['ok'] is True
    assert report['show']['frames_per_s']['ok'] is None                # bench not run


def test_a_compiled_path_that_falls_back_fails_the_check(tmp_path):
    path = tmp_path / 'gpu.json'
    rc = gpu_check(TINY + ['--backends', 'compiled', '--compile-backend', 'no-such-compiler',
                           '--json', str(path)])
    report = json.loads(path.read_text())
    assert rc == 1
    assert set(report['backends']['compiled']['fallbacks']) == {
        'vision', 'prefill', 'denoise', 'decode', 'seed'}
    assert report['show']['no_fallback']['ok'] is False


def test_show_holds_figures_against_the_targets():
    bench = {'fallbacks': {}, 'text_equal': True, 'speedup': 1.8, 'ideal_speedup': 1.9,
             'oxygen': {'action_latency_ms_p50': 18.0, 'action_hz': 31.0, 'tokens_per_s': 550.0}}
    compiled = {'fallbacks': {}, 'ms': {'vision': 2.0, 'prefill': 9.0, 'decode_step_b1': 2.4},
                'bench': bench}
    report = {'backends': {'compiled': compiled}, 'pipeline_parity': {'passed': True},
              'second_start': {'first_chunk_s': 25.0}}
    s = show(report)
    assert s['vision_ms']['ok'] and not s['prefill_ms']['ok']
    assert s['decode_step_b8_ms']['ok'] is None
    assert s['frames_per_s']['ok'] and not s['tokens_per_s']['ok']
    assert s['speedup_over_ideal']['measured'] == pytest.approx(1.8 / 1.9)
    assert s['speedup_over_ideal']['ok'] and s['second_start_first_chunk_s']['ok']
    assert s['no_fallback']['ok'] and s['text_equal_oxygen_vs_isolated']['ok']


def test_bench_start_reports_the_first_chunk():
    proc = subprocess.run([sys.executable, '-m', 'oxygen_ros.tools.bench.start', '--preset',
                           'tiny', '--dtype', 'float32', '--device', 'cpu', '--cameras', '2'],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = json.loads(proc.stdout.strip().splitlines()[-1])
    assert run['compile_mode'] == 'auto' and run['fallbacks'] == {}
    assert 0 < run['engine_build_s'] < run['main_to_first_chunk_s']
    assert run['compile_cache_hits'] is None                        # auto on the CPU: eager
