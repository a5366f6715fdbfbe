"""
DROID's robot policy (openpi ``src/openpi/policies/droid_policy.py``).

``DroidInputs``: the exterior camera feeds ``base_0_rgb``, the wrist camera
``left_wrist_0_rgb`` (the right wrist slot is masked); the state is the 7 joint positions and
the gripper position (8 dims). ``DroidOutputs`` keeps the first 8 action dims: joint
velocities (rad/s, applied for one ``action_dt`` each) and the gripper position. Neither
changes numbers beyond (un)normalization.
"""

from __future__ import annotations

from oxygen_ros.config import ActionSpace, CAMERA_SLOTS, PromptFormat
from oxygen_ros.policies.base import RobotPolicy

DROID = RobotPolicy(name='droid', cameras=CAMERA_SLOTS[:2], state_dim=8, robot_action_dim=8,
                    action_space=ActionSpace.JOINT_VELOCITY, gripper_dims=(7,),
                    prompt_format=PromptFormat.PI05_STATE)
"""DROID's Franka: 7 joint velocities and the gripper (``pi05_droid``)."""

__all__ = ['DROID']
