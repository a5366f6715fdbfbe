"""
The node's parts without DDS traffic: parameters, observation cache, diagnostics.

The node's control cycle is also driven by hand (one rclpy context per test, nothing spun).
"""

import logging
import math
from pathlib import Path
import threading
import time

from diagnostic_msgs.msg import DiagnosticStatus
import numpy as np
from oxygen_ros.config import CAMERA_SLOTS, get_preset
from oxygen_ros.engine.config import CycleStats, TextOutput
from oxygen_ros.engine.engine import EngineBusyError
from oxygen_ros.engine.inputs import InputFault
from oxygen_ros.model.prompt import TextTask
from oxygen_ros.resources import config_file, share_dir
from oxygen_ros.ros.convert import NS_PER_S, rgb_to_image, trajectory_to_actions
from oxygen_ros.ros.diagnostics import EngineDiagnostics, Level, STATUS_NAME, status_values
from oxygen_ros.ros.executor import NodeExecutor
from oxygen_ros.ros.node import OxygenNode
from oxygen_ros.ros.observation_cache import (
    InputIssue, ObservationCache, RejectedInput, synthetic_observation)
from oxygen_ros.ros.params import (
    build_configs, check_update, declare_parameters, ParameterError, PARAMETERS, SPECS)
from oxygen_ros.ros.text_requests import TextRequests
from oxygen_ros.sched.request import FinishReason
import pytest
import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.context import Context
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.node import Node
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState
import yaml

JOINTS = [f'joint_{i}' for i in range(1, 8)] + ['gripper']
NOW = 1_700_000_000 * NS_PER_S
CONFIGS = ['demo', 'test', 'pi05_droid', 'pi05_libero', 'pi05_base']


def yaml_params(name):
    return yaml.safe_load(config_file(name).read_text())['/**']['ros__parameters']


# ------------------------------------------------------------------------------ parameters

def test_defaults_follow_the_preset():
    engine, node = build_configs({'preset': 'tiny'})
    assert (engine.preset, engine.checkpoint, engine.tokenizer, engine.decode_budget,
            engine.kv_cache_mb, engine.control_period_s) == ('tiny', None, None, None, None, 0.1)
    assert node.cameras == ('base_0_rgb', 'left_wrist_0_rgb') == engine.cameras
    assert node.joint_names == tuple(f'joint_{i}' for i in range(1, 9))
    assert node.action_joint_names == node.joint_names[:7]  # tiny: robot_action_dim 7
    assert node.camera_topics == ('/camera/base/image_raw', '/camera/left_wrist/image_raw')
    _, base = build_configs({'preset': 'pi05_base'})
    assert base.cameras == CAMERA_SLOTS and len(base.action_joint_names) == 14


@pytest.mark.parametrize('name', CONFIGS)
def test_params_files_build_configs(name):
    engine, node = build_configs(yaml_params(name))
    assert engine.preset == {'test': 'tiny'}.get(name, name)
    assert math.isclose(engine.control_period_s, 1 / node.control_rate_hz)
    assert set(yaml_params(name)) <= set(SPECS)  # no typos in the files


def test_test_yaml_values():
    engine, node = build_configs(yaml_params('test'))
    assert (engine.tokens_per_cycle, engine.max_running_requests) == (4, 8)
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
])
def test_bad_values_are_rejected_with_the_value(values, match):
    with pytest.raises(ParameterError, match=match):
        build_configs({'preset': 'tiny', **values})


def test_check_update():
    _, node = build_configs({'preset': 'tiny'})
    assert check_update(node, 'max_observation_age', 0.25) is None
    assert check_update(node, 'instruction', 'stack the cups') is None
    assert check_update(node, 'use_sim_time', True) is None  # not ours
    assert check_update(node, 'preset', 'demo') == \
        "parameter 'preset' cannot change while the node runs"
    assert check_update(node, 'action_dt', -1.0) == 'action_dt must be in [0.001, 10.0], got -1.0'
    assert node.updated('control_rate_hz', 5.0).control_period_s == 0.2


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


