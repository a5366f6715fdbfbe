"""
The node's control cycle: the newest observation → ``Engine.step`` → chunk messages and texts.

The node's control timer runs one cycle per period, under the engine lock, in its own
MutuallyExclusive group. A cycle syncs the engine's action deadline with ``control_rate_hz``
(k adapts to it), assembles and prepares the newest observation (a refused one is logged when
its reason starts, then at most every ``LOG_EVERY_S``, and counted in ``/diagnostics``; the
cycle still decodes texts), asks for the periodic texts and begins the engine's cycle
(``Engine.begin``). The cycle hands the action chunk back as soon as it is denoised, before
its text decoding (``Cycle.action``): it is smoothed (``chunk_smoother``), turned into
messages for the node's config (``action_output``; clipped to the limits) and published; then
the cycle finishes (``Cycle.finish``) and its text outputs go to the text group
(``text_requests``). Every call goes down, into the engine; the chunk and the texts come back
as values. Its text work ends at the next tick, less ``CYCLE_SLACK`` of a period
(``cycle_deadline``).
"""

from __future__ import annotations

import time
from typing import Callable

from oxygen_ros.control.action_space import ClipCount
from oxygen_ros.engine import Engine, ObservationError, PreparedObservation, RefusalReason
from oxygen_ros.ros.action_output import ChunkOutput
from oxygen_ros.ros.chunk_smoother import ChunkSmoother
from oxygen_ros.ros.diagnostics import EngineDiagnostics
from oxygen_ros.ros.node_config import NodeConfig
from oxygen_ros.ros.observation_cache import ObservationCache
from oxygen_ros.ros.outcomes import REJECTION_NAMES
from oxygen_ros.ros.output_publishers import OutputPublishers
from oxygen_ros.ros.text_requests import TextRequests
from oxygen_ros.units import NS_PER_S
from rclpy.impl.rcutils_logger import RcutilsLogger

LOG_EVERY_S = 5.0
"""A rejection cause is logged when it starts and then at most this often."""
CYCLE_SLACK = 0.1
"""Fraction of the control period a cycle leaves free before the next tick: its text work
(``Engine.step``'s deadline) ends that much earlier, for the cycle's bookkeeping after it and
the executor's start of the next tick (``docs/robustness.md#the-action-rate-under-a-flood``)."""


def cycle_deadline(timer: object | None, period_s: float) -> float | None:
    """
    Return when this cycle's text work must end (monotonic seconds): the next tick.

    The timer's next call (rcl advanced it before this callback), not this cycle's start plus
    a period: a cycle that started late plans less text and the ticks stay on their schedule,
    instead of every following cycle running late until rcl skips a period. ``CYCLE_SLACK``
    of a period is left for the rest of the cycle.

    :param timer: the control timer (its ``time_until_next_call``, ns); None: no deadline.
    :param period_s: the control period.
    """
    if timer is None:
        return None
    left_ns = timer.time_until_next_call()
    left = period_s if left_ns is None else min(max(left_ns / NS_PER_S, 0.0), period_s)
    return time.monotonic() + left - CYCLE_SLACK * period_s


class ControlCycle:
    """
    The control cycle of one configured node: its chunk output, smoothing and input reports.

    :param cfg: the node's config at configure.
    :param logger: the node's logger.
    :param diag: the node's ``/diagnostics`` figures.
    :param texts: the node's text requests.
    :param pubs: the node's publishers.
    :param clock_ns: the node clock (ROS time), ns.
    :raises ParameterError: a config whose joints cannot carry its action space.
    """

    def __init__(self, cfg: NodeConfig, logger: RcutilsLogger, diag: EngineDiagnostics,
                 texts: TextRequests, pubs: OutputPublishers,
                 clock_ns: Callable[[], int]) -> None:
        self._output = ChunkOutput(cfg)
        self._smoother = ChunkSmoother(cfg.chunk_smoothing, cfg.ensemble_decay,
                                       cfg.rtc_max_guidance_weight)
        self._log, self._diag, self._texts, self._pubs = logger, diag, texts, pubs
        self._clock_ns = clock_ns
        self._logged: dict[RefusalReason | str, float] = {}
        self._last_issue: RefusalReason | None = None

    @property
    def publisher_keys(self) -> tuple[str, ...]:
        """Return the chunk publishers the action space needs (``ChunkOutput``)."""
        return self._output.publisher_keys

    def reset(self, engine: Engine) -> None:
        """Start smoothing over (at activation): no previous chunk, no delay sample."""
        self._smoother.reset()
        engine.reset_chunk_history()

    def run(self, engine: Engine, cache: ObservationCache, cfg: NodeConfig, now_s: float,
            deadline: float | None) -> None:
        """
        Run one cycle (the caller holds the engine lock).

        :param cfg: the node's config now (dynamic parameters may have changed it).
        :param now_s: the node clock at the tick.
        :param deadline: when the cycle's text work must end (``cycle_deadline``).
        :raises Exception: whatever the engine raised (the node stops acting).
        """
        if self._output.cfg is not cfg:
            self._output = ChunkOutput(cfg)  # action_dt, frame_id: once per change
        output, smoother = self._output, self._smoother
        prepared = self._prepare(engine, cache, cfg)
        self._texts.ask_periodic(now_s, cfg.subtask_period, cfg.memory_period,
                                 prepared is not None)
        published = []
        cycle = engine.begin(prepared, rtc=smoother.rtc_request(cfg.action_dt),
                             deadline=deadline)
        chunk = cycle.action()  # as soon as it is denoised, before this cycle's decoding
        if chunk is not None:
            chunk = smoother.before_publish(chunk, self._clock_ns(), cfg.action_dt)
            msgs = output.messages(chunk)
            self._report_clips(msgs.clips, cfg)
            published.extend(key for key, msg in msgs.messages
                             if self._pubs.publish_chunk(key, msg))
        out = cycle.finish()
        self._diag.record_cycle(now_s, out.stats, bool(published),
                                smoother.delay_steps(cfg.action_dt))
        self._texts.finish(out)

    def _prepare(self, engine: Engine, cache: ObservationCache,
                 cfg: NodeConfig) -> PreparedObservation | None:
        try:
            prepared = engine.prepare(cache.assemble(self._clock_ns(), cfg.max_observation_age))
            if self._last_issue is not None:
                self._log.info('inputs valid again: acting')
                self._last_issue = None
            return prepared
        except ObservationError as exc:  # the node's checks or the engine's: one refusal
            issue, reason = exc.reason, str(exc)
        self._diag.record_rejection(issue, reason)
        now = time.monotonic()
        if issue is not self._last_issue or now - self._logged.get(issue, -1e9) > LOG_EVERY_S:
            self._log.warning(f'not acting ({REJECTION_NAMES[issue]}): {reason}')
            self._logged[issue] = now
        self._last_issue = issue
        return None

    def _report_clips(self, clips: ClipCount, cfg: NodeConfig) -> None:
        if not clips.total:
            return
        self._diag.record_clips(clips)
        now = time.monotonic()
        if now - self._logged.get('clips', -1e9) > LOG_EVERY_S:
            names = [cfg.action_joint_names[d] for d in clips.dims]
            self._log.warning(
                f'limits clipped an action chunk: {clips.position} position and '
                f'{clips.velocity} velocity values, joints {names} (logged every '
                f'{LOG_EVERY_S:g} s; counted in /diagnostics)')
            self._logged['clips'] = now


__all__ = ['CYCLE_SLACK', 'ControlCycle', 'LOG_EVERY_S', 'cycle_deadline']
