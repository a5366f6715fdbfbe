"""
Layers import one way, the engine is the only door, nothing heavy happens at import.

docs/design.md draws the layers and the engine's door (its public API).
"""

import ast
import importlib
import json
import os
from pathlib import Path
import pkgutil
import subprocess
import sys

import oxygen_ros
import pytest

ALL = sorted(m.name for m in pkgutil.walk_packages(oxygen_ros.__path__, 'oxygen_ros.'))

LAYERS = {
    'kv': set(),
    'sched': {'kv', 'config'},
    'model': {'config'},
    'transforms': {'config', 'observation', 'resources', 'policies'},
    'checkpoint': {'model', 'transforms', 'config'},
    'backends': {'model', 'kv', 'sched', 'config', 'resources'},
    'engine': {'backends', 'model', 'transforms', 'checkpoint', 'kv', 'sched', 'control',
               'config', 'observation', 'resources', 'parameters', 'policies'},
    'ros': {'engine', 'control', 'config', 'resources', 'signals', 'units', 'parameters',
            'policies'},
    'sim': {'ros', 'control', 'config', 'resources', 'signals', 'units', 'parameters'},
    'serve': {'engine', 'config', 'policies'},
    'tools': {'sim', 'ros', 'serve', 'engine', 'backends', 'checkpoint', 'model', 'transforms',
              'kv', 'sched', 'control', 'config', 'observation', 'resources', 'signals', 'units',
              'parameters', 'policies'},
    'control': {'config', 'units'},
    'config': set(),
    'parameters': set(),
    'policies': {'config'},
    'observation': set(),
    'resources': set(),
    'signals': set(),
    'units': set(),
}
"""Which other parts of oxygen_ros each part may import (any import: top level, in a function
or under TYPE_CHECKING)."""

DOOR = 'oxygen_ros.engine'
"""The engine's public API (``engine/__init__.py``): the one module a driver imports of the
engine and of what lies behind it."""
BEHIND_THE_DOOR = {'engine', 'backends', 'checkpoint', 'kv', 'model', 'observation', 'sched',
                   'transforms'}
"""The parts reached through ``oxygen_ros.engine`` only: the engine's own modules, and the
layers it is built on (the observation's types come through the door too)."""
DRIVERS = ['oxygen_ros.ros', 'oxygen_ros.serve', 'oxygen_ros.sim', 'oxygen_ros.tools']
"""Whatever drives the engine: the node, the policy server, the simulator and the tools (the
demo, the stress tests, the bags, ``oxygen_ask``, the engine and serve benchmarks,
``oxygen_run``): each of their modules imports nothing behind the door but the door itself,
unless ``MEASURES`` names it."""
MEASURES = {
    'oxygen_ros.tools.bench.engine_parts': "the engine benchmark's parts beneath its two "
                                           'engines: the backend they share, the memory '
                                           'adapter, the component probe on their frame',
    'oxygen_ros.tools.bench.probe': "the model's calls timed alone on an engine's frame",
    'oxygen_ros.tools.bench.rtc_deviation': "RTC's guided denoise on the model, K steps vs all",
    'oxygen_ros.tools.bench.serve_messages': "the client's side of the serve benchmark: its "
                                             'images resized as openpi clients resize them',
    'oxygen_ros.tools.bench.start': "a start timed: the fast path's warm-up narrowed "
                                    '(engine.loading.make_backend_for and its options)',
    'oxygen_ros.tools.bench.model': "the model's entry points timed (oxygen_bench model)",
    'oxygen_ros.tools.bench.kernels': 'the kernel builds timed (oxygen_bench kernels)',
    'oxygen_ros.tools.bench.thor_projection': "the model's bytes and a GPU's specs",
    'oxygen_ros.tools.bench.gpu_components': 'kernels, attention and graphs timed alone',
    'oxygen_ros.tools.bench.gpu_phases': "the GPU session's phases: the fast path, its "
                                         'kernels and the FP8 gate, each measured',
    'oxygen_ros.tools.bench.gpu_autotune': "the fast path's max-autotune, step by step",
    'oxygen_ros.tools.bench.gpu_session': "the GPU session's tokenizer file",
    'oxygen_ros.tools.doctor': 'the install checked: the fast-path steps it can name',
    'oxygen_ros.tools.doctor.kernel_checks': "the device's kernels checked (FP8, Triton)",
    'oxygen_ros.tools.doctor.model_files': 'the checkpoint, tokenizer and norm stats checked',
    'oxygen_ros.tools.convert': 'openpi JAX checkpoints converted (oxygen_convert): the '
                                'checkpoint layouts and the model they are written for',
    'oxygen_ros.tools.export': "the model's graphs exported to ONNX (oxygen_export)",
    'oxygen_ros.tools.fetch.tokenizer': 'the tokenizer file fetched where the transforms load '
                                        'it, and checked',
    'oxygen_ros.tools.tensorrt': 'the ONNX export and the TensorRT backend (the plugin of '
                                 '``backend: tensorrt``): a backend, built on the core '
                                 'backends and the model',
}
"""The tools that measure, check, convert or export the layers themselves (benchmarks of the
model's components and kernels, ``oxygen_doctor``, ``oxygen_convert``, ``oxygen_export``,
``oxygen_fetch``, the TensorRT plugin): each may import the layers it measures, and what it is
for. A package (``tools/convert/``, ``tools/tensorrt/``) stands for all its modules."""