def test_share_dir_holds_the_params_files():
    assert {p.stem for p in (share_dir() / 'config').glob('*.yaml')} >= set(CONFIGS)


# ------------------------------------------------------------------------ observation cache

def image(stamp_ns, h=24, w=32, seed=0, encoding='rgb8'):
    rgb = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    return rgb, rgb_to_image(rgb, stamp_ns, 'cam', encoding)


def joint_state(stamp_ns, positions=None, names=JOINTS):
    msg = JointState()
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, NS_PER_S)
    msg.name = list(names)
    msg.position = [float(x) for x in (np.arange(len(names)) * 0.1
                                       if positions is None else positions)]
    return msg


def full_cache(stamp_ns=NOW - 50_000_000, **overrides):
    cache = ObservationCache(['left_wrist_0_rgb', 'base_0_rgb'], JOINTS, 'pick up the cup')
    base_rgb, base = image(stamp_ns, seed=1)
    wrist_rgb, wrist = image(stamp_ns + 1000, seed=2, encoding='bgr8')
    cache.put_image('base_0_rgb', overrides.get('base', base), NOW)
    cache.put_image('left_wrist_0_rgb', overrides.get('wrist', wrist), NOW)
    cache.put_joint_state(overrides.get('joints', joint_state(stamp_ns)), NOW - 7)
    return cache, base_rgb, wrist_rgb


def test_assemble_valid_observation():
    stamp = NOW - 50_000_000
    names = JOINTS[::-1] + ['extra']  # by name, not by message order
    cache, base_rgb, wrist_rgb = full_cache(joints=joint_state(
        stamp, positions=[float(i) for i in range(9)], names=names))
    obs = cache.assemble(NOW, 0.5)
    assert cache.cameras == ('base_0_rgb', 'left_wrist_0_rgb')  # CAMERA_SLOTS order
    np.testing.assert_array_equal(obs.images['base_0_rgb'], base_rgb)
    np.testing.assert_array_equal(obs.images['left_wrist_0_rgb'], wrist_rgb)
    np.testing.assert_array_equal(obs.state, np.arange(7, -1, -1, dtype=np.float32))
    assert obs.state.dtype == np.float32
    assert (obs.prompt, obs.stamp_ns) == ('pick up the cup', stamp)  # the base camera's
    assert obs.metadata == {'camera_stamps_ns': {'base_0_rgb': stamp,
                                                 'left_wrist_0_rgb': stamp + 1000},
                            'joint_state_stamp_ns': stamp}


def test_joint_state_without_stamp_is_aged_by_receive_time():
    cache, _, _ = full_cache(joints=joint_state(0))
    assert cache.assemble(NOW, 0.5).metadata['joint_state_stamp_ns'] == NOW - 7
    for slot in cache.cameras:
        cache.put_image(slot, image(NOW + NS_PER_S)[1], NOW + NS_PER_S)
    with pytest.raises(RejectedInput, match=r'joint state is 1.000 s old') as err:
        cache.assemble(NOW + NS_PER_S, 0.5)
    assert err.value.cause is InputIssue.STALE


def bad_image(**fields):
    _, msg = image(NOW)
    for k, v in fields.items():
        setattr(msg, k, v)
    return msg


