"""launch/sim.launch.py: checked by structure and against stand-ins (no launch_ros on PyPI)."""

import ast
import importlib.util
from pathlib import Path
import sys
import types

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILE = ROOT / 'launch' / 'sim.launch.py'


class Recorded:
    """Stand-in of a launch class: keeps its arguments."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class FakeLaunchConfiguration(Recorded):

    def perform(self, context):
        return context[self.args[0]]


def load_with_stand_ins(monkeypatch):
    names = {
        'launch': ['LaunchContext', 'LaunchDescription'],
        'launch.actions': ['DeclareLaunchArgument', 'OpaqueFunction'],
        'launch.substitutions': ['LaunchConfiguration', 'PathJoinSubstitution'],
        'launch_ros.actions': ['Node'],
        'launch_ros.substitutions': ['FindPackageShare'],
    }
    for module_name, classes in names.items():
        module = types.ModuleType(module_name)
        for cls in classes:
            setattr(module, cls, type(cls, (Recorded,), {}))
        monkeypatch.setitem(sys.modules, module_name, module)
    sys.modules['launch.substitutions'].LaunchConfiguration = FakeLaunchConfiguration
    monkeypatch.setitem(sys.modules, 'launch_ros', types.ModuleType('launch_ros'))
    spec = importlib.util.spec_from_file_location('oxygen_sim_launch', LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_structure():
    tree = ast.parse(LAUNCH_FILE.read_text())
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {'generate_launch_description', '_actions'} <= functions
    assert 'eval(' not in LAUNCH_FILE.read_text()


def test_sim_and_node_with_the_sim_params(monkeypatch):
    module = load_with_stand_ins(monkeypatch)
    [entities] = module.generate_launch_description().args
    declared = {e.args[0]: e.kwargs['default_value'] for e in entities
                if type(e).__name__ == 'DeclareLaunchArgument'}
    assert declared == {'chunk_smoothing': 'none', 'real_time_factor': '1.0'}
    [opaque] = [e for e in entities if type(e).__name__ == 'OpaqueFunction']
    sim, node = opaque.kwargs['function']({'chunk_smoothing': 'rtc',
                                           'real_time_factor': '0.5'})
    assert (sim.kwargs['package'], sim.kwargs['executable'], sim.kwargs['name']) == \
        ('oxygen_ros', 'oxygen-sim', 'oxygen_sim')
    assert sim.kwargs['parameters'] == [{'real_time_factor': 0.5}]
    assert (node.kwargs['executable'], node.kwargs['name']) == ('oxygen_node', 'oxygen')
    params_file, overrides = node.kwargs['parameters']
    share, config, name = params_file.args[0]
    assert (share.args, config, name) == (('oxygen_ros',), 'config', 'sim.yaml')
    assert overrides['norm_stats'].args[0][1:] == ['config', 'sim_norm_stats.json']
    assert overrides['chunk_smoothing'].args == ('chunk_smoothing',)
    for file in ('sim.yaml', 'sim_norm_stats.json'):
        assert (ROOT / 'config' / file).is_file()


def test_with_launch_ros():
    pytest.importorskip('launch_ros', reason='launch_ros is not on PyPI; a robot with a ROS 2 '
                                             'install runs this part')
    spec = importlib.util.spec_from_file_location('oxygen_sim_launch_real', LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.generate_launch_description().entities
