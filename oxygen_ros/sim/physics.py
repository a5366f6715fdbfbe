"""
Physics of the simulated Panda: position servos in, joint positions out, fixed time steps.

Menagerie's Panda has position servos (``ctrl`` = joint angle target, rad) on ``joint1`` ..
``joint7`` and one actuator on the fingers' tendon with ``ctrl`` in [0, 255], where 255 opens
the fingers (0.04 m each) and 0 closes them. The gripper here is one number in [0, 1],
0 open and 1 closed (DROID's convention): ``ctrl = 255 * (1 - gripper)``, and the measured
gripper position is ``1 - mean(finger opening) / 0.04``.

Time is an integer count of physics steps (``time_ns = steps * timestep_ns``), so sim time never
drifts through float sums.
"""

from __future__ import annotations

import mujoco
import numpy as np

from oxygen_ros.sim.scene import ARM_JOINTS, FINGER_JOINTS, HOME_KEY, PANDA_PREFIX
from oxygen_ros.units import NS_PER_S

FINGER_OPEN_M = 0.04
"""Finger joint position when open (Menagerie ``hand``: range 0 .. 0.04 m)."""
GRIPPER_CTRL_OPEN = 255.0


def gripper_to_ctrl(gripper: float) -> float:
    """Return the tendon actuator ``ctrl`` (0 .. 255) of a gripper command (0 open, 1 closed)."""
    return GRIPPER_CTRL_OPEN * (1.0 - min(max(float(gripper), 0.0), 1.0))


class PandaPhysics:
    """
    The scene's ``MjData`` stepped in fixed steps from the ``home`` keyframe.

    :param model: the compiled scene (``scene.build_model``).
    :raises KeyError: the model lacks the Panda's joints, actuators or home keyframe.
    """

    def __init__(self, model: mujoco.MjModel) -> None:
        self.model = model
        self.data = mujoco.MjData(model)
        self.timestep_ns = round(model.opt.timestep * NS_PER_S)
        self._arm_qpos = np.array([model.joint(PANDA_PREFIX + j).qposadr[0] for j in ARM_JOINTS])
        self._arm_dof = np.array([model.joint(PANDA_PREFIX + j).dofadr[0] for j in ARM_JOINTS])
        self._finger_qpos = np.array([model.joint(PANDA_PREFIX + j).qposadr[0]
                                      for j in FINGER_JOINTS])
        self._finger_dof = np.array([model.joint(PANDA_PREFIX + j).dofadr[0]
                                     for j in FINGER_JOINTS])
        self._arm_act = np.array([model.actuator(f'{PANDA_PREFIX}actuator{i}').id
                                  for i in range(1, 8)])
        self._gripper_act = model.actuator(f'{PANDA_PREFIX}actuator8').id
        self._ctrl_range = model.actuator_ctrlrange[self._arm_act].copy()
        self._home = model.key(PANDA_PREFIX + HOME_KEY).id
        self.steps = 0
        self.reset()

    def reset(self) -> None:
        """Go to the ``home`` keyframe (arm pose and servo targets), time 0."""
        mujoco.mj_resetDataKeyframe(self.model, self.data, self._home)
        mujoco.mj_forward(self.model, self.data)
        self.steps = 0

    @property
    def time_ns(self) -> int:
        """Sim time since reset in integer ns."""
        return self.steps * self.timestep_ns

    @property
    def arm_lower(self) -> np.ndarray:
        """``float64 [7]`` joint range lower bounds (rad) from the model."""
        return self.model.jnt_range[[self.model.joint(PANDA_PREFIX + j).id
                                     for j in ARM_JOINTS], 0].copy()

    @property
    def arm_upper(self) -> np.ndarray:
        """``float64 [7]`` joint range upper bounds (rad) from the model."""
        return self.model.jnt_range[[self.model.joint(PANDA_PREFIX + j).id
                                     for j in ARM_JOINTS], 1].copy()

    def set_command(self, arm_positions: np.ndarray, gripper: float) -> None:
        """
        Set the servo targets.

        :param arm_positions: ``[7]`` joint angle targets (rad), clipped to the servos'
            ``ctrlrange`` (the joint ranges).
        :param gripper: 0 open .. 1 closed (clipped).
        """
        lo, hi = self._ctrl_range[:, 0], self._ctrl_range[:, 1]
        self.data.ctrl[self._arm_act] = np.clip(np.asarray(arm_positions, dtype=float), lo, hi)
        self.data.ctrl[self._gripper_act] = gripper_to_ctrl(gripper)

    def step(self, num_steps: int = 1) -> None:
        """Advance ``num_steps`` physics steps."""
        mujoco.mj_step(self.model, self.data, nstep=num_steps)
        self.steps += num_steps

    def arm_positions(self) -> np.ndarray:
        """``float64 [7]`` measured joint angles (rad)."""
        return self.data.qpos[self._arm_qpos].copy()

    def arm_velocities(self) -> np.ndarray:
        """``float64 [7]`` measured joint velocities (rad/s)."""
        return self.data.qvel[self._arm_dof].copy()

    def finger_positions(self) -> np.ndarray:
        """``float64 [2]`` finger openings (m), 0 closed .. 0.04 open."""
        return self.data.qpos[self._finger_qpos].copy()

    def finger_velocities(self) -> np.ndarray:
        """``float64 [2]`` finger velocities (m/s)."""
        return self.data.qvel[self._finger_dof].copy()

    def gripper_position(self) -> float:
        """Return the measured gripper position, 0 open .. 1 closed."""
        opening = float(self.finger_positions().mean()) / FINGER_OPEN_M
        return min(max(1.0 - opening, 0.0), 1.0)


__all__ = ['FINGER_OPEN_M', 'PandaPhysics', 'gripper_to_ctrl']