@pytest.mark.parametrize('overrides, issue, match', [
    ({'base': bad_image(header=image(NOW - 600_000_000)[1].header)}, InputIssue.STALE,
     r'base_0_rgb is 0.600 s old \(max_observation_age 0.5 s\)'),
    ({'wrist': image(NOW + 700_000_000)[1]}, InputIssue.STALE,
     r'left_wrist_0_rgb is 0.700 s in the future'),
    ({'base': image(0)[1]}, InputIssue.STALE, r'base_0_rgb is 1700000000.000 s old'),
    ({'base': bad_image(encoding='16UC1')}, InputIssue.BAD_IMAGE,
     r"camera base_0_rgb: unsupported image encoding '16UC1'"),
    ({'wrist': bad_image(encoding='yuv422')}, InputIssue.BAD_IMAGE,
     r"camera left_wrist_0_rgb: unsupported image encoding 'yuv422'"),
    ({'base': bad_image(data=bytes(100))}, InputIssue.BAD_IMAGE,
     r'needs 2304 bytes, data has 100'),
    ({'base': bad_image(width=0)}, InputIssue.BAD_IMAGE, r'empty rgb8 image'),
    ({'joints': joint_state(NOW, positions=[0, 1, math.nan, 3, 4, 5, 6, 7])},
     InputIssue.BAD_JOINTS, r"non-finite positions for joints \['joint_3'\]"),
    ({'joints': joint_state(NOW, names=JOINTS[:7], positions=range(7))},
     InputIssue.BAD_JOINTS, r"JointState lacks joints \['gripper'\]"),
    ({'joints': joint_state(NOW - NS_PER_S)}, InputIssue.STALE, r'joint state is 1.000 s old'),
])
def test_assemble_refuses_bad_inputs(overrides, issue, match):
    cache, _, _ = full_cache(**overrides)
    with pytest.raises(RejectedInput, match=match) as err:
        cache.assemble(NOW, 0.5)
    assert err.value.cause is issue


def test_assemble_refuses_missing_inputs():
    cache = ObservationCache(['base_0_rgb', 'left_wrist_0_rgb'], JOINTS)
    cache.put_image('base_0_rgb', image(NOW)[1], NOW)
    with pytest.raises(RejectedInput, match=r"camera\(s\) \['left_wrist_0_rgb'\]") as err:
        cache.assemble(NOW, 0.5)
    assert err.value.cause is InputIssue.MISSING_CAMERA
    cache.put_image('left_wrist_0_rgb', image(NOW)[1], NOW)
    with pytest.raises(RejectedInput, match='no joint state received yet') as err:
        cache.assemble(NOW, 0.5)
    assert err.value.cause is InputIssue.BAD_JOINTS
    cache.put_joint_state(joint_state(NOW), NOW)
    with pytest.raises(RejectedInput, match='no instruction yet') as err:
        cache.assemble(NOW, 0.5)
    assert err.value.cause is InputIssue.NO_INSTRUCTION
    cache.set_instruction('open the drawer')
    assert cache.assemble(NOW, 0.5).prompt == 'open the drawer' == cache.instruction
    with pytest.raises(ValueError, match=r"unknown camera slots \['top'\]"):
        ObservationCache(['top'], JOINTS)


def test_engine_faults_map_to_issues():
    assert {InputIssue.from_fault(f) for f in InputFault} == {
        InputIssue.MISSING_CAMERA, InputIssue.BAD_IMAGE, InputIssue.BAD_JOINTS,
        InputIssue.BAD_PROMPT}
    assert InputIssue.from_fault(InputFault.BAD_STATE) is InputIssue.BAD_JOINTS


# ------------------------------------------------------------------------------ diagnostics

def stats(total_s=0.02, tokens=3, kv_used=10, kv_capacity=100):
    return CycleStats(cycle_id=0, total_s=total_s, forward_s=total_s, seconds_by_job={},
                      tokens_per_cycle=4, decode_batch=2, tokens_generated=tokens,
                      num_running=2, num_pending=1, kv_used_blocks=kv_used,
                      kv_capacity_blocks=kv_capacity, kv_used_bytes=kv_used * 2**20)


def run(diag, start, seconds, hz=10.0, published=True, **kw):
    n = round(seconds * hz)
    for i in range(n):
        diag.record_cycle(start + (i + 1) / hz, stats(**kw), published)
    return start + n / hz


