"""
A fallback drops one feature, not the compiler (``backends/fast_path/features.py``, ``warmup.py``).

A step whose paged attention kernel fails to build is compiled again without it (the context
gathered) and stays compiled: by the compiler of the test (``record``: Dynamo and AOTAutograd,
the kernel in Triton's interpreter) and, in a process without the interpreter, by Inductor
itself, for which the kernel cannot build on the CPU. The drop is said once, on the engine
and ``/diagnostics``; a build that failed is not tried again by the later steps.
"""

import logging
import os
from pathlib import Path
import subprocess
import sys
import textwrap

from oxygen_ros.backends.attention import sdpa_context
from oxygen_ros.backends.config import AttentionBackend, CompileMode, Step
from oxygen_ros.backends.fast_path.buckets import EngineLimits
from oxygen_ros.backends.fast_path.features import blame, Feature
from oxygen_ros.backends.fast_path.kernels import paged_decode
from oxygen_ros.backends.fast_path.model import FastPathModel
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.ros.diagnostics import EngineDiagnostics, Level, status_values
from paged_cases import interpreted_kernel
import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
H200 = ('CompilationError: at 37:8: Loop-carried variable m has initial type fp32 but is '
        're-assigned to fp64 in loop (in _context_partials)')
"""What Inductor's build of the paged kernel said on the H200 (2026-11-27), in short."""


def test_a_failure_names_the_feature_it_came_from():
    assert blame(RuntimeError(H200)) == [Feature.PAGED_ATTENTION]
    assert blame(RuntimeError('torch._scaled_mm: no kernel image')) == [Feature.FP8_MATMUL]
    assert blame(RuntimeError('error in flex_attention lowering')) == [Feature.FLEX_ATTENTION]
    assert blame(RuntimeError('parity gate failed: |compiled - eager| 0.3')) == []
    try:
        raise ValueError('outer') from RuntimeError('in _gated_norm: fp64')
    except ValueError as exc:
        assert blame(exc) == [Feature.PAGED_ATTENTION]        # the cause names it


def test_a_kernel_that_fails_to_build_is_dropped_and_every_step_stays_compiled(
        tiny_models, monkeypatch, caplog):
    interpreted_kernel()
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERA_SLOTS[:2])
    graphs, tried = [], []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def broken(*args):
        tried.append(1)
        raise RuntimeError(H200)
    monkeypatch.setattr(paged_decode, '_check', broken)
    limits = EngineLimits.for_model(model.cfg, num_slots=1024, max_batch=2,
                                    max_decode_tokens=8, max_cameras=2)
    fast = FastPathModel(model, CompileMode.DEFAULT, limits, backend=record,
                         only=[Step.SUFFIX, Step.DENOISE, Step.DECODE])
    pool = KVCache(model.cfg.vlm, 1024)
    torch._dynamo.reset()
    with caplog.at_level(logging.ERROR), sdpa_context(AttentionBackend.TRITON):
        fast.warmup(pool, progress=False)
        assert fast.fallbacks == {}                           # nothing runs eagerly
        assert fast.graph_counts().keys() == {'suffix', 'denoise', 'decode'}
        assert fast.without == {s: ('paged_attention',) for s in ('suffix', 'denoise',
                                                                  'decode')}
        assert list(fast.dropped) == ['paged_attention']
        assert fast.dropped['paged_attention'].startswith('suffix: ')
        assert fast.dropped['paged_attention'].endswith(f'(RuntimeError: {H200})')
        # the first step's first build met the failure; the later steps never tried again
        assert len(tried) == 1
        for gm in graphs:
            calls = [str(n.target) for n in gm.graph.nodes if n.op.startswith('call')]
            assert not [c for c in calls if 'paged_attention' in c]
        gen = torch.Generator().manual_seed(2)
        pool.k.normal_(generator=gen)
        pool.v.normal_(generator=gen)
        ctx = torch.arange(16, 16 + 140).expand(2, 140)
        mask = torch.arange(140)[None] < torch.tensor([[140], [131]])
        args = (torch.tensor([5, 9]), mask.sum(1), pool, torch.tensor([400, 401]), ctx, mask)
        with torch.inference_mode():
            want = model.decode_step(*args)
            got = fast.decode_step(*args)
        assert len(tried) == 1                  # the call too runs without it: no retrace
    torch._dynamo.reset()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    said = [r.getMessage() for r in caplog.records if 'left out' in r.getMessage()]
    assert said == ['fast path: the paged attention kernel (Triton) left out of every step: '
                    + fast.dropped['paged_attention']]


def test_a_dropped_feature_is_a_warning_on_diagnostics():
    diag = EngineDiagnostics('tiny')
    diag.set_fallbacks({}, {'paged_attention': f'suffix: RuntimeError: {H200}'})
    status = diag.status(0.0, 10.0, 1.0)
    assert status.level == Level.WARN.octet
    assert 'fast path without paged_attention' in status.message
    assert status_values(status)['dropped: paged_attention'] == f'suffix: RuntimeError: {H200}'


INDUCTOR_ON_THE_CPU = """
    import json, torch
    from oxygen_ros.backends.attention import sdpa_context
    from oxygen_ros.backends.fast_path.buckets import EngineLimits
    from oxygen_ros.backends.fast_path.model import FastPathModel
    from oxygen_ros.backends.config import AttentionBackend, CompileMode, Step
    from oxygen_ros.config import get_preset
    from oxygen_ros.model.kv_cache import KVCache
    from oxygen_ros.model.pi05 import build_model
    cfg = get_preset('tiny').model
    torch.manual_seed(0)
    model = build_model(cfg)
    limits = EngineLimits.for_model(cfg, num_slots=1024, max_batch=2,
                                    max_decode_tokens=8, max_cameras=1)
    fast = FastPathModel(model, CompileMode.DEFAULT, limits, backend='inductor',
                         only={Step.DECODE}, precompile=False,
                         attention=AttentionBackend.TRITON)
    with sdpa_context(AttentionBackend.TRITON):
        fast.warmup(KVCache(cfg.vlm, 1024), progress=False)
    print(json.dumps({'fallbacks': fast.fallbacks, 'dropped': fast.dropped,
                      'without': fast.without, 'graphs': fast.graph_counts(),
                      'kernels': fast.kernels.value}))
    """


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_inductor_compiles_the_step_without_a_kernel_it_cannot_build(tmp_path):
    """Inductor cannot build the Triton kernel for the CPU: the decode stays Inductor's."""
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = os.pathsep.join([str(ROOT), env.get('PYTHONPATH', '')])
    env['OXYGEN_ROS_CACHE'] = str(tmp_path)
    proc = subprocess.run([sys.executable, '-c', textwrap.dedent(INDUCTOR_ON_THE_CPU)],
                          capture_output=True, text=True, env=env, timeout=850)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out['fallbacks'] == {} and out['graphs'] == {'decode': 2}
    assert out['kernels'] == 'inductor'
    assert out['without'] == {'decode': ['paged_attention']}
    assert out['dropped']['paged_attention'].startswith('decode: InductorError')
