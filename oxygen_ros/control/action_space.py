"""
Action chunks in robot units → commands a controller can trust (pure numpy, no ROS).

What a chunk's numbers mean depends on the policy (``config.ActionSpace``):

- ``JOINT_POSITION``: point ``i`` is where the joints should be at ``i * dt``.
- ``JOINT_VELOCITY`` (DROID): ``v_i = scale * a_i`` is applied for one ``dt``. The command
  carries the positions the velocities integrate to from the observed joint state ``q``,
  ``p_0 = q``, ``p_{i+1} = p_i + v_i dt``, together with the velocities, so that a
  position-controlled arm follows them (point ``i`` at ``i * dt``: position ``p_i``, velocity
  ``v_i``; the convention of a ``JointTrajectory`` point). DROID's actions are normalized
  velocities: its controller moves ``0.2 a`` rad per 15 Hz step (``RobotIKSolver``
  ``max_joint_delta``), so ``scale = 0.2 * 15 = 3.0`` rad/s.
- ``EE_DELTA`` (LIBERO): per-step end-effector deltas, translation and axis-angle rotation,
  scaled to SI units (m, rad) by the controller's scale (robosuite's ``OSC_POSE`` maps its
  input range [-1, 1] to at most 0.05 m and 0.5 rad per step).

Gripper dims (``RobotPolicy.gripper_dims``) are positions (or commands) in every space.

Limits clip every chunk before it leaves the node, and every clipped value is counted:

- position limits ``[lower, upper]``: joint positions (integrated ones included, stepping
  stops at the bound and the velocity of that step becomes what reaches it), gripper
  positions, and for ``EE_DELTA`` the raw action values (the controller's input range);
- velocity limits ``v_max``: joint velocities, the whole arm's velocity of a step scaled down
  until every ``|v_ij| <= v_max_j`` (direction kept, as DROID's controller normalizes); for
  positions (joint and
  gripper) the step between consecutive points, the first one from the observed state when
  the state has that joint: ``|p_i - p_{i-1}| <= v_max dt``; for ``EE_DELTA`` the speed of
  the scaled deltas ``|delta| / dt``. Position limits win where both cannot hold (a robot
  observed outside its own position limits).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import math
from typing import Sequence

import numpy as np

from oxygen_ros.config import ActionSpace, EE_DELTA_DIMS, is_ee_delta_layout
from oxygen_ros.control.limits import JointLimits


@dataclass(frozen=True, slots=True)
class ClipCount:
    """
    Values of one chunk moved onto a limit.

    :ivar position: values clipped to a position limit.
    :ivar velocity: values clipped to a velocity limit (speeds or steps).
    :ivar dims: the action dims clipped, ascending.
    """

    position: int = 0
    velocity: int = 0
    dims: tuple[int, ...] = ()

    @property
    def total(self) -> int:
        return self.position + self.velocity


@dataclass(frozen=True, slots=True)
class JointCommand:
    """
    A chunk as joint-space points (``JointTrajectory``).

    :ivar positions: ``float64 [H, A]`` rad or m.
    :ivar velocities: ``float64 [H, A]`` rad/s or m/s (joint-velocity policies), else None.
    """

    positions: np.ndarray
    velocities: np.ndarray | None
    clips: ClipCount = field(default_factory=ClipCount)


@dataclass(frozen=True, slots=True)
class EeDeltaCommand:
    """
    A chunk as per-step end-effector deltas (``MultiDOFJointTrajectory``) plus grippers.

    :ivar translations: ``float64 [H, 3]`` m, delta of step i in the controller's frame.
    :ivar rotations: ``float64 [H, 3]`` rad, axis-angle delta of step i.
    :ivar grippers: ``float64 [H, G]`` the gripper dims, unscaled.
    """

    translations: np.ndarray
    rotations: np.ndarray
    grippers: np.ndarray
    clips: ClipCount = field(default_factory=ClipCount)


class _Clipper:
    """Clips arrays in place and counts what it moved."""

    def __init__(self) -> None:
        self.position = 0
        self.velocity = 0
        self.dims: set[int] = set()

    def clip(self, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, dims: np.ndarray,
             kind: str) -> np.ndarray:
        out = np.clip(x, lo, hi)
        moved = out != x
        n = int(moved.sum())
        if n:
            setattr(self, kind, getattr(self, kind) + n)
            self.dims.update(int(d) for d in dims[moved.reshape(-1, dims.size).any(axis=0)])
        return out

    def count(self) -> ClipCount:
        return ClipCount(self.position, self.velocity, tuple(sorted(self.dims)))


class ActionSemantics:
    """
    Turns robot-unit action chunks into clipped commands of one action space.

    :param space: what the action dims mean.
    :param num_dims: ``A``, the robot action dims.
    :param gripper_dims: dims that are gripper positions or commands in every space.
    :param limits: per-dim limits (:class:`JointLimits`); None clips nothing.
    :param action_dt: seconds between points, ``> 0``.
    :param state_index: for each action dim, its index in the observed state vector, or -1
        when the state does not have it (default: dim ``i`` is state ``i``).
    :param ee_scale: ``(m, rad)`` per unit of an ``EE_DELTA`` translation / rotation value.
    :param velocity_scale: rad/s (or m/s) per unit of a ``JOINT_VELOCITY`` action value.
    :raises ValueError: a joint-velocity dim without a state index (nothing to integrate
        from), an ``EE_DELTA`` layout that does not fit ``num_dims``, or inconsistent sizes.
    """

    def __init__(self, space: ActionSpace, num_dims: int, gripper_dims: Sequence[int] = (),
                 limits: JointLimits | None = None, action_dt: float = 0.1,
                 state_index: Sequence[int] | None = None,
                 ee_scale: tuple[float, float] = (1.0, 1.0),
                 velocity_scale: float = 1.0) -> None:
        self.space = ActionSpace(space)
        self.num_dims = int(num_dims)
        self.gripper_dims = tuple(sorted(int(d) for d in gripper_dims))
        self.limits = limits if limits is not None else JointLimits.unlimited(num_dims)
        if self.limits.num_dims != num_dims:
            raise ValueError(f'limits have {self.limits.num_dims} dims, the actions {num_dims}')
        self._lower, self._upper, self._vmax = self.limits.arrays()
        if not (math.isfinite(action_dt) and action_dt > 0):
            raise ValueError(f'action_dt must be a positive number of seconds, got {action_dt}')
        self.action_dt = float(action_dt)
        if not (math.isfinite(velocity_scale) and velocity_scale > 0):
            raise ValueError(f'velocity_scale must be a positive number, got {velocity_scale}')
        self.velocity_scale = float(velocity_scale)
        index = list(range(num_dims)) if state_index is None else [int(i) for i in state_index]
        if len(index) != num_dims:
            raise ValueError(f'state_index has {len(index)} entries for {num_dims} action dims')
        self.state_index = np.array(index, dtype=np.int64)
        if not all(0 <= d < num_dims for d in self.gripper_dims):
            raise ValueError(f'gripper dims {self.gripper_dims} not in 0..{num_dims - 1}')
        grip = np.zeros(num_dims, dtype=bool)
        grip[list(self.gripper_dims)] = True
        self._grip = grip
        if self.space is ActionSpace.JOINT_VELOCITY:
            orphans = np.flatnonzero(~grip & (self.state_index < 0))
            if orphans.size:
                raise ValueError(f'joint-velocity action dims {orphans.tolist()} have no joint '
                                 f'in the observed state to integrate from')
        if self.space is ActionSpace.EE_DELTA:
            if not is_ee_delta_layout(num_dims, self.gripper_dims):
                raise ValueError(f'ee_delta actions are {EE_DELTA_DIMS} delta dims followed by '
                                 f'the grippers; got {num_dims} dims, grippers '
                                 f'{self.gripper_dims}')
            scale = np.array(ee_scale, dtype=np.float64)
            if scale.shape != (2,) or not np.all(np.isfinite(scale) & (scale > 0)):
                raise ValueError(f'ee_scale must be two positive numbers, got {ee_scale}')
            self.ee_scale = (float(scale[0]), float(scale[1]))
        else:
            self.ee_scale = (1.0, 1.0)

    def command(self, actions: np.ndarray,
                state: np.ndarray | None = None) -> JointCommand | EeDeltaCommand:
        """
        Return the clipped command of one chunk.

        :param actions: ``float [H, A]`` robot units (``ActionChunk.actions``).
        :param state: ``float [S]`` the observed state the chunk starts from
            (``ActionChunk.state``); required for ``JOINT_VELOCITY``.
        :raises ValueError: wrong shape, NaN/Inf in the actions or the state entries used,
            or no state for a joint-velocity chunk.
        """
        a = np.array(actions, dtype=np.float64)
        if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] != self.num_dims:
            raise ValueError(f'actions must be [H, {self.num_dims}] with H >= 1, got {a.shape}')
        if not np.isfinite(a).all():
            raise ValueError('actions hold NaN/Inf')
        start = self._start(state)
        clipper = _Clipper()
        if self.space is ActionSpace.EE_DELTA:
            return self._ee_delta(a, clipper)
        positions = a.copy()
        velocities = None
        arm = ~self._grip
        if self.space is ActionSpace.JOINT_VELOCITY:
            velocities = np.zeros_like(a)
            positions[:, arm], velocities[:, arm] = self._integrate(
                a[:, arm], start[arm], np.flatnonzero(arm), clipper)
            direct = self._grip
        else:
            direct = np.ones(self.num_dims, dtype=bool)
        dims = np.flatnonzero(direct)
        if dims.size:
            positions[:, dims] = self._positions(a[:, dims], start[dims], dims, clipper)
            if velocities is not None:
                velocities[:-1, dims] = np.diff(positions[:, dims], axis=0) / self.action_dt
        return JointCommand(positions, velocities, clipper.count())

    # -- pieces -------------------------------------------------------------------------------
    def _start(self, state: np.ndarray | None) -> np.ndarray:
        """Return the observed position of each action dim (NaN where unknown)."""
        out = np.full(self.num_dims, np.nan)
        if state is None:
            if self.space is ActionSpace.JOINT_VELOCITY:
                raise ValueError('a joint-velocity chunk needs the observed state')
            return out
        s = np.asarray(state, dtype=np.float64)
        known = self.state_index >= 0
        if known.any() and (s.ndim != 1 or self.state_index[known].max() >= s.size):
            raise ValueError(f'state of shape {s.shape} lacks index '
                             f'{int(self.state_index.max())}')
        out[known] = s[self.state_index[known]]
        needed = ~self._grip if self.space is ActionSpace.JOINT_VELOCITY else known
        if not np.isfinite(out[needed]).all():
            raise ValueError('the observed state holds NaN/Inf')
        return out

    def _positions(self, p: np.ndarray, start: np.ndarray, dims: np.ndarray,
                   clipper: _Clipper) -> np.ndarray:
        """Clip positions to bounds, then rate-limit steps (from ``start`` where known)."""
        lo, hi = self._lower[dims], self._upper[dims]
        p = clipper.clip(p, lo, hi, dims, 'position')
        max_step = self._vmax[dims] * self.action_dt
        if not np.isfinite(max_step).any():
            return p
        out = np.empty_like(p)
        prev = np.where(np.isfinite(start), start, p[0])  # unknown start: no first step
        for i in range(p.shape[0]):
            limited = clipper.clip(p[i] - prev, -max_step, max_step, dims, 'velocity')
            # position limits win over a far-out start
            out[i] = prev = np.clip(prev + limited, lo, hi)
        return out

    def _integrate(self, v: np.ndarray, start: np.ndarray, dims: np.ndarray,
                   clipper: _Clipper) -> tuple[np.ndarray, np.ndarray]:
        """Return positions and velocities of velocity dims, both clipped."""
        vmax = self._vmax[dims]
        v = v * self.velocity_scale
        over = np.abs(v) > vmax
        if over.any():
            clipper.velocity += int(over.sum())
            clipper.dims.update(int(d) for d in dims[over.any(axis=0)])
            factor = np.max(np.abs(v) / vmax, axis=1, keepdims=True)
            v = v / np.maximum(factor, 1.0)
        lo, hi = self._lower[dims], self._upper[dims]
        dt = self.action_dt
        positions = np.empty_like(v)
        velocities = v.copy()
        p = start.copy()
        for i in range(v.shape[0]):
            positions[i] = p
            target = p + v[i] * dt
            reached = clipper.clip(target, np.minimum(lo, p), np.maximum(hi, p), dims,
                                   'position')
            velocities[i] = (reached - p) / dt
            p = reached
        return positions, velocities

    def _ee_delta(self, a: np.ndarray, clipper: _Clipper) -> EeDeltaCommand:
        dims = np.arange(self.num_dims)
        raw = clipper.clip(a, self._lower, self._upper, dims, 'position')
        scale = np.array([self.ee_scale[0]] * 3 + [self.ee_scale[1]] * 3)
        delta = raw[:, :EE_DELTA_DIMS] * scale
        ee = dims[:EE_DELTA_DIMS]
        max_delta = self._vmax[ee] * self.action_dt
        delta = clipper.clip(delta, -max_delta, max_delta, ee, 'velocity')
        grip = np.array(self.gripper_dims, dtype=np.int64)
        grippers = self._positions(raw[:, grip], np.full(grip.size, np.nan), grip, clipper) \
            if grip.size else np.zeros((a.shape[0], 0))
        return EeDeltaCommand(delta[:, :3], delta[:, 3:], grippers, clipper.count())


__all__ = ['ActionSemantics', 'ClipCount', 'EeDeltaCommand', 'JointCommand', 'JointLimits']
