"""
The engine loop: observations and text requests in, action chunks and finished texts out.

One ``step`` is one control cycle: prepare the newest observation, let the scheduler plan the
cycle (OxyGen or isolated: it admits waiting text requests onto the frame), run the plan on
the backend, and turn the results into robot-unit actions and text pieces. ``begin`` is the
same cycle in two parts (``cycle.Cycle``): the action chunk as soon as it is denoised, then
the text, so that a caller publishes the chunk before the cycle's decoding without the
engine ever calling back up into it. The engine knows nothing of ROS; the node begins a cycle
from its control timer.

Threads: ``step``/``begin`` (and the cycle), ``warmup`` and ``shutdown`` run in one thread
(the node's control cycle); ``submit_text``, ``abort`` and the counts may be called from any
other. The scheduler and its requests (with the engine's text state on each,
``text_request.TextRequest``) are touched only under ``_lock``, which a cycle holds while it
plans and while it books the results, never while the model runs: a request is queued or
refused at once, never after a control cycle.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
import itertools
import logging
import threading
import time
from typing import Iterator, Mapping, Sequence

import numpy as np
from oxygen_ros.backends.async_io import block_slots
from oxygen_ros.backends.interface import Backend
from oxygen_ros.config import get_preset
from oxygen_ros.control.rtc import ChunkHistory, RtcRequest
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.cycle import Cycle
from oxygen_ros.engine.frame_inputs import FrameMaker
from oxygen_ros.engine.loading import (
    build_backend, check_quantization, check_shared_backend, load_model, load_tokenizer,
    LoadedModel)
from oxygen_ros.engine.outputs import StepOutput, TextOutput
from oxygen_ros.engine.reports import EngineReports
from oxygen_ros.engine.robots import RobotObservations, Robots
from oxygen_ros.engine.text_request import frame_prompts, new_text_request, TextRequest
from oxygen_ros.engine.warm_texts import warm_texts
from oxygen_ros.model.lora import SuffixLoRA
from oxygen_ros.model.pi05 import Pi05Model
from oxygen_ros.observation import Observation
from oxygen_ros.sched.request import RequestStatus
from oxygen_ros.sched.request_queue import QueueFullError
from oxygen_ros.sched.scheduler import Scheduler
from oxygen_ros.transforms.conventions import resolve_conventions
from oxygen_ros.transforms.inputs import (
    CameraImage, prepare_camera, prepare_observation, PreparedObservation)
from oxygen_ros.transforms.norm_stats import NormStats
from oxygen_ros.transforms.normalize import Normalizer
from oxygen_ros.transforms.prompt import TextTask
from oxygen_ros.transforms.tokenizer import PaligemmaTokenizer
import torch

_LOG = logging.getLogger(__name__)

WARMUP_ACTION_DT_NS = 100_000_000
"""The action step of the warm-up's guided cycle (any: its frame is the previous one's)."""


class EngineClosedError(RuntimeError):
    """The engine was shut down; it takes no more observations or requests."""


class Engine(EngineReports):
    """
    π0.5 with unified KV cache management behind a step-per-control-cycle interface.

    :param model: an already built model to share (the benchmark runs two policies on one
        set of weights), or what ``loading.load_model`` returned (its fallbacks reported
        too, its float32 reference handed to the fast path's gate); its config must equal
        ``config.model_config()``, and it must be quantized as ``config.quantization`` says.
    :param backend: an already built backend on ``model`` to run on (the benchmark's two
        policies share one warm-up of the fast path: ``Backend.sharing_pool``); it
        must offer ``config.pool_blocks()`` blocks, and hold the memory adapter when the
        config names one. Default: one made for this config.
    :param robots: the robots served from the start (``robots.Robots``; more with
        :meth:`add_robot`): ``''`` the one unnamed robot, or names, at most
        ``config.scheduler.max_robots`` (``docs/design.md#several-robots``).
    :raises ValueError: inconsistent configuration, checkpoint, norm stats or backend, or
        bad robot names.
    :raises FileNotFoundError: missing checkpoint, tokenizer, norm stats or adapter file.
    :raises AdapterFormatError: a memory adapter that is not OxyGen's for this model.
    """

    def __init__(self, config: EngineConfig, *, model: Pi05Model | LoadedModel | None = None,
                 tokenizer: PaligemmaTokenizer | None = None,
                 norm_stats: Mapping[str, NormStats] | None = None,
                 backend: Backend | None = None, robots: Sequence[str] = ('',)) -> None:
        self.config = config
        self.model_cfg = config.model_config()
        self.robot = config.robot()
        """The robot policy: cameras, state and action dims and their transforms."""
        self.decode_budget = config.text_budget()
        """The default max tokens of a text request."""
        loaded = model if isinstance(model, LoadedModel) else \
            load_model(config, self.model_cfg) if model is None else LoadedModel(model)
        model = loaded.model
        self.load_fallbacks = dict(loaded.fallbacks)
        """Departures of the loaded weights from ``config.quantization`` (``loading.py``)."""
        check_quantization(config, loaded)
        if model.cfg != self.model_cfg:
            raise ValueError(f'shared model was built for preset {model.cfg.name} with '
                             f'{model.cfg.prefix_attention.value} prefix attention; this engine '
                             f'needs {self.model_cfg.name} / '
                             f'{self.model_cfg.prefix_attention.value}')
        self.model = model.eval()
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config)
        cfg = self.model_cfg
        self.conventions = resolve_conventions(config, get_preset(config.preset), norm_stats)
        _LOG.info('%s', self.conventions.describe())
        self.normalizer = Normalizer.from_config(
            cfg, self.robot, {'state': self.conventions.state,
                              'actions': self.conventions.actions})
        self.max_prefix_tokens = cfg.prefix_tokens(len(self.robot.cameras))
        num_blocks = config.pool_blocks()
        self.scheduler = Scheduler(config.scheduler, num_blocks=num_blocks,
                                   max_prefix_tokens=self.max_prefix_tokens,
                                   prefix_attention=cfg.prefix_attention,
                                   eos_token_id=self.tokenizer.eos_id)
        if backend is None:
            backend = build_backend(config, self.model, num_blocks, loaded.reference)
        else:
            check_shared_backend(config, backend, self.model, num_blocks)
        if config.backend.rtc and backend.guidance_unsupported:
            raise ValueError(f'real-time chunking (chunk_smoothing rtc) is not possible here: '
                             f'{backend.guidance_unsupported}')
        self.backend: Backend = backend
        self.adapter: SuffixLoRA | None = backend.adapter
        self.bytes_per_block = (self.backend.cache.nbytes // self.backend.cache.num_slots) * \
            config.scheduler.block_size
        self._lock = threading.Lock()
        self._req_ids = itertools.count()
        self._frame_ids = itertools.count()
        self._frames = FrameMaker(cfg, self.backend.device, self.conventions.image_resize,
                                  config.seed, config.backend.rtc_jacobian_steps)
        self._robots = Robots(robots, config.scheduler.max_robots, self.normalizer)
        self._closed = False
        _LOG.info('engine: preset %s, %s policy, %s prefix, k=%d, KV pool %d blocks x %d '
                  '(%.1f MiB); %s', cfg.name, config.scheduler.policy.value,
                  cfg.prefix_attention.value, config.scheduler.tokens_per_cycle, num_blocks,
                  config.scheduler.block_size,
                  self.backend.cache.nbytes / 2**20, self.describe_text())

    # -- robots (any thread) --------------------------------------------------------------
    @property
    def robots(self) -> tuple[str, ...]:
        """Return the names of the robots served (``('',)``: the one unnamed robot)."""
        with self._lock:
            return self._robots.names

    def add_robot(self, name: str) -> None:
        """Serve one more robot (thread-safe; ValueError: as ``Robots.add``)."""
        with self._lock:
            self._check_open()
            self._robots.add(name)

    def remove_robot(self, name: str) -> list[TextOutput]:
        """
        Stop serving a robot (thread-safe): its text requests dropped, its state forgotten.

        :returns: the last output of each of its waiting and running text requests
            (``FinishReason.DROPPED``, ``error`` ``robot removed``).
        :raises ValueError: an unknown robot.
        """
        with self._lock:
            self._robots.remove(name)
            ended = [self.scheduler.finish_request(req.req_id, RequestStatus.FINISHED_DROPPED,
                                                   'robot removed')
                     for req in list(self.scheduler.requests.values())
                     if isinstance(req, TextRequest) and req.robot == name]
            return [req.output(req.num_output_tokens) for req in ended]

    # -- requests (any thread) ------------------------------------------------------------
    def submit_text(self, task: TextTask, *, question: str | None = None,
                    max_tokens: int | None = None, req_id: str | None = None,
                    robot: str = '') -> str:
        """
        Queue a text request in the scheduler's waiting queue, or refuse it (thread-safe).

        It is admitted onto a later valid observation's prefix of ``robot``, first come
        first served.

        :returns: the request id.
        :raises EngineClosedError: after ``shutdown``.
        :raises QueueFullError: no place: ``max_waiting_requests`` wait, or ``robot``'s share
            is taken (``docs/design.md#several-robots``; importable from here, part of the API).
        :raises ValueError: ANSWER without a question (or one empty after cleaning), a
            question for another task, a budget < 1, a duplicate id, a budget the KV pool
            could never hold (``Scheduler.max_blocks_needed``), or an unknown robot.
        """
        self._check_open()
        with self._lock:   # a full queue refuses before tokenizing (checked again)
            self._robots.get(robot)
            self.scheduler.check_room(robot, self._robots.names)
        task = TextTask(task)
        budget = self.decode_budget if max_tokens is None else max_tokens
        context = self.config.text_context(task)
        req_id = req_id or f'{task.value}-{next(self._req_ids)}'
        request = new_text_request(self.tokenizer, req_id, task, context, question, budget,
                                   max_prompt_len=self.model_cfg.max_token_len,
                                   use_adapter=self.adapter is not None, robot=robot)
        with self._lock:
            self._check_open()
            self._robots.get(robot)
            self.scheduler.add_request(request, self._robots.names)
        return req_id

    def abort(self, req_id: str) -> TextOutput | None:
        """
        Cancel a waiting or running text request, freeing its KV blocks (thread-safe).

        :returns: its last output (``FinishReason.ABORT``, the text decoded so far), or None
            for an unknown or already finished request, or after ``shutdown``.
        """
        with self._lock:
            if self._closed:
                return None
            req = self.scheduler.abort_request(req_id)
            return req.output(req.num_output_tokens) if isinstance(req, TextRequest) else None

    def set_max_waiting_requests(self, limit: int) -> None:
        """
        Change the bound of the waiting queue (from the next ``submit_text`` on; thread-safe).

        The bound lives in the scheduler's settings, ``config.scheduler``, one object the
        scheduler reads at each request: the new one replaces it. Requests waiting beyond a
        lowered bound stay queued.

        :raises ValueError: a bound < 1.
        """
        with self._lock:
            settings = replace(self.config.scheduler, max_waiting_requests=limit)
            self.config = replace(self.config, scheduler=settings)
            self.scheduler.config = settings

    # -- the control cycle ---------------------------------------------------------------
    @property
    def resize_on_device(self) -> bool:
        """Return whether uint8 camera images go to the backend's device to be resized."""
        setting = self.config.resize_on_device
        return self.backend.device.type == 'cuda' if setting is None else setting

    def prepare_image(self, slot: str, image: np.ndarray) -> CameraImage:
        """
        Check one camera image and do its host share of preparation (thread-safe).

        What the node calls when an image arrives, off the control cycle: resize with pad
        and scale on the host, or, where the backend resizes on its device, the check alone.

        :param slot: the camera slot (for the error message).
        :raises ObservationError: a malformed image (``BAD_IMAGE``).
        """
        return prepare_camera(slot, image, self.model_cfg, self.conventions.image_resize,
                              on_device=self.resize_on_device)

    def prepare(self, obs: Observation) -> PreparedObservation:
        """
        Check and transform an observation without changing any engine state.

        :raises ObservationError: see ``transforms.inputs.prepare_observation``.
        """
        return prepare_observation(obs, self.model_cfg, self.tokenizer, self.normalizer,
                                   prompt_format=self.conventions.prompt_format,
                                   state_pad=self.conventions.state_prompt_pad,
                                   image_resize=self.conventions.image_resize,
                                   resize_on_device=self.resize_on_device)

    def step(self, obs: Observation | PreparedObservation | None | RobotObservations,
             now: float | None = None, *, rtc: RtcRequest | Mapping[str, RtcRequest] | None = None,
             deadline: float | None = None) -> StepOutput:
        """
        Run one control cycle to its end (``begin`` and the cycle's ``finish``).

        :raises ObservationError, EngineClosedError, ValueError: as :meth:`begin`.
        """
        return self.begin(obs, now, rtc=rtc, deadline=deadline).finish()

    def begin(self, obs: Observation | PreparedObservation | None | RobotObservations,
              now: float | None = None, *,
              rtc: RtcRequest | Mapping[str, RtcRequest] | None = None,
              deadline: float | None = None) -> Cycle:
        """
        Begin one control cycle: prepare the observations and plan the cycle.

        The caller then takes the action chunks (``Cycle.action``, several robots'
        ``Cycle.actions``) and publishes each, then finishes the cycle (``Cycle.finish``), in
        this thread, before the next ``begin``.

        :param obs: the newest observation of the engine's one robot; None when there is no
            valid one (no action is produced, no text request is seeded, running text keeps
            decoding). Several robots: a mapping robot -> observation (or None) of the
            robots due this cycle (those left out are not due); their frames run together.
        :param now: monotonic seconds at the start of the cycle (default: now).
        :param rtc: guide the chunk toward the previous one (real-time chunking): its points
            for the new chunk's times, found by the two observation stamps, are the target
            (``ChunkHistory.guidance``); none when there is no previous chunk, it has no point
            left for the new one, or the new frame is older. Several robots: a mapping robot
            -> request (robots left out: unguided).
        :param deadline: monotonic seconds by which the cycle's text work should be done (the
            node's next control tick): text decoding plans for it (k adapts, admission
            waits) and stops at it (``DecodeJob.deadline``); the action is never cut. None:
            no deadline, k ``tokens_per_cycle`` tokens per request.
        :raises ObservationError: an observation is invalid (nothing has changed then; with
            several robots, prepare each first, :meth:`prepare`, to tell whose).
        :raises EngineClosedError: after ``shutdown``.
        :raises ValueError: ``rtc`` on a backend that cannot guide, a single observation for
            an engine of several robots, an unknown robot (nothing has changed).
        """
        self._check_open()
        t0 = time.perf_counter()
        now = time.monotonic() if now is None else now
        with self._lock:
            observed, guided = self._robots.due(obs, rtc)
        if guided and self.backend.guidance_unsupported:
            raise ValueError(f'cannot guide this chunk (rtc): '
                             f'{self.backend.guidance_unsupported}')
        ready = [(robot, self.prepare(o) if isinstance(o, Observation) else o)
                 for robot, o in observed]
        frames, cycle_frames, inputs = self._frames.make_due(
            self._frame_ids, ready, now, deadline, guided)
        dropped: list[TextRequest] = []
        with self._lock:
            for k, frame in enumerate(frames):   # own prompts on each frame's instruction
                prompts, lost = frame_prompts(
                    self.scheduler, cycle_frames[frame.frame_id].prepared.instruction,
                    frame.robot)
                frames[k] = replace(frame, own_prompts=prompts)
                dropped += lost
            self.scheduler.kv.pool.reset_peak()
            plan = self.scheduler.schedule(frames, now, deadline=deadline)
            for data in plan.new_requests:
                self.scheduler.requests[data.req_id].frame_stamp_ns = \
                    cycle_frames[data.frame_id].prepared.stamp_ns
        return Cycle(plan, cycle_frames, inputs, t0, dropped, scheduler=self.scheduler,
                     backend=self.backend, lock=self._lock, normalizer=self.normalizer,
                     bytes_per_block=self.bytes_per_block)

    @property
    def chunk_history(self) -> ChunkHistory:
        """
        Return the last chunk of the engine's one robot, for real-time chunking.

        :raises ValueError: the engine serves several robots (:meth:`chunk_history_of`).
        """
        with self._lock:
            return self._robots.only().history

    def chunk_history_of(self, robot: str) -> ChunkHistory:
        """Return a robot's last chunk, for real-time chunking (ValueError: unknown robot)."""
        with self._lock:
            return self._robots.get(robot).history

    def reset_chunk_history(self, robot: str | None = None) -> None:
        """
        Forget a robot's previous action chunk (RTC starts over: at activation, after a gap).

        :param robot: its name; None: the engine's one robot.
        :raises ValueError: an unknown robot, or None for an engine of several.
        """
        with self._lock:
            state = self._robots.only() if robot is None else self._robots.get(robot)
            state.history.reset()

    @contextmanager
    def borrow_kv_slots(self, num_tokens: int) -> Iterator[torch.Tensor | None]:
        """
        Lend ``num_tokens`` slots of the KV pool while the context lasts (thread-safe).

        For measurements on the engine's own pool between cycles (the benchmark's component
        probe runs the fast path's graphs, which read the pool by address): the scheduler's
        KV manager holds the blocks for the borrower, and frees them at the end.

        :returns: (the context's value) ``int64 [num_tokens]`` slots of ``backend.cache`` on
            its device, or None when the pool has not that many free blocks now.
        """
        owner = f'borrowed-{next(self._req_ids)}'
        with self._lock:
            alloc = self.scheduler.kv.allocate(owner, (), num_tokens)
        if alloc is None:
            yield None
            return
        try:
            yield block_slots(alloc.block_ids, num_tokens, self.config.scheduler.block_size,
                              self.backend.device)
        finally:
            with self._lock:
                self.scheduler.kv.free(owner)

    # -- lifecycle -----------------------------------------------------------------------
    def warmup(self, observation: Observation) -> None:
        """
        Run full cycles with a text request of each kind of context in use, then a full batch.

        Fills caches, warms every text path (own prompt, suffix on the action prefix, the
        memory adapter), gives the cost model its first measurements, then decodes up to
        ``max_running_requests`` questions of the whole budget at once: a burst's largest batch
        and context, its memory there before the first burst (``docs/robustness.md#soak``).
        With ``config.backend.rtc`` a guided cycle follows: the robot's first guided one runs
        warm. Several robots: ``observation`` is every robot's, their frames run together and
        the requests go to them in turn; then each robot starts afresh (no chunk, frame 0).

        :raises ValueError: an engine serving no robot.
        """
        names = self.robots
        if not names:
            raise ValueError('no robot to warm up with: add_robot first')
        obs = observation if names == ('',) else dict.fromkeys(names, observation)
        tasks = {self.config.text_context(task): task for task in TextTask}  # memory last
        warm_texts(self, obs, names, list(tasks.values()), 2)
        warm_texts(self, obs, names,
                   [TextTask.ANSWER] * self.config.scheduler.max_running_requests,
                   self.decode_budget, as_the_pool_holds=True)
        if self.config.backend.rtc:
            rtc = RtcRequest(1, WARMUP_ACTION_DT_NS)
            self.step(obs, rtc=rtc if names == ('',) else dict.fromkeys(names, rtc))
        with self._lock:
            self._robots.reset()

    def shutdown(self) -> list[TextOutput]:
        """
        Abort every request, release the KV pool; later calls raise EngineClosedError.

        :returns: the last output of every waiting and running text request
            (``FinishReason.DROPPED``, ``error`` ``engine shut down``; running ones with their
            text so far).
        """
        with self._lock:
            if self._closed:
                return []
            out = [req.output(req.num_output_tokens)
                   for req in self.scheduler.drop_all('engine shut down')
                   if isinstance(req, TextRequest)]
            self._closed = True
        del self.backend
        return out

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError('the engine was shut down')


__all__ = ['Engine', 'EngineClosedError', 'QueueFullError', 'WARMUP_ACTION_DT_NS']
