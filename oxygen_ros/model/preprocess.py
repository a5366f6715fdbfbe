"""
Camera images → model input (spec §1.9).

openpi resizes each RGB image to 224×224 *keeping the aspect ratio* (bilinear, Pillow, in
``openpi_client/image_tools.py``), pads it centred with black, and the model then maps uint8
to [-1, 1] with ``x / 255 * 2 - 1``. We do the same: resize first (in the input's dtype),
then scale. Float images must already be in [-1, 1]; they are resized per channel with
Pillow's 32-bit float mode (the same bilinear filter, without uint8 rounding), clipped to
[-1, 1] and padded with -1 (black), as openpi's JAX/torch ``resize_with_pad`` do for float32.

Grayscale/RGBA/BGR conversion is the ROS layer's job: only ``[H, W, 3]`` RGB is accepted here.
"""

from __future__ import annotations

import logging
from typing import Mapping

import numpy as np

from oxygen_ros.config import CAMERA_SLOTS, ModelConfig

logger = logging.getLogger(__name__)

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def check_image(img: np.ndarray, name: str = 'image') -> None:
    """
    Validate one camera image.

    :param img: ``uint8 [H, W, 3]`` RGB, or ``float32/float64 [H, W, 3]`` in [-1, 1].
    :param name: used in error messages (e.g. the camera slot).
    :raises ValueError: not an array, not 3-D, channels != 3, zero size, unsupported dtype,
        NaN/Inf, or float values outside [-1, 1].
    """
    if not isinstance(img, np.ndarray):
        raise ValueError(f'{name}: expected a numpy array, got {type(img).__name__}')
    if img.ndim != 3:
        raise ValueError(f'{name}: expected an [H, W, 3] RGB image, got shape {img.shape}')
    if img.shape[2] != 3:
        raise ValueError(
            f'{name}: expected 3 channels (RGB, channels last), got {img.shape[2]} '
            f'(shape {img.shape}); convert grayscale/RGBA/BGR to RGB before the model')
    if img.shape[0] == 0 or img.shape[1] == 0:
        raise ValueError(f'{name}: zero-size image, shape {img.shape}')
    if img.dtype == np.uint8:
        return
    if img.dtype not in _FLOAT_DTYPES:
        raise ValueError(f'{name}: unsupported dtype {img.dtype}; expected uint8 [0, 255] or '
                         f'float32/float64 in [-1, 1]')
    finite = np.isfinite(img)
    if not finite.all():
        raise ValueError(f'{name}: {int((~finite).sum())} NaN/Inf values in a float image')
    lo, hi = float(img.min()), float(img.max())
    if lo < -1.0 or hi > 1.0:
        raise ValueError(f'{name}: float image values must be in [-1, 1], got [{lo:.6g}, '
                         f'{hi:.6g}] (a [0, 1] or [0, 255] float image? pass uint8 instead)')


