"""
The robot layouts of openpi's clients: their observation keys, checked, as the engine's input.

What openpi's policies read (``src/openpi/policies/{libero,droid,aloha}_policy.py``), key for
key, and the camera slot each image feeds:

- LIBERO (``LiberoInputs``): ``observation/image`` -> ``base_0_rgb``,
  ``observation/wrist_image`` -> ``left_wrist_0_rgb``, ``observation/state``, ``prompt``.
- DROID (``DroidInputs``): ``observation/exterior_image_1_left`` -> ``base_0_rgb``,
  ``observation/wrist_image_left`` -> ``left_wrist_0_rgb``; the state is
  ``observation/joint_position`` (7) then ``observation/gripper_position`` (1, or a scalar).
- ALOHA (``AlohaInputs``): ``images`` {``cam_high`` -> ``base_0_rgb``, ``cam_left_wrist`` ->
  ``left_wrist_0_rgb``, ``cam_right_wrist`` -> ``right_wrist_0_rgb``, ``cam_low`` accepted
  and unused, as openpi}, each ``[3, H, W]``; ``state`` (14), its joint flips and gripper
  mapping done by the ALOHA robot policy's transforms (``policies/aloha.py``).

Images as openpi's ``_parse_image``: a float image is ``(255 * x).astype(uint8)`` (so it must
be in [0, 1]), and a LIBERO or DROID image whose first dim is 3 is channels-first. Every key is
checked (type, dtype, shape, range, ``--max-image-side``) before the engine sees it; a key the
layout does not know is refused, as a missing one is (docs/serving.md#keys-per-robot).
"""

from __future__ import annotations

from dataclasses import dataclass
import enum
from typing import Any, Mapping

import numpy as np

from oxygen_ros.config import CAMERA_SLOTS
from oxygen_ros.engine import Observation
from oxygen_ros.policies import RobotPolicy
from oxygen_ros.policies.aloha import AlohaPolicy
from oxygen_ros.serve.errors import BadValue, MissingKey, UnknownKey
from oxygen_ros.serve.limits import TEXT_ALLOWANCE

PROMPT_KEY = 'prompt'
LANGUAGE_KEY = 'language_requests'
"""OxyGen's text requests ride in the observation dict (``serve/language.py``)."""
ALOHA_IMAGES = 'images'
_BASE, _LEFT, _RIGHT = CAMERA_SLOTS
_IMAGE_DTYPES = (np.dtype(np.uint8), np.dtype(np.float32), np.dtype(np.float64))


class Layout(str, enum.Enum):
    """An openpi robot's observation dict (the module docstring)."""

    LIBERO = 'libero'
    DROID = 'droid'
    ALOHA = 'aloha'


@dataclass(frozen=True, slots=True)
class _Spec:
    images: Mapping[str, str | None]
    """Image key (ALOHA: camera name in ``images``) -> camera slot (None: read, unused)."""
    state: tuple[tuple[str, int], ...]
    """The state's keys and dims, concatenated in order (0 dims: the robot's state_dim)."""
    channels_first: bool
    """Images are ``[3, H, W]`` always (ALOHA); else when their first dim is 3 (openpi)."""


_SPECS = {
    Layout.LIBERO: _Spec({'observation/image': _BASE, 'observation/wrist_image': _LEFT},
                         (('observation/state', 0),), False),
    Layout.DROID: _Spec({'observation/exterior_image_1_left': _BASE,
                         'observation/wrist_image_left': _LEFT},
                        (('observation/joint_position', 7),
                         ('observation/gripper_position', 1)), False),
    Layout.ALOHA: _Spec({'cam_high': _BASE, 'cam_low': None, 'cam_left_wrist': _LEFT,
                         'cam_right_wrist': _RIGHT}, (('state', 14),), True),
}


def default_layout(robot: RobotPolicy) -> Layout | None:
    """Return the layout of a robot family (None: the test robots; ``--layout`` says)."""
    if isinstance(robot, AlohaPolicy):
        return Layout.ALOHA
    return {'libero': Layout.LIBERO, 'droid': Layout.DROID}.get(robot.name)


