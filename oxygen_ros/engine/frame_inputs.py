"""
One valid observation as a frame: what the scheduler plans it with, what the backend runs it on.

``FrameMaker.make`` turns a ``PreparedObservation`` into the scheduler's ``FrameSpec`` (its
action request with the cycle's deadline and action prompt, its image tokens; the engine adds
the own prompts built on its instruction under its lock) and the backend's ``FrameInputs``:
the flow-matching noise (seeded per robot and frame, ``robots.noise_seed``), real-time
chunking's guidance toward the previous chunk, and the cameras as the vision tower's input
on the backend's device.

The camera images end their preparation here, in the order they flow: checked (and resized
on the host, where the device does not resize) once when they arrived (``Engine.prepare_image``
or ``transforms.inputs.prepare_observation``), then uploaded through persistent pinned buffers
(``backends.async_io.CameraUpload``) and, those left to the device, resized there with the
checkpoint family's filter (``transforms.images.resize_on_device``). The backend runs the
vision job on what it is given.
"""

from __future__ import annotations

from typing import Iterator, Mapping

import numpy as np
from oxygen_ros.backends.async_io import CameraUpload
from oxygen_ros.backends.interface import FrameInputs
from oxygen_ros.config import ModelConfig
from oxygen_ros.control.rtc import RtcRequest
from oxygen_ros.engine.cycle import CycleFrame
from oxygen_ros.engine.robots import noise_seed, RobotState
from oxygen_ros.model.guidance import RtcGuidance
from oxygen_ros.sched.request import FrameSpec, Request, RequestKind
from oxygen_ros.transforms.images import ImageResize, resize_on_device
from oxygen_ros.transforms.inputs import PreparedObservation
import torch


class FrameMaker:
    """
    Makes the frame of each valid observation of one engine.

    :param cfg: the model preset.
    :param device: the backend's device (where the images go).
    :param image_resize: the checkpoint family's filter (for images the device resizes).
    :param seed: the engine's seed (a frame's noise: ``robots.noise_seed``).
    :param rtc_jacobian_steps: the guided sampler's Jacobian steps (None: every step).
    """

    def __init__(self, cfg: ModelConfig, device: torch.device, image_resize: ImageResize,
                 seed: int, rtc_jacobian_steps: int | None) -> None:
        self._cfg = cfg
        self._upload = CameraUpload(device)
        self._resize = image_resize
        self._seed = seed
        self._jacobian_steps = rtc_jacobian_steps

    def make(self, frame_id: int, robot: RobotState, prepared: PreparedObservation,
             now: float, deadline: float | None,
             rtc: RtcRequest | None) -> tuple[FrameSpec, FrameInputs]:
        """
        Return the frame's ``FrameSpec`` and ``FrameInputs`` (the robot's frame counted).

        :param frame_id: the engine's id of the frame (unique over its robots).
        :param robot: the robot observed (its noise index, its previous chunk: the guidance
            target, with ``rtc``).
        :param now: monotonic seconds at the start of the cycle (the action's arrival).
        :param deadline: when the cycle's text work must end (the action request's deadline).
        """
        cfg = self._cfg
        action = Request(f'action-{frame_id}', RequestKind.ACTION, prepared.action_prompt_ids,
                         arrival_time=now, deadline=deadline)
        num_cams = prepared.num_cameras
        frame = FrameSpec(frame_id, num_cams * cfg.image_tokens_per_camera, num_cams, action,
                          robot=robot.name)
        seed = noise_seed(self._seed, robot.name, robot.next_noise_index())
        gen = torch.Generator().manual_seed(seed)
        noise = torch.randn((1, cfg.action_horizon, cfg.action_dim), generator=gen,
                            dtype=torch.float32)
        history = robot.history
        target = (history.guidance(prepared.stamp_ns, prepared.state, rtc)
                  if rtc is not None else None)
        guidance = None if target is None else RtcGuidance.from_numpy(
            target.target, target.soft_mask, target.max_guidance_weight, self._jacobian_steps)
        return frame, FrameInputs(frame_id, self.images(prepared.cameras), noise, guidance)

    def make_due(self, frame_ids: Iterator[int],
                 due: list[tuple[RobotState, PreparedObservation | None]], now: float,
                 deadline: float | None, rtc: Mapping[str, RtcRequest]
                 ) -> tuple[list[FrameSpec], dict[int, CycleFrame], list[FrameInputs]]:
        """
        Return the frames of the robots due with a valid observation (:meth:`make` each).

        :param frame_ids: the engine's frame ids (the next one per frame).
        :param rtc: the guided robots' requests.
        :returns: their ``FrameSpec``, their ``CycleFrame`` by frame id, their ``FrameInputs``.
        """
        frames, cycle_frames, inputs = [], {}, []
        for robot, prepared in due:
            if prepared is None:
                continue
            frame, frame_inputs = self.make(next(frame_ids), robot, prepared, now, deadline,
                                            rtc.get(robot.name))
            frames.append(frame)
            inputs.append(frame_inputs)
            cycle_frames[frame.frame_id] = CycleFrame(robot.name, prepared, robot.history,
                                                      frame_inputs.guidance is not None)
        return frames, cycle_frames, inputs

    @torch.inference_mode()
    def images(self, cameras: tuple[np.ndarray, ...]) -> torch.Tensor:
        """
        Return the cameras as the vision tower's input on the device.

        :param cameras: per camera ``float32 [3, S, S]`` in [-1, 1] (resized on the host) or
            ``uint8 [H, W, 3]`` (resized here, on the device).
        :returns: ``float32 [1, N, 3, S, S]``.
        """
        size = self._cfg.vision.image_size
        up = self._upload
        return torch.stack([
            up.upload(i, img) if img.dtype != np.uint8 else
            resize_on_device(up.upload(i, img), size, self._resize)
            for i, img in enumerate(cameras)])[None]


__all__ = ['FrameMaker']