def _resize(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear (Pillow) resize of a validated image; uint8 stays uint8, floats → float32."""
    from PIL import Image

    size = (width, height)  # Pillow is (w, h)
    if img.dtype == np.uint8:
        return np.asarray(Image.fromarray(img).resize(size, resample=Image.Resampling.BILINEAR))
    channels = [
        np.asarray(Image.fromarray(np.ascontiguousarray(img[..., c], dtype=np.float32))
                   .resize(size, resample=Image.Resampling.BILINEAR))
        for c in range(3)
    ]
    return np.clip(np.stack(channels, axis=-1), -1.0, 1.0)


def resize_with_pad(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """
    Resize keeping the aspect ratio, then pad centred with black to ``[height, width, 3]``.

    Same geometry as openpi ``image_tools.resize_with_pad`` (tf.image.resize_with_pad):
    ``ratio = max(w / width, h / height)``, content size ``int(h / ratio) × int(w / ratio)``
    (at least 1 pixel), top/left padding ``(height - h') // 2`` / ``(width - w') // 2``.
    An image already of the target size is returned unchanged.

    :param img: ``uint8 [H, W, 3]`` or ``float32/float64 [H, W, 3]`` in [-1, 1].
    :returns: ``uint8 [height, width, 3]`` (padding 0) for uint8 input, else
        ``float32 [height, width, 3]`` in [-1, 1] (padding -1).
    :raises ValueError: see :func:`check_image`; ``height``/``width`` < 1.
    """
    check_image(img)
    if height < 1 or width < 1:
        raise ValueError(f'target size must be positive, got {height}x{width}')
    is_uint8 = img.dtype == np.uint8
    cur_h, cur_w = img.shape[:2]
    if (cur_h, cur_w) == (height, width):
        return img if is_uint8 else img.astype(np.float32, copy=False)
    ratio = max(cur_w / width, cur_h / height)
    new_h = max(1, int(cur_h / ratio))
    new_w = max(1, int(cur_w / ratio))
    resized = _resize(img, new_h, new_w)
    out = np.full((height, width, 3), 0 if is_uint8 else -1.0,
                  dtype=np.uint8 if is_uint8 else np.float32)
    top, left = (height - new_h) // 2, (width - new_w) // 2
    out[top:top + new_h, left:left + new_w] = resized
    return out


def image_to_model(img: np.ndarray, size: int | None = None) -> np.ndarray:
    """
    Return one camera image as the vision tower's input.

    :param img: ``uint8 [H, W, 3]`` RGB, or ``float32/float64 [H, W, 3]`` already in [-1, 1].
    :param size: if given, :func:`resize_with_pad` to ``size × size`` first (in the input
        dtype, as openpi); if None the image keeps its size.
    :returns: ``float32 [3, S, S]`` (channels first) in [-1, 1]; uint8 maps ``x/255*2-1``.
    :raises ValueError: see :func:`check_image`.
    """
    if size is not None:
        img = resize_with_pad(img, size, size)
    else:
        check_image(img)
    if img.dtype == np.uint8:
        x = img.astype(np.float32) / np.float32(255.0) * np.float32(2.0) - np.float32(1.0)
    else:
        x = img.astype(np.float32, copy=False)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def prepare_images(images: Mapping[str, np.ndarray],
                   cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """
    Build the image input of all ``CAMERA_SLOTS`` for one observation.

    Slots of ``cfg.cameras`` present in ``images`` are converted with :func:`image_to_model`
    (resized to ``cfg.vision.image_size``). Other slots are black images (-1, openpi's
    ``np.zeros_like`` uint8 image after scaling) with mask False; whether a missing camera is
    an error is the caller's decision. Images of slots the preset does not use are ignored.

    :param images: slot name → image (``config.CAMERA_SLOTS`` names).
    :param cfg: the model preset.
    :returns: ``float32 [3, 3, S, S]`` images in slot order and ``bool [3]`` image masks.
    :raises ValueError: an unknown slot name, or an invalid image (message names the slot).
    """
    unknown = sorted(set(images) - set(CAMERA_SLOTS))
    if unknown:
        raise ValueError(f'unknown camera slots {unknown}; known: {list(CAMERA_SLOTS)}')
    size = cfg.vision.image_size
    out = np.full((len(CAMERA_SLOTS), 3, size, size), -1.0, dtype=np.float32)
    mask = np.zeros(len(CAMERA_SLOTS), dtype=np.bool_)
    for i, slot in enumerate(CAMERA_SLOTS):
        img = images.get(slot)
        if img is None:
            continue
        if slot not in cfg.cameras:
            logger.debug('ignoring camera %s: preset %s does not use it', slot, cfg.name)
            continue
        try:
            out[i] = image_to_model(img, size)
        except ValueError as exc:
            raise ValueError(f'camera {slot}: {exc}') from None
        mask[i] = True
    return out, mask


__all__ = ['check_image', 'image_to_model', 'prepare_images', 'resize_with_pad']
