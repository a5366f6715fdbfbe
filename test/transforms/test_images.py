"""Image preprocessing on the host and on the device (docs/model.md#preprocessing)."""

import numpy as np

from oxygen_ros.transforms.images import (
    check_image, image_to_model, ImageResize, resize_on_device, resize_with_pad)
from PIL import Image
import pytest
from skimage import data
import torch


def _openpi_client_reference(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """openpi_client.image_tools.resize_with_pad, restated: PIL bilinear, paste on black."""
    pil = Image.fromarray(img)
    ratio = max(pil.width / width, pil.height / height)
    w, h = int(pil.width / ratio), int(pil.height / ratio)
    canvas = Image.new(pil.mode, (width, height), 0)
    canvas.paste(pil.resize((w, h), resample=Image.Resampling.BILINEAR),
                 (int((width - w) / 2), int((height - h) / 2)))
    return np.asarray(canvas)


def _gradient(h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1),
                     (x + y) % 256], axis=-1).astype(np.uint8)


def test_landscape_480x640_content_rows_and_padding():
    out = resize_with_pad(np.full((480, 640, 3), 255, np.uint8), 224, 224)
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8
    # 640 wide -> ratio 640/224, content 168 x 224, 28 black rows above and below.
    assert (out[28:196] == 255).all()
    assert (out[:28] == 0).all() and (out[196:] == 0).all()
    model = image_to_model(np.full((480, 640, 3), 255, np.uint8), 224)
    assert model.shape == (3, 224, 224) and model.dtype == np.float32
    assert (model[:, 28:196] == 1.0).all()
    assert (model[:, :28] == -1.0).all() and (model[:, 196:] == -1.0).all()


def test_portrait_odd_padding_puts_the_extra_column_right():
    out = resize_with_pad(np.full((300, 101, 3), 200, np.uint8), 224, 224)
    # 101 / (300 / 224) = 75.4 -> 75 columns; 149 padding columns: 74 left, 75 right.
    assert (out[:, 74:149] == 200).all()
    assert (out[:, :74] == 0).all() and (out[:, 149:] == 0).all()


@pytest.mark.parametrize('shape', [(480, 640), (300, 101), (50, 100), (224, 224), (720, 1280),
                                   (97, 33), (5, 1000)])
def test_matches_openpi_client_resize_with_pad(shape):
    img = _gradient(*shape)
    np.testing.assert_array_equal(resize_with_pad(img, 224, 224),
                                  _openpi_client_reference(img, 224, 224))


def test_extreme_aspect_ratio_keeps_at_least_one_row():
    # openpi would ask Pillow for a 0-pixel-high image and fail; we keep one row.
    out = resize_with_pad(np.full((1, 1000, 3), 77, np.uint8), 224, 224)
    assert (out[111] == 77).all()
    assert (out[:111] == 0).all() and (out[112:] == 0).all()


def test_target_size_input_is_returned_unchanged():
    img = _gradient(224, 224)
    assert resize_with_pad(img, 224, 224) is img
    f = np.zeros((224, 224, 3), np.float64)
    out = resize_with_pad(f, 224, 224)
    assert out.dtype == np.float32 and out.shape == (224, 224, 3)


def test_float_input_resizes_like_uint8_and_pads_with_minus_one():
    img = _gradient(480, 640)
    as_float = img.astype(np.float32) / 255 * 2 - 1
    for dtype in (np.float32, np.float64):
        out = resize_with_pad(as_float.astype(dtype), 224, 224)
        assert out.dtype == np.float32
        assert (out[:28] == -1.0).all() and (out[196:] == -1.0).all()
        assert out.min() >= -1.0 and out.max() <= 1.0
        via_uint8 = image_to_model(img, 224).transpose(1, 2, 0)
        # Same bilinear filter; the uint8 path rounds to 1/255 steps (2/255 after scaling).
        assert np.abs(out - via_uint8).max() <= 2 / 255 + 1e-6
    const = resize_with_pad(np.full((480, 640, 3), 0.25, np.float32), 224, 224)
    np.testing.assert_allclose(const[28:196], 0.25, atol=1e-6)


def test_image_to_model_scaling_and_channel_order():
    img = np.zeros((4, 6, 3), np.uint8)
    img[..., 0], img[..., 1], img[..., 2] = 255, 0, 128
    out = image_to_model(img)
    assert out.shape == (3, 4, 6) and out.dtype == np.float32
    assert (out[0] == 1.0).all() and (out[1] == -1.0).all()
    np.testing.assert_allclose(out[2], 128 / 255 * 2 - 1, rtol=0, atol=1e-7)
    f = np.full((4, 6, 3), -0.5, np.float64)
    assert (image_to_model(f) == np.float32(-0.5)).all()


