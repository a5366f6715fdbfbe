"""
Normalization of state and actions.

``docs/model.md#preprocessing``; openpi ``src/openpi/shared/normalize.py``, LeRobot
``src/lerobot/processor/normalize_processor.py``.

π0.5 normalizes with the 1st/99th percentiles (openpi ``transforms.Normalize`` with
``use_quantiles=True``)::

    x_n = (x - q01) / (q99 - q01 + 1e-6) * 2 - 1
    x = (x_n + 1) / 2 * (q99 - q01 + 1e-6) + q01

on the first ``len(q01)`` dims of the last axis; further (padded) dims pass through. LeRobot
checkpoints name a mode per feature type in ``normalization_mapping`` (:class:`NormMode`) and
use their own formulas (``_NormalizationMixin._apply_transform``): quantiles without the
``+ 1e-6`` (a zero range is replaced by ``eps`` = 1e-8), ``MEAN_STD`` = ``(x - mean) / (std +
eps)`` with the inverse ``x * std + mean``, ``MIN_MAX`` like quantiles on min/max,
``IDENTITY``. :class:`QuantityNorm` holds one quantity's mode, stats and epsilons; the
quantile epsilon is 1e-6 for openpi and 0 for LeRobot.

Everything is computed in **float64** (openpi's stats are float64; see ``norm_stats.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
import enum
from typing import Mapping

import numpy as np

from oxygen_ros.config import ModelConfig
from oxygen_ros.policies import RobotPolicy
from oxygen_ros.transforms.norm_stats import identity_norm_stats, NormStats, REQUIRED_KEYS

QUANTILE_EPS = 1e-6
"""Added to q99 - q01 by openpi (``_normalize_quantile``); LeRobot adds nothing."""
LEROBOT_EPS = 1e-8
"""LeRobot's ``eps``: replaces a zero range, added to ``std`` (``NormalizerProcessorStep``)."""


class NormMode(str, enum.Enum):
    """How one quantity is normalized (LeRobot ``NormalizationMode`` names)."""

    QUANTILES = 'QUANTILES'
    """``(x - q01) / (q99 - q01 + quantile_eps) * 2 - 1`` (π0.5: openpi and LeRobot)."""
    QUANTILE10 = 'QUANTILE10'
    """The same on q10/q90."""
    MEAN_STD = 'MEAN_STD'
    """``(x - mean) / (std + eps)``; inverse ``x * std + mean`` (LeRobot's LIBERO recipe)."""
    MIN_MAX = 'MIN_MAX'
    """``(x - min) / (max - min) * 2 - 1``."""
    IDENTITY = 'IDENTITY'
    """No change."""


_BOUNDS = {NormMode.QUANTILES: ('q01', 'q99'), NormMode.QUANTILE10: ('q10', 'q90'),
           NormMode.MIN_MAX: ('minimum', 'maximum'), NormMode.MEAN_STD: ('mean', 'std')}


