"""
The node's control cycle: each robot's newest observation → ``Engine.begin`` → chunks, texts.

The node's control timer runs one cycle per period, under the engine lock, in its own
MutuallyExclusive group. A robot with a rate of its own is due every n-th cycle only
(``NodeConfig.due_every``, counted from activation; ``docs/running.md#a-rate-per-robot``):
on the other cycles it is left out, as if it were not there (no observation read, no chunk,
nothing counted as missing), while texts decode every cycle. A cycle assembles and prepares
the newest observation of each robot due (``robot_io.RobotIO.prepare``: a refused one is that
robot's alone, logged when its reason starts, then at most every ``LOG_EVERY_S``, and counted
in its ``/diagnostics``; the cycle still decodes texts), asks for each robot's periodic texts
and begins the engine's cycle (``Engine.begin``: one robot's observation, or those of the
robots due, None for a robot whose inputs were refused, which gets no chunk while the others
get theirs). The cycle hands each action chunk back as soon as it is denoised, before the text
decoding (``Cycle.action``; with several robots ``Cycle.actions``, one robot's chunk after the
other): it is smoothed (``chunk_smoother``), turned into messages for its robot's config
(``action_output``; clipped to its limits) and published on its robot's topics; then the cycle
finishes (``Cycle.finish``) and its text outputs go to the text group of their robot
(``TextOutput.robot``, ``text_requests``). Every call goes down, into the engine; the chunks
and the texts come back as values. Its text work ends at the next tick, less ``CYCLE_SLACK``
of a period (``cycle_deadline``).
"""

from __future__ import annotations

import time
from typing import Sequence

from oxygen_ros.engine import Engine
from oxygen_ros.ros.diagnostics import EngineDiagnostics
from oxygen_ros.ros.node_config import NodeConfig
from oxygen_ros.ros.robot_io import LOG_EVERY_S, RobotIO
from oxygen_ros.units import NS_PER_S
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
    The control cycle of one configured node, over its robots.

    :param robots: the node's robots (one: the unnamed robot ``''``, whose observation goes
        to the engine alone, as one robot's).
    :param diag: the engine's ``/diagnostics`` figures (the one robot's too).
    """

    def __init__(self, robots: Sequence[RobotIO], diag: EngineDiagnostics) -> None:
        self._robots = tuple(robots)
        self._by_name = {io.name: io for io in self._robots}
        self._one = [io.name for io in self._robots] == ['']
        self._diag = diag
        self._index = 0
        """The next cycle's index since activation (a robot due every n-th: index % n == 0)."""

    def reset(self, engine: Engine) -> None:
        """Start each robot's smoothing over (at activation): no previous chunk, no delay."""
        self._index = 0
        for io in self._robots:
            io.reset(engine)

    def due(self, cfg: NodeConfig) -> list[RobotIO]:
        """Return the robots due in the next cycle (each every ``cfg.due_every`` cycles)."""
        return [io for io in self._robots if self._index % cfg.due_every(io.name) == 0]

    def run(self, engine: Engine, cfg: NodeConfig, now_s: float,
            deadline: float | None) -> None:
        """
        Run one cycle (the caller holds the engine lock).

        :param cfg: the node's config now (dynamic parameters may have changed it).
        :param now_s: the node clock at the tick.
        :param deadline: when the cycle's text work must end (``cycle_deadline``).
        :raises Exception: whatever the engine raised (the node stops acting).
        """
        robots, due = self._robots, self.due(cfg)
        self._index += 1
        prepared = {io.name: io.prepare(engine, cfg) for io in due}
        for io in robots:
            io.texts.ask_periodic(now_s, cfg.subtask_period, cfg.memory_period,
                                  prepared.get(io.name) is not None)
        if self._one:
            cycle = engine.begin(prepared[''], rtc=robots[0].rtc_request(cfg),
                                 deadline=deadline)
            chunk = cycle.action()  # as soon as it is denoised, before this cycle's decoding
            chunks = () if chunk is None else (chunk,)
        else:
            rtc = {io.name: req for io in due for req in [io.rtc_request(cfg)]
                   if req is not None}
            cycle = engine.begin(prepared, rtc=rtc, deadline=deadline)
            chunks = cycle.actions()  # each robot's as soon as it is denoised
        published = set()
        for chunk in chunks:
            io = robots[0] if self._one else self._by_name[chunk.robot]
            if io.publish(chunk, cfg):
                published.add(io.name)
        out = cycle.finish()
        if not self._one:
            self._diag.record_cycle(now_s, out.stats, bool(published))
        for io in due:  # a robot not due: no cycle of its own, nothing missing
            io.diag.record_cycle(now_s, out.stats, io.name in published, io.delay_steps(cfg))
        for io in robots:
            io.texts.finish(out)


__all__ = ['CYCLE_SLACK', 'ControlCycle', 'LOG_EVERY_S', 'cycle_deadline']
