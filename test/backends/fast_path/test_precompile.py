"""
A warm start of the fast path loads its steps compiled ahead of time and traces nothing.

Each "start" is a new ``FastPathModel`` after ``torch._dynamo.reset()`` on one compile cache
folder (``$OXYGEN_ROS_COMPILE_CACHE``, a temporary one), as a process restart sees it (the
subprocess test with Inductor is in ``test_compile_cache.py``). Traces are Dynamo's own count
(``unique_graphs``, which ``aot_compile`` raises too); the compiler is ``aot_eager`` (its
graph is what ``save_compiled_function`` writes; Inductor's C++ builds take minutes here).
The models are bfloat16, where the gate needs a float32 reference or its record.
"""

import logging

from oxygen_ros.backends.config import CompileMode, Step
from oxygen_ros.backends.fast_path import static_calls
from oxygen_ros.backends.fast_path.attempts import graphs_compiled
from oxygen_ros.backends.fast_path.buckets import EngineLimits
from oxygen_ros.backends.fast_path.gate_record import GateRecord, weights_fingerprint
from oxygen_ros.backends.fast_path.model import FastPathModel
from oxygen_ros.backends.fast_path.parity_probe import ParityProbe
from oxygen_ros.backends.fast_path.precompile import ArtifactStore, PrecompiledStep
from oxygen_ros.config import CAMERA_SLOTS
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.loading import build_model
from oxygen_ros.model.kv_cache import KVCache
import pytest
import torch

SLOTS = 1024
STEPS = [Step.DENOISE, Step.DECODE, Step.SEED]


def _model():
    cfg = EngineConfig(preset='tiny', cameras=CAMERA_SLOTS[:2], seed=3, dtype='bfloat16')
    return build_model(cfg, cfg.model_config())


def _start(model, only=STEPS, max_batch=2, precompile=True, tokens_per_cycle=()):
    """One start: a fresh Dynamo, a fresh fast path on the cache folder; (model, traces)."""
    torch._dynamo.reset()
    limits = EngineLimits.for_model(model.cfg, num_slots=SLOTS, max_batch=max_batch,
                                    max_decode_tokens=8, max_cameras=2)
    comp = FastPathModel(model, CompileMode.DEFAULT, limits, backend='aot_eager', only=only,
                         precompile=precompile, tokens_per_cycle=tokens_per_cycle)
    before = graphs_compiled()
    comp.warmup(KVCache(model.cfg.vlm, SLOTS, dtype=model.dtype), progress=False)
    assert comp.fallbacks == {}, comp.fallbacks
    return comp, graphs_compiled() - before


@pytest.fixture(autouse=True)
def compile_cache(tmp_path, monkeypatch):
    monkeypatch.setenv('OXYGEN_ROS_COMPILE_CACHE', str(tmp_path))
    yield tmp_path
    torch._dynamo.reset()


def _calls(comp, model):
    """Decode, denoise and seed through ``comp`` on a fresh pool: their outputs."""
    gen = torch.Generator().manual_seed(5)
    cfg = model.cfg
    pool = comp._pool
    pool.k.normal_(generator=gen)
    pool.v.normal_(generator=gen)
    with torch.inference_mode():
        ctx = torch.arange(16, 16 + 150)[None].expand(2, -1)
        mask = torch.arange(150)[None] < torch.tensor([[150], [140]])
        logits = comp.decode_step(torch.tensor([5, 7]), torch.tensor([150, 140]), pool,
                                  torch.tensor([400, 401]), ctx, mask)
        prefix = model.prefill(torch.randint(3, 900, (1, 9), generator=gen), None,
                               image_embeds=torch.randn(1, 2, cfg.image_tokens_per_camera,
                                                        cfg.vlm.width, generator=gen),
                               cache=pool, slots=torch.arange(16, 16 + 137)[None])
        noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=gen)
        actions = comp.denoise(prefix, noise)
        seed = comp.lm_logits(torch.randn(2, cfg.vlm.width, generator=gen).to(model.dtype))
    return [logits, actions, seed]


def test_a_warm_start_loads_every_step_traces_nothing_and_computes_the_same(caplog):
    model = _model()
    cold, traced = _start(model)
    assert traced == sum(cold.compiles.values()) >= len(STEPS)
    assert all(cold.compiles[s.value] >= 1 and cold.loaded[s.value] == 0 for s in STEPS)
    assert 'float32' in cold.gate and 'no gate recorded' in cold.gate
    want = _calls(cold, model)
    with caplog.at_level(logging.INFO, logger='oxygen_ros.backends.fast_path.model'):
        warm, traced = _start(model)
    assert traced == 0 and set(warm.compiles.values()) == {0}          # no Dynamo trace
    assert warm.loaded == {s.value: cold.compiles[s.value] for s in STEPS}
    assert 'recorded for these weights' in warm.gate and 'no float32 copy' in warm.gate
    assert 'reference' not in warm.seconds                       # no float32 copy was made
    for step in STEPS:                               # gated afresh, against the record
        assert warm.parity[step.value].tolerance == cold.parity[step.value].tolerance
        assert warm.parity[step.value].error == cold.parity[step.value].error
    assert any('0 traced, 3 loaded' in r.getMessage() for r in caplog.records)
    for got, expected in zip(_calls(warm, model), want):    # the code loaded is the code
        torch.testing.assert_close(got, expected, atol=0, rtol=0)


