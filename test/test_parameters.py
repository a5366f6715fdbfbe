"""
Every parameter is declared once, in oxygen_parameters.yaml, and every config default is its.

The typed configs are introspected: each field with a default is an entry of the declaration
placed in that config, and holds that entry's default; each entry placed in a config is a
field of it; the scheduler's and the backend's configs have no default at all.
"""

from dataclasses import fields, MISSING
import enum
import math

from oxygen_ros.backends.config import AttentionBackend, BackendConfig, TRT_PRECISIONS
from oxygen_ros.config import get_preset, preset_names
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.parameters import (
    coerce, DeclarationError, declared_config, field_types, in_config, load, OnChange,
    ParamType, section)
from oxygen_ros.policies import get_robot, preset_robot, ROBOTS
from oxygen_ros.ros.node_config import build_configs, NodeConfig
from oxygen_ros.ros.param_spec import CHECKS
from oxygen_ros.sched.scheduler import SchedulerConfig
from oxygen_ros.sim.params import SimConfig
import pytest

CONFIGS = {'node': NodeConfig, 'engine': EngineConfig, 'scheduler': SchedulerConfig,
           'backend': BackendConfig, 'sim': SimConfig}
"""The typed configs, by the ``config`` name the declaration gives them."""


def default_of(field):
    """Return a dataclass field's default (a factory's product), or MISSING."""
    if field.default is not MISSING:
        return field.default
    return field.default_factory() if field.default_factory is not MISSING else MISSING


def test_each_name_is_declared_once():
    names = [spec.name for spec in load() if spec.section != 'oxygen_sim']
    assert len(names) == len(set(names)) and len(names) > 60
    sim = [spec.name for spec in section('oxygen_sim')]
    assert len(sim) == len(set(sim))
    with pytest.raises(DeclarationError, match=r"'seed' declared twice \(line 3\)"):
        load('oxygen:\n  seed: {type: int, default_value: 0, description: a, read_only: true}\n'
             '  seed: {type: int, default_value: 1, description: b, read_only: true}\n')
    with pytest.raises(DeclarationError, match=r"\['seed'\] declared in both oxygen and engine"):
        load('oxygen:\n  seed: {type: int, default_value: 0, description: a, read_only: true}\n'
             'engine:\n  seed: {type: int, default_value: 1, description: b}\n')
    with pytest.raises(DeclarationError, match=r'two entries set engine\.seed'):
        load('engine:\n  seed: {type: int, default_value: 0, description: a, config: engine}\n'
             '  rng: {type: int, default_value: 1, description: b, config: engine, '
             'field: seed}\n')


@pytest.mark.parametrize('name', sorted(CONFIGS))
def test_every_config_default_comes_from_the_declaration(name):
    """A field's default, or for a sub-config the value ``EngineConfig()`` gives it."""
    cls, declared = CONFIGS[name], in_config(name)
    types = field_types(cls)
    own = {f.name: f for f in fields(cls)}
    assert set(declared) <= set(own), f'declared for {name} but no field of {cls.__name__}'
    built = getattr(EngineConfig(), name) if name in ('scheduler', 'backend') else None
    for field_name, field in own.items():
        default = default_of(field) if built is None else getattr(built, field_name)
        if field_name in declared:
            want = coerce(types[field_name], declared[field_name].field_default)
            if (cls, field_name) == (BackendConfig, 'attention'):
                want = AttentionBackend.resolve(want)  # None: $OXYGEN_ROS_ATTENTION, else auto
            assert default == want and type(default) is type(want), (name, field_name)
        elif default is not MISSING:  # only the sub-configs, built from the declaration
            assert (cls, field_name) in {(EngineConfig, 'scheduler'),
                                         (EngineConfig, 'backend')}, (name, field_name)


def test_the_sub_configs_have_no_default_of_their_own_and_the_engine_builds_them():
    for cls in (SchedulerConfig, BackendConfig):
        assert all(default_of(f) is MISSING for f in fields(cls)), cls.__name__
    config = EngineConfig()
    assert config.scheduler == declared_config(SchedulerConfig, 'scheduler')
    assert config.backend == declared_config(BackendConfig, 'backend')
    # what disagreed before: the node's values, wherever a config is built
    assert (config.scheduler.max_running_requests, config.scheduler.tokens_per_cycle) == (32, 5)
    assert config.preset == 'demo'


