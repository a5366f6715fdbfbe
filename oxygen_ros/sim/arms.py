"""
The simulator's arms by name: their joint names, and the ``oxygen`` node's parameters for them.

``oxygen_sim`` runs one Panda per entry of its ``robots`` parameter (``['']``: the one arm, on
the topics of docs/simulation.md). A named arm's topics are under its namespace, as the node's
``robots`` has them (``sim.endpoints.arm_topic``), and its joints carry its name as a prefix,
``<arm>_joint1`` .. ``<arm>_joint7``, ``<arm>_gripper`` (the ``prefix`` convention of
multi-arm ros2_control descriptions), so a chunk meant for one arm is refused by the other's
executor. ``node_parameters`` gives the node what ``config/sim.yaml`` says for the one arm,
per arm: its ``robots`` and each robot's joint names. Pure (stdlib): the demo and the launch
file import it without MuJoCo.
"""

from __future__ import annotations

from typing import Sequence

ARM_JOINTS = tuple(f'joint{i}' for i in range(1, 8))
"""Menagerie's arm joint names (published without the model's ``panda/`` prefix)."""
FINGER_JOINTS = ('finger_joint1', 'finger_joint2')
GRIPPER = 'gripper'
"""The gripper as one joint of ``/joint_states`` and the chunks: 0 open, 1 closed."""
COMMAND_JOINTS = (*ARM_JOINTS, GRIPPER)
"""Joints the executor commands (the chunks' joint names), of the one unnamed arm."""
TWO_ARMS = ('left', 'right')


def arm_names(count: int) -> tuple[str, ...]:
    """
    Return the arms of a run of ``count`` arms: ``('',)``, ``('left', 'right')``, ``arm1`` ..

    :raises ValueError: ``count`` below 1.
    """
    if count < 1:
        raise ValueError(f'the number of arms must be at least 1, got {count}')
    if count == 1:
        return ('',)
    return TWO_ARMS if count == 2 else tuple(f'arm{i}' for i in range(1, count + 1))


def joint_name(joint: str, arm: str) -> str:
    """Return arm ``arm``'s name of ``joint`` (``<arm>_<joint>``; the one arm's: ``joint``)."""
    return f'{arm}_{joint}' if arm else joint


def arm_joints(joints: Sequence[str], arm: str) -> tuple[str, ...]:
    """Return ``joints`` as arm ``arm`` names them (``joint_name``)."""
    return tuple(joint_name(j, arm) for j in joints)


def node_parameters(arms: Sequence[str]) -> dict[str, object]:
    """
    Return the ``oxygen`` node's parameters that serve ``arms`` (none for the one arm).

    ``robots``, and for each arm ``<arm>.joint_names`` and ``<arm>.action_joint_names``: its
    command joints (``COMMAND_JOINTS`` prefixed). Everything else (cameras, action space,
    limits, instruction) is ``config/sim.yaml``'s, which every robot inherits.
    """
    if tuple(arms) == ('',):
        return {}
    out: dict[str, object] = {'robots': list(arms)}
    for arm in arms:
        out[f'{arm}.joint_names'] = list(arm_joints(COMMAND_JOINTS, arm))
        out[f'{arm}.action_joint_names'] = list(arm_joints(COMMAND_JOINTS, arm))
    return out


def ros_args(params: dict[str, object]) -> list[str]:
    """Return ``params`` as ``--ros-args`` arguments: ``-p name:=value`` (lists in YAML)."""
    def text(value: object) -> str:
        return f"[{','.join(map(str, value))}]" if isinstance(value, (list, tuple)) \
            else str(value)
    return [a for name, value in params.items() for a in ('-p', f'{name}:={text(value)}')]


__all__ = ['ARM_JOINTS', 'COMMAND_JOINTS', 'FINGER_JOINTS', 'GRIPPER', 'TWO_ARMS', 'arm_joints',
           'arm_names', 'joint_name', 'node_parameters', 'ros_args']