EXPERIMENTAL = 'oxygen_ros.tools.tensorrt'
"""The ONNX export and the TensorRT backend, beside ``oxygen_export``: built on the core
backends, never imported by the runtime (``backend: tensorrt`` loads it as a plugin)."""
DOORS_TO_EXPERIMENTAL = ['oxygen_ros.tools.export']
"""The only module outside it that imports it, inside the function that runs the export."""
FAST_PATH = 'oxygen_ros.backends.fast_path'
"""The torch backend's fast path (static shapes, CUDA graphs, the parity gate, its kernels)."""
DOORS_TO_FAST_PATH = ['oxygen_ros.backends.attention', 'oxygen_ros.backends.factory']
"""The only runtime modules outside it that import it, each inside a function: ``make_backend``
when ``compile_mode`` asks for it, and the attention switch, which turns the paged kernel on or
off for the attention backend (``sdpa_context``)."""
BACKEND_PLUGINS = {'tensorrt': f'{EXPERIMENTAL}.tensorrt_backend:create_backend'}
"""The entry points of group ``oxygen_ros.backends`` (``setup.py``) by which the factory finds a
backend beyond torch: the runtime names none of them in an import."""


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


def test_model_imports_no_ros_and_no_other_layer():
    loaded = loaded_after_import(of('oxygen_ros.model'))
    assert 'rclpy' not in loaded
    assert not [m for m in loaded if m.startswith(('oxygen_ros.engine', 'oxygen_ros.ros',
                                                   'oxygen_ros.tools', 'oxygen_ros.sched',
                                                   'oxygen_ros.kv', 'oxygen_ros.transforms',
                                                   'oxygen_ros.checkpoint',
                                                   'oxygen_ros.backends'))]


def test_transforms_are_numpy_code_without_torch_or_ros():
    # torch is imported inside images.resize_on_device only, when the device resizes
    loaded = loaded_after_import(of('oxygen_ros.transforms'))
    assert not {'torch', 'rclpy', 'sentencepiece'} & loaded
    assert not [m for m in loaded if m.startswith(('oxygen_ros.model', 'oxygen_ros.engine',
                                                   'oxygen_ros.backends', 'oxygen_ros.ros',
                                                   'oxygen_ros.tools', 'oxygen_ros.sched',
                                                   'oxygen_ros.kv', 'oxygen_ros.checkpoint'))]


def test_engine_imports_no_ros_and_tensorrt_only_when_selected():
    loaded = loaded_after_import(of('oxygen_ros.engine'))
    assert not {'rclpy', 'tensorrt', 'pycuda'} & loaded
    assert not [m for m in loaded if m.startswith(('oxygen_ros.ros', 'oxygen_ros.tools'))]


def test_ros_layer_does_not_reach_into_tools():
    loaded = loaded_after_import(of('oxygen_ros.ros'))
    assert not [m for m in loaded if m.startswith('oxygen_ros.tools')]
    assert 'rosbags' not in loaded


def test_the_policy_server_runs_without_ros_and_its_command_line_without_torch():
    loaded = loaded_after_import([m for m in of('oxygen_ros.serve') if '__main__' not in m])
    assert 'rclpy' not in loaded
    assert not [m for m in loaded if m.startswith(('oxygen_ros.ros', 'oxygen_ros.tools',
                                                   'oxygen_ros.sim'))]
    assert not {'torch', 'rclpy'} & loaded_after_import(['oxygen_ros.serve.app'])