def test_the_direct_api_and_the_node_build_the_same_config():
    engine, _ = build_configs({'preset': 'demo'})
    assert engine == EngineConfig.create(preset='demo', cameras=engine.cameras)
    assert EngineConfig.create(tokens_per_cycle=2, device='cuda', backend='torch').scheduler \
        .tokens_per_cycle == 2
    with pytest.raises(TypeError, match="'tokens' is no setting of the engine"):
        EngineConfig.create(tokens=2)
    changed = engine.with_settings(policy='isolated', compile_mode='none', seed=3)
    assert (changed.scheduler.policy.value, changed.backend.compile_mode.value, changed.seed) \
        == ('isolated', 'none', 3)
    assert changed.with_settings() == changed


def test_choices_are_the_enums_of_their_fields():
    for name, cls in CONFIGS.items():
        types = field_types(cls)
        for field_name, spec in in_config(name).items():
            members = [t for t in getattr(types[field_name], '__args__', (types[field_name],))
                       if isinstance(t, type) and issubclass(t, enum.Enum)]
            if spec.one_of is not None and members:
                assert set(spec.one_of) == {m.value for m in members[0]}, spec.name
            assert not members or spec.one_of is not None, spec.name
    assert in_config('backend')['trt_precision'].one_of == TRT_PRECISIONS    # a string field


def test_every_entry_is_complete():
    for spec in load():
        assert spec.description and spec.kind in ParamType, spec.name
        assert all(check in CHECKS for check in spec.checks), spec.name
        if spec.limits is not None:
            lo, hi = spec.limits
            assert lo <= hi and all(math.isfinite(v) for v in spec.limits), spec.name
            if spec.default is not None:
                assert lo <= spec.default <= hi, spec.name
        if spec.default is not None and spec.section != 'engine':
            spec.validate(spec.default)              # a default passes its own checks
    node = section('oxygen')
    assert {s.on_change for s in node if not s.read_only} == set(OnChange)
    assert all(s.preset_default for s in node if s.default is None)


def test_the_loader_refuses_what_it_cannot_read():
    with pytest.raises(DeclarationError, match=r"oxygen\.x: unknown keys \['defualt'\]"):
        load('oxygen:\n  x: {type: int, defualt: 0, description: a, read_only: true}\n')
    with pytest.raises(DeclarationError, match='names its on_change'):
        load('oxygen:\n  x: {type: int, default_value: 0, description: a, read_only: false}\n')
    with pytest.raises(DeclarationError, match=r"oxygen\.x: no 'description'"):
        load('oxygen:\n  x: {type: int, default_value: 0, read_only: true}\n')


def test_a_map_entry_is_declared_once_per_item_of_its_parameter():
    [spec] = load('oxygen:\n  __map_robots:\n    x: {type: int, default_value: 0, '
                  'description: a, read_only: true}\n')
    assert (spec.name, spec.map_of, spec.key) == ('<robots>.x', 'robots', 'x')
    left = spec.for_item('left')
    assert (left.name, left.key, left.default) == ('left.x', 'x', 0)
    plain = load('oxygen:\n  y: {type: int, default_value: 0, description: a, '
                 'read_only: true}\n')[0]
    with pytest.raises(ValueError, match='y is declared once, not per item'):
        plain.for_item('left')


def test_presets_name_a_network_and_a_robot_that_fits_it():
    assert set(ROBOTS) == {'droid', 'libero', 'aloha', 'panda', 'test_arm'}
    for name in preset_names():
        preset = get_preset(name)
        robot = get_robot(preset.robot)
        assert preset.model.name == name and preset.decode_budget >= 1
        assert robot.state_dim <= preset.model.action_dim >= robot.robot_action_dim
        assert preset_robot(name) is robot
    with pytest.raises(ValueError, match=r"unknown robot 'alhoa' \(did you mean 'aloha'\?\)"):
        get_robot('alhoa')
