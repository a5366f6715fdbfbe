"""The node's parameters without DDS traffic: specs, configs, descriptors, files, docs."""

import math
import re

from oxygen_ros.config import CAMERA_SLOTS, PromptFormat
from oxygen_ros.engine.config import BackendKind
from oxygen_ros.resources import config_file, share_dir
from oxygen_ros.ros import param_docs
from oxygen_ros.ros.diagnostics import status_values
from oxygen_ros.ros.input_limits import MAX_INSTRUCTION_BYTES
from oxygen_ros.ros.node import OxygenNode
from oxygen_ros.ros.node_config import build_configs, check_update
from oxygen_ros.ros.param_handler import ParameterHandler
from oxygen_ros.ros.param_spec import descriptor, OnChange, ParameterError, ParamType
from oxygen_ros.ros.params import declare_parameters, DECLARED, PARAMETERS, SPECS
from oxygen_ros.ros.security import SecuritySettings
import pytest
import rclpy
from rclpy.context import Context
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.node import Node
from rclpy.parameter import Parameter
import yaml

JOINTS = [f'joint_{i}' for i in range(1, 8)] + ['gripper']
CONFIGS = ['demo', 'test', 'pi05_droid', 'pi05_libero', 'pi05_base']


def yaml_params(name):
    return yaml.safe_load(config_file(name).read_text())['/**']['ros__parameters']


# ------------------------------------------------------------------------------ parameters

def test_defaults_follow_the_preset():
    engine, node = build_configs({'preset': 'tiny'})
    assert (engine.preset, engine.checkpoint, engine.tokenizer, engine.decode_budget,
            engine.kv_cache_mb) == ('tiny', None, None, None, None)
    assert node.cameras == ('base_0_rgb', 'left_wrist_0_rgb') == engine.cameras
    assert node.joint_names == tuple(f'joint_{i}' for i in range(1, 9))
    assert node.action_joint_names == node.joint_names[:7]  # tiny: robot_action_dim 7
    assert node.camera_topics == ('/camera/base/image_raw', '/camera/left_wrist/image_raw')
    _, base = build_configs({'preset': 'pi05_base'})
    assert base.cameras == CAMERA_SLOTS and len(base.action_joint_names) == 14
    assert not engine.backend.rtc   # chunk_smoothing none: nothing guided
    assert build_configs({'preset': 'tiny', 'chunk_smoothing': 'rtc'})[0].backend.rtc


def test_rtc_jacobian_steps_are_every_step_by_default_and_fit_the_presets_euler_steps():
    """-1 (the default) is exact RTC; 0..N is taken; beyond the preset's N steps refused."""
    rtc = {'preset': 'tiny', 'chunk_smoothing': 'rtc'}
    assert SPECS['rtc_jacobian_steps'].default == -1
    assert build_configs(rtc)[0].backend.rtc_jacobian_steps is None
    for k in (0, 5, 10):
        engine = build_configs({**rtc, 'rtc_jacobian_steps': k})[0]
        assert engine.backend.rtc_jacobian_steps == k
    with pytest.raises(ParameterError, match=r'^rtc_jacobian_steps must be in 0\.\.10 \(the '
                                             r'Euler steps of preset tiny\), got 11$'):
        build_configs({**rtc, 'rtc_jacobian_steps': 11})
    with pytest.raises(ParameterError, match='rtc_jacobian_steps'):
        build_configs({**rtc, 'rtc_jacobian_steps': -2})
    # /diagnostics shows a setting other than exact RTC beside "chunk smoothing"
    assert build_configs(rtc)[0].rtc_note() == ''
    assert build_configs({'preset': 'tiny', 'rtc_jacobian_steps': 5})[0].rtc_note() == ''
    assert build_configs({**rtc, 'rtc_jacobian_steps': 5})[0].rtc_note() == \
        ' (the Jacobian on 5 of 10 Euler steps)'


@pytest.mark.parametrize('name', CONFIGS)
def test_params_files_build_configs(name):
    engine, node = build_configs(yaml_params(name))
    assert engine.preset == node.preset == {'test': 'tiny'}.get(name, name)
    assert math.isclose(node.control_period_s, 1 / node.control_rate_hz)
    assert set(yaml_params(name)) <= set(SPECS)  # no typos in the files