def test_diagnostics_ok_when_acting_at_rate():
    diag = EngineDiagnostics('tiny', random_weights=True)
    diag.set_state('active', 100.0)
    end = run(diag, 100.0, 4.0, total_s=0.02)
    status = diag.status(end, 10.0, 0.5)
    values = status_values(status)
    assert (status.level, status.name, status.hardware_id) == \
        (Level.OK.octet, STATUS_NAME, 'tiny')
    assert status.message == 'acting at 10.0 Hz'
    assert values['control rate achieved (Hz)'] == values['action chunk rate (Hz)'] == '10.00'
    assert (values['cycle time p50 (ms)'], values['cycle time p99 (ms)']) == ('20.0', '20.0')
    assert values['tokens/s'] == '30.0' and values['action chunks published'] == '40'
    assert (values['KV use (%)'], values['KV used (MiB)'], values['KV blocks used']) == \
        ('10.0', '10.00', '10')
    assert (values['text requests running'], values['text requests pending'],
            values['decode batch'], values['tokens per cycle (k)']) == ('2', '1', '2', '4')
    assert values['random weights'] == 'yes' and values['state'] == 'active'
    assert {f'rejected: {i.value}' for i in InputIssue} <= set(values)
    assert status.level == DiagnosticStatus.OK


def test_diagnostics_warn_then_error_then_recover():
    diag = EngineDiagnostics('tiny')
    diag.set_state('active', 0.0)
    t = run(diag, 0.0, 3.0)
    diag.record_rejection(InputIssue.BAD_JOINTS, 'JointState has non-finite positions')
    status = diag.status(t, 10.0, 0.5)
    assert status.level == Level.WARN.octet
    assert status.message == 'inputs rejected (bad joints x1)'
    assert status_values(status)['rejected: bad joints'] == '1'
    assert status_values(status)['last rejection'] == \
        'bad joints: JointState has non-finite positions'
    # No chunk for longer than max_observation_age: ERROR.
    t = run(diag, t, 1.0, published=False)
    status = diag.status(t, 10.0, 0.5)
    assert status.level == Level.ERROR.octet
    assert status.message.startswith('no action chunk for 1.0 s; last rejection bad joints')
    t = run(diag, t, 3.0)
    assert diag.status(t, 10.0, 0.5).level == Level.OK.octet  # counters are per period
    assert status_values(diag.status(t, 10.0, 0.5))['rejected: bad joints'] == '1'  # totals


@pytest.mark.parametrize('case, message', [
    ('slow', 'control rate 5.0 Hz < 90 % of 10 Hz'),
    ('kv', 'KV pool 95 % full'),
    ('text', '1 text request(s) rejected'),
])
def test_diagnostics_warnings(case, message):
    diag = EngineDiagnostics('tiny')
    diag.set_state('active', 0.0)
    t = run(diag, 0.0, 4.0, hz=5.0 if case == 'slow' else 10.0,
            kv_used=95 if case == 'kv' else 10)
    if case == 'text':
        diag.record_text_rejected()
    status = diag.status(t, 10.0, 0.5)
    assert (status.level, status.message) == (Level.WARN.octet, message)


def test_diagnostics_failure_and_states():
    diag = EngineDiagnostics('tiny')
    assert (diag.status(0.0, 10.0, 0.5).level, diag.status(0.0, 10.0, 0.5).message) == \
        (Level.OK.octet, 'unconfigured')
    diag.set_state('inactive', 1.0)
    assert diag.status(5.0, 10.0, 0.5).message == 'inactive'  # no action clock when inactive
    diag.record_failure('RuntimeError: boom')
    status = diag.status(6.0, 10.0, 0.5)
    assert (status.level, status.message) == (Level.ERROR.octet, 'engine failed: RuntimeError: '
                                                                 'boom')
    assert status_values(status)['engine error'] == 'RuntimeError: boom'
    diag.reset('tiny', False)
    assert diag.status(7.0, 10.0, 0.5).level == Level.OK.octet


# ------------------------------------------------------- the node's cycle, driven by hand

@pytest.fixture
def tiny_node(context):
    node = OxygenNode(context=context, cli_args=[
        '--ros-args', '--params-file', str(config_file('test')), '-p', 'autostart:=false'])
    yield node
    node.destroy_node()


def feed(node, stamp_ns, positions=None):
    node._cache.put_image('base_0_rgb', image(stamp_ns, seed=1)[1], stamp_ns)
    node._cache.put_image('left_wrist_0_rgb', image(stamp_ns, seed=2)[1], stamp_ns)
    node._cache.put_joint_state(joint_state(stamp_ns, positions), stamp_ns)


