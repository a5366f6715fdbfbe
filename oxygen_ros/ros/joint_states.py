"""
``sensor_msgs/JointState`` to the robot state vector, by joint name.

Pure functions: no node, no DDS, no I/O.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from oxygen_ros.ros.input_limits import MAX_JOINT_STATE_LENGTH
from sensor_msgs.msg import JointState


class JointStateError(ValueError):
    """A ``sensor_msgs/JointState`` that cannot be mapped to the configured joint order."""


def joint_state_to_vector(msg: JointState, joint_names: Sequence[str]) -> np.ndarray:
    """
    Return the positions of ``joint_names`` from a ``sensor_msgs/JointState``, by name.

    The message may list more joints than asked for, in any order; only the requested ones
    are checked for finiteness.

    :param msg: the joint state.
    :param joint_names: the joint order of the robot state vector (parameter ``joint_names``).
    :returns: ``float32 [len(joint_names)]`` positions in message units (rad or m).
    :raises JointStateError: an array longer than ``MAX_JOINT_STATE_LENGTH``, ``name`` and
        ``position`` lengths differ, a name repeats in the message, requested joints are
        missing (all listed), or their positions are NaN/Inf (all listed).
    """
    lengths = {field: len(getattr(msg, field)) for field in ('name', 'position', 'velocity',
                                                             'effort')}
    longest = max(lengths, key=lengths.get)
    if lengths[longest] > MAX_JOINT_STATE_LENGTH:
        raise JointStateError(f'JointState {longest} has {lengths[longest]} entries, more than '
                              f'{MAX_JOINT_STATE_LENGTH}')
    names = list(msg.name)
    positions = np.asarray(msg.position, dtype=np.float64)
    if len(names) != positions.shape[0]:
        raise JointStateError(
            f'JointState has {len(names)} names but {positions.shape[0]} positions')
    index = {}
    for i, name in enumerate(names):
        if name in index:
            raise JointStateError(f'JointState lists joint {name!r} twice')
        index[name] = i
    missing = [name for name in joint_names if name not in index]
    if missing:
        raise JointStateError(
            f'JointState lacks joints {missing}; it has {names}')
    out = positions[[index[name] for name in joint_names]]
    bad = [name for name, value in zip(joint_names, out) if not math.isfinite(value)]
    if bad:
        raise JointStateError(f'JointState has non-finite positions for joints {bad}')
    return out.astype(np.float32)


__all__ = ['JointStateError', 'joint_state_to_vector']
