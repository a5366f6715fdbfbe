"""
Timing of streamed text as a client sees it: ``~/ask`` goals and ``~/<task>/stream`` pieces.

``oxygen_demo`` asks its questions through the ``~/ask`` action and listens to the stream
topics; this module keeps what it needs for its summary:

- per goal, the **time to the first piece** at the client (goal sent → first feedback, so
  DDS, the goal handshake, the wait for the next control cycle and the first decode step are
  all in it), the pieces received and the time to the result;
- per streamed request, the node's own ``time_from_request`` of its first piece (request
  arrival → first piece published) and its pieces per text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import time

import numpy as np
from oxygen_ros.ros.stamps import duration_to_ns
from oxygen_ros.units import NS_PER_S


@dataclass(slots=True)
class AskTiming:
    """One ``~/ask`` goal seen from the client (monotonic seconds)."""

    question: str
    sent_s: float = field(default_factory=time.monotonic)
    first_piece_s: float | None = None
    num_pieces: int = 0
    result_s: float | None = None
    succeeded: bool = False
    answer: str = ''
    outcome: str = ''

    def on_feedback(self, msg: object) -> None:
        """Feedback callback of the goal."""
        if self.first_piece_s is None:
            self.first_piece_s = time.monotonic()
        self.num_pieces += 1

    def on_result(self, succeeded: bool, answer: str, outcome: str) -> None:
        """Record the goal's result (``outcome``: how it ended, for the summary)."""
        self.result_s = time.monotonic()
        self.succeeded, self.answer, self.outcome = succeeded, answer, outcome


@dataclass(slots=True)
class _Streamed:
    first_piece_s: float
    num_pieces: int = 0
    final: bool = False


class TextTiming:
    """Goals and stream pieces of one run."""

    def __init__(self) -> None:
        self.asks: list[AskTiming] = []
        self._streams: dict[str, dict[str, _Streamed]] = {}

    def on_piece(self, task: str, msg: object) -> None:
        """Take one ``DecodedText`` piece from ``~/<task>/stream``."""
        requests = self._streams.setdefault(task, {})
        seen = requests.get(msg.request_id)
        if seen is None:
            elapsed = duration_to_ns(msg.time_from_request) / NS_PER_S
            seen = requests[msg.request_id] = _Streamed(elapsed, 0)
        seen.num_pieces += 1
        seen.final = seen.final or msg.is_final

    def all_answered(self) -> bool:
        """Return whether every goal has its result."""
        return all(a.result_s is not None for a in self.asks)

    def summary(self) -> list[str]:
        """Return the summary lines (asked questions, then the streams per task)."""
        lines = []
        if self.asks:
            done = [a for a in self.asks if a.result_s is not None]
            first = [a.first_piece_s - a.sent_s for a in done if a.first_piece_s is not None]
            whole = [a.result_s - a.sent_s for a in done]
            line = (f'asked (~/ask action): {len(self.asks)} question(s), '
                    f'{sum(a.succeeded for a in done)} answered')
            if first:
                line += (f'; time to first piece p50 {np.median(first):.2f} s, max '
                         f'{max(first):.2f} s; {np.mean([a.num_pieces for a in done]):.1f} '
                         f'pieces per answer; whole answer p50 {np.median(whole):.2f} s')
            lines.append(line)
            lines += [f'  {a.question!r} -> {a.answer[:60]!r} ({a.outcome or "no result"})'
                      for a in self.asks]
        parts = []
        for task, requests in self._streams.items():
            texts = [s for s in requests.values() if s.final]
            if texts:
                parts.append(f'{task} {len(texts)} text(s), first piece p50 '
                             f'{np.median([s.first_piece_s for s in texts]):.2f} s, '
                             f'{np.mean([s.num_pieces for s in texts]):.1f} pieces each')
        if parts:
            lines.append('streamed (~/<task>/stream; node: request -> first piece published): '
                         + '; '.join(parts))
        return lines


__all__ = ['AskTiming', 'TextTiming']
