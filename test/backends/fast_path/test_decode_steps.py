"""
A decode job's k steps in one graph (``backends/fast_path/decode_steps.py``) on the CPU.

The k-step graph must leave exactly what the per-step loop leaves (the same decode step's
compiled function runs in both: ids and K/V equal bit for bit in float32), be chosen only
when no early stop (EOS, deadline) is asked, and fall back loudly to the per-step loop. The
compiler is ``aot_eager``, as in ``test_fast_path.py``.
"""

from dataclasses import replace
import logging
import time

from oxygen_adapter import oxygen_arrays
from oxygen_ros.backends.config import CompileMode, Step
from oxygen_ros.backends.fast_path import backend as fast_backend, graph_builder
from oxygen_ros.backends.fast_path.static_calls import DecodeLoopCall
from oxygen_ros.backends.torch_backend import _RowState, TorchBackend
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.loading import make_backend_for
from oxygen_ros.model.lora import from_oxygen_arrays
from oxygen_ros.sched.output import DecodeJob
from oxygen_ros.tools.common.workload import make_observation
from oxygen_ros.transforms.prompt import TextTask
import pytest
import torch

CAMS = CAMERA_SLOTS[:2]
BLOCKS, BLOCK = 128, 16
K = 3
LENGTHS = (40, 33, 21)
"""Context lengths of the three running requests (prefix + tokens fed)."""


pytestmark = pytest.mark.usefixtures('fresh_dynamo')


def _backend(model, adapter=None):
    config = EngineConfig.create(preset='tiny', compile_mode=CompileMode.DEFAULT,
                                 block_size=BLOCK, max_running_requests=4, tokens_per_cycle=K)
    return make_backend_for(config, model, BLOCKS, backend='aot_eager', progress=False,
                            only=[Step.DECODE, Step.DECODE_STEPS], adapter=adapter)


def _start(backend, adapter_rows=(True, False, True)):
    """Put three running requests of unequal contexts on random K/V in the backend."""
    gen = torch.Generator().manual_seed(4)
    pool = backend.cache
    for t in (pool.k, pool.v):
        t.zero_()
        t[:, BLOCK:1024].normal_(generator=gen)
    backend._rows.clear()
    for i, (n, flag) in enumerate(zip(LENGTHS, adapter_rows)):
        start = BLOCK + 320 * i
        backend._rows[f'r{i}'] = _RowState(torch.arange(start, start + n + 8), n, 0,
                                           torch.tensor(7 + 100 * i), flag)


def _graph_calls(backend, step):
    return sum(g.num_calls for g in backend.fast_path._graphs.get(step, {}).values())


def _decode(backend, job):
    """Run ``job`` on fresh rows; return (ids per request, the pool past the null block)."""
    _start(backend, (True, False, True) if backend.adapter is not None else (False,) * 3)
    sampled = {}
    with torch.inference_mode():
        backend._decode(job, sampled)
    ids = {r: torch.cat(t).tolist() for r, t in sampled.items()}
    return ids, backend.cache.k[:, BLOCK:].clone(), backend.cache.v[:, BLOCK:].clone()


@pytest.mark.parametrize('lora', [False, True], ids=['plain', 'adapter'])
def test_k_steps_in_one_graph_equal_the_per_step_loop_exactly(tiny_models, lora):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    adapter = from_oxygen_arrays(oxygen_arrays(model.cfg, rank=4, std=0.2), model.cfg) \
        if lora else None
    backend = _backend(model, adapter)
    assert backend.fast_path.fallbacks == {} and 'decode_steps' in backend.fast_path.parity
    assert backend.warmup_report.graphs['decode_steps'] == len(backend.fast_path.shapes.batch) \
        * len(backend.fast_path.shapes.ctx)
    rows = ('r0', 'r1', 'r2')
    plain = DecodeJob(rows, (K, 1, 2), None)                 # unequal steps left
    stops = [replace(plain, eos_token_id=-1),                # an EOS never sampled
             replace(plain, deadline=time.monotonic() + 3600)]
    before = (_graph_calls(backend, Step.DECODE_STEPS), _graph_calls(backend, Step.DECODE))
    got = _decode(backend, plain)
    assert (_graph_calls(backend, Step.DECODE_STEPS), _graph_calls(backend, Step.DECODE)) == \
        (before[0] + 1, before[1])                           # one replay for the K steps
    for job in stops:                                        # an early stop asked: per step
        before = (_graph_calls(backend, Step.DECODE_STEPS), _graph_calls(backend, Step.DECODE))
        want = _decode(backend, job)
        assert (_graph_calls(backend, Step.DECODE_STEPS),
                _graph_calls(backend, Step.DECODE)) == (before[0], before[1] + K)
        assert got[0] == want[0] and [len(got[0][r]) for r in rows] == [K, 1, 2]
        assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    eager = TorchBackend(model, BLOCKS, BLOCK, adapter=adapter)
    ids, k, v = _decode(eager, plain)
    assert ids == got[0]
    torch.testing.assert_close(k, got[1], atol=1e-5, rtol=0)
    torch.testing.assert_close(v, got[2], atol=1e-5, rtol=0)
    assert (got[1] != 0).any()


