"""
ALOHA's robot policy: openpi's ``policies/aloha_policy.py`` and its absolute actions.

Three cameras (``cam_high`` -> ``base_0_rgb``, the wrists -> ``left_wrist_0_rgb`` and
``right_wrist_0_rgb``), 14 state and action dims (two 6-joint arms, each with a gripper at dims
6 and 13), joint positions. Unlike DROID and LIBERO, whose ``<Robot>Inputs``/``Outputs`` only
repack dicts and keep the first robot dims (``Normalizer`` does that), ALOHA (``pi05_base``
with the ``trossen`` norm stats, openpi's ``pi05_aloha`` config) also changes numbers:

- state in (``AlohaInputs(adapt_to_pi=True)``): joints flipped by
  ``[1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1]``, the two grippers (dims 6 and 13) mapped
  from ALOHA's linear gripper space to π's normalized angular space;
- actions out: ``AbsoluteActions(make_bool_mask(6, -1, 6, -1))`` adds the (model-space) state
  to the 12 arm joints (the model predicts them relative to the state, grippers absolute),
  then ``AlohaOutputs(adapt_to_pi=True)`` flips the joints back and maps the grippers to
  ALOHA's joint range.

Pure numpy. The constants are those of openpi's ``aloha_policy.py`` (they come from the
ALOHA and Interbotix code: gripper open/closed positions, arm length and horn radius).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oxygen_ros.config import ActionSpace, CAMERA_SLOTS, PromptFormat
from oxygen_ros.policies.base import RobotPolicy

ALOHA_JOINT_FLIP = np.array([1, -1, -1, 1, 1, 1, 1, 1, -1, -1, 1, 1, 1, 1], dtype=np.float64)
"""Sign between ALOHA's and π's joint angles (openpi ``_joint_flip_mask``)."""
ALOHA_GRIPPER_DIMS = (6, 13)
ALOHA_DELTA_MASK = np.array([True] * 6 + [False] + [True] * 6 + [False])
"""Arm joints predicted relative to the state (openpi ``make_bool_mask(6, -1, 6, -1)``)."""

_LINEAR_OPEN, _LINEAR_CLOSED = 0.01844, 0.05800
"""ALOHA ``PUPPET_GRIPPER_POSITION_OPEN`` / ``_CLOSED`` (m)."""
_ARM_LENGTH, _HORN_RADIUS = 0.036, 0.022
"""Interbotix gripper linkage (m)."""
_ANGULAR_LO, _ANGULAR_HI = 0.5476, 1.6296
"""π's gripper range in rad (encoder counts 2405..3110 of 4096 around a zero of 2048)."""
_JOINT_OPEN, _JOINT_CLOSE = -0.6213, 1.4910
"""ALOHA ``PUPPET_GRIPPER_JOINT_OPEN`` / ``_CLOSE`` (rad)."""


def aloha_gripper_to_angular(value: np.ndarray) -> np.ndarray:
    """
    Map ALOHA's normalized linear gripper position to π's normalized angular one.

    ``x = lo + value (hi - lo)`` (m), angle ``= asin(clip((r² + x² - L²) / (2 r x), -1, 1))``
    (inverse of Interbotix's angular-to-linear map), then normalized to ``[0.5476, 1.6296]``
    rad. openpi ``aloha_policy._gripper_to_angular``.

    :param value: any shape, ALOHA's gripper position in [0, 1].
    :returns: float64, same shape.
    """
    x = _LINEAR_OPEN + np.asarray(value, dtype=np.float64) * (_LINEAR_CLOSED - _LINEAR_OPEN)
    ratio = (_HORN_RADIUS**2 + x**2 - _ARM_LENGTH**2) / (2 * _HORN_RADIUS * x)
    angle = np.arcsin(np.clip(ratio, -1.0, 1.0))
    return (angle - _ANGULAR_LO) / (_ANGULAR_HI - _ANGULAR_LO)


def aloha_gripper_from_angular(value: np.ndarray) -> np.ndarray:
    """
    Map π's gripper output to ALOHA's normalized gripper joint command.

    ``(value + 0.5476 - open) / (close - open)`` with ALOHA's joint open/close angles. Not the
    inverse of :func:`aloha_gripper_to_angular` (openpi ``_gripper_from_angular`` does not
    rescale: the trossen model's predictions are already in radians).

    :param value: any shape. :returns: float64, same shape.
    """
    x = np.asarray(value, dtype=np.float64) + _ANGULAR_LO
    return (x - _JOINT_OPEN) / (_JOINT_CLOSE - _JOINT_OPEN)


