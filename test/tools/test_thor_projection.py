"""Thor's latency projected from the H100's measured efficiency, bf16 and FP8 (docs/gpu.md)."""

import json
from pathlib import Path

from oxygen_ros.tools.bench import thor_projection
from oxygen_ros.tools.bench.gpu_components import Workload
from oxygen_ros.tools.bench.gpu_specs import JETSON_AGX_THOR, lookup_gpu
from oxygen_ros.tools.bench.roofline import bound_ms, component_costs
import pytest

REPO = Path(__file__).resolve().parents[2]
SESSION = REPO / 'docs/gpu/2026-11-25-h100/session2.json'


def test_the_docs_table_is_computed_from_the_committed_h100_run():
    table = thor_projection.markdown(thor_projection.from_session(SESSION))
    assert table in (REPO / 'docs/gpu.md').read_text(), \
        'docs/gpu.md is stale: paste `python -m oxygen_ros.tools.bench.thor_projection ' \
        f'{SESSION.relative_to(REPO)}` into its "Thor projection" section'


def test_each_projection_is_thors_bound_over_the_h100s_efficiency():
    h100 = lookup_gpu('NVIDIA H100 80GB HBM3')
    work = Workload()
    ms = {'denoise_10_steps': 12.2, 'decode_step_b8': 3.76, 'lm_head': 0.1, 'vision': 2.57}
    out = thor_projection.project(ms, work, h100)
    assert out['projected'] is True and set(out['rows']) == set(ms)
    cfg = work.model_config()
    sizes = {'cameras': 3, 'prompt_tokens': 50, 'decode_batches': [1, 8, 32],
             'decode_ctx': 900, 'dtype_bytes': 2}
    bf16 = component_costs(cfg, **sizes)
    fp8 = component_costs(cfg, **sizes, fp8_weights=True)
    for name, row in out['rows'].items():
        efficiency = min(1.0, bound_ms(bf16[name], h100) / ms[name])
        assert row['efficiency'] == pytest.approx(efficiency)
        assert row['bf16']['projected_ms'] == pytest.approx(
            bound_ms(bf16[name], JETSON_AGX_THOR) / efficiency)
        assert row['fp8']['projected_ms'] == pytest.approx(
            bound_ms(fp8[name], JETSON_AGX_THOR) / efficiency)
    rows = out['rows']
    assert rows['lm_head']['efficiency'] == 1.0               # faster than its bound: capped
    assert rows['lm_head']['fp8'] == rows['lm_head']['bf16']  # the LM head is not quantized
    # weight-bound calls: FP8 reads about half the bytes on Thor's 273 GB/s
    assert 0.5 < rows['denoise_10_steps']['fp8']['bound_ms'] / \
        rows['denoise_10_steps']['bf16']['bound_ms'] < 0.53
    assert 'measured_ms' not in out['paper_cycle']            # prefill, suffix not measured


def test_the_paper_cycle_sums_its_parts():
    out = thor_projection.from_session(SESSION)
    cycle, rows = out['paper_cycle'], out['rows']
    parts = thor_projection.paper_cycle_parts()
    assert parts['decode_step_b8'] == 5 and len(parts) == 6
    for weights in ('bf16', 'fp8'):
        assert cycle[weights]['projected_ms'] == pytest.approx(
            sum(n * rows[p][weights]['projected_ms'] for p, n in parts.items()))
    assert cycle['fp8']['projected_ms'] < cycle['bf16']['projected_ms']


def test_a_file_without_compiled_times_is_refused(tmp_path, capsys):
    path = tmp_path / 'session1.json'
    path.write_text(json.dumps({'results': {}, 'config': {}}))
    assert thor_projection.main([str(path)]) == 2
    assert 'no compiled component times of a known GPU' in capsys.readouterr().err
