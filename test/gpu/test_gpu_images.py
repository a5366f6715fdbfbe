"""Camera images resized on a CUDA device equal the host path (``pytest -m gpu``)."""

import numpy as np
from oxygen_ros.backends.async_io import CameraUpload
from oxygen_ros.transforms.images import image_to_model, ImageResize, resize_on_device
import pytest
from skimage import data
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason='needs a CUDA GPU (torch.cuda.is_available() is False)'),
]
ONE_LEVEL = 2.0 / 255.0 + 1e-6


@pytest.mark.parametrize('resize', list(ImageResize), ids=lambda r: r.value)
def test_cuda_resize_within_one_uint8_level_of_the_host(resize):
    rng = np.random.default_rng(0)
    for img in (np.ascontiguousarray(data.coffee()[:400, :600]),
                rng.integers(0, 256, (480, 640, 3), dtype=np.uint8),
                rng.integers(0, 256, (97, 33, 3), dtype=np.uint8)):
        host = image_to_model(img, 224, resize)
        cuda = resize_on_device(torch.from_numpy(img).cuda(), 224, resize).cpu().numpy()
        assert np.abs(cuda - host).max() <= ONE_LEVEL, (resize, img.shape)


def test_uploads_reuse_their_pinned_buffers_and_never_wait_for_the_host():
    upload = CameraUpload(torch.device('cuda'))
    frames = [(np.full((480, 640, 3), v, np.uint8), np.full((3, 224, 224), 0.5, np.float32))
              for v in (10, 200)]
    outs = []
    torch.cuda.set_sync_debug_mode('error')      # an implicit host sync raises here
    try:
        for images in frames:
            outs.append(upload.upload(images, ImageResize.OPENPI, 224).clone())
    finally:
        torch.cuda.set_sync_debug_mode('default')
    assert len(upload._buffers) == 2 and all(b[0].is_pinned() for b in upload._buffers.values())
    assert outs[0].shape == (1, 2, 3, 224, 224)
    assert float(outs[1][0, 0, 0, 100, 100]) == pytest.approx(200 / 255 * 2 - 1, abs=1e-6)
