"""
A robot policy: one robot family's conventions around the network (openpi ``policies/``).

openpi wraps the model between a robot's ``<Robot>Inputs`` and ``<Robot>Outputs`` transforms
(``src/openpi/policies/droid_policy.py``, ``libero_policy.py``, ``aloha_policy.py``): which
camera feeds which image slot, how many state and action dims the robot has, what the actions
mean, and for some robots a change of numbers before normalization and after unnormalization
(``transforms.py``: ``DeltaActions``/``AbsoluteActions``). A ``RobotPolicy`` holds a family's
data and those transforms; the family's module gives one (``droid.py``, ``libero.py``,
``aloha.py``, ``panda.py``), and a preset names it (``config.Preset.robot``). Quantile
(un)normalization itself is ``transforms/normalize.py``'s, around these transforms.

Pure numpy (no torch, no ROS).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from oxygen_ros.config import ActionSpace, CAMERA_SLOTS, is_ee_delta_layout, PromptFormat


@dataclass(frozen=True, slots=True)
class RobotPolicy:
    """
    A robot family's data, and its state and action transforms (here: none, pass-through).

    :ivar name: the family (``droid``, ``libero``, ``aloha``, ...).
    :ivar cameras: the image slots the robot's cameras feed (``CAMERA_SLOTS`` names); the
        other slots are masked and never encoded.
    :ivar state_dim: robot state dims before padding to the model's ``action_dim`` (in the
        prompt if ``PI05_STATE``).
    :ivar robot_action_dim: action dims kept after unnormalizing (openpi's ``<Robot>Outputs``).
    :ivar action_space: what the robot-unit action dims mean.
    :ivar gripper_dims: action dims that are gripper positions (or commands) in every space.
    :ivar prompt_format: the action prompt's format.
    :raises ValueError: cameras that are no non-empty subset of ``CAMERA_SLOTS``, a dim < 1,
        gripper dims out of range or repeated, or an ``ee_delta`` layout that does not fit.
    """

    name: str
    cameras: tuple[str, ...]
    state_dim: int
    robot_action_dim: int
    action_space: ActionSpace
    gripper_dims: tuple[int, ...]
    prompt_format: PromptFormat

    def __post_init__(self) -> None:
        unknown = set(self.cameras) - set(CAMERA_SLOTS)
        if unknown or not self.cameras:
            raise ValueError(f'robot {self.name!r}: cameras must be a non-empty subset of '
                             f'{CAMERA_SLOTS}, got {self.cameras}')
        for attr in ('state_dim', 'robot_action_dim'):
            if getattr(self, attr) < 1:
                raise ValueError(f'robot {self.name!r}: {attr} must be >= 1, got '
                                 f'{getattr(self, attr)}')
        if len(set(self.gripper_dims)) != len(self.gripper_dims) or \
                not all(0 <= d < self.robot_action_dim for d in self.gripper_dims):
            raise ValueError(f'robot {self.name!r}: gripper_dims {self.gripper_dims} must be '
                             f'distinct dims in 0..{self.robot_action_dim - 1}')
        if self.action_space is ActionSpace.EE_DELTA and \
                not is_ee_delta_layout(self.robot_action_dim, self.gripper_dims):
            raise ValueError(f'robot {self.name!r}: ee_delta actions are 3 translation + 3 '
                             f'rotation dims followed by the gripper dims, got '
                             f'robot_action_dim {self.robot_action_dim}, gripper_dims '
                             f'{self.gripper_dims}')

    def with_cameras(self, cameras: Sequence[str]) -> RobotPolicy:
        """Return a copy fed by ``cameras`` (a subset of the slots; validated again)."""
        return replace(self, cameras=tuple(cameras))

    @property
    def relative_actions(self) -> bool:
        """Return whether some action dims are predicted relative to the frame's state."""
        return False

    def state_to_model(self, state: np.ndarray) -> np.ndarray:
        """
        Return the robot state in the model's convention, before normalization.

        :param state: ``float [state_dim]`` in robot units.
        :returns: ``float64 [state_dim]`` (a copy).
        """
        return np.array(state, dtype=np.float64)

    def actions_to_robot(self, actions: np.ndarray,
                         model_state: np.ndarray | None) -> np.ndarray:
        """
        Return unnormalized model actions in robot units.

        :param actions: ``float [..., H, robot_action_dim]`` after ``Unnormalize``.
        :param model_state: ``float [state_dim]``, the frame's state from
            :meth:`state_to_model` (used where :attr:`relative_actions`).
        :returns: ``float64 [..., H, robot_action_dim]``.
        """
        return np.asarray(actions, dtype=np.float64)

    def actions_to_model(self, actions: np.ndarray,
                         model_state: np.ndarray | None) -> np.ndarray:
        """
        Return robot-unit actions as the model would output them, before ``Unnormalize``.

        The inverse of :meth:`actions_to_robot` for a given state (how a previous chunk is
        re-anchored on a new frame's state for real-time chunking).

        :param actions: ``float [..., H, robot_action_dim]`` in robot units.
        :param model_state: as :meth:`actions_to_robot`'s.
        :returns: ``float64 [..., H, robot_action_dim]`` (a copy).
        """
        return np.array(actions, dtype=np.float64)


TEST_ARM = RobotPolicy(name='test_arm', cameras=CAMERA_SLOTS[:2], state_dim=8, robot_action_dim=7,
                       action_space=ActionSpace.JOINT_POSITION, gripper_dims=(),
                       prompt_format=PromptFormat.PI05_STATE)
"""The tests' robot (preset ``tiny``): two cameras, 8 state dims, 7 joint positions, no
gripper; made up, like the preset's sizes."""


__all__ = ['RobotPolicy', 'TEST_ARM']
