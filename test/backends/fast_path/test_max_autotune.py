"""``$OXYGEN_ROS_MAX_AUTOTUNE``: the steps Inductor compiles with ``max_autotune``."""

from oxygen_ros.backends.config import MAX_AUTOTUNE_ENV, max_autotune_steps, Step
from oxygen_ros.backends.fast_path.graph_builder import GraphBuilder
from oxygen_ros.config import get_preset
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.model.kv_cache import KVCache
from oxygen_ros.model.pi05 import build_model
import pytest


def test_the_environment_names_steps_or_all(monkeypatch):
    monkeypatch.delenv(MAX_AUTOTUNE_ENV, raising=False)
    assert max_autotune_steps() == frozenset()
    monkeypatch.setenv(MAX_AUTOTUNE_ENV, ' Vision, prefill ')
    assert max_autotune_steps() == {Step.VISION, Step.PREFILL}
    assert max_autotune_steps('all') == frozenset(Step)
    assert max_autotune_steps('') == frozenset()
    monkeypatch.setenv(MAX_AUTOTUNE_ENV, 'vision,prefil')
    with pytest.raises(ValueError, match="OXYGEN_ROS_MAX_AUTOTUNE='vision,prefil'.*vision, "
                                         'prefill, text_prefill'):
        EngineConfig(preset='tiny')                     # a bad environment fails configure


@pytest.mark.parametrize('compiler', ['inductor', 'aot_eager'])
def test_the_named_steps_compile_with_max_autotune_under_inductor_only(monkeypatch, compiler):
    """Other compilers get no Inductor options (aot_eager would warn that it ignores them)."""
    monkeypatch.setenv(MAX_AUTOTUNE_ENV, 'vision')
    model = build_model(get_preset('tiny').model)
    builder = GraphBuilder(model, model.vlm.layers, KVCache(model.cfg.vlm, 64),
                           compiler=compiler)
    tuned = {'max_autotune': True} if compiler == 'inductor' else None
    assert builder.compile_options(Step.VISION) == tuned
    assert builder.compile_options(Step.PREFILL) is None
