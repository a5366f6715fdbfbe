"""
Robot-specific state and action transforms around (un)normalization (openpi ``policies/``).

openpi wraps the model between a robot's ``<Robot>Inputs`` / ``<Robot>Outputs`` transforms
(``src/openpi/policies/*_policy.py``) and, for some data configs, ``DeltaActions`` /
``AbsoluteActions`` (``src/openpi/transforms.py``). DROID and LIBERO only repack dicts and keep
the first robot dims, which ``Normalizer`` already does; ALOHA (``pi05_base`` with the
``trossen`` norm stats, openpi's ``pi05_aloha`` config) also changes numbers:

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

import numpy as np

from oxygen_ros.config import RobotAdapter

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


def has_relative_actions(adapter: RobotAdapter) -> bool:
    """Return whether some of the adapter's action dims are predicted relative to the state."""
    return adapter is RobotAdapter.ALOHA


def state_to_model(adapter: RobotAdapter, state: np.ndarray) -> np.ndarray:
    """
    Return the robot state in the model's convention, before normalization.

    :param state: ``float [state_dim]`` in robot units.
    :returns: ``float64 [state_dim]`` (a copy).
    """
    x = np.array(state, dtype=np.float64)
    if adapter is RobotAdapter.ALOHA:
        x = ALOHA_JOINT_FLIP * x
        x[list(ALOHA_GRIPPER_DIMS)] = aloha_gripper_to_angular(x[list(ALOHA_GRIPPER_DIMS)])
    return x


def actions_to_robot(adapter: RobotAdapter, actions: np.ndarray,
                     model_state: np.ndarray | None) -> np.ndarray:
    """
    Return unnormalized model actions in robot units.

    :param actions: ``float [..., H, robot_action_dim]`` after ``Unnormalize``.
    :param model_state: ``float [state_dim]`` the frame's state from :func:`state_to_model`
        (required for ALOHA, whose arm joints are predicted relative to it).
    :returns: ``float64 [..., H, robot_action_dim]`` (a copy).
    :raises ValueError: ALOHA without a state.
    """
    a = np.array(actions, dtype=np.float64)
    if adapter is RobotAdapter.ALOHA:
        if model_state is None:
            raise ValueError('ALOHA actions are relative to the state: pass the frame state')
        a[..., ALOHA_DELTA_MASK] += np.asarray(model_state, dtype=np.float64)[ALOHA_DELTA_MASK]
        a = ALOHA_JOINT_FLIP * a
        a[..., list(ALOHA_GRIPPER_DIMS)] = aloha_gripper_from_angular(
            a[..., list(ALOHA_GRIPPER_DIMS)])
    return a


def actions_to_model(adapter: RobotAdapter, actions: np.ndarray,
                     model_state: np.ndarray | None) -> np.ndarray:
    """
    Return robot-unit actions as the model would output them, before ``Unnormalize``.

    The inverse of :func:`actions_to_robot` for a given state: ALOHA's gripper map and joint
    flips undone, then the state subtracted from the arm joints (the actions re-expressed
    relative to ``model_state``, which may be another frame's than the one they were made
    from: how a previous chunk is re-anchored for real-time chunking).

    :param actions: ``float [..., H, robot_action_dim]`` in robot units.
    :param model_state: ``float [state_dim]`` from :func:`state_to_model` (required for ALOHA).
    :returns: ``float64 [..., H, robot_action_dim]`` (a copy).
    :raises ValueError: ALOHA without a state.
    """
    a = np.array(actions, dtype=np.float64)
    if adapter is RobotAdapter.ALOHA:
        if model_state is None:
            raise ValueError('ALOHA actions are relative to the state: pass the frame state')
        grippers = list(ALOHA_GRIPPER_DIMS)
        a[..., grippers] = aloha_gripper_to_model_action(a[..., grippers])
        a = ALOHA_JOINT_FLIP * a
        a[..., ALOHA_DELTA_MASK] -= np.asarray(model_state, dtype=np.float64)[ALOHA_DELTA_MASK]
    return a


__all__ = ['ALOHA_DELTA_MASK', 'ALOHA_GRIPPER_DIMS', 'ALOHA_JOINT_FLIP', 'actions_to_model',
           'actions_to_robot', 'aloha_gripper_from_angular', 'aloha_gripper_to_angular',
           'aloha_gripper_to_model_action', 'has_relative_actions', 'state_to_model']
