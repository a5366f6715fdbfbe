"""
Position and velocity limits of a robot's joints (or action dims), one value per dim.

The node clips every chunk to them before publishing (``action_space``); an executor refuses
chunks beyond them (``chunk_executor``). REP-103 units: rad, m, rad/s, m/s (a gripper: its own
unit). ``-inf`` / ``+inf`` mean no limit.
"""

from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np


@dataclass(frozen=True, slots=True)
class JointLimits:
    """
    Per-dim limits of an action chunk, in robot units (REP-103: rad, m, rad/s, m/s).

    Stored as tuples (hashable, comparable); ``arrays()`` gives them as numpy arrays.

    :ivar lower: lowest position per dim; ``-inf`` = none.
    :ivar upper: highest position per dim; ``+inf`` = none.
    :ivar velocity: largest speed per dim, ``> 0``; ``+inf`` = none.
    :raises ValueError: lengths differ, NaN, ``lower > upper`` or a speed ``<= 0``.
    """

    lower: tuple[float, ...]
    upper: tuple[float, ...]
    velocity: tuple[float, ...]

    def __post_init__(self) -> None:
        arrays = []
        for name in ('lower', 'upper', 'velocity'):
            arr = np.array(getattr(self, name), dtype=np.float64)
            if arr.ndim != 1:
                raise ValueError(f'{name} limits must be a 1-D list, got shape {arr.shape}')
            if np.isnan(arr).any():
                raise ValueError(f'{name} limits hold NaN: {arr.tolist()}')
            object.__setattr__(self, name, tuple(arr.tolist()))
            arrays.append(arr)
        lower, upper, velocity = arrays
        if not lower.shape == upper.shape == velocity.shape:
            raise ValueError(f'limits must have one value per action dim, got {lower.size} '
                             f'lower, {upper.size} upper, {velocity.size} velocity')
        bad = np.flatnonzero(lower > upper)
        if bad.size:
            raise ValueError(f'lower > upper position limit at dims {bad.tolist()}')
        bad = np.flatnonzero(velocity <= 0)
        if bad.size:
            raise ValueError(f'velocity limits must be > 0, got {velocity[bad].tolist()} '
                             f'at dims {bad.tolist()}')

    @classmethod
    def unlimited(cls, num_dims: int) -> JointLimits:
        """Return limits that clip nothing."""
        return cls((-math.inf,) * num_dims, (math.inf,) * num_dims, (math.inf,) * num_dims)

    @property
    def num_dims(self) -> int:
        return len(self.lower)

    def check(self, num_dims: int) -> None:
        """
        Check that there is one limit per dim.

        :raises ValueError: another number of values.
        """
        if self.num_dims != num_dims:
            raise ValueError(f'limits must be {num_dims} numbers each, got {self.num_dims}')

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return ``(lower, upper, velocity)`` as ``float64 [A]`` arrays."""
        return (np.array(self.lower), np.array(self.upper), np.array(self.velocity))


__all__ = ['JointLimits']
