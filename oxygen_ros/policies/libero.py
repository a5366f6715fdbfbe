"""
LIBERO's robot policy (openpi ``src/openpi/policies/libero_policy.py``).

``LiberoInputs``: the agent-view image feeds ``base_0_rgb``, the wrist image
``left_wrist_0_rgb``; the state is the end effector's position, axis-angle orientation and the
two gripper joints (8 dims). ``LiberoOutputs`` keeps the first 7 action dims: robosuite
``OSC_POSE`` end-effector deltas (translation, axis-angle rotation) and the gripper command.
openpi's ``pi05_libero`` prompts with the task only (no state in the prompt).
"""

from __future__ import annotations

from oxygen_ros.config import ActionSpace, CAMERA_SLOTS, PromptFormat
from oxygen_ros.policies.base import RobotPolicy

LIBERO = RobotPolicy(name='libero', cameras=CAMERA_SLOTS[:2], state_dim=8, robot_action_dim=7,
                     action_space=ActionSpace.EE_DELTA, gripper_dims=(6,),
                     prompt_format=PromptFormat.PI0)
"""LIBERO's Panda in robosuite: 6 end-effector deltas and the gripper (``pi05_libero``)."""

__all__ = ['LIBERO']
