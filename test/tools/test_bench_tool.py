"""oxygen_bench engine and oxygen_run_model end to end on the tiny preset (a smoke run)."""

import json

from oxygen_ros.tools import run_model
from oxygen_ros.tools.bench import engine
import pytest

FIELDS = ['preset', 'cameras', 'frames', 'decode_budget', 'tokens_per_cycle',
          'isolated.frame_ms_p50', 'isolated.frame_ms_p99', 'oxygen.frame_ms_p50',
          'oxygen.frame_ms_p99', 'speedup', 'oxygen.action_hz', 'oxygen.tokens_per_s',
          'action_max_abs_diff', 'text_equal', 'ideal_speedup', 'manager_overhead_frac',
          'kv_bytes_peak', 'oxygen.full_prefills_per_frame', 'isolated.full_prefills_per_frame',
          'oxygen.suffix_tokens_per_frame', 'oxygen.prefill_tokens_per_frame', 'arrival.pattern',
          'requests_per_frame', 'text_context', 'ideal.components_ms.suffix']


@pytest.mark.parametrize('mode', ['causal_text', 'bidirectional'])
def test_bench_writes_every_field_and_both_policies_agree(tmp_path, mode, capsys):
    out = tmp_path / 'bench.json'
    plot = tmp_path / 'timeline.png'
    code = engine.main(['--preset', 'tiny', '--cameras', '2', '--frames', '3',
                        '--decode-budget', '6', '--tokens-per-cycle', '2', '--memory-every', '2',
                        '--prefix-attention', mode, '--json', str(out), '--plot', str(plot),
                        '--no-progress'])
    assert code == 0
    result = json.loads(out.read_text())
    for field in FIELDS:
        node = result
        for part in field.split('.'):
            assert part in node, field
            node = node[part]
    assert result['action_max_abs_diff'] <= 1e-5
    assert result['text_equal'] is True
    assert result['num_texts'] == 3 + 3 + 3            # text every frame, memory every 2nd
    assert result['prefix_attention'] == mode
    assert result['oxygen']['decode_batch_p50'] > 1     # requests of several frames batched
    assert result['isolated']['decode_batch_p50'] <= 1
    assert result['ideal_speedup'] > 0 and result['speedup'] > 0
    assert result['isolated']['kv_bytes_peak'] > 0      # held inside the cycle, then freed
    assert result['kv_bytes_peak'] >= max(used for _, used, _ in result['kv_curve'])
    assert 0 <= result['manager_overhead_frac'] < 1
    # text on the action prefix: one full prefill per frame; isolated copies the root per job
    assert result['text_context'] == 'action_prefix'
    assert result['oxygen']['full_prefills_per_frame'] == 1.0
    assert result['isolated']['full_prefills_per_frame'] == pytest.approx(2 + 1 / 3)
    assert result['ideal']['components_ms']['suffix'] > 0
    assert plot.stat().st_size > 10_000
    d = result['denoise']                               # guided vs plain, both eager here
    assert d['guided_ms'] > 0 and d['plain_ms'] > 0 and not d['guided_on_fast_path']
    assert d['guided_vs_plain'] == pytest.approx(d['guided_ms'] / d['plain_ms'])
    printed = capsys.readouterr().out
    assert 'speedup' in printed and 'guided (RTC)' in printed and '(eager)' in printed
    assert 'full prefills per frame: isolated 2.33, oxygen 1.00' in printed


def test_arrival_patterns_and_own_prompts(tmp_path):
    out = tmp_path / 'bench.json'
    code = engine.main(['--preset', 'tiny', '--cameras', '1', '--frames', '4',
                        '--decode-budget', '4', '--tokens-per-cycle', '2', '--arrival', 'poisson',
                        '--arrival-rate', '1.5', '--arrival-seed', '3', '--text-context',
                        'own_prompt', '--json', str(out), '--no-progress'])
    assert code == 0
    result = json.loads(out.read_text())
    assert result['arrival'] == {'pattern': 'poisson', 'every': 1, 'burst_size': 4,
                                 'burst_every': 8, 'rate': 1.5, 'seed': 3,
                                 'mean_per_frame': 1.5}
    assert result['text_context'] == 'own_prompt' and result['text_equal'] is True
    # bidirectional prefix, own prompts: a second full prefill for each frame with a text
    assert result['oxygen']['suffix_tokens_per_frame'] == 0
    assert result['oxygen']['full_prefills_per_frame'] > 1


def test_the_adapter_cost_is_measured_beside_a_plain_decode_step(tmp_path, capsys):
    out = tmp_path / 'bench.json'
    code = engine.main(['--preset', 'tiny', '--cameras', '1', '--frames', '2',
                        '--decode-budget', '4', '--tokens-per-cycle', '2', '--memory-every', '1',
                        '--memory-adapter', 'random', '--json', str(out), '--no-progress'])
    assert code == 0
    adapter = json.loads(out.read_text())['memory_adapter']
    assert adapter['adapter'] == 'random' and adapter['decode_b_adapter_ms'] > 0
    assert adapter['decode_overhead'] == pytest.approx(
        adapter['decode_b_adapter_ms'] / adapter['decode_b_ms'] - 1)
    assert 'memory adapter: decode step' in capsys.readouterr().out
    assert engine.main(['--preset', 'tiny', '--text-context', 'own_prompt',
                        '--memory-adapter', 'random']) == 2
    assert "it needs memory_context 'action_prefix'" in capsys.readouterr().err