def aloha_gripper_to_model_action(value: np.ndarray) -> np.ndarray:
    """
    Return the inverse of :func:`aloha_gripper_from_angular`: π's gripper output.

    :param value: any shape, ALOHA's normalized gripper joint command.
    :returns: float64, same shape.
    """
    return np.asarray(value, dtype=np.float64) * (_JOINT_CLOSE - _JOINT_OPEN) + _JOINT_OPEN - \
        _ANGULAR_LO


@dataclass(frozen=True, slots=True)
class AlohaPolicy(RobotPolicy):
    """
    ALOHA's data and transforms (``AlohaInputs``/``AlohaOutputs`` with ``adapt_to_pi``).

    :raises ValueError: as ``RobotPolicy``, or other than 14 state and action dims.
    """

    def __post_init__(self) -> None:
        RobotPolicy.__post_init__(self)
        if self.state_dim != 14 or self.robot_action_dim != 14:
            raise ValueError(f'robot {self.name!r}: ALOHA needs 14 state and action dims, got '
                             f'{self.state_dim} and {self.robot_action_dim}')

    @property
    def relative_actions(self) -> bool:
        """Return True: the arm joints are predicted relative to the state."""
        return True

    def state_to_model(self, state: np.ndarray) -> np.ndarray:
        """
        Return the state flipped and its grippers mapped to π's angular space.

        :param state: ``float [14]`` in robot units.
        :returns: ``float64 [14]`` (a copy).
        """
        x = ALOHA_JOINT_FLIP * np.array(state, dtype=np.float64)
        x[list(ALOHA_GRIPPER_DIMS)] = aloha_gripper_to_angular(x[list(ALOHA_GRIPPER_DIMS)])
        return x

    def actions_to_robot(self, actions: np.ndarray,
                         model_state: np.ndarray | None) -> np.ndarray:
        """
        Return the arm joints made absolute, flipped back, the grippers mapped to ALOHA's range.

        :param actions: ``float [..., H, 14]`` after ``Unnormalize``.
        :param model_state: ``float [14]`` from :meth:`state_to_model` (required).
        :returns: ``float64 [..., H, 14]`` (a copy).
        :raises ValueError: no state.
        """
        a = np.array(actions, dtype=np.float64)
        a[..., ALOHA_DELTA_MASK] += _arm_state(model_state)
        a = ALOHA_JOINT_FLIP * a
        a[..., list(ALOHA_GRIPPER_DIMS)] = aloha_gripper_from_angular(
            a[..., list(ALOHA_GRIPPER_DIMS)])
        return a

    def actions_to_model(self, actions: np.ndarray,
                         model_state: np.ndarray | None) -> np.ndarray:
        """
        Return :meth:`actions_to_robot` undone: gripper map and flips undone, state subtracted.

        The actions are re-expressed relative to ``model_state``, which may be another frame's
        than the one they were made from (how a previous chunk is re-anchored for RTC).

        :param actions: ``float [..., H, 14]`` in robot units.
        :param model_state: ``float [14]`` from :meth:`state_to_model` (required).
        :returns: ``float64 [..., H, 14]`` (a copy).
        :raises ValueError: no state.
        """
        state = _arm_state(model_state)
        a = np.array(actions, dtype=np.float64)
        grippers = list(ALOHA_GRIPPER_DIMS)
        a[..., grippers] = aloha_gripper_to_model_action(a[..., grippers])
        a = ALOHA_JOINT_FLIP * a
        a[..., ALOHA_DELTA_MASK] -= state
        return a


def _arm_state(model_state: np.ndarray | None) -> np.ndarray:
    """Return the arm joints of a model-convention state (what the actions are relative to)."""
    if model_state is None:
        raise ValueError('ALOHA actions are relative to the state: pass the frame state')
    return np.asarray(model_state, dtype=np.float64)[ALOHA_DELTA_MASK]


ALOHA = AlohaPolicy(name='aloha', cameras=CAMERA_SLOTS, state_dim=14, robot_action_dim=14,
                    action_space=ActionSpace.JOINT_POSITION, gripper_dims=ALOHA_GRIPPER_DIMS,
                    prompt_format=PromptFormat.PI05_STATE)
"""ALOHA (openpi's ``pi05_aloha``, the ``pi05_base`` checkpoint's ``trossen`` assets)."""


__all__ = ['ALOHA', 'ALOHA_DELTA_MASK', 'ALOHA_GRIPPER_DIMS', 'ALOHA_JOINT_FLIP', 'AlohaPolicy',
           'aloha_gripper_from_angular', 'aloha_gripper_to_angular',
           'aloha_gripper_to_model_action']
