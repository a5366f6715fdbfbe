"""
Per-dim statistics of state and actions, and openpi's ``norm_stats.json``.

``docs/checkpoints.md#norm-stats-and-the-prompt-per-family``; openpi
``src/openpi/shared/normalize.py``.

openpi writes ``<ckpt>/assets/<asset_id>/norm_stats.json`` =
``{"norm_stats": {"state": {"mean", "std", "q01", "q99"}, "actions": {...}}}``. LeRobot keeps
the same numbers (plus ``min``/``max`` and more quantiles) in its processor files
(``lerobot_processors.py``); both end up in :class:`NormStats`.

Stats are kept in **float64**, as openpi does (its JSON loader yields float64 arrays, so a
float32 state is normalized in float64): the state bins of the prompt
(``prompt.discretize_state``) then match openpi even for values on a bin edge.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
import json
import os
from pathlib import Path
import tempfile
from typing import Mapping

import numpy as np

NORM_STATS_FILENAME = 'norm_stats.json'
REQUIRED_KEYS = ('state', 'actions')
OPENPI_FIELDS = ('mean', 'std', 'q01', 'q99')
"""The fields of an openpi ``norm_stats.json`` entry (openpi ``shared/normalize.NormStats``)."""
FILE_NAMES = {'minimum': 'min', 'maximum': 'max'}
"""Field -> name in the files (LeRobot's ``min``/``max``; the others are spelt alike)."""
_ORDERED = (('q01', 'q99'), ('q10', 'q90'), ('minimum', 'maximum'))


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
    Per-dim statistics of one quantity (openpi ``NormStats``; LeRobot's dataset stats).

    Every field is optional (None); those given are converted to ``float64 [D]`` arrays of
    one length D. Which ones a normalization needs depends on its mode
    (``normalize.NormMode``): openpi's π0.5 uses ``q01``/``q99``.

    :ivar mean: mean.
    :ivar std: standard deviation, >= 0.
    :ivar q01: 1st percentile.
    :ivar q99: 99th percentile, >= q01.
    :ivar minimum: minimum (LeRobot ``min``).
    :ivar maximum: maximum (LeRobot ``max``), >= minimum.
    :ivar q10: 10th percentile (LeRobot ``QUANTILE10``).
    :ivar q90: 90th percentile, >= q10.
    :raises ValueError: no field given, not 1-D lists of numbers, different lengths, NaN/Inf,
        std < 0 or an upper statistic below its lower one (the message lists the dims).
    """

    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    q01: np.ndarray | None = None
    q99: np.ndarray | None = None
    minimum: np.ndarray | None = None
    maximum: np.ndarray | None = None
    q10: np.ndarray | None = None
    q90: np.ndarray | None = None

    def __post_init__(self) -> None:
        for field in self.present():
            object.__setattr__(self, field, _vector(getattr(self, field), field))
        lengths = {field: getattr(self, field).shape[0] for field in self.present()}
        if not lengths:
            raise ValueError('norm stats need at least one of ' +
                             ', '.join(f.name for f in fields(self)))
        if len(set(lengths.values())) != 1:
            raise ValueError(f'{"/".join(lengths)} must have the same length, got {lengths}')
        if self.std is not None:
            bad = np.flatnonzero(self.std < 0)
            if bad.size:
                raise ValueError(f'std < 0 at dims {bad.tolist()}')
        for low, high in _ORDERED:
            lo, hi = getattr(self, low), getattr(self, high)
            if lo is None or hi is None:
                continue
            bad = np.flatnonzero(hi < lo)
            if bad.size:
                raise ValueError(f'{high} < {low} at dims {bad.tolist()} ({low}='
                                 f'{lo[bad].tolist()}, {high}={hi[bad].tolist()})')

    def present(self) -> tuple[str, ...]:
        """Return the names of the fields that are given, in declaration order."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name) is not None)

    @property
    def dim(self) -> int:
        return int(getattr(self, self.present()[0]).shape[0])

    def to_json(self) -> dict[str, list[float]]:
        """Return the JSON object of the given fields (file names: ``min``, ``max``)."""
        return {FILE_NAMES.get(field, field): [float(v) for v in getattr(self, field)]
                for field in self.present()}


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


def openpi_norm_stats_file(folder: Path, asset_id: str) -> Path:
    """Return where an openpi checkpoint ``folder`` keeps the stats of ``asset_id``."""
    return folder / 'assets' / asset_id / NORM_STATS_FILENAME


def known_asset_ids(folder: Path) -> list[str]:
    """Return the asset ids under ``<folder>/assets`` that hold a ``norm_stats.json``."""
    assets = folder / 'assets'
    if not assets.is_dir():
        return []
    return sorted(str(f.parent.relative_to(assets)) for f in assets.rglob(NORM_STATS_FILENAME))


def _resolve(path: Path, asset_id: str | None) -> Path:
    """Return the norm_stats.json that ``path`` (+ ``asset_id``) names."""
    if path.is_file():
        return path
    if not path.exists():
        raise FileNotFoundError(f'norm stats: no such file or directory: {path}')
    candidate = (openpi_norm_stats_file(path, asset_id) if asset_id
                 else path / NORM_STATS_FILENAME)
    if candidate.is_file():
        return candidate
    known = known_asset_ids(path)
    hint = (f'asset ids with norm stats in {path / "assets"}: {", ".join(known)}' if known
            else f'{path / "assets"} holds no {NORM_STATS_FILENAME}')
    what = f'asset id {asset_id!r}' if asset_id else 'no asset id given'
    raise FileNotFoundError(f'norm stats not found: {candidate} ({what}); {hint}')


def load_norm_stats(path: str | Path, asset_id: str | None = None) -> dict[str, NormStats]:
    """
    Read an openpi ``norm_stats.json``.

    :param path: the JSON file itself, a folder holding ``norm_stats.json``, or a checkpoint
        folder together with ``asset_id`` (reads ``<path>/assets/<asset_id>/norm_stats.json``).
    :param asset_id: e.g. ``droid``, ``physical-intelligence/libero`` (``docs/model.md#presets``).
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
            raise ValueError(f'{where} must be an object with {list(OPENPI_FIELDS)}')
        absent = [field for field in OPENPI_FIELDS if entry.get(field) is None]
        if absent:
            raise ValueError(f'{where} lacks {absent} (quantile normalization of π0.5 needs '
                             f'q01 and q99; got fields {sorted(entry)})')
        try:
            stats[key] = NormStats(**{field: entry[field] for field in OPENPI_FIELDS})
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
        file = openpi_norm_stats_file(base, asset_id)
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


__all__ = [
    'NORM_STATS_FILENAME', 'NormStats', 'identity_norm_stats', 'known_asset_ids',
    'load_norm_stats', 'openpi_norm_stats_file', 'save_norm_stats',
]