def test_bench_probes_host_resized_images_where_the_engine_resizes_on_its_device(tmp_path):
    """The H100 run of 2026-11-25 stopped here: the probe asked the engine's uint8 frames."""
    out = tmp_path / 'bench.json'
    assert engine.main(['--preset', 'tiny', '--cameras', '2', '--frames', '2',
                        '--decode-budget', '4', '--resize-on-device', '--json', str(out),
                        '--no-progress']) == 0
    result = json.loads(out.read_text())
    assert result['resize_on_device'] is True
    assert result['action_max_abs_diff'] <= 1e-5 and result['text_equal'] is True
    assert result['ideal']['components_ms']['vision'] > 0


def test_bench_rejects_bad_flags(capsys):
    with pytest.raises(SystemExit) as exc:
        engine.main(['--preset', 'tiny', '--frames', '0'])
    assert exc.value.code == 2
    assert '--frames must be >= 1' in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        engine.main(['--preset', 'tiny', '--robots', '2', '--text-context', 'own_prompt'])
    assert exc.value.code == 2
    assert '--robots needs N >= 1 and --text-context action_prefix' in capsys.readouterr().err


ROBOT_FIELDS = ['chunks_per_s', 'tokens_per_s', 'round_ms_p50', 'round_ms_p99',
                'action_latency_ms_p50', 'action_latency_ms_p99', 'decode_batch_p50',
                'cycles_per_round', 'manager_overhead_frac', 'kv_bytes_peak']


def test_several_robots_batched_against_one_after_another(tmp_path, capsys):
    """``--robots 2``: both ways of serving measured, the ideal, each robot's outputs equal."""
    out, plot = tmp_path / 'robots.json', tmp_path / 'robots.png'
    code = engine.main(['--preset', 'tiny', '--cameras', '2', '--robots', '2', '--frames', '3',
                        '--decode-budget', '4', '--tokens-per-cycle', '2', '--json', str(out),
                        '--plot', str(plot), '--no-progress'])
    assert code == 0
    result = json.loads(out.read_text())
    assert result['robots'] == [2] and result['target_of_ideal'] == 0.9
    assert result['machine']['processor'] and result['warmup_frames'] == 2
    (run,) = result['runs']
    assert run['robots'] == 2 and run['names'] == ['robot0', 'robot1']
    for mode, cycles in (('batched', 1), ('one_after_another', 2)):
        figures = run[mode]
        for key in ROBOT_FIELDS:
            assert figures[key] == figures[key] and figures[key] >= 0, (mode, key)  # not NaN
        assert figures['cycles_per_round'] == cycles
        assert set(figures['per_robot']) == {'robot0', 'robot1'}
        for robot in figures['per_robot'].values():
            assert robot['chunks'] == 3
            assert robot['chunks_per_s'] == pytest.approx(figures['chunks_per_s'] / 2)
            assert 0 < robot['action_latency_ms_p50'] <= robot['action_latency_ms_p99']
    # one after another, robot1's chunk waits for robot0's whole cycle
    one = run['one_after_another']['per_robot']
    assert one['robot1']['action_latency_ms_p50'] > one['robot0']['action_latency_ms_p50']
    assert run['outputs_equal'] is True and run['text_equal'] is True
    assert run['action_max_abs_diff'] <= 1e-5
    assert run['num_texts'] == 2 * (2 + 3)       # a text per robot per round, warm-up included
    assert run['every_robot_every_round'] is True
    ideal = run['ideal']
    for frames in ('1', '2'):
        assert ideal['components_ms'][frames]['vision'] > 0
        assert ideal['components_ms'][frames]['suffix'] > 0
    assert ideal['decode_ms']['batched']['step_ms'] > 0
    assert ideal['speedup'] == pytest.approx(
        ideal['round_ms']['one_after_another'] / ideal['round_ms']['batched'])
    assert run['of_ideal'] == pytest.approx(
        run['batched']['chunks_per_s'] / ideal['chunks_per_s']['batched'])
    assert run['meets_target'] is (run['of_ideal'] >= 0.9)
    assert run['speedup'] == pytest.approx(
        run['batched']['chunks_per_s'] / run['one_after_another']['chunks_per_s'])
    assert plot.stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert 'batched / one after another: chunks/s' in printed and 'outputs equal True' in printed


def test_run_model_prints_chunk_and_texts(capsys):
    assert run_model.main(['--preset', 'tiny', '--ask', 'what is on the table?',
                           '--max-tokens', '3']) == 0
    out = capsys.readouterr().out
    assert 'action chunk (4 x 7, robot units)' in out
    assert 'subtask ' in out and 'answer ' in out and 'random weights' in out


