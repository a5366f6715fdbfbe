"""Stopping console scripts cleanly on SIGINT and SIGTERM."""

from __future__ import annotations

import signal
import threading


def stop_event_on_signals() -> threading.Event:
    """
    Return an event set by SIGINT or SIGTERM (instead of raising KeyboardInterrupt).

    Call it from the main thread; the caller polls the event and shuts down in order.
    """
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop
