"""
Stand-ins of the ``launch`` / ``launch_ros`` classes for the launch-file tests.

Neither package is on PyPI (``docs/running.md#ros-2-from-pypi-the-venv``): the tests execute the
launch files against classes that only record what they are given, so
``generate_launch_description`` runs here.
"""

import importlib.util
from pathlib import Path
import sys
import types

_CLASSES = {
    'launch': ['LaunchContext', 'LaunchDescription'],
    'launch.actions': ['DeclareLaunchArgument', 'ExecuteProcess', 'OpaqueFunction'],
    'launch.substitutions': ['LaunchConfiguration', 'PathJoinSubstitution'],
    'launch_ros.actions': ['Node'],
    'launch_ros.substitutions': ['FindPackagePrefix', 'FindPackageShare'],
}


class Recorded:
    """Stand-in of a launch class: keeps its arguments."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class FakeLaunchConfiguration(Recorded):
    """``LaunchConfiguration``: performs to the context's value."""

    def perform(self, context):
        return context[self.args[0]]


def install_stand_ins(monkeypatch) -> None:
    """Put the stand-in modules in ``sys.modules`` for the test (monkeypatch undoes it)."""
    for module_name, classes in _CLASSES.items():
        module = types.ModuleType(module_name)
        for cls in classes:
            setattr(module, cls, type(cls, (Recorded,), {}))
        monkeypatch.setitem(sys.modules, module_name, module)
    sys.modules['launch.substitutions'].LaunchConfiguration = FakeLaunchConfiguration
    monkeypatch.setitem(sys.modules, 'launch_ros', types.ModuleType('launch_ros'))


def load_launch_file(path: Path, name: str) -> types.ModuleType:
    """Execute a launch file as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