def test_run_model_rejects_unknown_images(capsys):
    assert run_model.main(['--preset', 'tiny', '--image', 'base_0_rgb=nope.png']) == 2
    assert 'neither a bundled photograph' in capsys.readouterr().err


def test_bench_warms_the_fast_path_up_once_for_both_policies(tmp_path, monkeypatch):
    """Both policies share one compiled model: one warm-up, one KV pool, two halves."""
    from oxygen_ros.backends.fast_path.model import FastPathModel

    warmups = []
    real = FastPathModel.warmup

    def counted(self, pool, **kw):
        warmups.append(pool)
        return real(self, pool, **kw)
    monkeypatch.setattr(FastPathModel, 'warmup', counted)
    out = tmp_path / 'bench.json'
    code = engine.main(['--preset', 'tiny', '--cameras', '2', '--frames', '3',
                        '--decode-budget', '6', '--tokens-per-cycle', '2', '--max-running', '4',
                        '--compile', 'default', '--compile-backend', 'aot_eager',
                        '--compile-cameras', '2', '--only', 'decode', 'seed',
                        '--json', str(out), '--no-progress'])
    assert code == 0 and len(warmups) == 1
    result = json.loads(out.read_text())
    assert result['shared_backend'] and result['compile_seconds'] > 0
    assert result['compile_counts'] == {'decode': 1, 'seed': 1} and result['fallbacks'] == {}
    assert result['text_equal'] is True and result['action_max_abs_diff'] <= 1e-5
    assert result['compile_only'] == ['decode', 'seed'] and result['compile_cameras'] == [2]


@pytest.mark.parametrize('jacobian_steps', [None, 4])
def test_bench_times_the_guided_denoise_on_the_fast_path_beside_the_plain_one(
        tmp_path, capsys, jacobian_steps):
    """With ``--rtc-jacobian-steps`` K it also says how far K lands from exact RTC."""
    out = tmp_path / 'bench.json'
    k = [] if jacobian_steps is None else ['--rtc-jacobian-steps', str(jacobian_steps)]
    code = engine.main(['--preset', 'tiny', '--cameras', '2', '--frames', '2',
                        '--decode-budget', '4', '--tokens-per-cycle', '2', '--max-running', '4',
                        '--compile', 'default', '--compile-backend', 'aot_eager',
                        '--compile-cameras', '2', '--only', 'denoise', 'guided_denoise',
                        '--rtc', *k, '--json', str(out), '--no-progress'])
    assert code == 0
    result = json.loads(out.read_text())
    assert result['fallbacks'] == {} and set(result['compile_counts']) == {
        'denoise', 'guided_denoise'}
    d = result['denoise']
    assert d['rtc'] and d['plain_on_fast_path'] and d['guided_on_fast_path']
    assert d['guided_ms'] > 0 and d['plain_ms'] > 0
    printed = capsys.readouterr().out
    assert 'ms (fast path) = ' in printed
    if jacobian_steps is None:
        assert d['jacobian_steps'] == 10 and d['jacobian_deviation'] is None
        assert d['guided_exact_ms'] is None
        assert 'guided (RTC) ' in printed and 'Jacobian' not in printed
        return
    dev = d['jacobian_deviation']
    assert d['jacobian_steps'] == 4 and 'guided (RTC, Jacobian on 4 steps) ' in printed
    assert 'Jacobian on 4 steps against every step' in printed
    assert d['guided_exact_ms'] > 0 and 'beside it, the Jacobian on every step' in printed
    assert d['guided_exact_vs_plain'] == pytest.approx(d['guided_exact_ms'] / d['plain_ms'])
    assert 0 < dev['max_abs_vs_exact'] < dev['chunk_max_abs']
    assert dev['frozen_max_abs_vs_exact'] <= dev['max_abs_vs_exact']
    assert 0 < dev['frozen_gap_exact'] and 0 < dev['frozen_gap']


def test_fp8_weights_in_the_bench_and_run_model_report_their_check(tmp_path, capsys):
    """Random tiny weights fail the FP8 action check: both tools say so and run float32."""
    out = tmp_path / 'bench.json'
    assert engine.main(['--preset', 'tiny', '--cameras', '1', '--frames', '1',
                        '--decode-budget', '2', '--quantization', 'fp8', '--json', str(out),
                        '--no-progress']) == 0
    result = json.loads(out.read_text())
    assert result['quantization'] == 'none'
    for policy in ('oxygen', 'isolated'):
        assert 'refused by the action check' in result['fallbacks'][policy]['quantization']
    assert run_model.main(['--preset', 'tiny', '--quantization', 'fp8', '--max-tokens',
                           '1']) == 0
    printed = capsys.readouterr().out
    assert 'weights float32, quantization none; FALLBACK quantization: FP8 weights (dequant ' \
        'kernel) refused by the action check' in printed