def test_test_yaml_values():
    engine, node = build_configs(yaml_params('test'))
    assert (engine.scheduler.tokens_per_cycle, engine.scheduler.max_running_requests) == (4, 8)
    assert (node.frame_id, node.action_dt, node.memory_period, node.torch_threads) == \
        ('base_link', 0.05, 1.0, 1)
    assert node.joint_names == tuple(JOINTS) and node.action_joint_names == tuple(JOINTS[:7])


@pytest.mark.parametrize('values, match', [
    ({'preset': 'pi05_dorid'}, r"preset: unknown preset 'pi05_dorid' \(did you mean "
                               r"'pi05_droid'\?\)"),
    ({'dtype': 'float16'}, r"dtype must be 'float32' or 'bfloat16', got 'float16'"),
    ({'backend': 'onnx'}, r"backend must be one of 'torch', 'tensorrt', got 'onnx'"),
    ({'policy': 'fast'}, r"policy must be one of 'oxygen', 'isolated', got 'fast'"),
    ({'prefix_attention': 'causal'}, r"prefix_attention must be '' or one of .*got 'causal'"),
    ({'device': 'gpu'}, r"device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
    ({'cameras': ['base_0_rgb', 'top']}, r'cameras must be distinct names of .*'
                                         r"got \['base_0_rgb', 'top'\]"),
    ({'cameras': ['base_0_rgb', 'base_0_rgb']}, r'cameras must be distinct'),
    ({'joint_names': JOINTS[:7]}, r'joint_names: preset tiny has a 8-dim state, got 7 names'),
    ({'joint_names': JOINTS[:7] + ['joint_1']}, r'joint_names must be distinct non-empty'),
    ({'action_joint_names': JOINTS}, r'action_joint_names: preset tiny has 7 action dims, '
                                     r'got 8 names'),
    ({'control_rate_hz': 0.0}, r'control_rate_hz must be in \[0.1, 1000.0\], got 0.0'),
    ({'max_observation_age': math.nan}, r'max_observation_age must be a finite number'),
    ({'tokens_per_cycle': 0}, r'tokens_per_cycle must be in \[1, 1024\], got 0'),
    ({'prompt_format': 'pi05'}, r"prompt_format must be '' or one of 'pi05_state', 'pi0', "
                                r"'pi05_no_state', got 'pi05'"),
    ({'quantile_eps': -0.5}, r"quantile_eps must be -1 \(the stats' own\) or in \[0, 1\], "
                             r'got -0.5'),
    ({'state_prompt_pad': 300}, r'state_prompt_pad must be in \[0, 256\], got 300'),
    ({'instruction': 'é' * 2049}, r'instruction of 4098 bytes is longer than the 4096-byte '
                                  r'limit'),
])
def test_bad_values_are_rejected_with_the_value(values, match):
    with pytest.raises(ParameterError, match=match):
        build_configs({'preset': 'tiny', **values})


def test_checkpoint_conventions_parameters():
    engine, _ = build_configs({'preset': 'tiny'})
    assert (engine.prompt_format, engine.state_prompt_pad, engine.quantile_eps) == (None, 0, None)
    engine, _ = build_configs({'preset': 'tiny', 'prompt_format': 'pi0', 'state_prompt_pad': 32,
                               'quantile_eps': 0.0})
    assert (engine.prompt_format, engine.state_prompt_pad, engine.quantile_eps) == \
        (PromptFormat.PI0, 32, 0.0)


def test_check_update():
    _, node = build_configs({'preset': 'tiny'})
    assert check_update(node, 'max_observation_age', 0.25) is None
    assert check_update(node, 'instruction', 'stack the cups') is None
    assert check_update(node, 'use_sim_time', True) is None  # not ours
    assert check_update(node, 'preset', 'demo') == \
        "parameter 'preset' cannot change while the node runs"
    assert check_update(node, 'action_dt', -1.0) == 'action_dt must be in [0.001, 10.0], got -1.0'
    assert node.updated('control_rate_hz', 5.0).control_period_s == 0.2
    assert check_update(None, 'instruction', 'x' * 4097) == \
        'instruction of 4097 bytes is longer than the 4096-byte limit'  # before configure
    assert check_update(None, 'frame_id', 'table') is None


def test_every_dynamic_parameter_names_its_change_and_lives_in_one_config():
    assert {spec.on_change for spec in PARAMETERS if not spec.read_only} == set(OnChange)
    for spec in PARAMETERS:
        if not spec.read_only:  # updated() replaces the node's field, or one config holds it
            assert spec.configs in (('node',), ('scheduler',)), spec.name
    _, node = build_configs({'preset': 'tiny'})
    assert node.updated('max_waiting_requests', 4) is node      # the engine's scheduler's
    with pytest.raises(ParameterError, match=r'max_waiting_requests must be in \[1, 100000\]'):
        node.updated('max_waiting_requests', 0)


def test_an_entry_turns_a_value_into_its_config_field():
    assert SPECS['decode_budget'].config_value(0) is None            # unset: the preset's
    assert SPECS['checkpoint'].config_value('') is None
    assert SPECS['quantile_eps'].config_value(-1.0) is None
    assert SPECS['quantile_eps'].config_value(0) == 0.0
    assert SPECS['compile_steps'].config_value(['all']) is None       # every step
    kv = SPECS['kv_cache_mb'].config_value(64)
    assert kv == 64.0 and isinstance(kv, float)
    assert SPECS['joint_names'].config_value(['a', 'b']) == ('a', 'b')
    assert SPECS['stop_on_eos'].config_value(False) is False
    assert SPECS['prefix_attention'].kind is ParamType.STRING
    assert SPECS['velocity_limits'].kind is ParamType.DOUBLE_ARRAY
    engine, _ = build_configs({'preset': 'tiny', 'backend': 'torch', 'prompt_format': 'pi0'})
    assert engine.backend.kind is BackendKind.TORCH                  # the field's enum
    assert engine.prompt_format is PromptFormat.PI0
    desc = descriptor(SPECS['tokens_per_cycle'])
    assert (desc.integer_range[0].from_value, desc.integer_range[0].to_value) == (1, 1024)
    assert not desc.floating_point_range and desc.read_only


@pytest.fixture
def context(ros_domain_id):
    ctx = Context()
    rclpy.init(context=ctx, domain_id=ros_domain_id)
    yield ctx
    ctx.try_shutdown()


@pytest.mark.parametrize('name', CONFIGS)
def test_declared_parameters_from_params_file(context, name):
    node = Node('oxygen', context=context,
                cli_args=['--ros-args', '--params-file', str(config_file(name))])
    try:
        declare_parameters(node)
        values = {spec.name: node.get_parameter(spec.name).value for spec in PARAMETERS}
        engine, cfg = build_configs({k: list(v) if isinstance(v, list) else v
                                     for k, v in values.items()})
        assert list(cfg.joint_names) == yaml_params(name)['joint_names']
        for spec in PARAMETERS:
            desc = node.describe_parameter(spec.name)
            assert desc.read_only == spec.read_only, spec.name
            assert desc.description == spec.description
            if spec.limits is not None:
                rng = (desc.floating_point_range or desc.integer_range)[0]
                assert (rng.from_value, rng.to_value) == spec.limits, spec.name
        result = node.set_parameters([Parameter('preset', value='tiny')])[0]
        assert not result.successful and 'read-only' in result.reason
        result = node.set_parameters([Parameter('control_rate_hz', value=5000.0)])[0]
        assert not result.successful and 'out of range' in result.reason
    finally:
        node.destroy_node()


def test_the_handler_needs_a_function_for_every_kind_of_change(context):
    node = Node('oxygen', context=context)
    try:
        apply = {change: print for change in OnChange
                 if change not in (OnChange.NEXT_CYCLE, OnChange.FRAME_ID)}
        with pytest.raises(ValueError, match=r"no function applies \['frame id'\]"):
            ParameterHandler(node, apply)
    finally:
        node.destroy_node()


def test_declared_defaults_follow_preset_override(context):
    node = Node('oxygen', context=context, parameter_overrides=[
        Parameter('preset', value='pi05_base')])
    try:
        declare_parameters(node)
        assert list(node.get_parameter('cameras').value) == list(CAMERA_SLOTS)
        assert len(node.get_parameter('joint_names').value) == 14
        assert node.get_parameter('action_joint_names').value == \
            node.get_parameter('joint_names').value
    finally:
        node.destroy_node()


def node_with_instruction(context, instruction: str) -> OxygenNode:
    """Return the test node, not configured (autostart off), given ``instruction``."""
    return OxygenNode(context=context, security=SecuritySettings(),
                      cli_args=['--ros-args', '--params-file', str(config_file('test')),
                                '-p', 'autostart:=false'],
                      parameter_overrides=[Parameter('instruction', value=instruction)])


def test_an_over_long_instruction_fails_configure_and_a_set_with_its_reason(context):
    # seen before: an over-long initial instruction was replaced by '' without a word
    too_long = 'pick up the red cup. ' * 200                        # 4200 bytes
    assert len(too_long.encode()) > MAX_INSTRUCTION_BYTES
    node = node_with_instruction(context, too_long)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        status = node._diag.status(0.0, 10.0, 0.5)
        assert status.message == ('engine failed: configure failed: bad parameter: instruction '
                                  'of 4200 bytes is longer than the 4096-byte limit')
        assert status_values(status)['state'] == 'unconfigured'
        assert node._engine is None                                  # nothing was built
        # set_parameters (the ~/set_parameters service's callback) refuses one too, and keeps
        # the value it had
        [result] = node.set_parameters([Parameter('instruction', value=too_long + '!')])
        assert (result.successful, result.reason) == (
            False, 'instruction of 4201 bytes is longer than the 4096-byte limit')
        assert node.get_parameter('instruction').value == too_long
        [result] = node.set_parameters([Parameter('instruction', value='pick up the red cup')])
        assert result.successful
    finally:
        node.destroy_node()


def test_an_instruction_too_long_for_the_model_fails_configure_as_a_bad_parameter(context):
    # seen before: under the byte limit but over max_token_len, configure failed with
    # 'cannot build the tiny engine: ObservationError: ...', as if the build had broken
    too_long = 'pick up the red cup. ' * 60                         # 1260 bytes, ~300 tokens
    assert len(too_long.encode()) <= MAX_INSTRUCTION_BYTES
    node = node_with_instruction(context, too_long)
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        message = node._diag.status(0.0, 10.0, 0.5).message
        match = re.fullmatch(r'engine failed: configure failed: bad parameter: instruction: '
                             r'instruction too long: its action prompt \(pi05_state, with BOS '
                             r'and the state\) is (\d+) tokens, the model takes 64 '
                             r'\(max_token_len of preset tiny\); shorten it by at least (\d+) '
                             r'token\(s\)', message)
        assert match is not None, message
        assert int(match[1]) - 64 == int(match[2]) > 0
        assert node._engine is None
        [result] = node.set_parameters([Parameter('instruction', value='pick up the red cup')])
        assert result.successful
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    finally:
        node.destroy_node()


def test_share_dir_holds_the_params_files():
    assert {p.stem for p in (share_dir() / 'config').glob('*.yaml')} >= set(CONFIGS)


def test_parameters_doc_is_generated_from_the_code():
    assert param_docs.DEFAULT_PAGE.read_text() == param_docs.render(), \
        'docs/parameters.md is stale: run `make docs`'
    assert param_docs.main(['--check']) == 0


def test_parameters_doc_check_fails_on_a_stale_page(tmp_path, capsys):
    stale = tmp_path / 'parameters.md'
    stale.write_text(param_docs.render().replace('`control_rate_hz`', '`control_hz`'))
    assert param_docs.main(['--check', str(stale)]) == 1
    assert capsys.readouterr().err == f'{stale} is stale: run `make docs`\n'


def test_parameters_doc_lists_every_parameter():
    doc = param_docs.DEFAULT_PAGE.read_text()
    rows = {line.split('`')[1] for line in doc.splitlines() if line.startswith('| `')}
    assert rows == {spec.name for spec in DECLARED}  # each robot's as <robots>.name
    for spec in DECLARED:
        row = next(line for line in doc.splitlines() if line.startswith(f'| `{spec.name}` |'))
        assert ('read-only' in row) == spec.read_only, spec.name
