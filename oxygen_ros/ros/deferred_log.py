"""
Log lines queued by the control cycle and written by another thread.

rclpy's ``RcutilsLogger.log`` finds its caller with ``inspect`` (frame info, the source file's real
path) before it checks the severity (its cost:
``docs/robustness.md#overload-a-flood-of-questions-on-ask``). The control cycle logged every
question and answer that way, so a flood of questions delayed the action chunk by that cost per
question. The cycle queues its lines here (O(1), under a lock) and the text group writes them.
"""

from __future__ import annotations

from collections import deque
import enum
import threading

from rclpy.impl.rcutils_logger import RcutilsLogger


class LogLevel(enum.Enum):
    """Severity of a queued line."""

    INFO = 'info'
    WARNING = 'warning'
    THROTTLED_WARNING = 'throttled warning'
    """A warning written at most once a second (``throttle_duration_sec=1.0``)."""


class DeferredLog:
    """
    A queue of log lines for one logger; thread-safe.

    :param logger: where ``write`` writes them.
    """

    def __init__(self, logger: RcutilsLogger) -> None:
        self._logger = logger
        self._lock = threading.Lock()
        self._lines: deque[tuple[LogLevel, str]] = deque()

    def __len__(self) -> int:
        with self._lock:
            return len(self._lines)

    def later(self, level: LogLevel, line: str) -> None:
        """Queue one line (any thread, never blocks on the logger)."""
        with self._lock:
            self._lines.append((level, line))

    def write(self) -> None:
        """Write the queued lines in order (not from the control cycle)."""
        with self._lock:
            lines = list(self._lines)
            self._lines.clear()
        for level, line in lines:
            if level is LogLevel.THROTTLED_WARNING:
                self._logger.warning(line, throttle_duration_sec=1.0)
            elif level is LogLevel.WARNING:
                self._logger.warning(line)
            else:
                self._logger.info(line)


__all__ = ['DeferredLog', 'LogLevel']