def test_package_and_configs_import_nothing_heavy():
    loaded = loaded_after_import(['oxygen_ros', 'oxygen_ros.config', 'oxygen_ros.resources',
                                  'oxygen_ros.units', 'oxygen_ros.parameters'])
    assert not {'torch', 'rclpy', 'numpy'} & loaded
    # the robot policies: numpy transforms, no torch, no ROS (openpi's policies/ likewise)
    assert not {'torch', 'rclpy'} & loaded_after_import(of('oxygen_ros.policies'))


def test_control_is_plain_python_reusable_on_a_robot():
    loaded = loaded_after_import(of('oxygen_ros.control'))
    assert not {'rclpy', 'mujoco', 'torch', 'trajectory_msgs'} & loaded
    assert not [m for m in loaded if m.startswith(('oxygen_ros.ros', 'oxygen_ros.sim',
                                                   'oxygen_ros.tools', 'oxygen_ros.engine',
                                                   'oxygen_ros.model', 'oxygen_ros.backends'))]


def test_sim_pieces_below_the_wrapper_import_no_ros_and_no_torch():
    pieces = ['oxygen_ros.sim.arms', 'oxygen_ros.sim.assets', 'oxygen_ros.sim.scene',
              'oxygen_ros.sim.physics', 'oxygen_ros.sim.render']
    loaded = loaded_after_import(pieces)
    assert not {'rclpy', 'torch'} & loaded
    loaded = loaded_after_import(of('oxygen_ros.sim'))  # with the rclpy wrapper
    assert 'torch' not in loaded
    assert not [m for m in loaded if m.startswith(('oxygen_ros.engine', 'oxygen_ros.model'))]


def import_graph() -> dict[str, set[str]]:
    """
    Return ``{module: oxygen_ros modules it imports}`` read from the source with ``ast``.

    Every import counts, wherever it sits (module level, inside a function, under
    ``TYPE_CHECKING``): a lazy import is still a dependency. ``from pkg import name`` points
    at ``pkg.name`` when that is a module, else at ``pkg``.
    """
    root = Path(oxygen_ros.__file__).parent
    modules = {}
    for path in root.rglob('*.py'):
        parts = path.relative_to(root.parent).with_suffix('').parts
        modules['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.split('.')[0] == 'oxygen_ros':
                for alias in node.names:
                    sub = f'{node.module}.{alias.name}'
                    targets.add(sub if sub in modules else node.module)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.split('.')[0] == 'oxygen_ros')
            assert not (isinstance(node, ast.ImportFrom) and node.level), \
                f'{name}: relative import'
        graph[name] = targets - {name}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def _part(module: str) -> str:
    return module.split('.')[1] if module.count('.') else ''


def test_no_import_cycles_among_modules():
    graph = import_graph()
    assert len(graph) == len(ALL) + 1            # every module (and the package) was read
    assert find_cycles(graph) == []


def test_find_cycles_finds_one():
    assert find_cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]
    assert find_cycles({'a': {'b'}, 'b': set()}) == []


def test_every_import_follows_the_layers():
    graph = import_graph()
    assert set(LAYERS) == {_part(m) for m in graph if m != 'oxygen_ros'}
    wrong = sorted(f'{src} -> {dst}' for src, targets in graph.items() for dst in targets
                   if src != 'oxygen_ros' and _part(dst) != _part(src)
                   and _part(dst) not in LAYERS[_part(src)])
    assert wrong == []


def test_checkpoint_conversion_imports_neither_jax_nor_tensorstore_nor_ros():
    loaded = loaded_after_import(of('oxygen_ros.checkpoint') + of('oxygen_ros.tools.convert'))
    assert not {'jax', 'tensorstore', 'orbax', 'rclpy'} & loaded


def _experimental(module: str) -> bool:
    return module == EXPERIMENTAL or module.startswith(EXPERIMENTAL + '.')


def module_level_imports(module: str) -> set[str]:
    """Return the oxygen_ros modules ``module`` imports outside any function body."""
    path = Path(oxygen_ros.__file__).parent.parent / (module.replace('.', '/') + '.py')
    if not path.is_file():
        path = path.with_suffix('') / '__init__.py'
    targets, todo = set(), list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            targets.update(f'{node.module}.{a.name}' for a in node.names)
            targets.add(node.module)
        elif isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        todo.extend(ast.iter_child_nodes(node))
    return {t for t in targets if t.split('.')[0] == 'oxygen_ros'}