def test_a_row_with_no_step_left_writes_only_the_null_slot(tiny_models, caplog):
    """``decode_greedy_steps`` with a row of 0 steps equals the per-step loop of the backend."""
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    backend = _backend(model)
    comp = backend.fast_path
    before = (_graph_calls(backend, Step.DECODE_STEPS), _graph_calls(backend, Step.DECODE))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger='oxygen_ros.backends.fast_path.model'):
        _decode(backend, DecodeJob(('r0', 'r1', 'r2'), (K - 1, 1, 1), None))   # k - 1 steps
    assert (_graph_calls(backend, Step.DECODE_STEPS), _graph_calls(backend, Step.DECODE)) == \
        (before[0], before[1] + K - 1)                    # step by step, by design: no warning
    assert not [r for r in caplog.records if r.name == 'oxygen_ros.backends.fast_path.model']
    job = DecodeJob(('r0', 'r1', 'r2'), (K, K, K), None)
    steps = torch.tensor([2, 0, K])
    width = max(LENGTHS) + K
    runs = []
    for k_steps in (True, False):
        _start(backend, (False,) * 3)
        rows = [backend._rows[r] for r in job.req_ids]
        tokens = torch.stack([r.last_token for r in rows])
        base = torch.tensor(LENGTHS)
        all_slots = torch.stack([torch.nn.functional.pad(r.slots, (0, width - len(r.slots)))
                                 for r in rows])
        with torch.inference_mode():
            if k_steps:
                ids = comp.decode_greedy_steps(tokens, base, steps, all_slots, 0,
                                               backend.cache, K)
            else:
                ids, _ = backend._decode_each(job, tokens, base, steps, all_slots,
                                              max(LENGTHS), 0, None, None, None)
        runs.append((ids, backend.cache.k[:, BLOCK:].clone(), backend.cache.v[:, BLOCK:]))
    (got, gk, gv), (want, wk, wv) = runs
    active = torch.arange(K)[None] < steps[:, None]
    assert torch.equal(got[active], want[active])
    assert torch.equal(gk, wk) and torch.equal(gv, wv)
    _start(backend, (False,) * 3)
    untouched = backend.cache.k[:, BLOCK:]
    written = (gk != untouched).any(-1).any(-1).any(0).nonzero()[:, 0] + BLOCK
    assert written.tolist() == list(range(BLOCK + 40, BLOCK + 42)) + \
        list(range(BLOCK + 640 + 21, BLOCK + 640 + 24))     # row 1: nothing outside block 0


class _Raising(DecodeLoopCall):

    def forward(self, *args):
        raise RuntimeError('no loop today')


class _Off(DecodeLoopCall):

    def forward(self, *args):
        return super().forward(*args) + 1


@pytest.mark.parametrize('loop,reason', [(_Raising, 'no loop today'),
                                         (_Off, 'parity gate failed')])
def test_a_failed_k_step_graph_falls_back_to_the_per_step_graphs_loudly(
        tiny_models, monkeypatch, caplog, loop, reason):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    monkeypatch.setattr(graph_builder, 'DecodeLoopCall', loop)
    with caplog.at_level(logging.ERROR, logger='oxygen_ros.backends.fast_path.model'):
        backend = _backend(model)
    fallbacks = backend.fast_path.fallbacks
    assert list(fallbacks) == ['decode_steps']
    assert reason in fallbacks['decode_steps']
    assert fallbacks['decode_steps'].endswith('decoding step by step')
    assert any('decode_steps decodes step by step' in r.getMessage() for r in caplog.records)
    before = _graph_calls(backend, Step.DECODE)
    got = _decode(backend, DecodeJob(('r0', 'r1', 'r2'), (K, 1, 2), None))
    assert _graph_calls(backend, Step.DECODE) == before + K    # the decode graphs, K times
    want = _decode(TorchBackend(model, BLOCKS, BLOCK), DecodeJob(('r0', 'r1', 'r2'),
                                                                 (K, 1, 2), None))
    assert got[0] == want[0]


def test_an_engine_decoding_k_steps_per_replay_equals_the_eager_engine(
        tiny_models, tokenizer, monkeypatch):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    monkeypatch.setattr(fast_backend, 'DEFAULT_COMPILE_BACKEND', 'aot_eager')
    cfg = EngineConfig.create(preset='tiny', cameras=CAMS, max_running_requests=4,
                              tokens_per_cycle=K, stop_on_eos=False, seed=2)

    def run(engine):
        texts = {}
        for f, budget in enumerate((7, 9, 2)):
            engine.submit_text(TextTask.SUBTASK, max_tokens=budget, req_id=f'r{f}')
            out = engine.step(make_observation(f, cfg.robot().cameras, 8))
            texts.update({t.req_id: t.token_ids for t in out.finished})
        while engine.num_running:
            texts.update({t.req_id: t.token_ids for t in engine.step(None).finished})
        return texts

    want = run(Engine(cfg, model=model, tokenizer=tokenizer))
    fast = Engine(cfg.with_settings(compile_mode=CompileMode.DEFAULT), model=model,
                  tokenizer=tokenizer)
    assert fast.fallbacks == {}
    compiled = fast.backend.fast_path
    assert compiled.shapes.tokens_per_cycle == (K,)
    got = run(fast)
    assert got == want and len(got) == 3
    replays = sum(g.num_calls for g in compiled._graphs[Step.DECODE_STEPS].values())
    assert replays > 0
