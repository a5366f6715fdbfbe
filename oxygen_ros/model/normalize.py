"""
Norm stats and quantile normalization of state and actions (spec §1.9).

π0.5 normalizes with the 1st/99th percentiles (openpi ``transforms.Normalize`` with
``use_quantiles=True``)::

    x_n = (x - q01) / (q99 - q01 + 1e-6) * 2 - 1
    x = (x_n + 1) / 2 * (q99 - q01 + 1e-6) + q01

on the first ``len(q01)`` dims of the last axis; further (padded) dims pass through.
Stats are read from ``<ckpt>/assets/<asset_id>/norm_stats.json`` in openpi's format
``{"norm_stats": {"state": {"mean", "std", "q01", "q99"}, "actions": {...}}}``.

Stats are kept and applied in **float64**, as openpi does (its JSON loader yields float64
arrays, so a float32 state is normalized in float64): the state bins of the prompt
(``prompt.discretize_state``) then match openpi even for values on a bin edge.
"""

from __future__ import annotations

from dataclasses import dataclass
import json
import logging
import os
from pathlib import Path
import tempfile
from typing import Mapping

import numpy as np

from oxygen_ros.config import ModelConfig, RobotAdapter
from oxygen_ros.model import robot_adapters

logger = logging.getLogger(__name__)

NORM_STATS_FILENAME = 'norm_stats.json'
QUANTILE_EPS = 1e-6
"""Added to q99 - q01 (openpi ``_normalize_quantile``)."""
REQUIRED_KEYS = ('state', 'actions')
_FIELDS = ('mean', 'std', 'q01', 'q99')


def _vector(value: object, field: str) -> np.ndarray:
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f'{field} must be a list of numbers, got {value!r:.80}') from None
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f'{field} must be a non-empty 1-D list, got shape {arr.shape}')
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise ValueError(f'{field} has NaN/Inf at dims {bad.tolist()}')
    return arr


@dataclass(frozen=True, slots=True)
class NormStats:
    """
    Per-dim statistics of one quantity (openpi ``shared/normalize.NormStats``).

    Fields are converted to ``float64 [D]`` arrays on construction.

    :ivar mean: mean (kept for the file format; π0.5 does not use it).
    :ivar std: standard deviation, >= 0 (idem).
    :ivar q01: 1st percentile.
    :ivar q99: 99th percentile, >= q01.
    :raises ValueError: not 1-D lists of numbers, different lengths, NaN/Inf, std < 0 or
        q99 < q01 (the message lists the dims).
    """

    mean: np.ndarray
    std: np.ndarray
    q01: np.ndarray
    q99: np.ndarray

    def __post_init__(self) -> None:
        for field in _FIELDS:
            object.__setattr__(self, field, _vector(getattr(self, field), field))
        lengths = {field: getattr(self, field).shape[0] for field in _FIELDS}
        if len(set(lengths.values())) != 1:
            raise ValueError(f'mean/std/q01/q99 must have the same length, got {lengths}')
        bad = np.flatnonzero(self.std < 0)
        if bad.size:
            raise ValueError(f'std < 0 at dims {bad.tolist()}')
        bad = np.flatnonzero(self.q99 < self.q01)
        if bad.size:
            raise ValueError(f'q99 < q01 at dims {bad.tolist()} (q01={self.q01[bad].tolist()}, '
                             f'q99={self.q99[bad].tolist()})')

    @property
    def dim(self) -> int:
        return int(self.q01.shape[0])

    def to_json(self) -> dict[str, list[float]]:
        """Return the openpi JSON object of these stats."""
        return {field: [float(v) for v in getattr(self, field)] for field in _FIELDS}


