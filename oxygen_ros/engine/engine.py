"""
The engine loop: observations and text requests in, action chunks and finished texts out.

One ``step`` is one control cycle: prepare the newest observation, let the scheduler plan the
cycle (OxyGen or isolated: it admits waiting text requests onto the frame), run the plan on
the backend, and turn the results into robot-unit actions and text pieces. The engine knows
nothing of ROS; the node calls ``step`` from its control timer.

Threads: ``step``, ``warmup`` and ``shutdown`` run in one thread (the node's control cycle);
``submit_text``, ``abort`` and the counts may be called from any other. The scheduler and the
per-request text state (``TextStates``) are touched only under ``_lock``, which a cycle
holds while it plans and while it books the results, never while the model runs: a request is
queued or refused at once, never after a control cycle.
"""

from __future__ import annotations

from dataclasses import replace
import itertools
import logging
import threading
import time
from typing import Callable, Mapping

import numpy as np
from oxygen_ros.backends.interface import Backend, FrameInputs
from oxygen_ros.control.rtc import ChunkHistory, RtcRequest
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.loading import (
    build_backend, check_quantization, check_shared_backend, load_model, load_tokenizer,
    LoadedModel)
from oxygen_ros.engine.outputs import ActionChunk, cycle_stats, StepOutput, TextOutput
from oxygen_ros.engine.text_states import TextStates
from oxygen_ros.engine.warm_texts import warm_texts
from oxygen_ros.model.guidance import RtcGuidance
from oxygen_ros.model.lora import SuffixLoRA
from oxygen_ros.model.pi05 import Pi05Model
from oxygen_ros.observation import Observation
from oxygen_ros.sched.request import FinishReason, FrameSpec, Request, RequestKind
from oxygen_ros.sched.request_queue import QueueFullError
from oxygen_ros.sched.scheduler import Scheduler
from oxygen_ros.transforms.conventions import resolve_conventions
from oxygen_ros.transforms.inputs import (
    CameraImage, InputFault, ObservationError, prepare_camera, prepare_observation,
    PreparedObservation)
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


