"""
A second start reuses the compiled code: the compile caches under ``$OXYGEN_ROS_CACHE``.

Each start is a fresh interpreter (as a node restart is) warming up the fast path's seed step
with Inductor. Compiled ahead of time (the default), the second start loads the step and
Dynamo traces nothing (``unique_graphs``, torch's count); compiled just in time (what a step
that cannot be compiled ahead of time gets), torch's own counters (``fxgraph_cache_hit`` /
``fxgraph_cache_miss``) say whether Inductor compiled or reused. Not timed: traces, loads,
hits and misses are what a faster start is made of.
"""

import json
import os
from pathlib import Path
import shutil
import subprocess
import sys

import pytest

START = """
import json, logging, sys, torch
from oxygen_ros.backends.fast_path.buckets import EngineLimits
from oxygen_ros.backends.fast_path.model import FastPathModel
from oxygen_ros.backends.config import CompileMode
from oxygen_ros.backends.fast_path.graph_builder import Step
from oxygen_ros.backends.fast_path.attempts import graphs_compiled
from oxygen_ros.config import get_preset
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model
logging.basicConfig(level=logging.INFO)
torch.manual_seed(0)
model = build_model(get_preset('tiny').model, dtype=torch.bfloat16)
limits = EngineLimits.for_model(model.cfg, num_slots=1024, max_batch=2, max_decode_tokens=8,
                                max_cameras=2)
comp = FastPathModel(model, CompileMode.DEFAULT, limits, backend='inductor', only=[Step.SEED],
                     precompile=sys.argv[1] == 'aot')
comp.warmup(KVCache(model.cfg.vlm, 1024, dtype=model.dtype), progress=False)
counts = comp.cache.counts()
print(json.dumps({'hits': counts.hits, 'misses': counts.misses, 'loaded': comp.cache.loaded,
                  'artifacts': str(comp.cache.artifacts), 'fallbacks': comp.fallbacks,
                  'traced': graphs_compiled(), 'aot_loaded': comp.loaded, 'gate': comp.gate}))
"""


def _start(cache: Path, how: str = 'aot') -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(('TORCHINDUCTOR_', 'TRITON_', 'OXYGEN_ROS_COMPILE_CACHE'))}
    env.update(OXYGEN_ROS_CACHE=str(cache), AMENT_PREFIX_PATH=sys.prefix)
    proc = subprocess.run([sys.executable, '-c', START, how], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result['fallbacks'] == {}, result
    assert 'fast path (default, inductor kernels) ready' in proc.stderr      # the log line
    return result


@pytest.mark.slow
def test_a_second_start_loads_the_steps_compiled_ahead_of_time(tmp_path):
    first = _start(tmp_path)
    assert first['traced'] == 1 and first['aot_loaded'] == {'seed': 0}
    assert 'float32' in first['gate']
    folders = list((tmp_path / 'torch_compile' / 'aot').iterdir())
    assert len(folders) == 1 and len(list(folders[0].glob('seed-*.bin'))) == 1
    second = _start(tmp_path)                  # nothing traced, Inductor's code loaded
    assert second['traced'] == 0 and second['aot_loaded'] == {'seed': 1}
    assert 'recorded for these weights' in second['gate']
    shutil.rmtree(tmp_path / 'torch_compile' / 'inductor')
    third = _start(tmp_path)                   # the step's file alone is enough
    assert third['traced'] == 0 and third['aot_loaded'] == {'seed': 1}


@pytest.mark.slow
def test_second_start_hits_the_compile_cache(tmp_path):
    """Compiled just in time: Inductor's caches spare the code generation, not the trace."""
    first = _start(tmp_path, 'jit')
    assert first['misses'] > 0 and first['hits'] == 0 and not first['loaded']
    artifacts = Path(first['artifacts'])
    assert artifacts.is_file() and artifacts.is_relative_to(tmp_path / 'torch_compile')
    assert (tmp_path / 'torch_compile' / 'inductor').is_dir()

    second = _start(tmp_path, 'jit')           # same cache directory: nothing compiled
    assert second['hits'] >= first['misses'] and second['misses'] == 0
    assert second['traced'] == 1               # but traced again

    shutil.rmtree(tmp_path / 'torch_compile' / 'inductor')
    third = _start(tmp_path, 'jit')            # the artifact file alone is enough
    assert third['loaded'] and third['misses'] == 0 and third['hits'] > 0


def test_the_compile_cache_can_live_outside_the_project_cache(tmp_path, monkeypatch):
    """``OXYGEN_ROS_COMPILE_CACHE``: the GPU session keeps it off the carried tokenizer folder."""
    from oxygen_ros.backends.fast_path.compile_cache import CompileCache

    monkeypatch.delenv('OXYGEN_ROS_COMPILE_CACHE')      # conftest's, for this session
    monkeypatch.setenv('OXYGEN_ROS_CACHE', str(tmp_path / 'project'))
    assert CompileCache('k').root == tmp_path / 'project' / 'torch_compile'
    monkeypatch.setenv('OXYGEN_ROS_COMPILE_CACHE', str(tmp_path / 'local'))
    cache = CompileCache('k')
    assert cache.root == tmp_path / 'local' and cache.artifacts.is_relative_to(tmp_path / 'local')