def identity_norm_stats(dim: int) -> NormStats:
    """
    Return stats that make quantile normalization (almost) the identity on [-1, 1].

    q01 = -1, q99 = 1, mean 0, std 1: ``x_n = (x + 1) / (2 + 1e-6) * 2 - 1``. For presets with
    random weights, which have no dataset.

    :raises ValueError: ``dim`` < 1.
    """
    if dim < 1:
        raise ValueError(f'dim must be >= 1, got {dim}')
    return NormStats(mean=np.zeros(dim), std=np.ones(dim), q01=-np.ones(dim), q99=np.ones(dim))


def _as_array(x: np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 0:
        raise ValueError(f'{what} must have at least one axis, got a scalar')
    return arr


def normalize_quantile(x: np.ndarray, stats: NormStats) -> np.ndarray:
    """
    Map robot units to the model's [-1, 1] range (spec §1.9; openpi ``_normalize_quantile``).

    Applied to the first ``min(stats.dim, x.shape[-1])`` dims of the last axis; the others
    pass through unchanged. Values outside [q01, q99] map outside [-1, 1] (no clipping).

    :param x: ``float [..., D]`` in robot units.
    :returns: ``float64 [..., D]``.
    :raises ValueError: ``x`` is a scalar.
    """
    out = _as_array(x, 'x').copy()
    d = min(stats.dim, out.shape[-1])
    q01, q99 = stats.q01[:d], stats.q99[:d]
    out[..., :d] = (out[..., :d] - q01) / (q99 - q01 + QUANTILE_EPS) * 2.0 - 1.0
    return out


def unnormalize_quantile(x: np.ndarray, stats: NormStats) -> np.ndarray:
    """
    Map model outputs back to robot units (spec §1.9; openpi ``_unnormalize_quantile``).

    Inverse of :func:`normalize_quantile` on the first ``min(stats.dim, x.shape[-1])`` dims;
    the others (e.g. the padding of a 32-d action) pass through unchanged.

    :param x: ``float [..., D]`` normalized values.
    :returns: ``float64 [..., D]``.
    :raises ValueError: ``x`` is a scalar.
    """
    out = _as_array(x, 'x').copy()
    d = min(stats.dim, out.shape[-1])
    q01, q99 = stats.q01[:d], stats.q99[:d]
    out[..., :d] = (out[..., :d] + 1.0) / 2.0 * (q99 - q01 + QUANTILE_EPS) + q01
    return out


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


def _resolve(path: Path, asset_id: str | None) -> Path:
    """Return the norm_stats.json that ``path`` (+ ``asset_id``) names."""
    if path.is_file():
        return path
    if not path.exists():
        raise FileNotFoundError(f'norm stats: no such file or directory: {path}')
    candidate = (path / 'assets' / asset_id / NORM_STATS_FILENAME if asset_id
                 else path / NORM_STATS_FILENAME)
    if candidate.is_file():
        return candidate
    assets = path / 'assets'
    known = sorted(str(f.parent.relative_to(assets)) for f in assets.rglob(NORM_STATS_FILENAME)
                   ) if assets.is_dir() else []
    hint = (f'asset ids with norm stats in {assets}: {", ".join(known)}' if known
            else f'{assets} holds no {NORM_STATS_FILENAME}')
    what = f'asset id {asset_id!r}' if asset_id else 'no asset id given'
    raise FileNotFoundError(f'norm stats not found: {candidate} ({what}); {hint}')


def load_norm_stats(path: str | Path, asset_id: str | None = None) -> dict[str, NormStats]:
    """
    Read an openpi ``norm_stats.json``.

    :param path: the JSON file itself, a folder holding ``norm_stats.json``, or a checkpoint
        folder together with ``asset_id`` (reads ``<path>/assets/<asset_id>/norm_stats.json``).
    :param asset_id: e.g. ``droid``, ``physical-intelligence/libero`` (spec §1.9).
    :returns: key (at least ``state`` and ``actions``) → stats.
    :raises FileNotFoundError: no such file; the message lists the asset ids that exist.
    :raises ValueError: malformed JSON, missing keys/fields, q01/q99 null (z-score-only stats
        of a π0 checkpoint), or invalid values (see :class:`NormStats`).
    """
    file = _resolve(Path(path).expanduser(), asset_id)
    try:
        data = json.loads(file.read_text(encoding='utf-8'))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f'{file}: malformed JSON ({exc})') from None
    if not isinstance(data, dict) or not isinstance(data.get('norm_stats'), dict):
        raise ValueError(f'{file}: expected {{"norm_stats": {{"state": ..., "actions": ...}}}} '
                         f'at the top level')
    entries = data['norm_stats']
    missing = [key for key in REQUIRED_KEYS if key not in entries]
    if missing:
        raise ValueError(f'{file}: norm_stats lacks {missing}; has {sorted(entries)}')
    stats: dict[str, NormStats] = {}
    for key, entry in entries.items():
        where = f'{file}: norm_stats[{key!r}]'
        if not isinstance(entry, dict):
            raise ValueError(f'{where} must be an object with {list(_FIELDS)}')
        absent = [field for field in _FIELDS if entry.get(field) is None]
        if absent:
            raise ValueError(f'{where} lacks {absent} (quantile normalization of π0.5 needs '
                             f'q01 and q99; got fields {sorted(entry)})')
        try:
            stats[key] = NormStats(**{field: entry[field] for field in _FIELDS})
        except ValueError as exc:
            raise ValueError(f'{where}: {exc}') from None
    return stats


