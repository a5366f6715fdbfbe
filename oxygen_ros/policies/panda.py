"""
The simulated Franka Panda's robot policy (``sim/``; the ``small`` and ``demo`` presets).

Two cameras (``base_0_rgb``, ``left_wrist_0_rgb``), the 7 joint positions and the gripper (8
state and action dims), joint positions out: DROID's layout with absolute actions, no
transforms beyond (un)normalization. Its presets run random weights (no checkpoint was trained
for it).
"""

from __future__ import annotations

from oxygen_ros.config import ActionSpace, CAMERA_SLOTS, PromptFormat
from oxygen_ros.policies.base import RobotPolicy

PANDA = RobotPolicy(name='panda', cameras=CAMERA_SLOTS[:2], state_dim=8, robot_action_dim=8,
                    action_space=ActionSpace.JOINT_POSITION, gripper_dims=(7,),
                    prompt_format=PromptFormat.PI05_STATE)
"""A Panda: 7 joint positions and the gripper."""

__all__ = ['PANDA']
