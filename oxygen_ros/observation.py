"""
The robot-side observation handed to the engine, and the one refusal of an input (numpy only).

Mirrors openpi's observation dict before transforms (``models/model.py``): raw camera images,
the raw (unnormalized) robot state and the task prompt, plus the stamp of the images so that
the action chunk can carry it (``header.stamp`` of ``~/action_chunk``).

An input that is not fit to act on is refused with one exception, ``ObservationError``, and
one reason (``RefusalReason``), whoever refuses it: the engine (a missing camera, a bad
image, state or prompt: ``transforms/inputs.py``) or the node (stale or out-of-order
messages, no instruction yet: ``ros/observation_cache.py``). The node counts each reason in
``/diagnostics`` under its own name (``ros/outcomes.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import enum
from typing import Mapping

import numpy as np


class RefusalReason(enum.Enum):
    """Why an observation was refused (one ``/diagnostics`` counter each)."""

    STALE = 'stale'
    """An input older than ``max_observation_age`` (or stamped in the future, or out of
    order): the node's check."""
    MISSING_CAMERA = 'missing_camera'
    BAD_IMAGE = 'bad_image'
    BAD_STATE = 'bad_state'
    """The robot state: missing, the wrong length, NaN/Inf (the node: its joint state)."""
    NO_INSTRUCTION = 'no_instruction'
    """No task instruction yet: the node's check (the engine refuses an empty prompt as
    ``BAD_PROMPT``)."""
    BAD_PROMPT = 'bad_prompt'


class ObservationError(ValueError):
    """
    An observation the engine or the node refuses to act on; nothing has changed then.

    :ivar reason: which kind of fault; the message details it (naming the camera, topic or
        joint).
    """

    def __init__(self, reason: RefusalReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


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


__all__ = ['Observation', 'ObservationError', 'RefusalReason']
