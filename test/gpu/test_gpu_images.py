"""
Camera images resized on the device equal the host path, on CUDA and, the same body, the CPU.

``cuda`` cases: ``pytest -m gpu`` (skipped without CUDA); ``cpu`` cases: ``make test``
(``test/devices.py``). The pinned, never-waiting upload is CUDA only.
"""

from devices import cuda_only, DEVICES
import numpy as np
from oxygen_ros.backends.async_io import CameraUpload
from oxygen_ros.transforms.images import image_to_model, ImageResize, resize_on_device
import pytest
from skimage import data
import torch

ONE_LEVEL = 2.0 / 255.0 + 1e-6


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('resize', list(ImageResize), ids=lambda r: r.value)
def test_resize_on_the_device_within_one_uint8_level_of_the_host(resize, device):
    rng = np.random.default_rng(0)
    for img in (np.ascontiguousarray(data.coffee()[:400, :600]),
                rng.integers(0, 256, (480, 640, 3), dtype=np.uint8),
                rng.integers(0, 256, (97, 33, 3), dtype=np.uint8)):
        host = image_to_model(img, 224, resize)
        out = resize_on_device(torch.from_numpy(img).to(device), 224, resize).cpu().numpy()
        assert np.abs(out - host).max() <= ONE_LEVEL, (resize, img.shape)


@cuda_only('pinned host buffers, an asynchronous upload, torch.cuda.set_sync_debug_mode')
def test_uploads_reuse_their_pinned_buffers_and_never_wait_for_the_host():
    upload = CameraUpload(torch.device('cuda'))
    frames = [(np.full((480, 640, 3), v, np.uint8), np.full((3, 224, 224), 0.5, np.float32))
              for v in (10, 200)]
    outs = []
    torch.cuda.set_sync_debug_mode('error')      # an implicit host sync raises here
    try:
        for raw, resized in frames:    # a uint8 camera resized there, one resized already
            outs.append(torch.stack([resize_on_device(upload.upload(0, raw), 224,
                                                      ImageResize.OPENPI),
                                     upload.upload(1, resized)])[None].clone())
    finally:
        torch.cuda.set_sync_debug_mode('default')
    assert len(upload._buffers) == 2 and all(b[0].is_pinned() for b in upload._buffers.values())
    assert outs[0].shape == (1, 2, 3, 224, 224)
    assert float(outs[1][0, 0, 0, 100, 100]) == pytest.approx(200 / 255 * 2 - 1, abs=1e-6)
