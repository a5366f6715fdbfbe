"""An engine whose camera images are resized on the backend's device, or prepared on arrival."""

from dataclasses import replace

import numpy as np
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.observation import Observation, ObservationError, RefusalReason
from oxygen_ros.transforms.images import ImageResize
from oxygen_ros.transforms.inputs import CameraImage
from oxygen_ros.transforms.prompt import TextTask
import pytest
from skimage import data

CAMS = CAMERA_SLOTS[:2]


def observation(f, prompt='pick up the cup'):
    rng = np.random.default_rng(f)
    images = {CAMS[0]: np.ascontiguousarray(data.coffee()[:400, :600]),
              CAMS[1]: rng.integers(0, 256, (120, 160, 3), dtype=np.uint8)}
    return Observation(images, rng.uniform(-1, 1, 8).astype(np.float32), prompt,
                       stamp_ns=f * 66_000_000)


def run(engine, frames=3):
    actions, texts = [], {}
    for f in range(frames):
        engine.submit_text(TextTask.MEMORY, max_tokens=3, req_id=f'm{f}')
        out = engine.step(observation(f))
        actions.append(out.action.actions)
        texts.update({t.req_id: t.token_ids for t in out.finished})
    return actions, texts


def test_an_engine_resizing_on_its_device_equals_one_resizing_on_the_host(tiny_models,
                                                                          tokenizer):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    cfg = EngineConfig.create(preset='tiny', cameras=CAMS, image_resize=ImageResize.LEROBOT,
                              seed=3, stop_on_eos=False)
    host = Engine(cfg, model=model, tokenizer=tokenizer)
    device = Engine(replace(cfg, resize_on_device=True), model=model, tokenizer=tokenizer)
    assert not host.resize_on_device and device.resize_on_device
    prepared = device.prepare(observation(0))
    assert [c.dtype for c in prepared.cameras] == [np.uint8, np.uint8]   # left as they came
    with pytest.raises(ValueError, match='resized on the device'):
        prepared.images
    a_host, t_host = run(host)
    a_dev, t_dev = run(device)
    for a, b in zip(a_host, a_dev):
        np.testing.assert_array_equal(a, b)
    assert t_host == t_dev


def test_images_prepared_when_they_arrive_are_taken_as_they_are(tiny_models, tokenizer):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMS)
    engine = Engine(EngineConfig(preset='tiny', cameras=CAMS, seed=3), model=model,
                    tokenizer=tokenizer)
    obs = observation(1)
    early = {slot: engine.prepare_image(slot, img) for slot, img in obs.images.items()}
    assert all(isinstance(c, CameraImage) and c.resized for c in early.values())
    a = engine.prepare(obs)
    b = engine.prepare(Observation(early, obs.state, obs.prompt, obs.stamp_ns))
    np.testing.assert_array_equal(a.images, b.images)
    with pytest.raises(ObservationError,
                       match=r'camera base_0_rgb: image: expected 3 channels') as exc:
        engine.prepare_image('base_0_rgb', np.zeros((4, 4, 4), np.uint8))
    assert exc.value.reason is RefusalReason.BAD_IMAGE
