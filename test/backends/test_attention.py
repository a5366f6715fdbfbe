"""The attention-kernel switch: from the config or the environment, applied to every cycle."""

from dataclasses import replace

import numpy as np
from oxygen_ros.backends.config import ATTENTION_ENV, AttentionBackend
from oxygen_ros.config import CAMERA_SLOTS
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.model.prompt import TextTask
from oxygen_ros.tools.common.workload import make_observation
import pytest


def test_the_config_wins_then_the_environment_then_auto(monkeypatch):
    monkeypatch.delenv(ATTENTION_ENV, raising=False)
    assert AttentionBackend.resolve(None) is AttentionBackend.AUTO
    monkeypatch.setenv(ATTENTION_ENV, ' Math ')
    assert AttentionBackend.resolve(None) is AttentionBackend.MATH
    assert AttentionBackend.resolve('flash') is AttentionBackend.FLASH
    assert EngineConfig(preset='tiny').backend_config().attention is AttentionBackend.MATH
    monkeypatch.setenv(ATTENTION_ENV, 'fast')
    with pytest.raises(ValueError, match="OXYGEN_ROS_ATTENTION='fast'.*auto, math, efficient"):
        EngineConfig(preset='tiny')
    cfg = EngineConfig(preset='tiny', attention_backend=AttentionBackend.CUDNN)
    assert cfg.backend_config().attention is AttentionBackend.CUDNN


def _run(cfg, model, tokenizer):
    engine = Engine(cfg, model=model, tokenizer=tokenizer)
    engine.submit_text(TextTask.SUBTASK, max_tokens=3, req_id='r')
    out = engine.step(make_observation(0, cfg.model_config().cameras, 8))
    return out.action.actions


def test_every_cycle_runs_with_the_chosen_kernel(tiny_models, tokenizer, monkeypatch):
    """CPU has the math and flash kernels only: 'efficient' fails the cycle, math equals auto."""
    monkeypatch.delenv(ATTENTION_ENV, raising=False)
    cfg = EngineConfig(preset='tiny', cameras=CAMERA_SLOTS[:2], seed=1)
    model = tiny_models(cfg.model_config().prefix_attention, CAMERA_SLOTS[:2])
    auto = _run(cfg, model, tokenizer)
    math = _run(replace(cfg, attention_backend=AttentionBackend.MATH), model, tokenizer)
    np.testing.assert_allclose(math, auto, atol=1e-4, rtol=0)
    matmul = _run(replace(cfg, attention_backend=AttentionBackend.MATMUL), model, tokenizer)
    np.testing.assert_allclose(matmul, auto, atol=1e-4, rtol=0)
    with pytest.raises(RuntimeError, match='No viable backend'):
        _run(replace(cfg, attention_backend=AttentionBackend.EFFICIENT), model, tokenizer)
