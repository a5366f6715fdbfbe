"""
The text share of ``Engine.warmup``: requests submitted together and stepped until they end.

Its last round is a burst's shape: ``max_running_requests`` questions of the whole budget at
once, the largest batch and context the robot's text can reach, so that what they need (the
control thread's malloc arena, docs/robustness.md#soak) is there before the first burst.
"""

from __future__ import annotations

from typing import Mapping

from oxygen_ros.observation import Observation
from oxygen_ros.transforms.prompt import TextTask

QUESTION = 'what is on the table?'
"""The warm-up's question (answer requests need one)."""


def warm_texts(engine: object, observation: Observation | Mapping[str, Observation],
               robots: tuple[str, ...], tasks: list[TextTask], tokens: int, *,
               as_the_pool_holds: bool = False) -> None:
    """
    Submit ``tasks`` (``tokens`` each) at once and step ``observation`` until they end.

    The waiting-queue bound is lifted for them. After ``len(tasks) + tokens + 3`` cycles the
    rest are aborted.

    :param engine: the ``engine.Engine`` warming up (it imports this module).
    :param observation: what ``Engine.step`` takes (one robot's, or every robot's by name).
    :param robots: the robots the requests go to, in turn.
    :param as_the_pool_holds: a request whose budget the KV pool can never hold (a small
        ``kv_cache_mb``) ends the submitting, as the robot's would be refused; else its
        ``ValueError`` is raised.
    :raises ValueError: see ``Engine.submit_text``.
    """
    limit = engine.config.scheduler.max_waiting_requests
    engine.set_max_waiting_requests(max(limit, len(tasks)))  # room for them under any bound
    req_ids: set[str] = set()
    try:
        for i, task in enumerate(tasks):
            req_ids.add(engine.submit_text(
                task, max_tokens=tokens, question=QUESTION if task is TextTask.ANSWER else None,
                robot=robots[i % len(robots)]))
    except ValueError:
        if not as_the_pool_holds:
            raise
    finally:
        engine.set_max_waiting_requests(limit)
    for _ in range(len(tasks) + tokens + 3):
        req_ids -= {t.req_id for t in engine.step(observation).finished}
        if not req_ids:
            break
    for req_id in req_ids:
        engine.abort(req_id)


__all__ = ['QUESTION', 'warm_texts']