def check_layout(layout: Layout, robot: RobotPolicy) -> None:
    """
    Check that ``layout`` feeds every camera and state dim of the robot.

    :raises ValueError: a camera slot of the robot no key of the layout feeds, a state of
        another size, or ALOHA without ALOHA's transforms (its joint flips and gripper
        mapping: openpi's ``AlohaInputs``/``AlohaOutputs``, ``policies/aloha.py``).
    """
    spec = _SPECS[Layout(layout)]
    fed = {slot for slot in spec.images.values() if slot}
    unfed = [slot for slot in robot.cameras if slot not in fed]
    if unfed:
        raise ValueError(f'layout {layout.value} feeds camera slots {sorted(fed)}; robot '
                         f'{robot.name} also needs {unfed}')
    dims = sum(n for _, n in spec.state)
    if dims and dims != robot.state_dim:
        raise ValueError(f'layout {layout.value} sends a state of {dims} dims; robot '
                         f'{robot.name} takes {robot.state_dim}')
    if layout is Layout.ALOHA and not isinstance(robot, AlohaPolicy):
        raise ValueError(f"layout aloha needs the ALOHA robot policy (openpi's "
                         f'AlohaInputs/AlohaOutputs: joint flips, gripper mapping); robot '
                         f'{robot.name} has no such transforms')


def observation_keys(layout: Layout, robot: RobotPolicy) -> dict[str, str]:
    """Return each key a client sends -> what it holds (the metadata's description)."""
    spec = _SPECS[layout]
    image = '[3, H, W]' if spec.channels_first else '[H, W, 3] or [3, H, W]'
    prefix = f'{ALOHA_IMAGES}/' if layout is Layout.ALOHA else ''
    keys = {f'{prefix}{key}': f'uint8 {image} (or float in [0, 1]) -> ' + (
        slot if slot in robot.cameras else 'unused') for key, slot in spec.images.items()}
    keys.update({key: f'float [{n or robot.state_dim}]' for key, n in spec.state})
    keys[PROMPT_KEY] = 'str: the task'
    keys[LANGUAGE_KEY] = 'optional: list of text requests (docs/serving.md#language-updates)'
    return keys


def message_bytes(layout: Layout, max_image_side: int) -> int:
    """Return the default bound of one message: every image at the largest side in uint8."""
    return len(_SPECS[layout].images) * max_image_side ** 2 * 3 + TEXT_ALLOWANCE


def to_observation(layout: Layout, msg: Mapping[Any, Any], robot: RobotPolicy, *,
                   max_image_side: int, default_prompt: str | None = None,
                   stamp_ns: int = 0) -> Observation:
    """
    Return the engine's observation of one client message, checked key by key.

    :param msg: the message's map (``wire.unpack_message``); ``language_requests`` is
        skipped here.
    :param default_prompt: the task when the message has no ``prompt`` (openpi's
        ``default_prompt``; ALOHA's clients send none); None: ``prompt`` is required.
    :raises UnknownKey: a key the layout does not know.
    :raises MissingKey: an image, state part or prompt absent.
    :raises BadValue: a value of the wrong type, dtype, shape or range.
    """
    spec = _SPECS[layout]
    top = {PROMPT_KEY, LANGUAGE_KEY} | {key for key, _ in spec.state} | (
        {ALOHA_IMAGES} if layout is Layout.ALOHA else set(spec.images))
    _check_keys(msg, top, f'a {layout.value} observation')
    if layout is Layout.ALOHA:
        images = _required(msg, ALOHA_IMAGES)
        if not isinstance(images, dict):
            raise BadValue(f'{ALOHA_IMAGES}: expected a map of camera name -> image, got '
                           f'{type(images).__name__}')
        _check_keys(images, set(spec.images), f'{ALOHA_IMAGES}')
        prefix = f'{ALOHA_IMAGES}/'
    else:
        images, prefix = msg, ''
    slots = {}
    for key, slot in spec.images.items():
        if key in images or slot in robot.cameras:
            pixels = _image(_required(images, key, prefix), prefix + key, spec.channels_first,
                            max_image_side)
            if slot in robot.cameras:
                slots[slot] = pixels
    state = np.concatenate([_vector(_required(msg, key), key, n or robot.state_dim)
                            for key, n in spec.state])
    return Observation(slots, state, _prompt(msg, default_prompt), stamp_ns)