def test_the_experimental_backends_are_imported_only_where_selected():
    graph = import_graph()
    importers = sorted(src for src, targets in graph.items() if not _experimental(src)
                       and any(_experimental(t) for t in targets))
    assert importers == DOORS_TO_EXPERIMENTAL
    for module in importers:                  # lazily: inside the selecting function
        assert not [t for t in module_level_imports(module) if _experimental(t)], module
    core = of('oxygen_ros.backends') + of('oxygen_ros.engine')
    assert not [m for m in loaded_after_import(core) if _experimental(m)]


def _fast_path(module: str) -> bool:
    return module == FAST_PATH or module.startswith(FAST_PATH + '.')


def test_the_fast_path_is_entered_through_two_doors_only():
    graph = import_graph()
    importers = sorted(src for src, targets in graph.items() if not _fast_path(src)
                       and not src.startswith('oxygen_ros.tools')
                       and any(_fast_path(t) for t in targets))
    assert importers == DOORS_TO_FAST_PATH
    for module in importers:                  # lazily: inside the function that selects it
        assert not [t for t in module_level_imports(module) if _fast_path(t)], module
    eager = [m for m in of('oxygen_ros.backends') + of('oxygen_ros.engine') if not _fast_path(m)]
    assert not [m for m in loaded_after_import(eager) if _fast_path(m)]


def test_backends_beyond_torch_are_plugins_named_in_the_package_metadata():
    from importlib import metadata
    from oxygen_ros.backends.config import BackendKind
    from oxygen_ros.backends.factory import BACKEND_PLUGINS as GROUP, plugin
    found = {ep.name: ep.value for ep in metadata.entry_points(group=GROUP)}
    assert found == BACKEND_PLUGINS, 'stale package metadata? reinstall: make setup'
    assert set(found) == {k.value for k in BackendKind} - {'torch'}
    from oxygen_ros.tools.tensorrt.tensorrt_backend import create_backend
    assert plugin('tensorrt') is create_backend


def test_module_level_imports_skip_function_bodies():
    assert 'oxygen_ros.backends.fast_path.backend' not in module_level_imports(
        'oxygen_ros.backends.factory')
    assert 'oxygen_ros.backends.torch_backend' in module_level_imports(
        'oxygen_ros.backends.factory')


def test_backends_import_no_ros_no_engine_and_tensorrt_only_when_selected():
    loaded = loaded_after_import(of('oxygen_ros.backends'))
    assert not {'rclpy', 'tensorrt', 'pycuda'} & loaded
    assert not [m for m in loaded if m.startswith(('oxygen_ros.engine', 'oxygen_ros.ros',
                                                   'oxygen_ros.tools'))]


def _behind_the_door(module: str) -> bool:
    return module != DOOR and _part(module) in BEHIND_THE_DOOR


def _within(module: str, names) -> bool:
    return any(module == name or module.startswith(name + '.') for name in names)


def test_the_engine_is_the_only_door():
    graph = import_graph()
    drivers = [m for m in graph if _within(m, DRIVERS)]
    assert len(drivers) > 100                     # the node, the server, the sim, the tools
    through = sorted(f'{src} -> {dst}' for src in drivers if not _within(src, MEASURES)
                     for dst in graph[src] if _behind_the_door(dst))
    assert through == []
    assert [m for m in drivers if DOOR in graph[m]]   # the door is used
    # every tool listed measures the layers: none is listed that keeps to the door
    assert sorted(name for name in MEASURES if not any(
        _behind_the_door(dst) for src in graph if _within(src, [name])
        for dst in graph[src])) == []
    assert set(MEASURES) <= set(graph)


def test_the_door_names_what_it_exports_and_costs_nothing_at_import():
    import oxygen_ros.engine as door

    assert not {'torch', 'numpy', 'rclpy'} & loaded_after_import([DOOR])
    assert not {'torch', 'rclpy'} & loaded_after_import(
        ['oxygen_ros.engine.config'])                      # a config costs no model
    for name in door.__all__:           # each from the module the table names, which defines it
        value = getattr(door, name)
        assert value is getattr(importlib.import_module(door._EXPORTS[name]), name)
        assert getattr(value, '__module__', door._EXPORTS[name]) == door._EXPORTS[name], name
    with pytest.raises(AttributeError, match="no attribute 'Scheduler'"):
        door.Scheduler  # noqa: B018 (behind the door)
