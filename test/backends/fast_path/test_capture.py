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

from oxygen_ros.backends.config import CompileMode
from oxygen_ros.backends.fast_path import warmup as fast_warmup
from oxygen_ros.backends.fast_path.buckets import EngineLimits
from oxygen_ros.backends.fast_path.graph_builder import Step
from oxygen_ros.backends.fast_path.model import FastPathModel
from oxygen_ros.backends.fast_path.static_graph import GraphCapture, StaticCall
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.model.kv_cache import KVCache
import pytest
import torch
from torch.utils._python_dispatch import _disable_current_modes, TorchDispatchMode

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
                                    max_decode_tokens=8, max_cameras=2)
    comp = FastPathModel(model, CompileMode.DEFAULT, limits, backend='aot_eager',
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
                                    max_decode_tokens=8, max_cameras=2)
    comp = FastPathModel(model, CompileMode.DEFAULT, limits, backend='inductor',
                         only=[Step.SEED])
    with caplog.at_level(logging.ERROR, logger='oxygen_ros.backends.fast_path.model'):
        comp.warmup(KVCache(model.cfg.vlm, SLOTS), progress=False)
    assert comp.fallbacks == {} and comp.compile_seconds > 0
    assert Step.SEED in comp._graphs
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ['cannot write the compile cache (the next start compiles afresh): '
                      'RuntimeError: artifact serialization failed'], errors


class _Ops(TorchDispatchMode):
    """Record the ATen ops run while it is active (not those of :func:`_unrecorded` calls)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _unrecorded(fn):
    """Return ``fn`` run outside any dispatch mode (a graph's function: Dynamo needs that)."""
    def run(*args):
        with _disable_current_modes():
            return fn(*args)
    return run


def test_inputs_are_padded_in_place_and_margins_filled_only_when_needed():
    seen = []
    call = StaticCall(lambda ids, mask: seen.append((ids.clone(), mask.clone())), (),
                      (torch.zeros(4, 6, dtype=torch.int64), torch.zeros(4, dtype=torch.bool)))
    for rows, cols in ((2, 3), (2, 4), (2, 6), (3, 2), (4, 6), (1, 1)):
        ids, valid = torch.arange(rows * cols).view(rows, cols) + 1, torch.ones(rows) > 0
        with _Ops() as mode:
            call(ids, valid, pad=(-1, False))
        want = torch.nn.functional.pad(ids, (0, 6 - cols, 0, 4 - rows), value=-1)
        assert torch.equal(seen[-1][0], want), (rows, cols)
        assert torch.equal(seen[-1][1], torch.arange(4) < rows)
        # fills of the ids' margin (2 dims) and the mask's: (2, 4), (2, 6): grown in every
        # dim since the last fill, the margins hold their values still; (3, 2): the ids shrunk
        # in a dim, the mask grew; (4, 6): whole buffers; (1, 1): after whole buffers
        fills = mode.ops.count('fill_')
        assert fills == {(2, 3): 3, (2, 4): 0, (2, 6): 0, (3, 2): 2, (4, 6): 0,
                         (1, 1): 3}[rows, cols], (rows, cols, mode.ops)
        assert set(mode.ops) <= {'copy_', 'slice', 'fill_', 'clone'}, mode.ops
    with pytest.raises(ValueError, match=r'static input \(4, 6\) got \(5, 6\)'):
        call(torch.zeros(5, 6, dtype=torch.int64), torch.ones(4, dtype=torch.bool),
             pad=(0, False))
    with pytest.raises(ValueError, match=r'static input \(4,\) got \(2,\)'):
        call(torch.zeros(4, 6, dtype=torch.int64), torch.ones(2, dtype=torch.bool))


def test_a_decode_step_pads_nothing_outside_its_graph(tiny_models):
    """Around the graph: the inputs copied into its buffers, the token ids copied out."""
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERA_SLOTS[:2])
    limits = EngineLimits.for_model(model.cfg, num_slots=SLOTS, max_batch=4,
                                    max_decode_tokens=8, max_cameras=2)
    comp = FastPathModel(model, CompileMode.DEFAULT, limits, backend='aot_eager',
                         only=[Step.DECODE])
    pool = KVCache(model.cfg.vlm, SLOTS)
    comp.warmup(pool, progress=False)
    mode = _Ops()
    for graph in comp._graphs[Step.DECODE].values():
        graph.fn = _unrecorded(graph.fn)
    tokens, positions = torch.tensor([5, 7, 9]), torch.tensor([100, 90, 80])
    with torch.inference_mode():
        for step in range(3):                        # a decode job: the context grows
            c, pos, write = 100 + step, positions + step, 500 + torch.arange(3)
            ctx = torch.arange(16, 16 + c).expand(3, c)
            mask = torch.arange(c) < pos[:, None]
            want = model.decode_step(tokens, pos, pool, write, ctx, mask).argmax(-1)
            with mode:
                mode.ops.clear()
                got = comp.decode_greedy(tokens, pos, pool, write, ctx, mask)
            assert torch.equal(got, want)
            copies, other = mode.ops.count('copy_'), set(mode.ops) - {'copy_', 'slice'}
            assert copies == 5 and other == ({'fill_', 'clone'} if step == 0 else {'clone'}), \
                mode.ops