def test_the_decode_of_k_steps_runs_the_decode_steps_loaded_function():
    """``DECODE_STEPS`` calls ``DECODE``'s compiled function: loaded with it, traced never."""
    model = _model()                                       # bfloat16: the gate's own rule
    only = [Step.DECODE, Step.DECODE_STEPS]
    cold, _ = _start(model, only=only, tokens_per_cycle=(3,))
    assert cold.compiles['decode_steps'] == 0 and cold.loaded['decode_steps'] == 0
    assert cold.parity['decode_steps'].reference_error > 0            # held to bf16 rounding
    warm, traced = _start(model, only=only, tokens_per_cycle=(3,))
    assert traced == 0 and warm.loaded == {'decode': 1, 'decode_steps': 1}
    assert 'recorded for these weights' in warm.gate


def test_another_configuration_compiles_its_own():
    model = _model()
    first, _ = _start(model, only=[Step.SEED], max_batch=2)
    other, traced = _start(model, only=[Step.SEED], max_batch=4)      # other buckets: key
    assert traced == 1 and other.loaded == {'seed': 0}
    assert other.store.dir != first.store.dir and 'no gate recorded' in other.gate
    again, traced = _start(model, only=[Step.SEED], max_batch=2)
    assert traced == 0 and again.loaded == {'seed': 1}


def test_changed_weights_run_the_full_gate_on_the_loaded_code():
    """Weights are read from the live model; the record of the old ones is not used."""
    model = _model()
    _start(model, only=[Step.DECODE, Step.SEED])
    with torch.no_grad():
        model.vlm.final_norm.weight.add_(0.25)           # a fine-tune, a new checkpoint
    changed, traced = _start(model, only=[Step.DECODE, Step.SEED])
    assert traced == 0 and changed.loaded == {'decode': 1, 'seed': 1}
    assert 'float32' in changed.gate and 'weights changed' in changed.gate
    assert 'reference' in changed.seconds
    hidden = torch.randn(2, model.cfg.vlm.width).to(model.dtype)
    with torch.inference_mode():                      # the loaded code reads the new weights
        torch.testing.assert_close(changed.lm_logits(hidden), model.lm_logits(hidden),
                                   atol=0.05, rtol=0.02)
    again, _ = _start(model, only=[Step.DECODE, Step.SEED])   # recorded for the new weights
    assert 'recorded for these weights' in again.gate


def _wrong_seed(self, hidden):
    logits = static_calls._lm_head(self.model, hidden) * 1.5
    return logits, logits.argmax(-1)


def test_a_wrong_artifact_fails_the_warm_gate_and_is_compiled_again(monkeypatch, caplog):
    model = _model()
    cold, _ = _start(model, only=[Step.SEED])
    store = ArtifactStore(cold.store.dir.parents[1], cold.cache_key())
    assert store.dir == cold.store.dir
    store.drop('seed')
    with monkeypatch.context() as patch:             # same class, other code: a stale file
        patch.setattr(static_calls.SeedCall, 'forward', _wrong_seed)
        wrong = PrecompiledStep(static_calls.SeedCall(model), 'aot_eager', store, 'seed')
        with torch.inference_mode():
            wrong(torch.randn(2, model.cfg.vlm.width).to(model.dtype))
    assert len(list(store.dir.glob('seed-*.bin'))) == 1
    with caplog.at_level(logging.WARNING, logger='oxygen_ros.backends.fast_path.model'):
        repaired, traced = _start(model, only=[Step.SEED])
    assert 'recorded for these weights' in repaired.gate           # the cheap gate caught it
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and 'ahead-of-time kernels' in errors[0], errors
    assert 'parity gate failed' in errors[0] and '> tolerance' in errors[0]
    assert any('failed; compiling them again' in r.getMessage() for r in caplog.records)
    assert traced == 1 and repaired.loaded == {'seed': 0}
    third, traced = _start(model, only=[Step.SEED])                # the folder is repaired
    assert traced == 0 and third.loaded == {'seed': 1}


