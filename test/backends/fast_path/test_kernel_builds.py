"""
The model's Triton kernels build for Hopper (sm_90) and Thor (sm_110) as Inductor builds them.

No GPU needed: ``oxygen_bench kernels`` (``backends/fast_path/kernels/builds.py``) records every
launch of every preset's callers on the ``meta`` device, types each argument with torch's own
function for a ``wrap_triton`` kernel (a Python float: fp64 on this torch), runs torch's mutation
analysis and compiles a cubin with Triton's bundled ptxas, once per target, in a process without
``TRITON_INTERPRET``. Before the kernels cast their scalars themselves, the paged attention failed
here exactly as on the H200 (``docs/gpu.md#kernels-built-as-inductor-builds-them``).
"""

import json
import os
from pathlib import Path
import subprocess
import sys
import textwrap

from oxygen_ros.config import get_preset
import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
WRITES = {'_context_partials': ['acc_ptr', 'l_ptr', 'm_ptr'],
          '_new_tokens_and_merge': ['out_ptr']}
"""What each kernel writes (its outputs, never its inputs or the KV pool)."""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    env['PYTHONPATH'] = os.pathsep.join([str(ROOT), env.get('PYTHONPATH', '')])
    return env


@pytest.fixture(scope='module')
def table(tmp_path_factory):
    """Build the table for both targets, side by side (one process each)."""
    out = tmp_path_factory.mktemp('kernels')
    procs = {arch: subprocess.Popen(
        [sys.executable, '-m', 'oxygen_ros.tools.bench.kernels', '--target', str(arch),
         '--json', str(out / f'{arch}.json')], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=_env()) for arch in (90, 110)}
    results = {}
    for arch, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=1200)
        print(stdout)                            # the kernel x variant x dtype x target table
        assert proc.returncode == 0, f'sm_{arch}:\n{stdout[-3000:]}\n{stderr[-3000:]}'
        results[arch] = json.loads((out / f'{arch}.json').read_text())['builds']
    return results


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize('arch', [90, 110])
def test_every_kernel_builds_for_the_target_as_inductor_types_it(table, arch):
    builds = table[arch]
    assert {b['target'] for b in builds} == {f'sm_{arch}'}
    assert all(b['ok'] for b in builds), [b for b in builds if not b['ok']]
    kernels = {b['kernel'] for b in builds}
    assert kernels == {'_context_partials', '_new_tokens_and_merge', '_gated_norm'}
    # every variant the callers launch: RoPE on load (denoise) or not, causal or not, both
    # dtypes, the norm with and without the residual
    variants = {(b['kernel'], 'ROPE=True' in b['variant'], 'IEEE=True' in b['variant'])
                for b in builds if b['kernel'] != '_gated_norm'}
    assert len(variants) == 8, variants
    assert {'RESIDUAL=True' in b['variant'] for b in builds if b['kernel'] == '_gated_norm'} \
        == {True, False}
    for b in builds:
        # the scalars as torch types a float argument, the kernels casting them themselves
        scalars = {n: t for n, t in b['signature'].items() if n in ('scale', 'eps')}
        assert set(scalars.values()) <= {'fp32', 'fp64'} and scalars, b
        want = WRITES.get(b['kernel']) or (
            ['x_out_ptr', 'y_ptr'] if 'RESIDUAL=True' in b['variant'] else ['y_ptr'])
        assert b['mutated'] == want, b          # torch's mutation analysis: outputs only


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_16_bit_kernels_do_not_spill_on_hopper(table):
    """Where the fast path runs them (bf16): registers only; float32 at head dim 256 spills."""
    bf16 = [b for b in table[90] if 'IEEE=True' not in b['variant']
            and b['signature'].get('q_ptr', b['signature'].get('x_ptr')) == '*bf16']
    assert bf16 and all(b['spills'] == 0 for b in bf16), [b for b in bf16 if b['spills']]


