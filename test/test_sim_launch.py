"""launch/sim.launch.py: checked by structure and against stand-ins (no launch_ros on PyPI)."""

import ast
from pathlib import Path

from launch_stand_ins import install_stand_ins, load_launch_file
import pytest

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILE = ROOT / 'launch' / 'sim.launch.py'


def load_with_stand_ins(monkeypatch):
    install_stand_ins(monkeypatch)
    return load_launch_file(LAUNCH_FILE, 'oxygen_sim_launch')


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
    assert declared == {'chunk_smoothing': 'none', 'real_time_factor': '1.0', 'robots': '1'}
    [opaque] = [e for e in entities if type(e).__name__ == 'OpaqueFunction']
    sim, node = opaque.kwargs['function']({'chunk_smoothing': 'rtc',
                                           'real_time_factor': '0.5', 'robots': '1'})
    assert (sim.kwargs['package'], sim.kwargs['executable'], sim.kwargs['name']) == \
        ('oxygen_ros', 'oxygen_sim', 'oxygen_sim')
    assert sim.kwargs['parameters'] == [{'real_time_factor': 0.5}]
    assert (node.kwargs['executable'], node.kwargs['name']) == ('oxygen_node', 'oxygen')
    params_file, overrides = node.kwargs['parameters']
    share, config, name = params_file.args[0]
    assert (share.args, config, name) == (('oxygen_ros',), 'config', 'sim.yaml')
    assert overrides['norm_stats'].args[0][1:] == ['config', 'sim_norm_stats.json']
    assert overrides['chunk_smoothing'].args == ('chunk_smoothing',)
    for file in ('sim.yaml', 'sim_norm_stats.json'):
        assert (ROOT / 'config' / file).is_file()


def test_two_arms_and_one_node_serving_both(monkeypatch):
    module = load_with_stand_ins(monkeypatch)
    [entities] = module.generate_launch_description().args
    [opaque] = [e for e in entities if type(e).__name__ == 'OpaqueFunction']
    sim, node = opaque.kwargs['function']({'chunk_smoothing': 'none',
                                           'real_time_factor': '1.0', 'robots': '2'})
    assert sim.kwargs['parameters'] == [{'real_time_factor': 1.0, 'robots': ['left', 'right']}]
    _, overrides = node.kwargs['parameters']
    assert overrides['robots'] == ['left', 'right']
    joints = ['joint1', 'joint2', 'joint3', 'joint4', 'joint5', 'joint6', 'joint7', 'gripper']
    for arm in ('left', 'right'):
        assert overrides[f'{arm}.joint_names'] == [f'{arm}_{j}' for j in joints]
        assert overrides[f'{arm}.action_joint_names'] == [f'{arm}_{j}' for j in joints]


def test_with_launch_ros():
    pytest.importorskip('launch_ros', reason='launch_ros is not on PyPI; a robot with a ROS 2 '
                                             'install runs this part')
    module = load_launch_file(LAUNCH_FILE, 'oxygen_sim_launch_real')
    assert module.generate_launch_description().entities
