"""oxygen_bench image_decode on a small frame (a smoke run: the table and JSON, not the timing)."""

import json

from oxygen_ros.tools.bench import image_decode


def test_decode_bench_prints_both_codecs_and_writes_json(tmp_path, capsys):
    out = tmp_path / 'decode.json'
    assert image_decode.main(['--runs', '3', '--width', '64', '--height', '48',
                              '--corrupt', '20', '--json', str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith('decode_bench ') and '64x48' in lines[0]
    assert [line.split()[0] for line in lines[2:5]] == ['raw', 'jpeg', 'png']
    result = json.loads(out.read_text())
    assert result['raw_bytes'] == 64 * 48 * 3
    assert [r['codec'] for r in result['rows']] == ['jpeg', 'png']
    for row in result['rows']:
        assert 0 < row['bytes'] and set(row['ms']) >= {'oxygen_ros', 'Pillow'}
        assert all(ms > 0 for ms in row['ms'].values())
    refused = result['jpeg_corruption']['refused']
    assert result['jpeg_corruption']['positions'] == 20
    assert all(0 <= n <= 20 for n in refused.values()) and refused['oxygen_ros'] > 0
    assert 'refused by: oxygen_ros' in lines[-1]