def _python(code: str) -> dict:
    """Run ``code`` (it prints one JSON object) without ``TRITON_INTERPRET``; return it."""
    proc = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True,
                          text=True, env=_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_torch_types_a_float_argument_of_a_user_kernel_as_the_kernels_expect():
    """The typing the table builds with is torch's, for the installed torch."""
    out = _python("""
        import json, torch
        from torch._inductor import config
        from oxygen_ros.config import get_preset
        from oxygen_ros.backends.fast_path.kernels.builds import inductor_signature, model_launches
        launch = next(la for la in model_launches(get_preset('tiny').model, torch.bfloat16)
                      if la.name == '_context_partials')
        types, constants = inductor_signature(launch)
        print(json.dumps({'types': types, 'rope': constants['ROPE'],
                          'fp64': config._use_fp64_for_unbacked_floats}))
        """)
    types = out['types']
    assert types['scale'] == ('fp64' if out['fp64'] else 'fp32')
    assert types['q_ptr'] == '*bf16' and types['slots_ptr'] == '*i64'
    assert out['rope'] is False and types['ROPE'] == 'constexpr'


def test_the_launches_are_the_callers_own():
    """Decode (one new token: ``num_new`` = 1, a constant), suffix and denoise, as they run."""
    out = _python("""
        import json, torch
        from oxygen_ros.config import get_preset
        from oxygen_ros.backends.fast_path.kernels.builds import model_launches, variant
        launches = model_launches(get_preset('pi05_droid').model, torch.bfloat16)
        print(json.dumps({
            'kinds': sorted([la.name, variant(la)] for la in launches),
            'mod': [str(la.args['mod_ptr'].dtype) for la in launches
                    if la.name == '_gated_norm'],
            'q': [str(la.args['q_ptr'].dtype) for la in launches
                  if la.name != '_gated_norm']}))
        """)
    kinds = out['kinds']
    assert len(kinds) == 7, kinds
    merge = [v for n, v in kinds if n == '_new_tokens_and_merge']
    assert sum('num_new=1' in v for v in merge) == 1          # the decode step's
    assert sum('ROPE=True CAUSAL=False' in v for v in merge) == 1      # the denoise's
    assert set(out['mod']) == {'torch.float32'}               # openpi keeps adaRMS in fp32
    assert set(out['q']) == {'torch.bfloat16'}


def test_under_the_interpreter_there_is_nothing_to_build():
    from oxygen_ros.backends.fast_path.kernels.builds import model_launches
    with pytest.raises(RuntimeError, match='TRITON_INTERPRET'):
        model_launches(get_preset('tiny').model, torch.float32)


def test_the_device_check_answers_on_the_cpu_without_building():
    from oxygen_ros.backends.fast_path.kernels.device_check import check_device
    out = check_device('cpu')
    assert not out.ok and out.target == 'cpu'
    assert out.reason == ("cpu: no CUDA device; the kernels run there only in Triton's "
                          'interpreter (TRITON_INTERPRET=1)')


@pytest.mark.timeout(600)
def test_a_target_the_compiler_cannot_build_for_is_refused_and_the_caller_lives_on():
    """Triton's LLVM aborts its process for a GPU newer than it knows: the child's, not ours."""
    from oxygen_ros.backends.fast_path.kernels.device_check import check_target_apart, PTXAS_HINT
    out = check_target_apart(('cuda', 200, 32), get_preset('tiny').model, torch.bfloat16)
    assert not out.ok and out.target == 'cuda sm_200'
    assert out.reason.startswith('the Triton compiler crashed building the kernels for cuda '
                                 'sm_200 (exit -6): LLVM ERROR')
    assert out.reason.endswith(PTXAS_HINT)
    thor = check_target_apart(('cuda', 110, 32), get_preset('tiny').model, torch.bfloat16)
    assert thor.ok and thor.reason is None and len(thor.lines) == 7, thor
