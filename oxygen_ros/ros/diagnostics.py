"""
Rolling statistics of the control loop and the ``/diagnostics`` status built from them.

One ``diagnostic_msgs/DiagnosticStatus`` named ``oxygen: engine`` (``hardware_id`` = preset),
and with several robots one more per robot, ``oxygen: robot <name>``, of that robot's inputs,
chunks, clips and texts (its target and achieved rate, chunk rate and "no action chunk" are
its own, counted over the cycles it is due; a robot whose input is stale does not turn the
others' or the engine's status ERROR). Levels, worst first:

- ERROR: the engine failed (an exception in a control cycle, or configure failed), or the node
  is active and no action chunk was published for more than ``max_observation_age`` seconds
  (a robot due every n-th control cycle: that plus the n - 1 periods it was not due).
- WARN: inputs were rejected since the previous status, text requests were rejected since
  then, limits clipped an action chunk since then, the achieved control rate is below 90 % of
  the target, the KV pool is over 90 % full, a compiled step fell back to eager execution, or
  the weights are not quantized as asked (``Engine.fallbacks``, named).
- OK: acting at rate (or inactive / unconfigured with nothing wrong).

Times are node-clock seconds (ROS time, ``/clock`` under ``use_sim_time``), so rates are in
the robot's time. Thread-safe: the control cycle records, the diagnostics timer reads.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
import enum
import threading
from typing import Mapping, Sequence

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
import numpy as np
from oxygen_ros.control.action_space import ClipCount
from oxygen_ros.engine import CycleStats, QUANTIZATION_FALLBACK, RefusalReason
from oxygen_ros.ros.heap import HeapFigures
from oxygen_ros.ros.outcomes import REJECTION_NAMES
from std_msgs.msg import Header

STATUS_NAME = 'oxygen: engine'
RATE_WINDOW_S = 3.0
"""Seconds over which control rate, chunk rate and tokens/s are measured."""
MIN_RATE_FRACTION = 0.9
MAX_KV_FRACTION = 0.9
_MIB = float(1 << 20)


class Level(enum.IntEnum):
    """``DiagnosticStatus`` levels we use."""

    OK = 0
    WARN = 1
    ERROR = 2

    @property
    def octet(self) -> bytes:
        return bytes([self.value])


@dataclass(frozen=True, slots=True)
class _Tick:
    time_s: float
    published: bool
    tokens: int


class EngineDiagnostics:
    """
    Counters and rolling windows of the node's control loop.

    :param preset: the model preset (``hardware_id``).
    :param random_weights: the engine runs without a checkpoint.
    :param num_cycles: control cycles kept for the cycle-time percentiles.
    :param robot: the robot whose status this is (``oxygen: robot <name>``); '': the engine's
        (``STATUS_NAME``), which is also the one robot's.
    """

    def __init__(self, preset: str = '', random_weights: bool = False,
                 num_cycles: int = 200, *, robot: str = '') -> None:
        self.robot = robot
        self.name = f'oxygen: robot {robot}' if robot else STATUS_NAME
        """The status's name."""
        self._lock = threading.Lock()
        self._cycle_s: deque[float] = deque(maxlen=num_cycles)
        self._ticks: deque[_Tick] = deque()
        self.security = 'off'
        """DDS security as the node started (``SecuritySettings.describe``)."""
        self._heap: HeapFigures | None = None
        self._trims = (0, 0, 0.0)
        self.reset(preset, random_weights)

    def reset(self, preset: str, random_weights: bool, action_space: str = '',
              smoothing: str = '') -> None:
        """Forget everything (at configure)."""
        with self._lock:
            self.preset = preset
            self.random_weights = random_weights
            self.action_space = action_space
            self.smoothing = smoothing
            self._delay_steps: int | None = None
            self._clips = Counter()
            self._period_clips = 0
            self._cycle_s.clear()
            self._ticks.clear()
            self._state = 'unconfigured'
            self._active_since: float | None = None
            self._last_chunk_s: float | None = None
            self._chunks = 0
            self._stats: CycleStats | None = None
            self._rejections: Counter[RefusalReason] = Counter()
            self._period_rejections: Counter[RefusalReason] = Counter()
            self._last_rejection = ''
            self._texts_rejected = 0
            self._period_texts_rejected = 0
            self._last_text_rejection = ''
            self._texts_waiting = 0
            self._period_waiting_peak = 0
            self._texts_open = 0
            self._failure = ''
            self._fallbacks: dict[str, str] = {}
            self._dropped: dict[str, str] = {}
            self._text_contexts = ''
            self._memory_adapter = 'none'
            self.quantization = 'none'
            """The weights' quantization as it runs (``Engine.describe_quantization``)."""

    def record_heap(self, figures: HeapFigures | None, trims: int, released: int,
                    last_trim_s: float) -> None:
        """
        Record the process's memory (``heap.HeapTrimmer``: kept across ``reset``).

        :param figures: RSS and glibc malloc's figures (None: not glibc; shown as ``n/a``).
        :param trims: ``malloc_trim`` calls so far; ``released``: the RSS bytes they freed;
            ``last_trim_s``: how long the last one took.
        """
        with self._lock:
            self._heap = figures
            self._trims = (trims, released, last_trim_s)

    def set_text_setup(self, contexts: str, adapter: str) -> None:
        """Record what each text task reads and the memory adapter (``Engine.describe_*``)."""
        with self._lock:
            self._text_contexts, self._memory_adapter = contexts, adapter

    def set_state(self, label: str, now_s: float) -> None:
        """Record the lifecycle state (``active`` starts the no-action clock)."""
        with self._lock:
            self._state = label
            self._active_since = now_s if label == 'active' else None
            self._ticks.clear()

    def record_cycle(self, now_s: float, stats: CycleStats, published: bool,
                     delay_steps: int | None = None) -> None:
        """
        Record one control cycle and whether it published an action chunk.

        :param delay_steps: the measured inference delay in action steps (None: no sample).
        """
        with self._lock:
            self._delay_steps = delay_steps
            self._cycle_s.append(stats.total_s)
            self._ticks.append(_Tick(now_s, published, stats.tokens_generated))
            self._stats = stats
            if published:
                self._chunks += 1
                self._last_chunk_s = now_s
            self._trim(now_s)

    def record_rejection(self, reason: RefusalReason, message: str) -> None:
        """Count a cycle whose inputs were refused (``message``: the refusal's)."""
        with self._lock:
            self._rejections[reason] += 1
            self._period_rejections[reason] += 1
            self._last_rejection = f'{REJECTION_NAMES[reason]}: {message}'

    def record_text_rejected(self, reason: str = '') -> None:
        """Count a text request refused or dropped (``reason``: shown as the last one)."""
        with self._lock:
            self._texts_rejected += 1
            self._period_texts_rejected += 1
            if reason:
                self._last_text_rejection = reason

    def record_texts(self, waiting: int, open_requests: int) -> None:
        """
        Record the text requests (``TextRequests``, on every change).

        :param waiting: requests in the engine's waiting queue (bounded by
            ``max_waiting_requests``), or the number a refusal found there.
        :param open_requests: text requests whose reply is still owed (waiting or decoding,
            periodic ones included).
        """
        with self._lock:
            self._texts_waiting = waiting
            self._period_waiting_peak = max(self._period_waiting_peak, waiting)
            self._texts_open = open_requests

    def record_clips(self, clips: ClipCount) -> None:
        """Count the values of one chunk that the limits clipped."""
        with self._lock:
            self._clips['position'] += clips.position
            self._clips['velocity'] += clips.velocity
            self._clips['chunks'] += 1 if clips.total else 0
            self._period_clips += clips.total

    def set_fallbacks(self, fallbacks: Mapping[str, str],
                      dropped: Mapping[str, str] | None = None) -> None:
        """
        Record what does not run as configured; WARN.

        :param fallbacks: fast-path steps that fell back (step -> reason, e.g. to eager), and
            the quantization.
        :param dropped: the fast path's optional features left out (feature -> reason).
        """
        with self._lock:
            self._fallbacks = dict(fallbacks)
            self._dropped = dict(dropped or {})

    def record_failure(self, message: str) -> None:
        """Mark the engine as failed (ERROR until the next ``reset``)."""
        with self._lock:
            self._failure = message

    @property
    def chunks_published(self) -> int:
        with self._lock:
            return self._chunks

    def _trim(self, now_s: float) -> None:
        while self._ticks and self._ticks[0].time_s <= now_s - RATE_WINDOW_S:
            self._ticks.popleft()

    def _rates(self, now_s: float) -> tuple[float, float, float]:
        """Return control ticks/s, chunks/s and tokens/s over the rate window."""
        self._trim(now_s)
        if self._active_since is None:
            return 0.0, 0.0, 0.0
        span = min(RATE_WINDOW_S, now_s - self._active_since)
        if span <= 0:
            return 0.0, 0.0, 0.0
        ticks = list(self._ticks)
        return (len(ticks) / span, sum(t.published for t in ticks) / span,
                sum(t.tokens for t in ticks) / span)

    def status(self, now_s: float, target_hz: float, max_age_s: float,
               slack_s: float = 0.0) -> DiagnosticStatus:
        """
        Return the current status and start a new period (per-period counters reset).

        :param now_s: node-clock seconds (the clock ``record_cycle`` got).
        :param target_hz: ``control_rate_hz``; a robot's: its own rate (``record_cycle`` is
            called on the cycles it is due only).
        :param max_age_s: ``max_observation_age``.
        :param slack_s: how much longer than ``max_age_s`` a gap between chunks may last
            before one is missing: the control periods in which none was due (``n - 1`` of
            them for a robot due every n-th cycle).
        """
        with self._lock:
            rate, chunk_rate, tokens_s = self._rates(now_s)
            level, summary = self._level(now_s, rate, target_hz, max_age_s + slack_s)
            values = self._values(rate, chunk_rate, tokens_s, target_hz)
            self._period_rejections.clear()
            self._period_texts_rejected = 0
            self._period_clips = 0
            self._period_waiting_peak = self._texts_waiting
        if self.robot:
            values.insert(0, ('robot', self.robot))
        return DiagnosticStatus(level=level.octet, name=self.name, message=summary,
                                hardware_id=self.preset,
                                values=[KeyValue(key=k, value=v) for k, v in values])

    def array(self, stamp: object, now_s: float, target_hz: float, max_age_s: float,
              robots: Sequence[tuple[EngineDiagnostics, float, float]] = (),
              slack_s: float = 0.0) -> DiagnosticArray:
        """
        Return a ``DiagnosticArray`` holding ``status``, then each robot's (``stamp``: Time).

        :param robots: the robots' own figures, each with its rate and slack (``status``'s
            ``target_hz`` and ``slack_s``; several robots; none for the one robot).
        :param slack_s: the engine's: that of its fastest robot.
        """
        return DiagnosticArray(header=Header(stamp=stamp), status=[
            self.status(now_s, target_hz, max_age_s, slack_s),
            *(d.status(now_s, hz, max_age_s, slack) for d, hz, slack in robots)])

    def _kv_fraction(self) -> float:
        s = self._stats
        return s.kv_used_blocks / s.kv_capacity_blocks if s and s.kv_capacity_blocks else 0.0

    def _level(self, now_s: float, rate: float, target_hz: float,
               max_age_s: float) -> tuple[Level, str]:
        if self._failure:
            return Level.ERROR, f'engine failed: {self._failure}'
        steps = sorted(k for k in self._fallbacks if k != QUANTIZATION_FALLBACK)
        slow = '; '.join(
            ([f'fast-path step(s) fell back: {", ".join(steps)} (see "fallback: <step>")']
             if steps else [])
            + (['quantization fell back (see "fallback: quantization")']
               if QUANTIZATION_FALLBACK in self._fallbacks else [])
            + ([f'fast path without {", ".join(sorted(self._dropped))} (see "dropped: '
                f'<feature>")'] if self._dropped else []))
        if self._active_since is None:
            return (Level.WARN, f'{self._state}; {slow}') if slow else (Level.OK, self._state)
        since = max(self._last_chunk_s or self._active_since, self._active_since)
        if now_s - since > max_age_s:
            why = f'; last rejection {self._last_rejection}' if self._last_rejection else ''
            return Level.ERROR, f'no action chunk for {now_s - since:.1f} s{why}'
        warnings = []
        if self._period_rejections:
            counts = ', '.join(f'{REJECTION_NAMES[k]} x{n}'
                               for k, n in self._period_rejections.items())
            warnings.append(f'inputs rejected ({counts})')
        if now_s - self._active_since >= RATE_WINDOW_S and \
                rate < MIN_RATE_FRACTION * target_hz:
            warnings.append(f'control rate {rate:.1f} Hz < 90 % of {target_hz:g} Hz')
        if self._kv_fraction() > MAX_KV_FRACTION:
            warnings.append(f'KV pool {100 * self._kv_fraction():.0f} % full')
        if self._period_texts_rejected:
            warnings.append(f'{self._period_texts_rejected} text request(s) rejected')
        if self._period_clips:
            warnings.append(f'limits clipped {self._period_clips} action value(s)')
        if slow:
            warnings.append(slow)
        if warnings:
            return Level.WARN, '; '.join(warnings)
        return Level.OK, f'acting at {rate:.1f} Hz'

    def _values(self, rate: float, chunk_rate: float, tokens_s: float,
                target_hz: float) -> list[tuple[str, str]]:
        cycles = np.asarray(self._cycle_s, dtype=np.float64)
        p50, p99 = (np.percentile(cycles, [50, 99]) * 1e3) if cycles.size else (0.0, 0.0)
        s = self._stats
        values = [
            ('state', self._state),
            ('control rate target (Hz)', f'{target_hz:g}'),
            ('control rate achieved (Hz)', f'{rate:.2f}'),
            ('action chunk rate (Hz)', f'{chunk_rate:.2f}'),
            ('cycle time p50 (ms)', f'{p50:.1f}'),
            ('cycle time p99 (ms)', f'{p99:.1f}'),
            ('action chunks published', str(self._chunks)),
            ('action space', self.action_space),
            ('chunk smoothing', self.smoothing),
            ('inference delay (action steps)',
             'n/a' if self._delay_steps is None else str(self._delay_steps)),
            ('limit clips: position values', str(self._clips['position'])),
            ('limit clips: velocity values', str(self._clips['velocity'])),
            ('limit clips: chunks', str(self._clips['chunks'])),
            ('tokens/s', f'{tokens_s:.1f}'),
            ('text requests running', str(s.num_running if s else 0)),
            ('text requests rejected', str(self._texts_rejected)),
            ('text requests waiting', str(self._texts_waiting)),
            ('text requests waiting peak', str(self._period_waiting_peak)),
            ('text requests open', str(self._texts_open)),
            ('last text rejection', self._last_text_rejection),
            ('decode batch', str(s.decode_batch if s else 0)),
            ('tokens per cycle (k)', str(s.tokens_per_cycle if s else 0)),
            ('KV blocks used', str(s.kv_used_blocks if s else 0)),
            ('KV blocks capacity', str(s.kv_capacity_blocks if s else 0)),
            ('KV use (%)', f'{100 * self._kv_fraction():.1f}'),
            ('KV used (MiB)', f'{(s.kv_used_bytes if s else 0) / _MIB:.2f}'),
        ]
        values += self._memory_values()
        values += [(f'rejected: {name}', str(self._rejections[reason]))
                   for reason, name in REJECTION_NAMES.items()]
        values += [('last rejection', self._last_rejection),
                   ('random weights', 'yes' if self.random_weights else 'no'),
                   ('text contexts', self._text_contexts),
                   ('memory adapter', self._memory_adapter),
                   ('quantization', self.quantization),
                   ('DDS security', self.security)]
        values += [(f'fallback: {step}', why) for step, why in sorted(self._fallbacks.items())]
        values += [(f'dropped: {feature}', why) for feature, why in sorted(self._dropped.items())]
        if self._failure:
            values.append(('engine error', self._failure))
        return values

    def _memory_values(self) -> list[tuple[str, str]]:
        h = self._heap
        sizes = ('RSS', 'rss'), ('malloc arenas', 'arenas'), ('malloc in use', 'in_use'), \
            ('malloc free', 'free'), ('malloc mmapped', 'mmapped')
        return [(f'{label} (MiB)', 'n/a' if h is None else f'{getattr(h, name) / _MIB:.1f}')
                for label, name in sizes] + [
            ('malloc trims', str(self._trims[0])),
            ('malloc trimmed (MiB)', f'{self._trims[1] / _MIB:.1f}'),
            ('malloc last trim (ms)', f'{1e3 * self._trims[2]:.2f}')]


def status_values(status: DiagnosticStatus) -> dict[str, str]:
    """Return the key/values of a status as a dict (for tools and tests)."""
    return {kv.key: kv.value for kv in status.values}


__all__ = ['EngineDiagnostics', 'Level', 'MAX_KV_FRACTION', 'MIN_RATE_FRACTION',
           'RATE_WINDOW_S', 'STATUS_NAME', 'status_values']
