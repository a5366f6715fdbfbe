"""
The newest camera images, joint state and instruction, and the observation built from them.

Subscription callbacks store the newest message (with its receive time) under a lock; an
image is decoded and prepared for the engine right there (``Engine.prepare_image``: resized
on the host, or only checked where the device resizes it), off the control cycle, which calls
``assemble`` once per tick to check ages and contents and pick the prepared images. There
is no time synchronisation across topics beyond the age limit (``message_filters`` is not on
PyPI): every input must be younger than ``max_observation_age`` at the tick.

Ages are ``now - header.stamp`` on the node clock. A joint state stamped 0 (some drivers do
not stamp) is aged by its receive time instead; an image stamped 0 is stale, since the action
chunk carries the image stamp. A stamp more than ``max_observation_age`` in the future (clock
skew between machines) is refused as stale too. An image that arrives after one of the same
camera with a later stamp (out of order: two publishers, a replay restarted with old stamps, a
network path reordering) is refused while that later image is still within
``max_observation_age``: the node never acts on an older frame than one it has received, so
action chunk stamps never go backwards.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
import threading
from typing import Callable, Sequence

import numpy as np
from oxygen_ros.config import CAMERA_SLOTS, ModelConfig
from oxygen_ros.engine import Observation, ObservationError, RefusalReason
from oxygen_ros.policies import RobotPolicy
from oxygen_ros.ros.images.raw import ImageConversionError
from oxygen_ros.ros.images.transport import camera_image_to_rgb
from oxygen_ros.ros.input_limits import instruction_refusal
from oxygen_ros.ros.joint_states import joint_state_to_vector, JointStateError
from oxygen_ros.ros.stamps import stamp_to_ns
from oxygen_ros.units import NS_PER_S
from sensor_msgs.msg import CompressedImage, Image, JointState


_RECENT_STAMPS = 16
"""Images per camera whose stamps the out-of-order check remembers (~0.5 s at 30 Hz)."""


@dataclass(frozen=True, slots=True)
class Stamped:
    """A message as the cache keeps it."""

    msg: object
    received_ns: int
    """Node clock time when the callback stored it."""
    image: object = None
    """An image message decoded (and prepared) when it arrived."""
    error: str = ''
    """Why the image could not be decoded or prepared (refused at ``assemble``)."""


class ObservationCache:
    """
    Thread-safe newest-message store that assembles ``Observation`` objects.

    :param cameras: camera slots (``CAMERA_SLOTS`` names) an observation needs.
    :param joint_names: the robot state's joints, in model order.
    :param instruction: the initial task prompt ('' = none yet; one too long is refused as
        by ``set_instruction``).
    :param prepare_image: ``(slot, rgb uint8 [h, w, 3]) -> image`` applied when an image
        arrives (``Engine.prepare_image``); its ``ValueError`` refuses the image at
        ``assemble``. None: the decoded RGB array is kept.
    :raises ValueError: an unknown camera slot.
    """

    def __init__(self, cameras: Sequence[str], joint_names: Sequence[str],
                 instruction: str = '',
                 prepare_image: Callable[[str, np.ndarray], object] | None = None) -> None:
        unknown = sorted(set(cameras) - set(CAMERA_SLOTS))
        if unknown:
            raise ValueError(f'unknown camera slots {unknown}; known: {list(CAMERA_SLOTS)}')
        self.cameras = tuple(s for s in CAMERA_SLOTS if s in cameras)
        self.joint_names = tuple(joint_names)
        self._lock = threading.Lock()
        self._images: dict[str, Stamped] = {}
        self._recent_stamps_ns: dict[str, deque[int]] = {
            slot: deque(maxlen=_RECENT_STAMPS) for slot in self.cameras}
        """Per camera, the ``header.stamp`` of the last images received (out-of-order check)."""
        self._prepare = prepare_image
        self._joints: Stamped | None = None
        self._instruction = ''
        self._instruction_refusal: str | None = None
        self.set_instruction(instruction)

    def put_image(self, slot: str, msg: Image | CompressedImage, received_ns: int) -> None:
        """
        Decode and prepare ``msg`` (raw or compressed), keep it as the newest of ``slot``.

        Runs in the subscription's thread: the work is done before the control cycle needs
        the image. A bad image is kept with its error, refused at ``assemble``.
        """
        try:
            stamp = stamp_to_ns(msg.header.stamp)
        except ValueError:
            stamp = None  # refused at assemble with the reason
        image, error = None, ''
        try:
            image = camera_image_to_rgb(msg)
            if self._prepare is not None:
                image = self._prepare(slot, image)
        except (ImageConversionError, ValueError, TypeError) as exc:  # never crash on data
            image, error = None, str(exc)
            if not error.startswith(f'camera {slot}'):
                error = f'camera {slot}: {error}'
        with self._lock:
            self._images[slot] = Stamped(msg, received_ns, image, error)
            if stamp is not None and slot in self._recent_stamps_ns:
                self._recent_stamps_ns[slot].append(stamp)

    def put_joint_state(self, msg: JointState, received_ns: int) -> None:
        """Keep ``msg`` as the newest joint state."""
        with self._lock:
            self._joints = Stamped(msg, received_ns)

    def set_instruction(self, text: str) -> str | None:
        """
        Replace the task prompt.

        A refused one (``input_limits.instruction_refusal``: too long) replaces the previous
        one too: the node never goes on with an instruction the operator meant to replace, and
        refuses to act (bad prompt, with the reason) until a valid one arrives.

        :returns: why ``text`` is refused, or None.
        """
        reason = instruction_refusal(text)
        with self._lock:
            self._instruction = '' if reason else text
            self._instruction_refusal = reason
        return reason

    @property
    def instruction(self) -> str:
        with self._lock:
            return self._instruction

    def assemble(self, now_ns: int, max_age_s: float) -> Observation:
        """
        Build an observation from the newest inputs.

        Checks, in order: every camera has a message; image stamps are within
        ``max_age_s`` of ``now_ns`` and not older than an image of the same camera received
        before (while that one is within ``max_age_s``); images decoded and were prepared
        when they arrived (``images.transport.camera_image_to_rgb``: raw or JPEG/PNG); a
        joint state exists, is recent, and holds finite positions for every joint name; the
        instruction is not empty and was not refused.

        :param now_ns: node clock time of the control tick.
        :param max_age_s: ``max_observation_age`` in seconds.
        :returns: images per slot (``uint8 [h, w, 3]`` RGB, or as ``prepare_image`` made
            them), ``float32 [len(joint_names)]``
            state, the instruction; ``stamp_ns`` = the stamp of the first camera in
            ``CAMERA_SLOTS`` order (the base camera when used); ``metadata`` holds
            ``camera_stamps_ns`` and ``joint_state_stamp_ns``.
        :raises ObservationError: with the reason and a message naming the topic/camera.
        """
        with self._lock:
            images = dict(self._images)
            recent = {slot: tuple(ns) for slot, ns in self._recent_stamps_ns.items()}
            joints = self._joints
            instruction, refusal = self._instruction, self._instruction_refusal
        max_age_ns = round(max_age_s * NS_PER_S)
        missing = [slot for slot in self.cameras if slot not in images]
        if missing:
            raise ObservationError(RefusalReason.MISSING_CAMERA,
                                   f'no image received yet from camera(s) {missing}')
        stamps = {}
        for slot in self.cameras:
            stamps[slot] = _checked_age(slot, images[slot].msg, None, now_ns, max_age_ns)
            later = max((s for s in recent[slot] if abs(now_ns - s) <= max_age_ns),
                        default=stamps[slot])  # garbage stamps out of the window don't count
            if later > stamps[slot]:
                raise ObservationError(
                    RefusalReason.STALE, f'{slot} image stamped {stamps[slot]} ns arrived '
                    f'after one stamped {later} ns ({(later - stamps[slot]) / NS_PER_S:.3f} s '
                    f'later): out of order, not acting on the older frame')
        for slot in self.cameras:
            if images[slot].error:
                raise ObservationError(RefusalReason.BAD_IMAGE, images[slot].error)
        rgb = {slot: images[slot].image for slot in self.cameras}
        if joints is None:
            raise ObservationError(RefusalReason.BAD_STATE, 'no joint state received yet')
        joint_stamp = _checked_age('joint state', joints.msg, joints.received_ns, now_ns,
                                   max_age_ns)
        try:
            state = joint_state_to_vector(joints.msg, self.joint_names)
        except (JointStateError, ValueError, TypeError) as exc:
            raise ObservationError(RefusalReason.BAD_STATE, str(exc)) from None
        if refusal is not None:
            raise ObservationError(RefusalReason.BAD_PROMPT, f'instruction refused: {refusal}')
        if not instruction.strip():
            raise ObservationError(RefusalReason.NO_INSTRUCTION,
                                   'no instruction yet (publish ~/instruction or set the '
                                   'instruction parameter)')
        return Observation(images=rgb, state=state, prompt=instruction,
                           stamp_ns=stamps[self.cameras[0]],
                           metadata={'camera_stamps_ns': stamps,
                                     'joint_state_stamp_ns': joint_stamp})


def synthetic_observation(model: ModelConfig, robot: RobotPolicy,
                          instruction: str = '') -> Observation:
    """Return an observation of the robot's shapes (black images, zero state) for warm-up."""
    size = model.vision.image_size
    images = {slot: np.zeros((size, size, 3), dtype=np.uint8) for slot in robot.cameras}
    return Observation(images, np.zeros(robot.state_dim, np.float32), instruction or 'warm up')


def _checked_age(what: str, msg: Image | CompressedImage | JointState,
                 received_ns: int | None, now_ns: int, max_age_ns: int) -> int:
    """Return the stamp of ``msg`` (or ``received_ns`` if 0 and given) if it is recent."""
    try:
        stamp = stamp_to_ns(msg.header.stamp)
    except ValueError as exc:
        reason = RefusalReason.BAD_STATE if received_ns is not None else RefusalReason.BAD_IMAGE
        raise ObservationError(reason, f'{what}: {exc}') from None
    if stamp == 0 and received_ns is not None:
        stamp = received_ns
    age_ns = now_ns - stamp
    if abs(age_ns) > max_age_ns:
        label = f'{age_ns / NS_PER_S:.3f} s old' if age_ns > 0 else \
            f'{-age_ns / NS_PER_S:.3f} s in the future'
        raise ObservationError(RefusalReason.STALE,
                               f'{what} is {label} (max_observation_age '
                               f'{max_age_ns / NS_PER_S:g} s); stamp {stamp} ns')
    return stamp


__all__ = ['ObservationCache', 'Stamped', 'synthetic_observation']
