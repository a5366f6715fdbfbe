"""
Robot policies: each robot family's conventions around the network (openpi ``policies/``).

One module per family (``droid``, ``libero``, ``aloha``, ``panda``; ``base.TEST_ARM`` for the
tests), each giving the family's data (cameras, state and action dims, action space, grippers,
prompt format) and its input and output transforms (``base.RobotPolicy``); a preset names its
robot (``config.Preset.robot``) beside its network. Pure numpy.
"""

from __future__ import annotations

from oxygen_ros.config import by_name, get_preset
from oxygen_ros.policies.aloha import ALOHA
from oxygen_ros.policies.base import RobotPolicy, TEST_ARM
from oxygen_ros.policies.droid import DROID
from oxygen_ros.policies.libero import LIBERO
from oxygen_ros.policies.panda import PANDA

ROBOTS: dict[str, RobotPolicy] = {r.name: r for r in (DROID, LIBERO, ALOHA, PANDA, TEST_ARM)}
"""Every robot policy, by name."""


def get_robot(name: str) -> RobotPolicy:
    """
    Return the robot policy called ``name``.

    :raises ValueError: unknown name, with the closest match suggested.
    """
    return by_name(ROBOTS, name, 'robot')


def preset_robot(preset: str) -> RobotPolicy:
    """
    Return the robot policy the preset ``preset`` names.

    :raises ValueError: an unknown preset (with a suggestion).
    """
    return get_robot(get_preset(preset).robot)


__all__ = ['ROBOTS', 'RobotPolicy', 'TEST_ARM', 'get_robot', 'preset_robot']
