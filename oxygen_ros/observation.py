"""
The robot-side observation handed from the ROS layer to the engine (numpy only).

Mirrors openpi's observation dict before transforms (``models/model.py``): raw camera images,
the raw (unnormalized) robot state and the task prompt, plus the stamp of the images so that
the action chunk can carry it (``header.stamp`` of ``~/action_chunk``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np


@dataclass(frozen=True, slots=True)
class Observation:
    """
    One complete observation of the robot.

    :ivar images: camera slot name (``config.CAMERA_SLOTS``) -> image, ``uint8 [h, w, 3]`` RGB
        or ``float32 [h, w, 3]`` in [-1, 1]. Any size; resized with padding by preprocessing.
        An image the engine prepared when it arrived (``Engine.prepare_image``, an
        ``transforms.inputs.CameraImage``) is taken as it is. A slot of the preset that is absent
        here is a missing camera.
    :ivar state: ``float32 [state_dim]`` robot state in robot units (REP-103 SI: rad, m).
    :ivar prompt: the task instruction.
    :ivar stamp_ns: acquisition time of the images in nanoseconds (ROS time).
    """

    images: Mapping[str, object]
    state: np.ndarray
    prompt: str
    stamp_ns: int = 0
    metadata: Mapping[str, object] = field(default_factory=dict)
