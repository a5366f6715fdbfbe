"""The observation cache, diagnostics and the warm-up observation, without DDS."""

import math

from diagnostic_msgs.msg import DiagnosticStatus
import numpy as np
from oxygen_ros.config import CAMERA_SLOTS, get_preset
from oxygen_ros.engine.outputs import CycleStats
from oxygen_ros.observation import ObservationError, RefusalReason
from oxygen_ros.policies import preset_robot
from oxygen_ros.ros.diagnostics import EngineDiagnostics, Level, STATUS_NAME, status_values
from oxygen_ros.ros.heap import HeapFigures
from oxygen_ros.ros.input_limits import MAX_INSTRUCTION_BYTES
from oxygen_ros.ros.observation_cache import ObservationCache, synthetic_observation
from oxygen_ros.ros.outcomes import REJECTION_NAMES
from oxygen_ros.units import NS_PER_S
import pytest
from ros_inputs import image, joint_state, JOINTS

NOW = 1_700_000_000 * NS_PER_S


# ------------------------------------------------------------------------ observation cache

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
    with pytest.raises(ObservationError, match=r'joint state is 1.000 s old') as err:
        cache.assemble(NOW + NS_PER_S, 0.5)
    assert err.value.reason is RefusalReason.STALE


def bad_image(**fields):
    _, msg = image(NOW)
    for k, v in fields.items():
        setattr(msg, k, v)
    return msg


@pytest.mark.parametrize('overrides, issue, match', [
    ({'base': bad_image(header=image(NOW - 600_000_000)[1].header)}, RefusalReason.STALE,
     r'base_0_rgb is 0.600 s old \(max_observation_age 0.5 s\)'),
    ({'wrist': image(NOW + 700_000_000)[1]}, RefusalReason.STALE,
     r'left_wrist_0_rgb is 0.700 s in the future'),
    ({'base': image(0)[1]}, RefusalReason.STALE, r'base_0_rgb is 1700000000.000 s old'),
    ({'base': bad_image(encoding='16UC1')}, RefusalReason.BAD_IMAGE,
     r"camera base_0_rgb: unsupported image encoding '16UC1'"),
    ({'wrist': bad_image(encoding='yuv422')}, RefusalReason.BAD_IMAGE,
     r"camera left_wrist_0_rgb: unsupported image encoding 'yuv422'"),
    ({'base': bad_image(data=bytes(100))}, RefusalReason.BAD_IMAGE,
     r'needs 2304 bytes, data has 100'),
    ({'base': bad_image(width=0)}, RefusalReason.BAD_IMAGE, r'empty rgb8 image'),
    ({'joints': joint_state(NOW, positions=[0, 1, math.nan, 3, 4, 5, 6, 7])},
     RefusalReason.BAD_STATE, r"non-finite positions for joints \['joint_3'\]"),
    ({'joints': joint_state(NOW, names=JOINTS[:7], positions=range(7))},
     RefusalReason.BAD_STATE, r"JointState lacks joints \['gripper'\]"),
    ({'joints': joint_state(NOW - NS_PER_S)}, RefusalReason.STALE, r'joint state is 1.000 s old'),
])
def test_assemble_refuses_bad_inputs(overrides, issue, match):
    cache, _, _ = full_cache(**overrides)
    with pytest.raises(ObservationError, match=match) as err:
        cache.assemble(NOW, 0.5)
    assert err.value.reason is issue