def test_node_cycle_by_hand(tiny_node):
    node = tiny_node
    published = []
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
    node._pubs['action'].publish = published.append
    texts = []
    node._pubs['answer'].publish = texts.append
    node._cache.set_instruction('pick up the cup')
    feed(node, node._now_ns())
    node._texts.ask('what is on the table?')
    node._texts.ask('   ')  # refused by the engine: answered at once
    node._control_tick()
    [chunk] = published
    actions = trajectory_to_actions(chunk)
    assert actions.shape == (4, 7) and np.isfinite(actions).all()
    assert list(chunk.joint_names) == JOINTS[:7] and chunk.header.frame_id == 'base_link'
    assert [p.time_from_start.nanosec for p in chunk.points] == [0, 50_000_000, 100_000_000,
                                                                 150_000_000]
    assert list(node._texts.live.values()) == [TextTask.ANSWER, TextTask.MEMORY]
    feed(node, node._now_ns(), positions=[math.nan] * 8)
    node._control_tick()  # refused: no chunk, the answer keeps decoding
    assert len(published) == 1
    for _ in range(20):
        node._control_tick()
        node._publish_texts()
    assert [t.data for t in texts][0] == 'no answer: an ANSWER request needs a non-empty ' \
                                         'question'
    assert len(texts) == 2 and not texts[1].data.startswith('no answer')  # decoded under NaNs
    values = status_values(node._diag.status(1e9, 10.0, 0.5))
    assert values['rejected: bad joints'] == '21' and values['action chunks published'] == '1'
    assert node.trigger_shutdown() == TransitionCallbackReturn.SUCCESS
    assert node.finished.is_set() and node._engine is None


def test_engine_failure_deactivates(tiny_node):
    node = tiny_node
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS

    def boom(obs):
        raise RuntimeError('boom')

    node._engine.step = boom
    node._control_tick()
    status = node._diag.status(0.0, 10.0, 0.5)
    assert (status.level, status.message) == (Level.ERROR.octet,
                                              'engine failed: RuntimeError: boom')
    assert status_values(status)['state'] == 'inactive' and node._timer is None
    assert node.trigger_activate() == TransitionCallbackReturn.FAILURE
    assert node.trigger_cleanup() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS  # a fresh engine
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS


def test_configure_fails_on_missing_checkpoint(context, tmp_path):
    node = OxygenNode(context=context, cli_args=[
        '--ros-args', '--params-file', str(config_file('test')), '-p', 'autostart:=false',
        '-p', f'checkpoint:={tmp_path / "nope"}'])
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        status = node._diag.status(0.0, 10.0, 0.5)
        assert status.level == Level.ERROR.octet
        assert status.message.startswith('engine failed: configure failed: cannot build the '
                                         'tiny engine: ')
        assert str(tmp_path / 'nope') in status.message
        assert node._engine is None and not node._pubs
    finally:
        node.destroy_node()


def test_synthetic_observation_has_the_model_shapes():
    obs = synthetic_observation(get_preset('pi05_base'))
    assert sorted(obs.images) == sorted(CAMERA_SLOTS) and obs.state.shape == (14,)
    assert obs.images['base_0_rgb'].shape == (224, 224, 3) and obs.prompt == 'warm up'


# ---------------------------------------------------------------------------- text requests

class FakeEngine:

    def __init__(self, busy=False):
        self.busy, self.submitted = busy, []

    def submit_text(self, task, question=None):
        if self.busy:
            raise EngineBusyError('64 text requests already wait')
        if task is TextTask.ANSWER and not question.strip():
            raise ValueError('an ANSWER request needs a non-empty question')
        self.submitted.append((task, question))
        return f'{task.value}-{len(self.submitted)}'


def output(req_id, task, text='', reason=FinishReason.STOP, error=''):
    return TextOutput(req_id, task, text, (), reason, 5, 2, error)


