"""
Camera images → model input, as each checkpoint family resized them in training.

Both families resize each RGB image to 224×224 *keeping the aspect ratio* and pad it centred
with black; they differ in the filter (``ImageResize``):

- ``OPENPI``: Pillow's bilinear filter on the uint8 image (``openpi_client/image_tools.py``
  ``resize_with_pad``; Pillow widens the filter when it shrinks: antialiased, as
  ``jax.image.resize``), then ``x / 255 * 2 - 1``. Float images must already be in [-1, 1];
  they are resized per channel with Pillow's 32-bit float mode (the same filter, without
  uint8 rounding), clipped to [-1, 1] and padded with -1 (black), as openpi's
  ``resize_with_pad`` does for float32.
- ``LEROBOT``: LeRobot feeds float images in [0, 1] (uint8 / 255) to
  ``policies/common/vla_utils.py`` ``resize_with_pad_torch``: ``F.interpolate(mode=
  'bilinear', align_corners=False)`` without antialiasing, clipped to [0, 1], padded with
  0, then ``x * 2 - 1`` (``modeling_pi05.py`` ``_preprocess_images``). On a 600×400
  photograph the two filters give model inputs up to 0.9 apart: a checkpoint sees what it
  was trained on only with its own.

Grayscale/RGBA/BGR conversion is the ROS layer's job: only ``[H, W, 3]`` RGB is accepted here.
"""

from __future__ import annotations

import enum

import numpy as np

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class ImageResize(str, enum.Enum):
    """Which family's resize-with-pad filter (see the module docstring)."""

    OPENPI = 'openpi'
    """Pillow bilinear (antialiased when shrinking) on uint8, openpi's."""
    LEROBOT = 'lerobot'
    """``F.interpolate`` bilinear without antialiasing on [0, 1] floats, LeRobot's."""


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
    new_h, new_w, top, left = pad_geometry(cur_h, cur_w, height, width)
    resized = _resize(img, new_h, new_w)
    out = np.full((height, width, 3), 0 if is_uint8 else -1.0,
                  dtype=np.uint8 if is_uint8 else np.float32)
    out[top:top + new_h, left:left + new_w] = resized
    return out


def pad_geometry(height: int, width: int, size_h: int, size_w: int
                 ) -> tuple[int, int, int, int]:
    """
    Return ``(new_h, new_w, top, left)`` of a resize-with-pad to ``size_h × size_w``.

    ``ratio = max(width / size_w, height / size_h)``, content ``int(h / ratio) × int(w /
    ratio)`` (at least 1 pixel), padding split with the extra pixel at the bottom/right
    (openpi ``resize_with_pad``; LeRobot's ``resize_with_pad_torch`` the same).
    """
    ratio = max(width / size_w, height / size_h)
    new_h, new_w = max(1, int(height / ratio)), max(1, int(width / ratio))
    return new_h, new_w, (size_h - new_h) // 2, (size_w - new_w) // 2


def lerobot_resize_with_pad(images: object, size: int) -> object:
    """
    Resize with pad as LeRobot does, a batch on any torch device (``ImageResize.LEROBOT``).

    :param images: ``float32 [N, 3, H, W]`` torch tensor in [0, 1].
    :returns: ``float32 [N, 3, size, size]`` in [0, 1]: ``F.interpolate`` bilinear
        (``align_corners=False``, no antialiasing), clipped to [0, 1], padded with 0.
    """
    import torch.nn.functional as F  # noqa: N812

    h, w = images.shape[-2:]
    if (h, w) == (size, size):
        return images
    new_h, new_w, top, left = pad_geometry(h, w, size, size)
    resized = F.interpolate(images, size=(new_h, new_w), mode='bilinear',
                            align_corners=False).clamp(0.0, 1.0)
    return F.pad(resized, (left, size - new_w - left, top, size - new_h - top), value=0.0)


def _lerobot_image_to_model(img: np.ndarray, size: int) -> np.ndarray:
    """Return the input LeRobot makes of one image (uint8, or [-1, 1] float taken to [0, 1])."""
    import torch

    check_image(img)
    x = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None]
    x = x.float() / 255.0 if img.dtype == np.uint8 else (x.float() + 1.0) / 2.0
    return (lerobot_resize_with_pad(x, size)[0] * 2.0 - 1.0).numpy()


def resize_on_device(image: object, size: int,
                     resize: ImageResize = ImageResize.OPENPI) -> object:
    """
    Resize with pad and scale one uint8 camera image with torch, on the image's device.

    The GPU's share of image preparation: the uint8 image goes up as it came and is resized
    there. ``LEROBOT`` is LeRobot's own computation (:func:`lerobot_resize_with_pad`), equal to
    the host path. ``OPENPI`` is ``F.interpolate(mode='bilinear', antialias=True)``, rounded to
    uint8 as Pillow rounds: within one uint8 level of Pillow (the host path).

    :param image: ``uint8 [H, W, 3]`` torch tensor.
    :param size: the square side S.
    :returns: ``float32 [3, S, S]`` in [-1, 1].
    """
    import torch.nn.functional as F  # noqa: N812

    x = image.permute(2, 0, 1)[None].float()
    if ImageResize(resize) is ImageResize.LEROBOT:
        return lerobot_resize_with_pad(x / 255.0, size)[0] * 2.0 - 1.0
    h, w = image.shape[:2]
    if (h, w) != (size, size):
        new_h, new_w, top, left = pad_geometry(h, w, size, size)
        x = F.interpolate(x, size=(new_h, new_w), mode='bilinear', align_corners=False,
                          antialias=True).round_().clamp_(0.0, 255.0)
        x = F.pad(x, (left, size - new_w - left, top, size - new_h - top), value=0.0)
    return x[0] / 255.0 * 2.0 - 1.0


def image_to_model(img: np.ndarray, size: int | None = None,
                   resize: ImageResize = ImageResize.OPENPI) -> np.ndarray:
    """
    Return one camera image as the vision tower's input.

    :param img: ``uint8 [H, W, 3]`` RGB, or ``float32/float64 [H, W, 3]`` already in [-1, 1].
    :param size: if given, resize with pad to ``size × size`` first (:func:`resize_with_pad`
        in the input dtype for OPENPI, :func:`lerobot_resize_with_pad` for LEROBOT); if None
        the image keeps its size.
    :param resize: the checkpoint family's filter.
    :returns: ``float32 [3, S, S]`` (channels first) in [-1, 1]; uint8 maps ``x/255*2-1``.
    :raises ValueError: see :func:`check_image`.
    """
    if size is not None and ImageResize(resize) is ImageResize.LEROBOT:
        return _lerobot_image_to_model(img, size)
    if size is not None:
        img = resize_with_pad(img, size, size)
    else:
        check_image(img)
    if img.dtype == np.uint8:
        x = img.astype(np.float32) / np.float32(255.0) * np.float32(2.0) - np.float32(1.0)
    else:
        x = img.astype(np.float32, copy=False)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


__all__ = ['ImageResize', 'check_image', 'image_to_model', 'lerobot_resize_with_pad',
           'pad_geometry', 'resize_on_device', 'resize_with_pad']
