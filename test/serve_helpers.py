"""
Helpers of the oxygen_serve tests: a server in a thread, openpi observations per robot layout.

The server runs as ``oxygen_serve`` runs it (``serve.run.make_server`` on a built engine, its
own event loop: ``serve.run.ServerThread``), in a thread of the test process, so that a
reference engine can share its random weights; clients are real (openpi's
``WebsocketClientPolicy``, websockets, raw sockets) over real localhost sockets.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
import time
from typing import Iterator

import numpy as np
from oxygen_ros.config import CAMERA_SLOTS
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.loading import build_model
from oxygen_ros.observation import Observation
from oxygen_ros.serve.layouts import Layout
from oxygen_ros.serve.limits import ServeLimits
from oxygen_ros.serve.run import make_server, ServerThread

PRESETS = {Layout.LIBERO: 'tiny', Layout.DROID: 'tiny', Layout.ALOHA: 'tiny_aloha'}
"""The test-size preset each layout is served with (tiny: 2 cameras and 8 state dims)."""
SEED = 3
PROMPT = 'pick up the cup'
_MODELS: dict[object, object] = {}


def model_for(cfg: EngineConfig):
    """Return the seeded random model of ``cfg`` (built once per model config and session)."""
    key = cfg.model_config()
    if key not in _MODELS:
        _MODELS[key] = build_model(cfg, key)
    return _MODELS[key]


def engine_for(layout: Layout, tokenizer, **config) -> Engine:
    """Return a fresh engine (its own KV pool, frame 0) on the layout's shared model."""
    cfg = EngineConfig.create(preset=PRESETS[layout], seed=SEED, **config)
    return Engine(cfg, model=model_for(cfg), tokenizer=tokenizer)


@contextmanager
def running(engine: Engine, layout: Layout, limits: ServeLimits | None = None,
            **kwargs) -> Iterator[ServerThread]:
    """Serve ``engine`` on localhost for the block (a message bound for 224-pixel images)."""
    limits = limits or ServeLimits(max_message_bytes=4 * 2**20)
    srv = ServerThread(make_server(engine, layout, limits, **kwargs))
    if kwargs.get('ssl_context'):
        srv.uri = f'wss://localhost:{srv.port}'   # the name the test certificate holds
    try:
        yield srv
    finally:
        srv.close()


@contextmanager
def openpi_client(port: int, **kwargs) -> Iterator[object]:
    """Return openpi's ``WebsocketClientPolicy`` on ``port``, closed after the block."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    client = WebsocketClientPolicy('localhost', port, **kwargs)
    try:
        yield client
    finally:
        client._ws.close()          # the policy has no close(); its connection has


def logged(caplog, *parts: str, timeout: float = 20.0) -> str:
    """Return the first log line holding every one of ``parts``, waiting for the server."""
    deadline = time.monotonic() + timeout
    while True:
        for record in list(caplog.records):
            message = record.getMessage()
            if all(part in message for part in parts):
                return message
        if time.monotonic() > deadline:
            raise AssertionError(f'no log line with {parts}')
        time.sleep(0.05)


def images(rng: np.random.Generator, n: int, size: int = 224) -> list[np.ndarray]:
    return [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in range(n)]


def openpi_observation(layout: Layout, seed: int, *, prompt: str | None = PROMPT
                       ) -> dict:
    """Return the dict an openpi example client of ``layout`` sends (random content)."""
    rng = np.random.default_rng(seed)
    if layout is Layout.LIBERO:
        base, wrist = images(rng, 2)
        obs = {'observation/image': base, 'observation/wrist_image': wrist,
               'observation/state': rng.uniform(-1, 1, 8)}
    elif layout is Layout.DROID:
        base, wrist = images(rng, 2)
        obs = {'observation/exterior_image_1_left': base, 'observation/wrist_image_left': wrist,
               'observation/joint_position': rng.uniform(-1, 1, 7),
               'observation/gripper_position': rng.uniform(0, 1, 1)}
    else:
        cams = images(rng, 4)
        obs = {'images': {name: img.transpose(2, 0, 1) for name, img in zip(
            ('cam_high', 'cam_low', 'cam_left_wrist', 'cam_right_wrist'), cams)},
               'state': rng.uniform(-0.5, 0.5, 14)}
    if prompt is not None:
        obs['prompt'] = prompt
    return obs


def engine_observation(layout: Layout, obs: dict, prompt: str = PROMPT) -> Observation:
    """
    Return the engine's observation of an openpi dict, as openpi's policies read it.

    Written out here apart from ``serve/layouts.py``: LIBERO and DROID images by their openpi
    keys, DROID's state joints then gripper, ALOHA's cameras channels-first (``cam_low``
    unused) and its raw state (the preset's ALOHA adapter flips it).
    """
    base, left, right = CAMERA_SLOTS
    if layout is Layout.LIBERO:
        imgs = {base: obs['observation/image'], left: obs['observation/wrist_image']}
        state = obs['observation/state']
    elif layout is Layout.DROID:
        imgs = {base: obs['observation/exterior_image_1_left'],
                left: obs['observation/wrist_image_left']}
        state = np.concatenate([obs['observation/joint_position'],
                                obs['observation/gripper_position']])
    else:
        cams = obs['images']
        imgs = {base: cams['cam_high'].transpose(1, 2, 0),
                left: cams['cam_left_wrist'].transpose(1, 2, 0),
                right: cams['cam_right_wrist'].transpose(1, 2, 0)}
        state = obs['state']
    return Observation({k: np.ascontiguousarray(v) for k, v in imgs.items()},
                       np.asarray(state, np.float64), obs.get('prompt', prompt))


def with_stamp(obs: Observation, stamp_ns: int) -> Observation:
    return replace(obs, stamp_ns=stamp_ns)