class Engine:
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
    :raises ValueError: inconsistent configuration, checkpoint, norm stats or backend.
    :raises FileNotFoundError: missing checkpoint, tokenizer, norm stats or adapter file.
    :raises AdapterFormatError: a memory adapter that is not OxyGen's for this model.
    """

    def __init__(self, config: EngineConfig, *, model: Pi05Model | LoadedModel | None = None,
                 tokenizer: PaligemmaTokenizer | None = None,
                 norm_stats: Mapping[str, NormStats] | None = None,
                 backend: Backend | None = None) -> None:
        self.config = config
        self.model_cfg = config.model_config()
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
        self.conventions = resolve_conventions(config, cfg, norm_stats)
        _LOG.info('%s', self.conventions.describe())
        self.normalizer = Normalizer.from_config(
            cfg, {'state': self.conventions.state, 'actions': self.conventions.actions})
        self.max_prefix_tokens = cfg.max_prefix_tokens
        sched_cfg = config.scheduler_config(self.tokenizer.eos_id)
        self.scheduler = Scheduler(sched_cfg)
        if backend is None:
            backend = build_backend(config, self.model, sched_cfg.num_blocks, loaded.reference)
        else:
            check_shared_backend(config, backend, self.model, sched_cfg.num_blocks)
        if config.rtc and backend.guidance_unsupported:
            raise ValueError(f'real-time chunking (chunk_smoothing rtc) is not possible here: '
                             f'{backend.guidance_unsupported}')
        self.backend: Backend = backend
        self.adapter: SuffixLoRA | None = backend.adapter
        self.bytes_per_block = (self.backend.cache.nbytes // self.backend.cache.num_slots) * \
            config.block_size
        self._lock = threading.Lock()
        self._texts = TextStates(self.tokenizer, self.model_cfg.max_token_len)
        self._req_ids = itertools.count()
        self._frame_index = 0
        self.chunk_history = ChunkHistory(self.normalizer)
        """The last chunk, for real-time chunking."""
        self._closed = False
        _LOG.info('engine: preset %s, %s policy, %s prefix, k=%d, KV pool %d blocks x %d '
                  '(%.1f MiB); %s', cfg.name, config.policy.value, cfg.prefix_attention.value,
                  config.tokens_per_cycle, sched_cfg.num_blocks, config.block_size,
                  self.backend.cache.nbytes / 2**20, self.describe_text())

    def describe_contexts(self) -> str:
        """Return what each text task reads, e.g. ``subtask: own_prompt, answer: ...``."""
        return ', '.join(f'{task.value}: {self.config.text_context(task).value}'
                         for task in TextTask)

    def describe_adapter(self) -> str:
        """Return the memory adapter as logs and diagnostics name it (``none`` if absent)."""
        if self.adapter is None:
            return 'none'
        return (f'{self.config.memory_adapter} (rank {self.adapter.rank}, alpha '
                f'{self.adapter.alpha:g})')

    def describe_text(self) -> str:
        """Return :meth:`describe_contexts` and :meth:`describe_adapter` in one line."""
        return f'text contexts {self.describe_contexts()}; memory adapter ' \
            f'{self.describe_adapter()}'

    # -- requests (any thread) ------------------------------------------------------------
    def submit_text(self, task: TextTask, *, question: str | None = None,
                    max_tokens: int | None = None, req_id: str | None = None) -> str:
        """
        Queue a text request in the scheduler's waiting queue, or refuse it (thread-safe).

        It is admitted onto a later valid observation's prefix, first come first served.

        :returns: the request id.
        :raises EngineClosedError: after ``shutdown``.
        :raises QueueFullError: ``max_waiting_requests`` requests wait already (the refusal;
            importable from this module, part of the engine's API).
        :raises ValueError: ANSWER without a question (or one empty after cleaning), a
            question for another task, a budget < 1, a duplicate id, or a budget the KV pool
            could never hold (``Scheduler.max_blocks_needed``).
        """
        self._check_open()
        self.scheduler.check_room()  # a full queue refuses before tokenizing (checked again)
        task = TextTask(task)
        budget = self.model_cfg.decode_budget if max_tokens is None else max_tokens
        context = self.config.text_context(task)
        req_id = req_id or f'{task.value}-{next(self._req_ids)}'
        request = self._texts.new_request(req_id, task, context, question, budget,
                                          use_adapter=self.adapter is not None)
        with self._lock:
            self._check_open()
            self.scheduler.add_request(request)
            self._texts.add(req_id, task, context, question)
        return req_id

    def abort(self, req_id: str) -> TextOutput | None:
        """
        Cancel a waiting or running text request, freeing its KV blocks (thread-safe).

        :returns: its output (``FinishReason.ABORT``, the text decoded so far), or None for
            an unknown or already finished request, or after ``shutdown``.
        """
        with self._lock:
            if self._closed:
                return None
            req = self.scheduler.abort_request(req_id)
            if req is None:
                return None
            return self._texts.ended(req_id, tuple(req.output_token_ids), FinishReason.ABORT)

    def set_max_waiting_requests(self, limit: int) -> None:
        """
        Change the bound of the waiting queue (from the next ``submit_text`` on; thread-safe).

        Requests waiting beyond a lowered bound stay queued.

        :raises ValueError: a bound < 1.
        """
        with self._lock:
            self.scheduler.config = replace(self.scheduler.config, max_waiting_requests=limit)
            self.config = replace(self.config, max_waiting_requests=limit)

    def set_control_period(self, seconds: float | None) -> None:
        """
        Change the action deadline per cycle (k adapts to it from the next cycle on).

        :param seconds: the control period, or None for a fixed k.
        :raises ValueError: a period <= 0.
        """
        if seconds is not None and seconds <= 0:
            raise ValueError(f'control period must be > 0 s, got {seconds}')
        with self._lock:
            self.config = replace(self.config, control_period_s=seconds)
            self.scheduler.config = replace(self.scheduler.config,
                                            adapt_tokens_per_cycle=seconds is not None)

    @property
    def num_running(self) -> int:
        """Return the text requests decoding."""
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        """Return the text requests waiting for admission (the scheduler's queue)."""
        return self.scheduler.num_waiting

    @property
    def fallbacks(self) -> dict[str, str]:
        """
        Return what does not run as configured: compiled step -> reason, and ``quantization``.

        The compiled steps that fell back to eager execution (none when nothing was compiled
        or everything compiled passed its parity gate), and ``config.QUANTIZATION_FALLBACK``
        when the weights are not quantized as asked (``loading.load_model``). The node
        reports each on ``/diagnostics`` (WARN); ``oxygen_bench gpu`` fails on any.
        """
        return {**self.load_fallbacks, **self.backend.warmup_report.fallbacks}

    @property
    def dropped_features(self) -> dict[str, str]:
        """
        Return the fast path's features left out (``backends/features.py``): name -> reason.

        The steps stay compiled without them; the node reports each on ``/diagnostics``.
        """
        return dict(self.backend.warmup_report.dropped)

    def describe_quantization(self) -> str:
        """Return the weights' quantization as it runs (``model/fp8.py``), e.g. ``none``."""
        from oxygen_ros.model.fp8 import describe_quantization
        return describe_quantization(self.model)

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
        try:
            return prepare_camera(image, self.model_cfg, self.conventions.image_resize,
                                  on_device=self.resize_on_device)
        except ValueError as exc:
            raise ObservationError(InputFault.BAD_IMAGE, f'camera {slot}: {exc}') from None

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

    def step(self, obs: Observation | PreparedObservation | None, now: float | None = None, *,
             on_action: Callable[[ActionChunk], None] | None = None,
             rtc: RtcRequest | None = None, deadline: float | None = None) -> StepOutput:
        """
        Run one control cycle.

        :param obs: the newest observation; None when there is no valid one (no action is
            produced, no text request is seeded, running text keeps decoding).
        :param now: monotonic seconds at the start of the cycle (default: now).
        :param on_action: called (in this thread) with the action chunk as soon as it is
            denoised, before the cycle's text decoding: publish it from here for the lowest
            latency. Not called for a cycle without a valid observation or with non-finite
            actions. The chunk is also in the returned ``StepOutput``.
        :param rtc: guide the chunk toward the previous one (real-time chunking): its points
            for the new chunk's times, found by the two observation stamps, are the target
            (``ChunkHistory.guidance``); none when there is no previous chunk, it has no point
            left for the new one, or the new frame is older.
        :param deadline: monotonic seconds by which the cycle's text work should be done (the
            node's next control tick); default ``now + control_period_s``. Text decoding
            plans for it and stops at it (``DecodeJob.deadline``); the action is never cut.
        :raises ObservationError: ``obs`` is invalid (nothing has changed then).
        :raises EngineClosedError: after ``shutdown``.
        :raises ValueError: ``rtc`` on a backend that cannot guide (nothing has changed).
        """
        self._check_open()
        if rtc is not None and self.backend.guidance_unsupported:
            raise ValueError(f'cannot guide this chunk (rtc): '
                             f'{self.backend.guidance_unsupported}')
        t0 = time.perf_counter()
        now = time.monotonic() if now is None else now
        prepared = self.prepare(obs) if isinstance(obs, Observation) else obs
        frame, inputs, rejected = None, None, []
        if prepared is not None:
            frame, inputs = self._new_frame(prepared, now, rtc, deadline)
        with self._lock:
            if prepared is not None:
                rejected = self._texts.build_prompts(list(self.scheduler.waiting),
                                                     prepared.instruction)
                for text in rejected:
                    self.scheduler.abort_request(text.req_id)
                    _LOG.warning('text request %s rejected: %s', text.req_id, text.error)
            self.scheduler.kv.pool.reset_peak()
            plan = self.scheduler.schedule(frame, now)
            for data in plan.new_requests:
                self._texts.states[data.req_id].frame_stamp_ns = prepared.stamp_ns
        ready: list[ActionChunk | None] = []
        latency = [float('nan')]

        def actions_ready(_frame_id: int, actions: torch.Tensor) -> None:
            # only the frame's DenoiseJob calls this, so prepared and frame are set
            ready.append(self._action_chunk(actions, prepared, frame.frame_id,
                                            inputs.guidance is not None))
            if ready[0] is not None:
                self.chunk_history.record(prepared.stamp_ns, actions[0].float().cpu().numpy(),
                                          ready[0].actions)
            latency[0] = time.perf_counter() - t0
            if on_action is not None and ready[0] is not None:
                on_action(ready[0])
        result = self.backend.execute(plan, inputs, on_actions=actions_ready)
        with self._lock:
            decoding = [(req, req.num_output_tokens) for req in map(
                self.scheduler.requests.get, result.runner.sampled_token_ids) if req is not None]
            finished = self.scheduler.update_from_output(plan, result.runner)
            deltas = [self._texts.delta(req, num_before) for req, num_before in decoding]
            texts = [self._texts.finished(req) for req in finished] + rejected
            stats = cycle_stats(plan, result, self.scheduler, self.bytes_per_block,
                                time.perf_counter() - t0, latency[0])
        return StepOutput(ready[0] if ready else None, tuple(texts), stats,
                          tuple(d for d in deltas if d is not None))

    def _new_frame(self, prepared: PreparedObservation, now: float, rtc: RtcRequest | None,
                   deadline: float | None) -> tuple[FrameSpec, FrameInputs]:
        fid = self._frame_index
        self._frame_index += 1
        period = self.config.control_period_s
        if deadline is None and period:
            deadline = now + period
        action = Request(f'action-{fid}', RequestKind.ACTION, prepared.action_prompt_ids,
                         arrival_time=now, deadline=deadline)
        num_cams = prepared.num_cameras
        frame = FrameSpec(fid, num_cams * self.model_cfg.image_tokens_per_camera, num_cams,
                          action)
        gen = torch.Generator().manual_seed(self.config.seed * 1_000_003 + fid)
        noise = torch.randn((1, self.model_cfg.action_horizon, self.model_cfg.action_dim),
                            generator=gen, dtype=torch.float32)
        target = (self.chunk_history.guidance(prepared.stamp_ns, prepared.state, rtc)
                  if rtc is not None else None)
        guidance = None if target is None else RtcGuidance.from_numpy(
            target.target, target.soft_mask, target.max_guidance_weight,
            self.config.rtc_jacobian_steps)
        return frame, FrameInputs(fid, prepared.cameras, noise, guidance,
                                  self.conventions.image_resize)

    def reset_chunk_history(self) -> None:
        """Forget the previous action chunk (RTC starts over: at activation, after a gap)."""
        self.chunk_history.reset()

    def _action_chunk(self, actions: torch.Tensor, prepared: PreparedObservation,
                      frame_id: int, guided: bool) -> ActionChunk | None:
        x = actions[0].float().cpu().numpy()
        if not np.all(np.isfinite(x)):
            _LOG.error('frame %d: the model produced NaN/Inf actions; not publishing them',
                       frame_id)
            return None
        robot = self.normalizer.actions_to_robot(x, prepared.state)
        return ActionChunk(np.ascontiguousarray(robot, dtype=np.float32), prepared.stamp_ns,
                           frame_id, prepared.state, guided)

    # -- lifecycle -----------------------------------------------------------------------
    def warmup(self, observation: Observation) -> None:
        """
        Run full cycles with a text request of each kind of context in use, then a full batch.

        Fills caches, warms every text path (own prompt, suffix on the action prefix, the
        memory adapter), gives the cost model its first measurements, then decodes up to
        ``max_running_requests`` questions of the whole budget at once: a burst's largest batch
        and context, its memory there before the first burst (``docs/robustness.md#soak``).
        With ``config.rtc`` a guided cycle follows: the robot's first guided one runs warm.
        """
        tasks = {self.config.text_context(task): task for task in TextTask}  # memory last
        warm_texts(self, observation, list(tasks.values()), 2)
        warm_texts(self, observation, [TextTask.ANSWER] * self.config.max_running_requests,
                   self.model_cfg.decode_budget, as_the_pool_holds=True)
        if self.config.rtc:
            self.step(observation, rtc=RtcRequest(1, WARMUP_ACTION_DT_NS))
        self._frame_index = 0
        self.chunk_history.reset()

    def shutdown(self) -> list[TextOutput]:
        """
        Abort every request, release the KV pool; later calls raise EngineClosedError.

        :returns: the output of every waiting and running text request (``error``
            ``engine shut down``; running ones with their text so far).
        """
        with self._lock:
            if self._closed:
                return []
            out = [self._texts.ended(req.req_id, tuple(req.output_token_ids),
                                     req.finish_reason, 'engine shut down')
                   for req in self.scheduler.abort_all()]
            self._closed = True
        del self.backend
        return [t for t in out if t is not None]

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError('the engine was shut down')


__all__ = ['Engine', 'EngineClosedError', 'QueueFullError', 'WARMUP_ACTION_DT_NS']
