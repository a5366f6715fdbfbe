"""
Several robots on the fast path: each frame through the graphs of one frame, reported.

The fast path's graphs have no robot-batch dimension yet: a plan with several robots' frames
runs them one after the other through the batch-1 graphs (``FastPathBackend.batch_frames``),
never a batched call outside them that would run eagerly. The results equal the eager
engine's (which batches the frames), and an engine that may serve several robots reports the
missing robot-batch graphs as a dropped feature.
"""

import logging

import numpy as np
from oxygen_ros.backends.config import CompileMode
from oxygen_ros.backends.fast_path import backend as fast_backend
from oxygen_ros.backends.fast_path.backend import FastPathBackend, ROBOT_BATCH
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine import Engine, EngineConfig, TextTask
from oxygen_ros.tools.common.workload import make_observation

CAMS = CAMERA_SLOTS[:2]
ROBOTS = ('left', 'right')


def serve(engine):
    """Two robots for four cycles (the right one due every other), texts to the end."""
    chunks, texts = [], {}
    for f in range(4):
        for robot in ROBOTS:
            engine.submit_text(TextTask.SUBTASK, max_tokens=3, req_id=f'{robot}{f}',
                               robot=robot)
        due = {'left': make_observation(f, CAMS, 8)}
        if f % 2:
            due['right'] = make_observation(f + 10, CAMS, 8)
        out = engine.step(due)
        chunks += [(c.robot, c.actions) for c in out.actions]
        texts.update({t.req_id: t.token_ids for t in out.finished})
    while engine.num_running or engine.num_waiting:
        texts.update({t.req_id: t.token_ids for t in engine.step({}).finished})
    return chunks, texts


def test_several_robots_on_the_fast_path_equal_eager(tiny_models, tokenizer, monkeypatch,
                                                     caplog):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    monkeypatch.setattr(fast_backend, 'DEFAULT_COMPILE_BACKEND', 'aot_eager')
    cfg = EngineConfig.create(preset='tiny', cameras=CAMS, max_running_requests=4,
                              max_robots=2, stop_on_eos=False, seed=3)
    want = serve(Engine(cfg, model=model, tokenizer=tokenizer, robots=ROBOTS))
    with caplog.at_level(logging.WARNING):
        engine = Engine(cfg.with_settings(compile_mode=CompileMode.DEFAULT), model=model,
                        tokenizer=tokenizer, robots=ROBOTS)
        got = serve(engine)
    assert isinstance(engine.backend, FastPathBackend) and engine.fallbacks == {}
    assert not [r for r in caplog.records if 'outside the compiled ones' in r.getMessage()]
    assert [r for r, _ in got[0]] == [r for r, _ in want[0]] == \
        ['left', 'left', 'right', 'left', 'left', 'right']
    for (_, a), (_, b) in zip(want[0], got[0]):
        np.testing.assert_allclose(b, a, atol=1e-5, rtol=0)
    assert got[1] == want[1] and len(got[1]) == 8
    assert engine.dropped_features[ROBOT_BATCH] == (
        'no robot-batch graphs: the frames of up to 2 robots run one after the other')


def test_one_robot_reports_no_robot_batch(tiny_models, tokenizer, monkeypatch):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    monkeypatch.setattr(fast_backend, 'DEFAULT_COMPILE_BACKEND', 'aot_eager')
    cfg = EngineConfig.create(preset='tiny', cameras=CAMS, max_running_requests=2,
                              compile_mode=CompileMode.DEFAULT)
    assert ROBOT_BATCH not in Engine(cfg, model=model, tokenizer=tokenizer).dropped_features
