"""
The robots one engine serves: each one's chunk history, frame count and noise (no torch).

An engine serves one robot (named ``''``, today's one-robot callers) or several, up to the
scheduler's ``max_robots``, on one checkpoint, one KV pool and one fast path
(``docs/design.md#several-robots``). What a robot holds on its own is here: the last chunk
for real-time chunking (``ChunkHistory``; the node's ensembling history is the node's, per
robot) and how many of its frames the engine has made, which seeds its flow-matching noise.
Its text requests are the scheduler's, each naming its robot (``Request.robot``).

The noise of a robot's frame depends on the engine's seed, the robot's name and the robot's
own frame index only (:func:`noise_seed`): a robot served beside others gets the noise it
would get served alone, so its chunks equal those of serving it alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import re
from typing import Iterable, Mapping, TYPE_CHECKING, Union
import zlib

from oxygen_ros.control.rtc import ChunkHistory, ModelUnits, RtcRequest

if TYPE_CHECKING:
    from oxygen_ros.observation import Observation
    from oxygen_ros.transforms.inputs import PreparedObservation

RobotObservations = Mapping[str, Union['Observation', 'PreparedObservation', None]]
"""The observations of the robots due in a cycle, by robot (None: due, no valid one)."""

ROBOT_NAME = re.compile(r'[A-Za-z][A-Za-z0-9_]*\Z')
"""A robot's name: a ROS 2 name token (its topics live under ``/<name>/``); ``''``: unnamed."""
SEED_STRIDE = 1_000_003
"""The engine's seed is spread by this prime before a frame index is added (seeds stay apart)."""
ROBOT_STRIDE = 1_000_000_007
"""A named robot's CRC-32 is spread by this prime (frame indices of two robots never meet)."""


def noise_seed(seed: int, robot: str, index: int) -> int:
    """
    Return the seed of the noise of a robot's frame ``index`` (its own count, from 0).

    ``seed * SEED_STRIDE + index`` for the unnamed robot (the one-robot engine's noise as it
    always was); a named robot's adds ``crc32(name) * ROBOT_STRIDE``; modulo 2**63.
    """
    offset = zlib.crc32(robot.encode()) * ROBOT_STRIDE if robot else 0
    return (seed * SEED_STRIDE + index + offset) % 2**63


@dataclass(slots=True)
class RobotState:
    """
    One robot's own state in the engine.

    :ivar name: its name (``''``: the one unnamed robot).
    :ivar history: its last chunk (real-time chunking's target).
    :ivar num_frames: frames of it the engine has made (the next one's noise index).
    """

    name: str
    history: ChunkHistory
    num_frames: int = field(default=0)

    def next_noise_index(self) -> int:
        """Return the index of its next frame, and count it."""
        self.num_frames += 1
        return self.num_frames - 1

    def reset(self) -> None:
        """Forget its last chunk and start its frame count over (after the warm-up)."""
        self.history.reset()
        self.num_frames = 0


class Robots:
    """
    The robots of one engine, by name (not thread-safe: the engine's lock guards it).

    :param names: the robots served from the start.
    :param max_robots: the most robots served at once (``SchedulerConfig.max_robots``).
    :param units: the engine's normalizer (each robot's ``ChunkHistory``).
    :raises ValueError: as :meth:`add`.
    """

    def __init__(self, names: Iterable[str], max_robots: int, units: ModelUnits) -> None:
        self._max, self._units = max_robots, units
        self._robots: dict[str, RobotState] = {}
        for name in names:
            self.add(name)

    @property
    def names(self) -> tuple[str, ...]:
        """Return the robots' names in the order they were added."""
        return tuple(self._robots)

    def add(self, name: str) -> RobotState:
        """
        Serve one more robot.

        :raises ValueError: a name that is neither ``''`` nor a ROS name token, one served
            already, ``''`` beside named robots, or ``max_robots`` robots served already.
        """
        if name and not ROBOT_NAME.match(name):
            raise ValueError(f'robot name {name!r} is not a ROS name token '
                             f'([A-Za-z][A-Za-z0-9_]*)')
        if name in self._robots:
            raise ValueError(f'robot {name!r} is served already')
        if '' in self._robots or (not name and self._robots):
            raise ValueError('the unnamed robot is served alone: name every robot '
                             f'(served: {self.names}, adding {name!r})')
        if len(self._robots) >= self._max:
            raise ValueError(f'{len(self._robots)} robots served already {self.names}, '
                             f'max_robots is {self._max}')
        self._robots[name] = state = RobotState(name, ChunkHistory(self._units))
        return state

    def remove(self, name: str) -> None:
        """
        Stop serving a robot (its state is gone).

        :raises ValueError: an unknown robot.
        """
        self.get(name)
        del self._robots[name]

    def get(self, name: str) -> RobotState:
        """
        Return a robot's state.

        :raises ValueError: an unknown robot.
        """
        try:
            return self._robots[name]
        except KeyError:
            raise ValueError(f'unknown robot {name!r}; this engine serves '
                             f'{self.names}') from None

    def only(self) -> RobotState:
        """
        Return the state of the engine's one robot.

        :raises ValueError: the engine serves several robots (or none).
        """
        if len(self._robots) != 1:
            raise ValueError(f'this engine serves {len(self._robots)} robots {self.names}: '
                             f'name the robot (a mapping of observations by robot)')
        return next(iter(self._robots.values()))

    def due(self, obs: Observation | PreparedObservation | None | RobotObservations,
            rtc: RtcRequest | Mapping[str, RtcRequest] | None
            ) -> tuple[list[tuple[RobotState, Observation | PreparedObservation | None]],
                       dict[str, RtcRequest]]:
        """
        Return the robots due in a cycle with their observations, and the guided ones' RTC.

        :param obs: the engine's one robot's observation (or None), or a mapping robot ->
            observation of the robots due (``Engine.begin``).
        :param rtc: the one robot's request, or a mapping robot -> request.
        :raises ValueError: one observation for several robots, an unknown robot, rtc for a
            robot not due, or rtc not in the form of ``obs``.
        """
        if not isinstance(obs, Mapping):
            robot = self.only()
            if isinstance(rtc, Mapping):
                raise ValueError('rtc by robot needs observations by robot')
            return [(robot, obs)], ({} if rtc is None else {robot.name: rtc})
        rtc = {} if rtc is None else rtc
        if not isinstance(rtc, Mapping):
            raise ValueError('observations by robot need rtc by robot (a mapping)')
        unknown = set(rtc) - set(obs)
        if unknown:
            raise ValueError(f'rtc for robots not due this cycle: {sorted(unknown)}')
        return [(self.get(name), o) for name, o in obs.items()], dict(rtc)

    def reset(self) -> None:
        """Reset every robot (:meth:`RobotState.reset`)."""
        for state in self._robots.values():
            state.reset()


__all__ = ['noise_seed', 'ROBOT_NAME', 'RobotObservations', 'RobotState', 'Robots']
