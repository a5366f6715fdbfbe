"""
Several robots on the fast path: their frames batched through the robot-batch graphs.

A plan with several robots' frames runs their vision, prefills and denoise as one call each
(``frame_batch.py``), and on the fast path each call replays the graph of its robot batch
(``buckets.robot_buckets``: 1, 2, 4, ...), never an eager call outside the graphs. The
results equal the eager engine's; the robot-batch graphs are gated like every other.
"""

import logging

import numpy as np
from oxygen_ros.backends.config import CompileMode, Step
from oxygen_ros.backends.fast_path import backend as fast_backend
from oxygen_ros.backends.fast_path.backend import FastPathBackend
from oxygen_ros.backends.fast_path.buckets import robot_buckets
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine import Engine, EngineConfig, TextTask
from oxygen_ros.tools.common.workload import make_observation
import pytest

CAMS = CAMERA_SLOTS[:2]
ROBOTS = ('left', 'right', 'third')


pytestmark = pytest.mark.usefixtures('fresh_dynamo')


def test_robot_buckets():
    assert robot_buckets(1) == (1,) and robot_buckets(2) == (1, 2)
    assert robot_buckets(3) == (1, 2, 3) and robot_buckets(4) == (1, 2, 4)
    assert robot_buckets(6) == (1, 2, 4, 6)
    with pytest.raises(ValueError, match='max_robots must be >= 1, got 0'):
        robot_buckets(0)


def serve(engine):
    """Three robots for four cycles (left every cycle, right every other, third in the last)."""
    chunks, texts = [], {}
    for f in range(4):
        for robot in ROBOTS[:2]:
            engine.submit_text(TextTask.SUBTASK, max_tokens=3, req_id=f'{robot}{f}',
                               robot=robot)
        due = {'left': make_observation(f, CAMS, 8)}
        if f % 2:    # prompts of unequal lengths: padded in the batch
            due['right'] = make_observation(f + 10, CAMS, 8, instruction='stack the blocks '
                                            'on the left side of the table, then wave')
        if f == 3:
            due['third'] = make_observation(f + 20, CAMS, 8, instruction='wave')
        out = engine.step(due)
        chunks += [(c.robot, c.actions) for c in out.actions]
        texts.update({t.req_id: t.token_ids for t in out.finished})
    while engine.num_running or engine.num_waiting:
        texts.update({t.req_id: t.token_ids for t in engine.step({}).finished})
    return chunks, texts


@pytest.mark.parametrize('mode', list(PrefixAttention), ids=lambda m: m.value)
def test_several_robots_batched_on_the_fast_path_equal_eager(tiny_models, tokenizer,
                                                             monkeypatch, caplog, mode):
    model = tiny_models(mode, CAMS)
    monkeypatch.setattr(fast_backend, 'DEFAULT_COMPILE_BACKEND', 'aot_eager')
    cfg = EngineConfig.create(preset='tiny', cameras=CAMS, max_running_requests=4,
                              max_robots=3, stop_on_eos=False, seed=3, prefix_attention=mode)
    want = serve(Engine(cfg, model=model, tokenizer=tokenizer, robots=ROBOTS))
    with caplog.at_level(logging.WARNING):
        engine = Engine(cfg.with_settings(compile_mode=CompileMode.DEFAULT), model=model,
                        tokenizer=tokenizer, robots=ROBOTS)
        fast = engine.backend.fast_path
        calls = {s: {k: g.num_calls for k, g in gs.items()} for s, gs in fast._graphs.items()}
        got = serve(engine)
    assert isinstance(engine.backend, FastPathBackend) and engine.fallbacks == {}
    assert engine.dropped_features == {}
    assert not [r for r in caplog.records if 'outside the compiled ones' in r.getMessage()]
    assert [r for r, _ in got[0]] == [r for r, _ in want[0]] == \
        ['left', 'left', 'right', 'left', 'left', 'right', 'third']
    for (_, a), (_, b) in zip(want[0], got[0]):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
    assert got[1] == want[1] and len(got[1]) == 8
    used = {s: {k: g.num_calls - calls[s][k] for k, g in gs.items() if g.num_calls > calls[s][k]}
            for s, gs in fast._graphs.items()}
    # cycles of 1, 2, 1 and 3 frames: the graphs of robot batches 1, 2 and 3 replayed
    assert sorted({k[0] for k in used[Step.DENOISE]}) == [1, 2, 3]
    prefill = Step.TEXT_PREFILL if mode is PrefixAttention.CAUSAL_TEXT else Step.PREFILL
    assert sorted({k[0] for k in used[prefill]}) == [1, 2, 3]
    assert sorted(used[Step.VISION]) == [(2,), (4,), (6,)]       # frames x 2 cameras


def test_one_robot_compiles_no_robot_batch(tiny_models, tokenizer, monkeypatch):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    monkeypatch.setattr(fast_backend, 'DEFAULT_COMPILE_BACKEND', 'aot_eager')
    cfg = EngineConfig.create(preset='tiny', cameras=CAMS, max_running_requests=2,
                              compile_mode=CompileMode.DEFAULT)
    fast = Engine(cfg, model=model, tokenizer=tokenizer).backend.fast_path
    assert fast.shapes.robots == (1,) and fast.shapes.images == (1, 2)
    assert {k[0] for k in fast._graphs[Step.DENOISE]} == {1}
