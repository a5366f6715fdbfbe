"""
OxyGen's language side on openpi's wire: text requests in, ``language_updates`` out (pure).

A client asks for text inside its observation dict, under ``language_requests``: a list of
maps ``{task: 'subtask' | 'answer' | 'memory', question: str (answers only), max_tokens: int
(optional, at most the decode budget), request_id: str (optional)}``, the node's three text
tasks (``transforms/prompt.py`` ``TextTask``). Every reply then carries ``language_updates``,
one map per request with news since the connection's previous reply: ``request_id``,
``task``, ``tokens`` (the ids decoded since then), ``text`` (the whole text so far),
``finished``, ``finish_reason`` (``stop``, ``length``, ``abort`` or None) and ``error`` (why a
request was refused or dropped, else None) (docs/serving.md#language-updates): the engine's
``FinishReason`` on the wire, a refused or dropped request's as None (``wire_finish_reason``).

``ConnectionTexts`` is one connection's share: the requests it asked that wait for one of its
own frames, those in the engine, and the news for its next reply. The driver touches it from
its one thread only, so it has no lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import re
from typing import Any

from oxygen_ros.engine import FinishReason, TextOutput, TextTask
from oxygen_ros.serve.errors import BadLanguageRequest, one_line

MAX_PER_MESSAGE = 8
"""Text requests one observation may carry."""
_REQUEST_KEYS = frozenset({'task', 'question', 'max_tokens', 'request_id'})
_REQUEST_ID = re.compile(r'[A-Za-z0-9_.:-]{1,64}')


@dataclass(frozen=True, slots=True)
class LanguageRequest:
    """
    One text request as a client asked it.

    :ivar request_id: the client's name for it (unique among the connection's open ones).
    :ivar max_tokens: its budget; None: the engine's decode budget.
    """

    request_id: str
    task: TextTask
    question: str | None = None
    max_tokens: int | None = None


def parse_language_requests(value: Any, *, decode_budget: int, first_index: int = 0
                            ) -> list[LanguageRequest]:
    """
    Return the requests of a message's ``language_requests``.

    :param decode_budget: the largest ``max_tokens``.
    :param first_index: numbers the default ids (``'{task}-{index}'``).
    :raises BadLanguageRequest: not a list of maps with the keys above, more than
        ``MAX_PER_MESSAGE``, an unknown task, a question on a task other than ``answer`` or none
        on ``answer``, a budget outside 1..decode_budget, a malformed ``request_id``.
    """
    if not isinstance(value, list):
        raise BadLanguageRequest(f'language_requests: expected a list of maps, got '
                                 f'{type(value).__name__}')
    if len(value) > MAX_PER_MESSAGE:
        raise BadLanguageRequest(f'language_requests: {len(value)} requests in one message, at '
                                 f'most {MAX_PER_MESSAGE}')
    return [_request(entry, decode_budget, first_index + i) for i, entry in enumerate(value)]


def _request(entry: Any, decode_budget: int, index: int) -> LanguageRequest:
    where = f'language_requests[{index}]'
    if not isinstance(entry, dict) or not set(entry) <= _REQUEST_KEYS:
        keys = sorted(map(str, entry)) if isinstance(entry, dict) else type(entry).__name__
        raise BadLanguageRequest(f'{where}: expected a map with keys among '
                                 f'{sorted(_REQUEST_KEYS)}, got {keys}')
    try:
        task = TextTask(entry.get('task'))
    except ValueError:
        raise BadLanguageRequest(f'{where}: task must be one of '
                                 f'{[t.value for t in TextTask]}, got {entry.get("task")!r}'
                                 ) from None
    question = entry.get('question')
    if task is TextTask.ANSWER and not (isinstance(question, str) and question.strip()):
        raise BadLanguageRequest(f'{where}: an answer needs a non-empty question (a string)')
    if task is not TextTask.ANSWER and question is not None:
        raise BadLanguageRequest(f'{where}: only an answer takes a question, not {task.value}')
    budget = entry.get('max_tokens')
    if budget is not None and not (type(budget) is int and 1 <= budget <= decode_budget):
        raise BadLanguageRequest(f'{where}: max_tokens must be an integer in '
                                 f'1..{decode_budget}, got {budget!r}')
    request_id = entry.get('request_id', f'{task.value}-{index}')
    if not (isinstance(request_id, str) and _REQUEST_ID.fullmatch(request_id)):
        raise BadLanguageRequest(f'{where}: request_id must be 1 to 64 of A-Z a-z 0-9 _ . : -, '
                                 f'got {request_id!r}')
    return LanguageRequest(request_id, task, question, budget)


@dataclass(slots=True)
class _Update:
    request_id: str
    task: str
    tokens: list[int] = field(default_factory=list)
    text: str = ''
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None

    def as_wire(self) -> dict[str, Any]:
        return {'request_id': self.request_id, 'task': self.task, 'tokens': list(self.tokens),
                'text': self.text, 'finished': self.finished,
                'finish_reason': self.finish_reason, 'error': self.error}


class ConnectionTexts:
    """
    One connection's text requests and the news its next reply carries.

    :param conn_id: unique per connection: the engine's request ids are ``'{conn_id}/{id}'``.
    :param max_open: requests the connection may have waiting or decoding at once.
    """

    def __init__(self, conn_id: str, max_open: int) -> None:
        self.conn_id = conn_id
        self.max_open = max_open
        self.pending: list[LanguageRequest] = []
        """Asked, not yet on one of this connection's frames, in order."""
        self.in_engine: dict[str, LanguageRequest] = {}
        """Engine request id -> request: submitted (this frame) or decoding."""
        self._news: dict[str, _Update] = {}
        self._text: dict[str, str] = {}
        self.num_asked = 0

    def engine_id(self, request: LanguageRequest) -> str:
        """Return the engine's id of ``request`` (this connection's namespace)."""
        return f'{self.conn_id}/{request.request_id}'

    @property
    def num_open(self) -> int:
        return len(self.pending) + len(self.in_engine)

    def ask(self, requests: list[LanguageRequest]) -> None:
        """
        Queue new requests for this connection's next frame; refuse those over ``max_open``.

        A refused request ends in the next reply's updates (``TooManyLanguageRequests``).

        :raises BadLanguageRequest: an id in use (open, or its end not reported yet), or
            twice in ``requests``; nothing is queued then.
        """
        in_use = {r.request_id for r in self.pending} | set(self._news) | {
            r.request_id for r in self.in_engine.values()}
        ids = [r.request_id for r in requests]
        clash = sorted({i for i in ids if i in in_use or ids.count(i) > 1})
        if clash:
            raise BadLanguageRequest(f'request_id {", ".join(map(repr, clash))} in use (open, '
                                     f'or its end not reported yet)')
        for req in requests:
            self.num_asked += 1
            if self.num_open >= self.max_open:
                self.refuse(req, f'TooManyLanguageRequests: {self.num_open} open on this '
                                 f'connection (--max-language-requests {self.max_open})')
            else:
                self.pending.append(req)

    def refuse(self, request: LanguageRequest, error: str) -> None:
        """Record that ``request`` ends unanswered, for the next reply."""
        self._news[request.request_id] = _Update(request.request_id, request.task.value,
                                                 finished=True, error=one_line(error))

    def on_output(self, request: LanguageRequest, output: TextOutput) -> None:
        """Add one engine cycle's news of ``request``: its tokens and text, or its end."""
        news = self._news.setdefault(request.request_id,
                                     _Update(request.request_id, request.task.value))
        news.tokens.extend(output.new_token_ids)
        if not output.finished:
            self._text[request.request_id] = self._text.get(request.request_id, '') + \
                output.new_text
            news.text = self._text[request.request_id]
            return
        news.text, news.finished = output.text, True
        news.finish_reason = wire_finish_reason(output.finish_reason)
        news.error = one_line(output.error) if output.error else None
        self._text.pop(request.request_id, None)

    def take_updates(self) -> list[dict[str, Any]]:
        """Return the news since the previous call, one map per request, and forget it."""
        news, self._news = self._news, {}
        return [update.as_wire() for update in news.values()]


_ON_THE_WIRE = frozenset({FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORT})


def wire_finish_reason(reason: FinishReason | None) -> str | None:
    """Return an update's ``finish_reason``: the engine's name, None for a dropped request."""
    return reason.value if reason in _ON_THE_WIRE else None


__all__ = ['ConnectionTexts', 'LanguageRequest', 'MAX_PER_MESSAGE', 'parse_language_requests',
           'wire_finish_reason']