def test_assemble_refuses_missing_inputs():
    cache = ObservationCache(['base_0_rgb', 'left_wrist_0_rgb'], JOINTS)
    cache.put_image('base_0_rgb', image(NOW)[1], NOW)
    with pytest.raises(ObservationError, match=r"camera\(s\) \['left_wrist_0_rgb'\]") as err:
        cache.assemble(NOW, 0.5)
    assert err.value.reason is RefusalReason.MISSING_CAMERA
    cache.put_image('left_wrist_0_rgb', image(NOW)[1], NOW)
    with pytest.raises(ObservationError, match='no joint state received yet') as err:
        cache.assemble(NOW, 0.5)
    assert err.value.reason is RefusalReason.BAD_STATE
    cache.put_joint_state(joint_state(NOW), NOW)
    with pytest.raises(ObservationError, match='no instruction yet') as err:
        cache.assemble(NOW, 0.5)
    assert err.value.reason is RefusalReason.NO_INSTRUCTION
    cache.set_instruction('open the drawer')
    assert cache.assemble(NOW, 0.5).prompt == 'open the drawer' == cache.instruction
    with pytest.raises(ValueError, match=r"unknown camera slots \['top'\]"):
        ObservationCache(['top'], JOINTS)


def test_an_instruction_over_the_byte_bound_is_refused_and_replaces_the_previous_one():
    cache, _, _ = full_cache()
    assert cache.assemble(NOW, 0.5).prompt == 'pick up the cup'
    at_bound = 'é' * (MAX_INSTRUCTION_BYTES // 2)                  # 2 bytes each in UTF-8
    assert cache.set_instruction(at_bound) is None
    assert cache.assemble(NOW, 0.5).prompt == at_bound
    reason = cache.set_instruction(at_bound + 'x')
    assert reason == (f'instruction of {MAX_INSTRUCTION_BYTES + 1} bytes is longer than the '
                      f'{MAX_INSTRUCTION_BYTES}-byte limit')
    with pytest.raises(ObservationError) as err:
        cache.assemble(NOW, 0.5)
    assert (err.value.reason, str(err.value)) == (RefusalReason.BAD_PROMPT,
                                                  f'instruction refused: {reason}')
    assert cache.instruction == ''                 # the previous one is not acted on either
    assert cache.set_instruction('open the drawer') is None
    assert cache.assemble(NOW, 0.5).prompt == 'open the drawer'
    too_long = ObservationCache(['base_0_rgb'], JOINTS, 'x' * (MAX_INSTRUCTION_BYTES + 1))
    assert too_long.instruction == ''


def test_out_of_order_images_are_refused_until_the_newer_one_ages_out():
    # Found by test_node_fuzz: the node acted on an image older than one it had received.
    cache, _, _ = full_cache(stamp_ns=NOW - 100_000_000)
    assert cache.assemble(NOW, 0.5).stamp_ns == NOW - 100_000_000
    cache.put_image('base_0_rgb', image(NOW - 200_000_000)[1], NOW)  # older, arrives later
    with pytest.raises(ObservationError, match=r'base_0_rgb image stamped \d+ ns arrived after '
                                               r'one stamped \d+ ns \(0.100 s later\): out of '
                                               r'order') as err:
        cache.assemble(NOW, 0.5)
    assert err.value.reason is RefusalReason.STALE
    cache.put_image('base_0_rgb', image(NOW - 50_000_000)[1], NOW)  # in order again
    assert cache.assemble(NOW, 0.5).stamp_ns == NOW - 50_000_000
    # A garbage stamp far in the future neither blocks later frames nor hides the order.
    cache.put_image('base_0_rgb', image(NOW + 3600 * NS_PER_S)[1], NOW)
    with pytest.raises(ObservationError, match='s in the future'):
        cache.assemble(NOW, 0.5)
    cache.put_image('base_0_rgb', image(NOW - 10_000_000)[1], NOW)
    assert cache.assemble(NOW, 0.5).stamp_ns == NOW - 10_000_000
    cache.put_image('base_0_rgb', image(NOW - 20_000_000)[1], NOW)
    with pytest.raises(ObservationError, match=r'\(0.010 s later\): out of order'):
        cache.assemble(NOW, 0.5)


def test_every_refusal_has_its_diagnostics_name():
    # one refusal type for the node's checks and the engine's: the state is the joints'
    assert REJECTION_NAMES == {
        RefusalReason.STALE: 'stale', RefusalReason.MISSING_CAMERA: 'missing camera',
        RefusalReason.BAD_IMAGE: 'bad image', RefusalReason.BAD_STATE: 'bad joints',
        RefusalReason.NO_INSTRUCTION: 'no instruction', RefusalReason.BAD_PROMPT: 'bad prompt'}
    assert list(REJECTION_NAMES) == list(RefusalReason)   # the diagnostics keys' order


# ------------------------------------------------------------------------------ diagnostics

def stats(total_s=0.02, tokens=3, kv_used=10, kv_capacity=100):
    return CycleStats(cycle_id=0, total_s=total_s, forward_s=total_s, seconds_by_job={},
                      tokens_per_cycle=4, decode_batch=2, tokens_generated=tokens,
                      num_running=2, num_waiting=1, kv_used_blocks=kv_used,
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
    assert (values['text requests running'], values['decode batch'],
            values['tokens per cycle (k)']) == ('2', '2', '4')
    assert values['random weights'] == 'yes' and values['state'] == 'active'
    assert {f'rejected: {n}' for n in ('stale', 'missing camera', 'bad image', 'bad joints',
                                       'no instruction', 'bad prompt')} <= set(values)
    assert status.level == DiagnosticStatus.OK


def test_diagnostics_warn_then_error_then_recover():
    diag = EngineDiagnostics('tiny')
    diag.set_state('active', 0.0)
    t = run(diag, 0.0, 3.0)
    diag.record_rejection(RefusalReason.BAD_STATE, 'JointState has non-finite positions')
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


def test_diagnostics_of_a_robot_due_every_nth_cycle_count_its_own_cycles():
    # a robot at 1 Hz on a 10 Hz node: recorded on its due cycles only, its own target; its
    # 1 s between chunks is no missing chunk (slack: the 9 periods it was not due)
    diag = EngineDiagnostics('tiny', robot='right')
    diag.set_state('active', 0.0)
    t = run(diag, 0.0, 4.0, hz=1.0)
    status = diag.status(t + 0.9, 1.0, 0.5, slack_s=0.9)
    values = status_values(status)
    assert (status.level, status.message) == (Level.OK.octet, 'acting at 1.0 Hz')
    assert (values['control rate target (Hz)'], values['control rate achieved (Hz)']) == \
        ('1', '1.00')
    assert diag.status(t + 0.9, 1.0, 0.5).level == Level.ERROR.octet  # without the slack
    # missed past the slack: ERROR
    assert diag.status(t + 1.5, 1.0, 0.5, slack_s=0.9).message == 'no action chunk for 1.5 s'


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


def test_diagnostics_memory_section():
    diag = EngineDiagnostics('tiny')
    keys = ['RSS (MiB)', 'malloc arenas (MiB)', 'malloc in use (MiB)', 'malloc free (MiB)',
            'malloc mmapped (MiB)', 'malloc trims', 'malloc trimmed (MiB)',
            'malloc last trim (ms)']
    values = status_values(diag.status(0.0, 10.0, 0.5))
    assert [values[k] for k in keys] == ['n/a'] * 5 + ['0', '0.0', '0.00']  # not glibc yet
    mib = 1 << 20
    diag.record_heap(HeapFigures(rss=500 * mib, arenas=300 * mib, in_use=210 * mib + mib // 2,
                                 free=90 * mib, mmapped=82 * mib), 3, 45 * mib, 0.0012)
    diag.reset('tiny', False)  # configure again: the process's memory is still reported
    values = status_values(diag.status(1.0, 10.0, 0.5))
    assert [values[k] for k in keys] == ['500.0', '300.0', '210.5', '90.0', '82.0', '3', '45.0',
                                         '1.20']
    assert list(values).index('RSS (MiB)') == list(values).index('KV used (MiB)') + 1


def test_synthetic_observation_has_the_model_shapes():
    obs = synthetic_observation(get_preset('pi05_base').model, preset_robot('pi05_base'))
    assert sorted(obs.images) == sorted(CAMERA_SLOTS) and obs.state.shape == (14,)
    assert obs.images['base_0_rgb'].shape == (224, 224, 3) and obs.prompt == 'warm up'