@pytest.mark.parametrize('img,message', [
    ([[0, 0, 0]], 'expected a numpy array, got list'),
    (np.zeros((8, 8), np.uint8), r'expected an \[H, W, 3\] RGB image, got shape \(8, 8\)'),
    (np.zeros((8, 8, 1), np.uint8), r'expected 3 channels .* got 1 .*grayscale'),
    (np.zeros((8, 8, 4), np.uint8), 'expected 3 channels .* got 4 '),
    (np.zeros((3, 48, 64), np.uint8), r'got 64 \(shape \(3, 48, 64\)\)'),
    (np.zeros((0, 8, 3), np.uint8), 'zero-size image'),
    (np.zeros((8, 0, 3), np.uint8), 'zero-size image'),
    (np.zeros((8, 8, 3), np.int32), 'unsupported dtype int32'),
    (np.zeros((8, 8, 3), np.uint16), 'unsupported dtype uint16'),
    (np.zeros((8, 8, 3), np.float16), 'unsupported dtype float16'),
    (np.zeros((8, 8, 3), bool), 'unsupported dtype bool'),
    (np.full((8, 8, 3), np.nan, np.float32), '192 NaN/Inf'),
    (np.full((8, 8, 3), -np.inf, np.float64), 'NaN/Inf'),
    (np.full((8, 8, 3), 255.0, np.float32), r'in \[-1, 1\], got \[255, 255\]'),
    (np.linspace(0, 1.5, 192).reshape(8, 8, 3), r'got \[0, 1.5\]'),
])
def test_bad_images_are_rejected(img, message):
    with pytest.raises(ValueError, match=message):
        check_image(img)
    with pytest.raises(ValueError, match=message):
        image_to_model(img, 224)
    with pytest.raises(ValueError, match=message):
        resize_with_pad(img, 224, 224)


def test_bad_target_size():
    with pytest.raises(ValueError, match='target size must be positive, got 0x224'):
        resize_with_pad(np.zeros((8, 8, 3), np.uint8), 0, 224)


def _lerobot_reference(img: np.ndarray, size: int) -> np.ndarray:
    """Restate LeRobot's pi05 input: [0, 1] float, F.interpolate, clip, pad 0, x * 2 - 1."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    x = torch.from_numpy(img).permute(2, 0, 1)[None].to(torch.float32) / 255.0
    h, w = img.shape[:2]
    ratio = max(w / size, h / size)
    rh, rw = int(h / ratio), int(w / ratio)
    x = F.interpolate(x, size=(rh, rw), mode='bilinear', align_corners=False).clamp(0.0, 1.0)
    top, left = divmod(size - rh, 2)[0], divmod(size - rw, 2)[0]
    x = F.pad(x, (left, size - rw - left, top, size - rh - top), value=0.0)
    return (x * 2.0 - 1.0)[0].numpy()


@pytest.mark.parametrize('shape', [(480, 640), (300, 101), (400, 600), (224, 224), (97, 33)])
def test_lerobot_resize_is_lerobots_own(shape):
    img = _gradient(*shape)
    got = image_to_model(img, 224, ImageResize.LEROBOT)
    np.testing.assert_array_equal(got, _lerobot_reference(img, 224))
    assert got.shape == (3, 224, 224) and got.dtype == np.float32


def test_the_two_families_filters_differ_on_a_photograph():
    """Shrinking a real photo: Pillow antialiases, F.interpolate does not (both are right)."""
    from skimage import data

    photo = np.ascontiguousarray(data.coffee()[:400, :600])          # 600 x 400
    openpi = image_to_model(photo, 224, ImageResize.OPENPI)
    lerobot = image_to_model(photo, 224, ImageResize.LEROBOT)
    diff = np.abs(openpi - lerobot)
    assert diff.max() > 0.5 and diff.mean() > 0.01
    # the same geometry: both pad the same rows with black
    assert (openpi[:, :37] == -1).all() and (lerobot[:, :37] == -1).all()
    same = image_to_model(_gradient(224, 224), 224, ImageResize.LEROBOT)
    np.testing.assert_array_equal(same, image_to_model(_gradient(224, 224), 224))


ONE_LEVEL = 2.0 / 255.0 + 1e-6          # one uint8 level in model units ([-1, 1])


def photos():
    coffee = np.ascontiguousarray(data.coffee()[:400, :600])
    rng = np.random.default_rng(0)
    return [coffee, np.ascontiguousarray(data.astronaut()),
            rng.integers(0, 256, (97, 33, 3), dtype=np.uint8),
            rng.integers(0, 256, (100, 150, 3), dtype=np.uint8),
            rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)]


@pytest.mark.parametrize('resize', list(ImageResize), ids=lambda r: r.value)
def test_device_resize_against_the_host_path(resize):
    for img in photos():
        host = image_to_model(img, 224, resize)
        device = resize_on_device(torch.from_numpy(img), 224, resize).numpy()
        if resize is ImageResize.LEROBOT:      # the same computation
            np.testing.assert_array_equal(device, host)
        else:                                  # Pillow's filter, within one uint8 level
            assert np.abs(device - host).max() <= ONE_LEVEL, img.shape
