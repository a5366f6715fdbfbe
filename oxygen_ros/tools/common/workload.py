"""
Deterministic observations from real photographs bundled in scikit-image.

``coffee.png`` (a cup on a table) is the base camera; the ``stereo_motorcycle`` pair gives
the wrist cameras. Frame i shows a crop shifted by a few pixels per frame so that no two
frames are identical, and the joint state follows smooth sinusoids (rad).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from oxygen_ros.config import CAMERA_SLOTS
from oxygen_ros.engine import Observation
from oxygen_ros.units import NS_PER_S

DEFAULT_INSTRUCTION = 'pick up the coffee cup and put it on the plate'


@lru_cache(maxsize=1)
def _photos() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from skimage import data
    left, right, _ = data.stereo_motorcycle()
    return data.coffee(), left, right


def camera_image(slot: str, frame: int, *, crop: float = 0.9) -> np.ndarray:
    """
    Return ``uint8 [h, w, 3]`` RGB of camera ``slot`` at ``frame``: a drifting crop.

    :raises ValueError: unknown slot.
    """
    if slot not in CAMERA_SLOTS:
        raise ValueError(f'unknown camera slot {slot!r}; known: {CAMERA_SLOTS}')
    photo = _photos()[CAMERA_SLOTS.index(slot)]
    h, w = photo.shape[:2]
    ch, cw = int(h * crop), int(w * crop)
    span_y, span_x = h - ch, w - cw
    phase = 2 * np.pi * frame / 60.0
    y = int(round(span_y * (0.5 + 0.5 * np.sin(phase))))
    x = int(round(span_x * (0.5 + 0.5 * np.cos(phase))))
    return np.ascontiguousarray(photo[y:y + ch, x:x + cw, :3])


def joint_state(frame: int, dim: int, rate_hz: float = 15.0) -> np.ndarray:
    """Return ``float32 [dim]`` joint positions in rad: slow sinusoids, one phase per joint."""
    t = frame / rate_hz
    j = np.arange(dim, dtype=np.float64)
    return (0.6 * np.sin(0.5 * t + 0.7 * j) + 0.1 * j / max(dim, 1)).astype(np.float32)


def make_observation(frame: int, cameras: tuple[str, ...], state_dim: int, *,
                     instruction: str = DEFAULT_INSTRUCTION, rate_hz: float = 15.0
                     ) -> Observation:
    """Return the observation of ``frame`` for ``cameras`` (stamp = frame / rate_hz)."""
    images = {slot: camera_image(slot, frame) for slot in cameras}
    return Observation(images=images, state=joint_state(frame, state_dim, rate_hz),
                       prompt=instruction, stamp_ns=int(round(frame * NS_PER_S / rate_hz)))
