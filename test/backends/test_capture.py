"""
The fast path's capture logic on the CPU: one capture for all graphs, recompiles refused.

``CpuCapture`` is ``GraphCapture`` with its four CUDA calls (side stream, graph, capture
context) replaced by CPU stand-ins: its "graph" runs the captured function again on replay
and writes into the captured outputs, as a CUDA graph's replay does. Everything else (the
warm-up calls, the capture under ``no_recompile``, one object for every graph of a model,
the outputs read from the capture) is the CUDA code path. CUDA itself: ``test/gpu``.
"""

import contextlib
import logging
import os

from oxygen_ros.backends import warmup as fast_warmup
from oxygen_ros.backends.buckets import EngineLimits
from oxygen_ros.backends.compiled import CompiledModel
from oxygen_ros.backends.config import CompileMode
from oxygen_ros.backends.graph_builder import Step
from oxygen_ros.backends.static_graph import GraphCapture, StaticCall
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.model.kv_cache import KVCache
import pytest
import torch

SLOTS = 2048


class _Replay:
    """A CPU stand-in of ``torch.cuda.CUDAGraph``: replay re-runs fn into the outputs."""

    def __init__(self) -> None:
        self.fn = self.args = self.outputs = None

    def replay(self) -> None:
        new = self.fn(*self.args)
        pairs = zip(self.outputs, new) if isinstance(new, tuple) else [(self.outputs, new)]
        for old, now in pairs:
            old.copy_(now)


class CpuCapture(GraphCapture):
    """``GraphCapture`` with CPU stand-ins for the CUDA stream and graph."""

    instances: list['CpuCapture'] = []

    def __init__(self, pool=None, *, warmup: int = 2) -> None:
        self.streams = 0
        super().__init__(pool=object(), warmup=warmup)
        CpuCapture.instances.append(self)

    def _new_stream(self):
        self.streams += 1
        return None

    def _on_side_stream(self):
        return contextlib.nullcontext()

    def _join_side_stream(self) -> None:
        pass

    def _graph(self):
        return _Replay()

    def _capturing(self, graph):
        return contextlib.nullcontext()

    def capture(self, fn, args):
        graph, outputs = super().capture(fn, args)
        graph.fn, graph.args, graph.outputs = fn, args, outputs
        return graph, outputs


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    CpuCapture.instances.clear()
    yield
    torch._dynamo.reset()


def _counting(graphs):
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    return backend


SCALE = {'value': 2.0}


def _scaled(pool, x):
    return x * SCALE['value'] + pool.sum()


def test_a_recompile_during_capture_is_refused():
    """A guard failing between warm-up and capture raises instead of compiling in the graph."""
    graphs = []
    fn = torch.compile(_scaled, backend=_counting(graphs), fullgraph=True)
    pool = torch.ones(4)

    class Drifting(CpuCapture):

        def _capturing(self, graph):            # something the guards read changes
            SCALE['value'] = 3.0
            return contextlib.nullcontext()
    try:
        with pytest.raises(RuntimeError, match='Detected recompile') as err:
            StaticCall(fn, (pool,), (torch.ones(3),), capture=Drifting())
        assert "['value'] == 2.0" in str(err.value)             # names the guard that failed
        assert len(graphs) == 1                              # compiled once, in the warm-up
    finally:
        SCALE['value'] = 2.0
    call = StaticCall(fn, (pool,), (torch.ones(3),), capture=CpuCapture())
    assert call.captured and len(graphs) == 1                # guards held: no compile
    torch.testing.assert_close(call(torch.full((3,), 5.0)), torch.full((3,), 14.0))


def test_every_graph_is_captured_through_one_capture(tiny_models, monkeypatch):
    """One warm-up side stream and one pool for all graphs; replays equal eager."""
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERA_SLOTS[:2])
    monkeypatch.setattr(fast_warmup, 'GraphCapture', CpuCapture)
    limits = EngineLimits.for_model(model.cfg, num_slots=SLOTS, max_batch=4,
                                    max_decode_tokens=model.cfg.decode_budget)
    comp = CompiledModel(model, CompileMode.DEFAULT, limits, backend='aot_eager',
                         only=[Step.VISION, Step.DENOISE, Step.SEED])
    comp.cuda_graphs = True                      # what a CUDA device sets
    pool = KVCache(model.cfg.vlm, SLOTS)
    comp.warmup(pool, progress=False)
    assert comp.fallbacks == {}
    graphs = [g for gs in comp._graphs.values() for g in gs.values()]
    assert len(CpuCapture.instances) == 1 and CpuCapture.instances[0].streams == 1
    assert CpuCapture.instances[0].num_captured == len(graphs) and all(
        g.captured for g in graphs)
    size = model.cfg.vision.image_size
    images = torch.rand(1, 2, 3, size, size) * 2 - 1
    with torch.inference_mode():
        torch.testing.assert_close(comp.encode_images(images), model.encode_images(images),
                                   atol=1e-5, rtol=0)
        hidden = torch.randn(3, model.cfg.vlm.width)
        torch.testing.assert_close(comp.lm_logits(hidden), model.lm_logits(hidden),
                                   atol=1e-5, rtol=0)


def test_compile_cache_errors_are_logged_not_raised(tiny_models, monkeypatch, tmp_path,
                                                    caplog):
    """``save_cache_artifacts`` raising anything (not only OSError) costs no fast path."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv('OXYGEN_ROS_CACHE', str(tmp_path))
    for name, value in (('TORCHINDUCTOR_CACHE_DIR', default_cache_dir()),
                        ('TRITON_CACHE_DIR', str(tmp_path / 'triton'))):
        monkeypatch.setenv(name, os.environ.get(name, value))   # restored after the test

    def broken():
        raise RuntimeError('artifact serialization failed')
    monkeypatch.setattr(torch.compiler, 'save_cache_artifacts', broken)
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERA_SLOTS[:2])
    limits = EngineLimits.for_model(model.cfg, num_slots=SLOTS, max_batch=2,
                                    max_decode_tokens=model.cfg.decode_budget)
    comp = CompiledModel(model, CompileMode.DEFAULT, limits, backend='inductor',
                         only=[Step.SEED])
    with caplog.at_level(logging.ERROR, logger='oxygen_ros.backends.compiled'):
        comp.warmup(KVCache(model.cfg.vlm, SLOTS), progress=False)
    assert comp.fallbacks == {} and comp.compile_seconds > 0
    assert Step.SEED in comp._graphs
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ['cannot write the compile cache (the next start compiles afresh): '
                      'RuntimeError: artifact serialization failed'], errors