@dataclass(frozen=True, slots=True)
class QuantityNorm:
    """
    The normalization of one quantity (state or actions): mode, stats and epsilons.

    :ivar stats: the statistics; None only for ``IDENTITY``.
    :ivar mode: see :class:`NormMode`.
    :ivar quantile_eps: added to the range of ``QUANTILES``/``QUANTILE10`` (openpi 1e-6,
        LeRobot 0).
    :ivar eps: replaces a range that is exactly 0 (``QUANTILES``, ``QUANTILE10``,
        ``MIN_MAX``) and is added to ``std`` (``MEAN_STD``), as LeRobot does.
    :raises ValueError: the stats lack the fields the mode needs, or an epsilon < 0.
    """

    stats: NormStats | None
    mode: NormMode = NormMode.QUANTILES
    quantile_eps: float = QUANTILE_EPS
    eps: float = LEROBOT_EPS

    def __post_init__(self) -> None:
        object.__setattr__(self, 'mode', NormMode(self.mode))
        if self.quantile_eps < 0 or self.eps < 0:
            raise ValueError(f'epsilons must be >= 0, got quantile_eps {self.quantile_eps}, '
                             f'eps {self.eps}')
        if self.mode is NormMode.IDENTITY:
            return
        needed = _BOUNDS[self.mode]
        have = self.stats.present() if self.stats is not None else ()
        missing = [f for f in needed if f not in have]
        if missing:
            raise ValueError(f'{self.mode.value} normalization needs {list(needed)}, the stats '
                             f'lack {missing} (they have {list(have)})')

    @property
    def dim(self) -> int | None:
        """Return the dims the stats cover (None for ``IDENTITY`` without stats)."""
        return None if self.stats is None else self.stats.dim

    def _prepare(self, x: np.ndarray) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
        """Return a float64 copy of ``x``, the dims d to map and their ``(offset, range)``."""
        out = _as_array(x)
        if self.mode is NormMode.IDENTITY:
            return out, 0, np.zeros(0), np.zeros(0)
        d = min(self.stats.dim, out.shape[-1])
        return (out, d, *self._terms(d))

    def _terms(self, d: int) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(offset, range)`` of the first ``d`` dims (``x_n = (x - offset) / range``)."""
        low, high = (getattr(self.stats, f)[:d] for f in _BOUNDS[self.mode])
        if self.mode is NormMode.MEAN_STD:
            return low, high
        span = high - low
        if self.mode is not NormMode.MIN_MAX:
            span = span + self.quantile_eps
        return low, np.where(span == 0, self.eps, span)

    def normalize(self, x: np.ndarray) -> np.ndarray:
        """
        Map robot units to model units on the first ``min(dim, D)`` dims; the others pass.

        Values outside the stats' range map outside [-1, 1] (no clipping).

        :param x: ``float [..., D]``.
        :returns: ``float64 [..., D]`` (a new array).
        :raises ValueError: ``x`` is a scalar.
        """
        out, d, offset, span = self._prepare(x)
        if self.mode is NormMode.IDENTITY:
            return out
        if self.mode is NormMode.MEAN_STD:
            out[..., :d] = (out[..., :d] - offset) / (span + self.eps)
        else:
            out[..., :d] = (out[..., :d] - offset) / span * 2.0 - 1.0
        return out

    def unnormalize(self, x: np.ndarray) -> np.ndarray:
        """
        Map model units back to robot units (inverse of :meth:`normalize`).

        LeRobot's ``MEAN_STD`` inverse has no ``eps``: ``x * std + mean``.

        :param x: ``float [..., D]``.
        :returns: ``float64 [..., D]`` (a new array).
        :raises ValueError: ``x`` is a scalar.
        """
        out, d, offset, span = self._prepare(x)
        if self.mode is NormMode.IDENTITY:
            return out
        if self.mode is NormMode.MEAN_STD:
            out[..., :d] = out[..., :d] * span + offset
        else:
            out[..., :d] = (out[..., :d] + 1.0) / 2.0 * span + offset
        return out


def _chunk(actions: np.ndarray, dim: int, what: str) -> np.ndarray:
    """Return ``actions`` as float64 ``[..., H, dim]``; raise on another shape or NaN/Inf."""
    x = np.asarray(actions, dtype=np.float64)
    if x.ndim < 2 or x.shape[-1] != dim:
        raise ValueError(f'actions must have shape [..., H, {dim}], got {x.shape}')
    if not np.all(np.isfinite(x)):
        raise ValueError(f'{what} actions contain {int((~np.isfinite(x)).sum())} NaN/Inf '
                         f'values')
    return x


def _as_array(x: np.ndarray) -> np.ndarray:
    arr = np.array(x, dtype=np.float64)
    if arr.ndim == 0:
        raise ValueError('x must have at least one axis, got a scalar')
    return arr


def normalize_quantile(x: np.ndarray, stats: NormStats) -> np.ndarray:
    """
    Map robot units to the model's [-1, 1] range as openpi (``_normalize_quantile``).

    :param x: ``float [..., D]``; dims past ``stats.dim`` pass through.
    :returns: ``float64 [..., D]``.
    :raises ValueError: ``x`` is a scalar, or the stats lack q01/q99.
    """
    return QuantityNorm(stats).normalize(x)


def unnormalize_quantile(x: np.ndarray, stats: NormStats) -> np.ndarray:
    """
    Inverse of :func:`normalize_quantile` (openpi ``_unnormalize_quantile``).

    :returns: ``float64 [..., D]``.
    :raises ValueError: ``x`` is a scalar, or the stats lack q01/q99.
    """
    return QuantityNorm(stats).unnormalize(x)


def pad_to(x: np.ndarray, dim: int) -> np.ndarray:
    """
    Zero-pad the last axis of ``x`` to ``dim`` (openpi ``pad_to_dim``); dtype is kept.

    :raises ValueError: ``x`` is a scalar or already longer than ``dim``.
    """
    arr = np.asarray(x)
    if arr.ndim == 0:
        raise ValueError('cannot pad a scalar')
    if arr.shape[-1] > dim:
        raise ValueError(f'cannot pad last axis of size {arr.shape[-1]} down to {dim}')
    if arr.shape[-1] == dim:
        return arr
    pad = [(0, 0)] * (arr.ndim - 1) + [(0, dim - arr.shape[-1])]
    return np.pad(arr, pad)


@dataclass(frozen=True, slots=True)
class Normalizer:
    """
    State → model inputs and model actions → robot units for one robot and network.

    openpi ``src/openpi/transforms.py`` ``Normalize`` / ``Unnormalize``, between the robot
    policy's input and output transforms (``<Robot>Inputs`` before ``Normalize``,
    ``Unnormalize`` before ``<Robot>Outputs``); ``docs/model.md#preprocessing``.

    :ivar state: normalization of the robot state (stats ``dim`` >= ``state_dim``).
    :ivar actions: of the actions (stats ``dim`` >= ``robot_action_dim``).
    :ivar robot: the robot policy: its dims and its transforms around (un)normalization.
    :ivar action_dim: the model's padded dim A (32).
    :raises ValueError: stats shorter than the robot dims, or dims out of range.
    """

    state: QuantityNorm
    actions: QuantityNorm
    robot: RobotPolicy
    action_dim: int

    @property
    def state_dim(self) -> int:
        """Return the robot state dims (before padding)."""
        return self.robot.state_dim

    @property
    def robot_action_dim(self) -> int:
        """Return the action dims sent to the robot."""
        return self.robot.robot_action_dim

    def __post_init__(self) -> None:
        if not 0 < self.state_dim <= self.action_dim:
            raise ValueError(f'state_dim {self.state_dim} not in 1..{self.action_dim}')
        if not 0 < self.robot_action_dim <= self.action_dim:
            raise ValueError(f'robot_action_dim {self.robot_action_dim} not in '
                             f'1..{self.action_dim}')
        if self.state.dim is not None and self.state.dim < self.state_dim:
            raise ValueError(f'state norm stats have {self.state.dim} dims, the robot state '
                             f'has {self.state_dim}: wrong asset id?')
        if self.actions.dim is None:
            return
        if self.actions.dim < self.robot_action_dim:
            raise ValueError(f'action norm stats have {self.actions.dim} dims, the robot '
                             f'takes {self.robot_action_dim}: wrong asset id?')
        if self.actions.dim > self.action_dim:
            raise ValueError(f'action norm stats have {self.actions.dim} dims, more than the '
                             f'model action dim {self.action_dim}')

    @classmethod
    def from_config(cls, cfg: ModelConfig, robot: RobotPolicy,
                    stats: Mapping[str, NormStats | QuantityNorm]) -> Normalizer:
        """
        Build from a network, its robot policy and loaded stats.

        :param stats: ``state`` and ``actions``: :class:`NormStats` (openpi's quantile
            normalization, ``load_norm_stats``) or :class:`QuantityNorm` (any mode, e.g. read
            from LeRobot's processor files).
        :raises ValueError: ``state``/``actions`` missing, too short for the robot, or stats
            without the fields of their mode.
        """
        missing = [key for key in REQUIRED_KEYS if key not in stats]
        if missing:
            raise ValueError(f'norm stats lack {missing}; have {sorted(stats)}')
        norms = {key: stats[key] if isinstance(stats[key], QuantityNorm) else
                 QuantityNorm(stats[key]) for key in REQUIRED_KEYS}
        return cls(state=norms['state'], actions=norms['actions'], robot=robot,
                   action_dim=cfg.action_dim)

    @classmethod
    def identity(cls, cfg: ModelConfig, robot: RobotPolicy) -> Normalizer:
        """Return a normalizer with :func:`identity_norm_stats` (random-weight presets)."""
        return cls(state=QuantityNorm(identity_norm_stats(robot.state_dim)),
                   actions=QuantityNorm(identity_norm_stats(robot.robot_action_dim)),
                   robot=robot, action_dim=cfg.action_dim)

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        """
        Return the normalized, unpadded state (for ``prompt.discretize_state``).

        The robot policy's input transform comes first (openpi: ``<Robot>Inputs`` before
        ``Normalize``).

        :param state: ``float [state_dim]`` in robot units.
        :returns: ``float64 [state_dim]``.
        :raises ValueError: wrong shape or NaN/Inf.
        """
        x = np.asarray(state, dtype=np.float64)
        if x.shape != (self.state_dim,):
            raise ValueError(f'state must have shape ({self.state_dim},), got {x.shape}')
        if not np.all(np.isfinite(x)):
            bad = np.flatnonzero(~np.isfinite(x)).tolist()
            raise ValueError(f'state has NaN/Inf at dims {bad}')
        return self.state.normalize(self.robot.state_to_model(x))

    def state_to_model(self, state: np.ndarray) -> np.ndarray:
        """
        Return the normalized state zero-padded to the model's action dim.

        :param state: ``float [state_dim]`` in robot units.
        :returns: ``float32 [action_dim]``.
        :raises ValueError: see :meth:`normalize_state`.
        """
        return pad_to(self.normalize_state(state), self.action_dim).astype(np.float32)

    def actions_to_robot(self, actions: np.ndarray,
                         state: np.ndarray | None = None) -> np.ndarray:
        """
        Unnormalize model actions, keep the robot's dims, apply the robot's output transform.

        openpi's output pipeline: ``Unnormalize`` → (``AbsoluteActions``) → ``<Robot>Outputs``.

        :param actions: ``float [..., H, action_dim]`` model output (normalized, padded).
        :param state: ``float [state_dim]`` the frame's robot state in robot units; required
            by robots whose actions are relative to it (ALOHA).
        :returns: ``float64 [..., H, robot_action_dim]`` in robot units.
        :raises ValueError: last axis != ``action_dim``, NaN/Inf in the actions, or a state
            missing or of the wrong shape where the robot needs one.
        """
        x = _chunk(actions, self.action_dim, 'model')
        robot = self.actions.unnormalize(x)[..., :self.robot_action_dim]
        return self.robot.actions_to_robot(robot, self._model_state(state))

    def _model_state(self, state: np.ndarray | None) -> np.ndarray | None:
        """Return the frame state in the model's convention where actions are relative to it."""
        if not self.robot.relative_actions:
            return None
        if state is None or np.shape(state) != (self.state_dim,):
            raise ValueError(f'the {self.robot.name} robot needs the frame state of shape '
                             f'({self.state_dim},), got '
                             f'{None if state is None else np.shape(state)}')
        return self.robot.state_to_model(state)

    @property
    def relative_actions(self) -> bool:
        """Return whether some action dims are predicted relative to the frame's state."""
        return self.robot.relative_actions

    def actions_to_model(self, actions: np.ndarray,
                         state: np.ndarray | None = None) -> np.ndarray:
        """
        Return robot-unit actions in normalized model units (``actions_to_robot`` inverted).

        The robot's dims only; relative to ``state`` where the robot's actions are relative
        to a state.

        Real-time chunking keeps the previous chunk in robot units (absolute) and re-expresses
        it against the new frame's state with this (strands-labs/robots#779,
        huggingface/lerobot#3453: a relative chunk guided in the old frame is off by the
        state's change).

        :param actions: ``float [..., H, robot_action_dim]`` in robot units.
        :param state: ``float [state_dim]`` robot units; required by relative robots.
        :returns: ``float64 [..., H, robot_action_dim]`` normalized (not padded).
        :raises ValueError: last axis != ``robot_action_dim``, NaN/Inf, or a state missing
            or of the wrong shape where the robot needs one.
        """
        x = _chunk(actions, self.robot_action_dim, 'robot')
        x = self.robot.actions_to_model(x, self._model_state(state))
        return self.actions.normalize(x)


__all__ = [
    'LEROBOT_EPS', 'NormMode', 'Normalizer', 'QUANTILE_EPS', 'QuantityNorm',
    'normalize_quantile', 'pad_to', 'unnormalize_quantile',
]