def test_a_step_that_cannot_be_compiled_ahead_of_time_is_compiled_just_in_time(
        monkeypatch, caplog):
    model = _model()

    def refuse(self, args, plain):
        raise RuntimeError('cannot serialize this graph')
    with monkeypatch.context() as patch, \
            caplog.at_level(logging.WARNING, logger='oxygen_ros.backends.fast_path.model'):
        patch.setattr(PrecompiledStep, '_compile', refuse)
        first, traced = _start(model, only=[Step.SEED])
    assert traced == 1 and first.fallbacks == {}                  # just in time, gated
    assert 'cannot serialize this graph' in first.store.refused('seed')
    assert any('cannot be compiled ahead of time' in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger='oxygen_ros.backends.fast_path.model'):
        second, traced = _start(model, only=[Step.SEED])
    assert traced == 1 and second.loaded == {'seed': 0}           # not tried again
    assert any('compiled just in time (traced at every start)' in r.getMessage() and
               'cannot serialize' in r.getMessage() for r in caplog.records)


def test_the_guided_denoise_is_compiled_just_in_time_without_trying(caplog):
    """Real-time chunking's guided step: torch refuses its VJP ahead of time."""
    model = _model()
    limits = EngineLimits.for_model(model.cfg, num_slots=SLOTS, max_batch=2,
                                    max_decode_tokens=8, max_cameras=2)
    for _ in range(2):
        torch._dynamo.reset()
        comp = FastPathModel(model, CompileMode.DEFAULT, limits, backend='aot_eager',
                             only=[Step.GUIDED_DENOISE], guided=True, precompile=True)
        with caplog.at_level(logging.WARNING, logger='oxygen_ros.backends.fast_path.model'):
            comp.warmup(KVCache(model.cfg.vlm, SLOTS, dtype=model.dtype), progress=False)
        assert comp.fallbacks == {} and comp.compiles == {'guided_denoise': 1}
        assert comp.loaded == {'guided_denoise': 0}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any('version_counter' in r.getMessage() for r in caplog.records)


def test_precompile_is_off_by_default_for_aot_eager_and_custom_compilers():
    model = _model()
    plain, traced = _start(model, only=[Step.SEED], precompile=None)
    assert plain.store is None and traced == 1 and plain.loaded == {'seed': 0}
    assert 'float32' in plain.gate
    limits = EngineLimits.for_model(model.cfg, num_slots=SLOTS, max_batch=2,
                                    max_decode_tokens=8, max_cameras=2)
    custom = FastPathModel(model, CompileMode.DEFAULT, limits, backend=lambda gm, ex: gm,
                           precompile=True)
    assert not custom.precompile                      # a callable cannot be saved by name


def test_the_weights_fingerprint_sees_one_element():
    model = _model()
    base = weights_fingerprint(model)
    assert weights_fingerprint(model) == base
    p = model.vlm.final_norm.weight
    with torch.no_grad():
        old = p[3].clone()
        p[3] = torch.nextafter(p[3].float(), torch.tensor(10.0)).to(p.dtype)   # one ulp
        assert weights_fingerprint(model) != base
        p[3] = old
    assert weights_fingerprint(model) == base


def test_the_gate_record_says_why_it_is_not_used(tmp_path):
    record = GateRecord(tmp_path, 'abc')
    assert record.tolerances({'seed (2,)'}) == (None, 'no gate recorded for this '
                                                      'configuration')
    record.save({'seed (2,)': (0.5, 0.1), 'decode (2, 256)': (0.7, 0.2)})
    found, why = record.tolerances({'seed (2,)'})
    assert found == {'seed (2,)': (0.5, 0.1)} and why == 'recorded for these weights (abc)'
    found, why = GateRecord(tmp_path, 'xyz').tolerances({'seed (2,)'})
    assert found is None and 'weights changed' in why and 'xyz' in why
    found, why = record.tolerances({'seed (2,)', 'seed (4,)'})
    assert found is None and 'lacks 1 probe' in why
    (tmp_path / 'gate.json').write_text('{"weights": "abc", "tolera')
    found, why = record.tolerances({'seed (2,)'})
    assert found is None and 'unreadable gate record' in why


def test_each_probe_sees_the_same_inputs_whatever_ran_before():
    """A probe is seeded by its step and shape: what a full gate measured comes back."""
    model = _model()
    comp, _ = _start(model, only=[Step.DECODE, Step.SEED], precompile=False)
    pool = comp._pool

    def probe():
        return ParityProbe(comp, model, None, pool, comp.shapes, 16)
    first = probe().run('seed', (2,))
    other = probe()
    other.run('decode', comp.steps()[Step.DECODE][-1])
    other.run('seed', (2,))
    again = other.run('seed', (2,))
    assert first.error == again.error and first.name == again.name
    assert other.measured.keys() == {ParityProbe.label('decode', comp.steps()[Step.DECODE][-1]),
                                     'seed (2,)'}
    region = other.size                     # a pool of another size: the same probe region
    kept = pool.k[:, :region].clone()
    bigger = KVCache(model.cfg.vlm, 2 * SLOTS, dtype=model.dtype)
    ParityProbe(comp, model, None, bigger, comp.shapes, 16)
    ParityProbe(comp, model, None, pool, comp.shapes, 16)
    assert torch.equal(bigger.k[:, :region], pool.k[:, :region])
    assert not torch.equal(kept, torch.zeros_like(kept))
