"""The backend factory: the torch backend is its own, any other is a plugin by entry point."""

from oxygen_ros.backends.config import BackendKind
from oxygen_ros.backends.errors import BackendUnavailableError
from oxygen_ros.backends.factory import BACKEND_PLUGINS, make_backend, plugin
from oxygen_ros.engine.config import EngineConfig
import pytest


def test_a_backend_without_an_entry_point_is_refused_with_what_to_do():
    with pytest.raises(BackendUnavailableError) as info:
        plugin('nosuch')
    assert str(info.value) == (
        f"backend 'nosuch' is not installed: no entry point 'nosuch' in group "
        f"'{BACKEND_PLUGINS}' (the oxygen_ros package registers it in setup.py; reinstall "
        f"it: 'make setup' or 'colcon build'), or use backend 'torch'")


def test_a_plugin_gets_no_memory_adapter():
    config = EngineConfig.create(preset='tiny', backend=BackendKind.TENSORRT)
    with pytest.raises(ValueError, match="backend 'tensorrt' has no LoRA in its graphs"):
        make_backend(config.backend, None, 8, scheduler=config.scheduler, max_decode_tokens=8,
                     max_cameras=2, adapter=object())
