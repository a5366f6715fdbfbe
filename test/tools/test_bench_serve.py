"""``oxygen_bench serve``: the wire beside the engine's step, every field, equal actions."""

import json

from oxygen_ros.tools.bench import serve
import pytest


@pytest.mark.parametrize('preset, layout', [('tiny', 'libero'), ('tiny_aloha', None)])
def test_the_wire_is_timed_beside_the_engine_and_the_actions_agree(
        tmp_path, capsys, preset, layout):
    out = tmp_path / 'serve.json'
    args = ['--preset', preset, '--frames', '3', '--warmup', '1', '--text-every', '2',
            '--json', str(out)] + (['--layout', layout] if layout else [])
    assert serve.main(args) == 0
    result = json.loads(out.read_text())
    assert result['layout'] == (layout or 'aloha') and result['actions_equal'] is True
    for key in ('round_trip_ms', 'served_engine_ms', 'direct_step_ms', 'wire_overhead_ms'):
        assert set(result[key]) == {'p50', 'p90', 'mean'} and result[key]['p50'] > 0, key
    assert result['wire_overhead_frac'] == pytest.approx(
        result['wire_overhead_ms']['p50'] / result['direct_step_ms']['p50'])
    assert result['message_bytes'] > 224 * 224 * 3 * 2 and result['target_frac'] == 0.05
    printed = capsys.readouterr().out
    assert 'wire overhead: ' in printed and '% of a frame' in printed
    assert 'actions equal to the direct step: True' in printed


def test_a_layout_that_does_not_fit_the_preset_is_refused(capsys):
    assert serve.main(['--preset', 'tiny', '--layout', 'aloha', '--frames', '1']) == 2
    assert 'sends a state of 14 dims' in capsys.readouterr().err
