"""Joint states -> the robot state vector, by name (oxygen_ros.ros.joint_states); no DDS."""

import numpy as np
from oxygen_ros.ros.input_limits import MAX_JOINT_STATE_LENGTH
from oxygen_ros.ros.joint_states import joint_state_to_vector, JointStateError
import pytest
from sensor_msgs.msg import JointState


NAMES = ['joint_1', 'joint_2', 'gripper']


def test_joint_state_errors_are_value_errors():
    assert issubclass(JointStateError, ValueError)


def test_joint_state_maps_by_name_not_order():
    msg = JointState(name=['gripper', 'extra', 'joint_2', 'joint_1'],
                     position=[0.5, float('nan'), -2.0, 1.25])
    out = joint_state_to_vector(msg, NAMES)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.array([1.25, -2.0, 0.5], np.float32))


def test_joint_state_missing_names_listed():
    msg = JointState(name=['joint_2'], position=[0.0])
    with pytest.raises(JointStateError, match=r"lacks joints \['joint_1', 'gripper'\]"):
        joint_state_to_vector(msg, NAMES)


def test_joint_state_non_finite_listed():
    msg = JointState(name=NAMES, position=[float('inf'), 0.0, float('nan')])
    with pytest.raises(JointStateError,
                       match=r"non-finite positions for joints \['joint_1', 'gripper'\]"):
        joint_state_to_vector(msg, NAMES)


def test_joint_state_length_mismatch():
    msg = JointState(name=NAMES, position=[0.0, 1.0])
    with pytest.raises(JointStateError, match='has 3 names but 2 positions'):
        joint_state_to_vector(msg, NAMES)


def test_joint_state_duplicate_name():
    msg = JointState(name=['joint_1', 'joint_1'], position=[0.0, 1.0])
    with pytest.raises(JointStateError, match="lists joint 'joint_1' twice"):
        joint_state_to_vector(msg, ['joint_1'])


@pytest.mark.parametrize('field', ['name', 'position', 'velocity', 'effort'])
def test_joint_state_arrays_are_bounded(field):
    n = MAX_JOINT_STATE_LENGTH
    names = [f'j{i}' for i in range(n)]
    ok = JointState(name=names, position=[0.0] * n, velocity=[0.0] * n, effort=[0.0] * n)
    assert joint_state_to_vector(ok, ['j0', f'j{n - 1}']).shape == (2,)   # at the bound
    setattr(ok, field, [*getattr(ok, field), 'x' if field == 'name' else 0.0])
    with pytest.raises(JointStateError) as err:
        joint_state_to_vector(ok, ['j0'])
    assert str(err.value) == f'JointState {field} has {n + 1} entries, more than {n}'