def save_norm_stats(path: str | Path, stats: Mapping[str, NormStats],
                    asset_id: str | None = None) -> Path:
    """
    Write stats in openpi's ``norm_stats.json`` format, atomically.

    :param path: a ``*.json`` file, a folder (writes ``<path>/norm_stats.json``), or with
        ``asset_id`` a checkpoint folder (writes ``<path>/assets/<asset_id>/norm_stats.json``).
    :param stats: key → stats; values are written as float64 (exact round trip).
    :returns: the file written.
    :raises ValueError: empty ``stats`` or a value that is not a :class:`NormStats`.
    """
    if not stats:
        raise ValueError('no norm stats to save')
    for key, value in stats.items():
        if not isinstance(value, NormStats):
            raise ValueError(f'norm_stats[{key!r}] is {type(value).__name__}, not NormStats')
    base = Path(path).expanduser()
    if asset_id:
        file = base / 'assets' / asset_id / NORM_STATS_FILENAME
    elif base.suffix == '.json':
        file = base
    else:
        file = base / NORM_STATS_FILENAME
    text = json.dumps({'norm_stats': {k: v.to_json() for k, v in stats.items()}}, indent=2)
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f'.{file.name}.', suffix='.tmp')
    try:
        with os.fdopen(fd, 'w', encoding='utf-8') as f:
            f.write(text + '\n')
        os.replace(tmp, file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return file


@dataclass(frozen=True, slots=True)
class Normalizer:
    """
    State → model inputs and model actions → robot units for one preset (spec §1.9).

    :ivar state: stats of the robot state (``dim`` >= ``state_dim``).
    :ivar actions: stats of the actions (``dim`` >= ``robot_action_dim``).
    :ivar state_dim: robot state dims (before padding).
    :ivar robot_action_dim: action dims sent to the robot.
    :ivar action_dim: the model's padded dim A (32).
    :ivar adapter: the robot's transforms around (un)normalization (``robot_adapters``).
    :raises ValueError: stats shorter than the robot dims, or dims out of range.
    """

    state: NormStats
    actions: NormStats
    state_dim: int
    robot_action_dim: int
    action_dim: int = 32
    adapter: RobotAdapter = RobotAdapter.NONE

    def __post_init__(self) -> None:
        if not 0 < self.state_dim <= self.action_dim:
            raise ValueError(f'state_dim {self.state_dim} not in 1..{self.action_dim}')
        if not 0 < self.robot_action_dim <= self.action_dim:
            raise ValueError(f'robot_action_dim {self.robot_action_dim} not in '
                             f'1..{self.action_dim}')
        if self.state.dim < self.state_dim:
            raise ValueError(f'state norm stats have {self.state.dim} dims, the robot state '
                             f'has {self.state_dim}: wrong asset id?')
        if self.actions.dim < self.robot_action_dim:
            raise ValueError(f'action norm stats have {self.actions.dim} dims, the robot '
                             f'takes {self.robot_action_dim}: wrong asset id?')
        if self.actions.dim > self.action_dim:
            raise ValueError(f'action norm stats have {self.actions.dim} dims, more than the '
                             f'model action dim {self.action_dim}')

    @classmethod
    def from_config(cls, cfg: ModelConfig, stats: Mapping[str, NormStats]) -> Normalizer:
        """
        Build from a preset and loaded stats (``load_norm_stats``).

        :raises ValueError: ``state``/``actions`` missing or too short for the preset.
        """
        missing = [key for key in REQUIRED_KEYS if key not in stats]
        if missing:
            raise ValueError(f'norm stats lack {missing}; have {sorted(stats)}')
        return cls(state=stats['state'], actions=stats['actions'], state_dim=cfg.state_dim,
                   robot_action_dim=cfg.robot_action_dim, action_dim=cfg.action_dim,
                   adapter=cfg.robot_adapter)

    @classmethod
    def identity(cls, cfg: ModelConfig) -> Normalizer:
        """Return a normalizer with :func:`identity_norm_stats` (random-weight presets)."""
        return cls(state=identity_norm_stats(cfg.state_dim),
                   actions=identity_norm_stats(cfg.robot_action_dim), state_dim=cfg.state_dim,
                   robot_action_dim=cfg.robot_action_dim, action_dim=cfg.action_dim,
                   adapter=cfg.robot_adapter)

    def normalize_state(self, state: np.ndarray) -> np.ndarray:
        """
        Return the normalized, unpadded state (for ``prompt.discretize_state``).

        The robot adapter's input transform comes first (openpi: ``<Robot>Inputs`` before
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
        return normalize_quantile(robot_adapters.state_to_model(self.adapter, x), self.state)

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
        Unnormalize model actions, keep the robot's dims, apply the robot adapter.

        openpi's output pipeline: ``Unnormalize`` → (``AbsoluteActions``) → ``<Robot>Outputs``.

        :param actions: ``float [..., H, action_dim]`` model output (normalized, padded).
        :param state: ``float [state_dim]`` the frame's robot state in robot units; required
            by adapters whose actions are relative to it (ALOHA).
        :returns: ``float64 [..., H, robot_action_dim]`` in robot units.
        :raises ValueError: last axis != ``action_dim``, NaN/Inf in the actions, or a state
            missing or of the wrong shape where the adapter needs one.
        """
        x = np.asarray(actions, dtype=np.float64)
        if x.ndim < 2 or x.shape[-1] != self.action_dim:
            raise ValueError(f'actions must have shape [..., H, {self.action_dim}], '
                             f'got {x.shape}')
        if not np.all(np.isfinite(x)):
            raise ValueError(f'model actions contain {int((~np.isfinite(x)).sum())} NaN/Inf '
                             f'values')
        robot = unnormalize_quantile(x, self.actions)[..., :self.robot_action_dim]
        if self.adapter is RobotAdapter.NONE:
            return robot
        if state is None or np.shape(state) != (self.state_dim,):
            raise ValueError(f'the {self.adapter.value} adapter needs the frame state of shape '
                             f'({self.state_dim},), got '
                             f'{None if state is None else np.shape(state)}')
        model_state = robot_adapters.state_to_model(self.adapter, state)
        return robot_adapters.actions_to_robot(self.adapter, robot, model_state)


__all__ = [
    'NORM_STATS_FILENAME', 'NormStats', 'Normalizer', 'QUANTILE_EPS', 'identity_norm_stats',
    'load_norm_stats', 'normalize_quantile', 'pad_to', 'save_norm_stats',
    'unnormalize_quantile',
]