def test_text_requests_give_every_question_one_reply():
    diag = EngineDiagnostics('tiny')
    texts = TextRequests(logging.getLogger('test'), diag)
    engine = FakeEngine()
    for q in ('what is this?', ' ', 'and that?', 'why?'):
        texts.ask(q)
    texts.submit(engine, 0.0, 0.0, 0.0, valid_observation=False)  # questions need no frame
    assert engine.submitted == [(TextTask.ANSWER, q) for q in ('what is this?', 'and that?',
                                                               'why?')]
    assert texts.finish([output('answer-1', TextTask.ANSWER, 'a cup'),
                         output('answer-2', TextTask.ANSWER, '', None,
                                'not admitted for 51 cycles'),
                         output('answer-3', TextTask.ANSWER, '', FinishReason.ABORT)])
    assert texts.take() == [
        (TextTask.ANSWER, 'no answer: an ANSWER request needs a non-empty question'),
        (TextTask.ANSWER, 'a cup'), (TextTask.ANSWER, 'no answer: not admitted for 51 cycles'),
        (TextTask.ANSWER, 'no answer: request aborted')]
    assert texts.take() == [] and texts.live == {}
    assert status_values(diag.status(0.0, 10.0, 0.5))['text requests rejected'] == '3'
    texts.ask('busy?')
    texts.submit(FakeEngine(busy=True), 0.0, 0.0, 0.0, True)
    assert texts.take() == [(TextTask.ANSWER, 'no answer: 64 text requests already wait')]


def test_periodic_requests_wait_for_valid_input_and_the_previous_one():
    texts = TextRequests(logging.getLogger('test'), EngineDiagnostics('tiny'))
    engine = FakeEngine()
    texts.start(10.0)
    texts.submit(engine, 10.0, 2.0, 0.0, valid_observation=False)
    assert engine.submitted == []
    texts.submit(engine, 10.1, 2.0, 0.0, valid_observation=True)
    assert engine.submitted == [(TextTask.SUBTASK, None)]  # memory_period 0: never
    texts.submit(engine, 12.5, 2.0, 0.0, True)  # due, but subtask-1 still decodes
    assert len(engine.submitted) == 1
    texts.finish([output('subtask-1', TextTask.SUBTASK, 'grasp the cup')])
    texts.submit(engine, 12.6, 2.0, 0.0, True)
    assert engine.submitted[1:] == [(TextTask.SUBTASK, None)]
    texts.finish([output('subtask-2', TextTask.SUBTASK, '', None, 'bad text prompt')])
    assert texts.take() == [(TextTask.SUBTASK, 'grasp the cup')]  # failures are not published
    texts.submit(engine, 13.0, 2.0, 0.0, True)  # next due at 14.6
    assert len(engine.submitted) == 2


# ---------------------------------------------------------------------------------- executor

def test_executor_submits_each_callback_once(context):
    node = Node('executor_test', context=context)
    executor = NodeExecutor(num_threads=3, context=context)
    executor.add_node(node)
    submits, runs = [], []
    pool_submit = executor._executor.submit
    executor._executor.submit = lambda *a: submits.append(1) or pool_submit(*a)
    slow_group, fast_group = MutuallyExclusiveCallbackGroup(), MutuallyExclusiveCallbackGroup()
    node.create_timer(0.1, lambda: time.sleep(0.08), slow_group)
    node.create_timer(0.01, lambda: runs.append(1), fast_group)
    thread = threading.Thread(target=executor.spin)
    thread.start()
    time.sleep(1.0)
    executor.shutdown()
    thread.join()
    node.destroy_node()
    assert len(runs) >= 50  # the fast timer ran beside the slow one
    assert len(submits) <= len(runs) + 15  # not thousands (rclpy#1452)


def test_parameters_doc_lists_every_parameter():
    doc = (Path(__file__).resolve().parents[2] / 'docs' / 'parameters.md').read_text()
    rows = {line.split('`')[1] for line in doc.splitlines() if line.startswith('| `')}
    assert rows == {spec.name for spec in PARAMETERS}
    for spec in PARAMETERS:
        row = next(line for line in doc.splitlines() if line.startswith(f'| `{spec.name}` |'))
        assert ('read-only' in row) == spec.read_only, spec.name
