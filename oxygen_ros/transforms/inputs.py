"""
Observation checks and the openpi input transforms, before anything reaches the scheduler.

Order as openpi at inference (``docs/model.md#preprocessing``): Normalize (state, quantile) →
resize with pad → tokenize (the state goes into the prompt as 256-bin codes for
``PI05_STATE``). A bad observation raises ``ObservationError`` (``observation.py``) with the
``RefusalReason`` the node counts in diagnostics; the engine's state is untouched by it. An
action prompt longer than ``max_token_len`` is refused (openpi cuts it at the end, which can
drop the state bins or the ``Action:`` cue the model acts on): the instruction is too long,
and the message says by how many tokens.

Each camera image is prepared once (``prepare_camera``): when it arrives (the node, through
``Engine.prepare_image``) or in ``prepare_observation`` for an image that comes raw; an image
prepared already (a ``CameraImage``) is taken as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oxygen_ros.config import CAMERA_SLOTS, ModelConfig, PromptFormat
from oxygen_ros.observation import Observation, ObservationError, RefusalReason
from oxygen_ros.transforms.images import check_image, image_to_model, ImageResize
from oxygen_ros.transforms.normalize import Normalizer
from oxygen_ros.transforms.prompt import action_prompt_ids
from oxygen_ros.transforms.tokenizer import PaligemmaTokenizer


@dataclass(frozen=True, slots=True)
class CameraImage:
    """
    One camera image checked for the engine and ready for its vision job.

    Made by ``prepare_camera``: through ``Engine.prepare_image`` (the node calls it when an
    image arrives, off the control cycle), or inside ``prepare_observation``.

    :ivar pixels: ``float32 [3, S, S]`` in [-1, 1], resized on the host; or ``uint8 [H, W,
        3]`` RGB as it came, resized by the backend on its device
        (``transforms.images.resize_on_device``, from ``engine/frame_inputs.py``).
    """

    pixels: np.ndarray

    @property
    def resized(self) -> bool:
        """Return whether the image is resized already (else the device resizes it)."""
        return self.pixels.dtype != np.uint8


def prepare_camera(slot: str, img: np.ndarray, cfg: ModelConfig, resize: ImageResize, *,
                   on_device: bool = False) -> CameraImage:
    """
    Check one camera image and resize it on the host unless the device will.

    :param slot: the camera slot (for the error message).
    :param img: ``uint8 [H, W, 3]`` RGB or ``float [H, W, 3]`` in [-1, 1].
    :param resize: the checkpoint family's filter.
    :param on_device: keep a uint8 image as it is (the engine resizes it on the backend's
        device; float images are resized on the host either way).
    :raises ObservationError: ``BAD_IMAGE``, ``camera <slot>: `` and what
        ``transforms.images.check_image`` found.
    """
    try:
        if on_device and isinstance(img, np.ndarray) and img.dtype == np.uint8:
            check_image(img)
            return CameraImage(np.ascontiguousarray(img))
        return CameraImage(image_to_model(img, cfg.vision.image_size, resize))
    except ValueError as exc:
        raise ObservationError(RefusalReason.BAD_IMAGE, f'camera {slot}: {exc}') from None


@dataclass(frozen=True, slots=True)
class PreparedObservation:
    """
    An observation in model space.

    :ivar cameras: the preset's cameras in ``CAMERA_SLOTS`` order, each ``CameraImage.pixels``
        (resized on the host, or uint8 for the device to resize).
    :ivar action_prompt_ids: BOS + action prompt ids (no padding).
    :ivar state: ``float64 [state_dim]`` the robot state in robot units, as observed (the
        action chunk of this frame starts from it).
    """

    cameras: tuple[np.ndarray, ...]
    action_prompt_ids: tuple[int, ...]
    instruction: str
    stamp_ns: int
    state: np.ndarray

    @property
    def num_cameras(self) -> int:
        return len(self.cameras)

    @property
    def images(self) -> np.ndarray:
        """
        Return ``float32 [N, 3, S, S]``: the cameras resized on the host, stacked.

        :raises ValueError: a camera is left to the device to resize.
        """
        if any(c.dtype == np.uint8 for c in self.cameras):
            raise ValueError('the images of this observation are resized on the device')
        return np.stack(self.cameras)


def prepare_observation(obs: Observation, cfg: ModelConfig, tokenizer: PaligemmaTokenizer,
                        normalizer: Normalizer, *, prompt_format: PromptFormat | None = None,
                        state_pad: int = 0, image_resize: ImageResize = ImageResize.OPENPI,
                        resize_on_device: bool = False) -> PreparedObservation:
    """
    Check an observation and turn it into model inputs.

    :param prompt_format: the action prompt's format (default: the preset's).
    :param state_pad: dims the state is zero-padded to before binning (0: none).
    :param image_resize: the checkpoint family's resize-with-pad filter.
    :param resize_on_device: leave uint8 images to be resized on the device (``prepare_camera``).

    The robot's cameras and prompt format are those of the robot policy ``normalizer`` holds.

    :raises ObservationError: a camera of the robot's is missing; an image is malformed;
        the state has the wrong length or NaN/Inf; the prompt is empty or its action prompt
        longer than ``cfg.max_token_len`` tokens.
    """
    robot = normalizer.robot
    missing = [slot for slot in robot.cameras if slot not in obs.images]
    if missing:
        raise ObservationError(RefusalReason.MISSING_CAMERA,
                               f'missing camera(s) {missing}; preset {cfg.name} needs '
                               f'{list(robot.cameras)}')
    unknown = sorted(set(obs.images) - set(CAMERA_SLOTS))
    if unknown:
        raise ObservationError(RefusalReason.BAD_IMAGE, f'unknown camera slots {unknown}; '
                                                        f'known: {list(CAMERA_SLOTS)}')
    cameras = []
    for slot in (s for s in CAMERA_SLOTS if s in robot.cameras):
        image = obs.images[slot]
        if not isinstance(image, CameraImage):      # else prepared when it arrived
            image = prepare_camera(slot, image, cfg, image_resize, on_device=resize_on_device)
        cameras.append(image.pixels)

    try:
        # Shape and NaN/Inf are checked there. The state is normalized in float64 without a
        # float32 rounding first, as openpi does (a rounding can move a state bin).
        state_n = normalizer.normalize_state(obs.state)
    except ValueError as exc:
        raise ObservationError(RefusalReason.BAD_STATE, str(exc)) from None

    if not obs.prompt or not obs.prompt.strip():
        raise ObservationError(RefusalReason.BAD_PROMPT, 'empty task prompt (no instruction)')
    fmt = robot.prompt_format if prompt_format is None else prompt_format
    try:
        ids = action_prompt_ids(tokenizer, obs.prompt,
                                state_n if fmt is PromptFormat.PI05_STATE else None, fmt,
                                state_pad=state_pad)
    except ValueError as exc:
        raise ObservationError(RefusalReason.BAD_PROMPT, str(exc)) from None
    if len(ids) > cfg.max_token_len:
        over = len(ids) - cfg.max_token_len
        raise ObservationError(
            RefusalReason.BAD_PROMPT,
            f'instruction too long: its action prompt ({fmt.value}, with BOS and the state) is '
            f'{len(ids)} tokens, the model takes {cfg.max_token_len} (max_token_len of preset '
            f'{cfg.name}); shorten it by at least {over} token(s)')
    return PreparedObservation(cameras=tuple(cameras), action_prompt_ids=tuple(ids),
                               instruction=obs.prompt,
                               stamp_ns=int(obs.stamp_ns),
                               state=np.array(obs.state, dtype=np.float64))