def _check_keys(msg: Mapping[Any, Any], known: set[str], what: str) -> None:
    unknown = sorted(repr(k) if not isinstance(k, str) else k for k in msg if k not in known)
    if unknown:
        raise UnknownKey(f'{", ".join(unknown)} not in {what}; its keys: '
                         f'{", ".join(sorted(known))}')


def _required(msg: Mapping[Any, Any], key: str, prefix: str = '') -> Any:
    if key not in msg:
        raise MissingKey(f'{prefix}{key} is missing')
    return msg[key]


def _image(value: Any, name: str, channels_first: bool, max_side: int) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise BadValue(f'{name}: expected an image array, got {type(value).__name__}')
    if value.dtype not in _IMAGE_DTYPES:
        raise BadValue(f'{name}: dtype {value.dtype} refused; uint8, or float32/float64 in '
                       f'[0, 1]')
    if value.ndim != 3:
        raise BadValue(f'{name}: expected a 3-dim image, got shape {value.shape}')
    if channels_first and value.shape[0] != 3:
        raise BadValue(f'{name}: expected [3, H, W] (channels first), got {value.shape}')
    img = value.transpose(1, 2, 0) if value.shape[0] == 3 else value
    if img.shape[2] != 3:
        raise BadValue(f'{name}: expected 3 (RGB) channels, got shape {value.shape}')
    if not (1 <= img.shape[0] <= max_side and 1 <= img.shape[1] <= max_side):
        raise BadValue(f'{name}: {img.shape[1]}x{img.shape[0]} pixels; each side must be in '
                       f'1..{max_side} (--max-image-side)')
    if img.dtype != np.uint8:
        if not np.all(np.isfinite(img)) or img.min() < 0.0 or img.max() > 1.0:
            raise BadValue(f'{name}: a float image must be finite and in [0, 1] (openpi '
                           f'takes it to uint8 as 255 * x)')
        img = (255 * img).astype(np.uint8)
    return np.ascontiguousarray(img)


def _vector(value: Any, name: str, dims: int) -> np.ndarray:
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        value = np.asarray([value])            # DROID's gripper may be a scalar
    elif isinstance(value, list) and all(type(v) in (int, float) for v in value):
        value = np.asarray(value, dtype=np.float64)
    if not isinstance(value, np.ndarray) or value.dtype.kind not in 'iuf':
        raise BadValue(f'{name}: expected a numeric array, got '
                       f'{getattr(value, "dtype", type(value).__name__)}')
    x = value.reshape(-1) if value.ndim == 0 else value
    if x.shape != (dims,):
        raise BadValue(f'{name}: expected shape ({dims},), got {value.shape}')
    x = x.astype(np.float64)
    if not np.all(np.isfinite(x)):
        raise BadValue(f'{name}: NaN/Inf at dims {np.flatnonzero(~np.isfinite(x)).tolist()}')
    return x


def _prompt(msg: Mapping[Any, Any], default: str | None) -> str:
    if PROMPT_KEY not in msg:
        if default is None:
            raise MissingKey(f'{PROMPT_KEY} is missing (the server has no --default-prompt)')
        return default
    value = msg[PROMPT_KEY]
    if isinstance(value, bytes):                      # DroidInputs decodes bytes too
        try:
            value = value.decode('utf-8')
        except UnicodeDecodeError:
            raise BadValue(f'{PROMPT_KEY}: bytes that are not UTF-8') from None
    if not isinstance(value, str):
        raise BadValue(f'{PROMPT_KEY}: expected a string, got {type(value).__name__}')
    return value


__all__ = ['ALOHA_IMAGES', 'LANGUAGE_KEY', 'Layout', 'PROMPT_KEY', 'check_layout',
           'default_layout', 'message_bytes', 'observation_keys', 'to_observation']
