"""Layers import in one direction only, and nothing heavy happens at import (architecture §1)."""

import json
import os
import pkgutil
import subprocess
import sys

import oxygen_ros
import pytest

ALL = sorted(m.name for m in pkgutil.walk_packages(oxygen_ros.__path__, 'oxygen_ros.'))


def loaded_after_import(modules: list[str]) -> set[str]:
    """Return the top-level modules (and oxygen_ros submodules) loaded by importing these."""
    code = (f'import importlib, json, sys\n'
            f'for m in {modules!r}: importlib.import_module(m)\n'
            f'print(json.dumps(sorted(sys.modules)))')
    env = dict(os.environ, AMENT_PREFIX_PATH=sys.prefix)
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env,
                          check=True)
    return set(json.loads(proc.stdout.splitlines()[-1]))


def of(prefix: str) -> list[str]:
    return [m for m in ALL if m == prefix or m.startswith(prefix + '.')]


@pytest.mark.parametrize('layer', ['oxygen_ros.kv', 'oxygen_ros.sched'])
def test_pure_layers_use_the_standard_library_only(layer):
    loaded = loaded_after_import(of(layer))
    assert not {'torch', 'numpy', 'rclpy'} & loaded
    assert not [m for m in loaded if m.startswith(('oxygen_ros.model', 'oxygen_ros.engine',
                                                   'oxygen_ros.ros', 'oxygen_ros.tools'))]


def test_control_layer_is_numpy_only():
    loaded = loaded_after_import(of('oxygen_ros.control'))
    assert not {'torch', 'rclpy'} & loaded
    assert not [m for m in loaded if m.startswith(('oxygen_ros.model', 'oxygen_ros.engine',
                                                   'oxygen_ros.ros', 'oxygen_ros.tools',
                                                   'oxygen_ros.sched', 'oxygen_ros.kv'))]


def test_model_imports_no_ros_and_no_other_layer():
    loaded = loaded_after_import(of('oxygen_ros.model'))
    assert 'rclpy' not in loaded
    assert not [m for m in loaded if m.startswith(('oxygen_ros.engine', 'oxygen_ros.ros',
                                                   'oxygen_ros.tools', 'oxygen_ros.sched',
                                                   'oxygen_ros.kv'))]


def test_engine_imports_no_ros_and_tensorrt_only_when_selected():
    loaded = loaded_after_import(of('oxygen_ros.engine'))
    assert not {'rclpy', 'tensorrt', 'pycuda'} & loaded
    assert not [m for m in loaded if m.startswith(('oxygen_ros.ros', 'oxygen_ros.tools'))]


def test_ros_layer_does_not_reach_into_tools():
    loaded = loaded_after_import(of('oxygen_ros.ros'))
    assert not [m for m in loaded if m.startswith('oxygen_ros.tools')]
    assert 'rosbags' not in loaded


def test_package_and_configs_import_nothing_heavy():
    loaded = loaded_after_import(['oxygen_ros', 'oxygen_ros.config', 'oxygen_ros.resources'])
    assert not {'torch', 'rclpy', 'numpy'} & loaded


def test_control_is_plain_python_reusable_on_a_robot():
    loaded = loaded_after_import(of('oxygen_ros.control'))
    assert not {'rclpy', 'mujoco', 'torch', 'trajectory_msgs'} & loaded
    assert not [m for m in loaded if m.startswith(('oxygen_ros.ros', 'oxygen_ros.sim',
                                                   'oxygen_ros.tools', 'oxygen_ros.engine'))]


def test_sim_pieces_below_the_wrapper_import_no_ros_and_no_torch():
    pieces = ['oxygen_ros.sim.assets', 'oxygen_ros.sim.scene', 'oxygen_ros.sim.physics',
              'oxygen_ros.sim.render']
    loaded = loaded_after_import(pieces)
    assert not {'rclpy', 'torch'} & loaded
    loaded = loaded_after_import(of('oxygen_ros.sim'))  # with the rclpy wrapper
    assert 'torch' not in loaded
    assert not [m for m in loaded if m.startswith(('oxygen_ros.engine', 'oxygen_ros.model'))]
