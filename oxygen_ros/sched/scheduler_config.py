"""
The scheduler's settings (``EngineConfig.scheduler``) and its two policies (stdlib only).

``Scheduler`` (``scheduler.py``) reads them; the engine builds them from the declared
parameters (``oxygen_ros/parameters/oxygen_parameters.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass
import enum


class Policy(enum.Enum):
    OXYGEN = 'oxygen'
    ISOLATED = 'isolated'


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """
    The scheduler's settings: ``EngineConfig.scheduler``.

    No defaults of its own: each field is declared once, with its default, in
    ``oxygen_ros/parameters/oxygen_parameters.yaml``, and ``EngineConfig`` builds this config
    from there (this layer reads no YAML). What the engine derives (the pool's size, the
    longest prefix, the EOS id) is given to ``Scheduler`` itself.

    :param policy: OXYGEN or ISOLATED.
    :param block_size: tokens per KV block.
    :param tokens_per_cycle: k, decode tokens per text request per cycle (OXYGEN).
    :param min_tokens_per_cycle: lower bound of k when the deadline shrinks it (0 lets text
        stall entirely while the action path needs the whole period).
    :param max_running_requests: the largest decode batch.
    :param max_waiting_requests: text requests waiting for admission; ``add_request`` refuses
        one more (``QueueFullError``).
    :param stop_on_eos: end a text request at EOS; False decodes every request to its budget.
    :param max_robots: the most robots whose frames one cycle plans (one frame each): the
        action reserve holds an action prefix for each.
    :raises ValueError: a bound below 1, or ``min_tokens_per_cycle`` outside
        ``0..tokens_per_cycle``.
    """

    policy: Policy
    block_size: int
    tokens_per_cycle: int
    min_tokens_per_cycle: int
    max_running_requests: int
    max_waiting_requests: int
    stop_on_eos: bool
    max_robots: int

    def __post_init__(self) -> None:
        object.__setattr__(self, 'policy', Policy(self.policy))
        for name in ('block_size', 'tokens_per_cycle', 'max_running_requests',
                     'max_waiting_requests', 'max_robots'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
        if not 0 <= self.min_tokens_per_cycle <= self.tokens_per_cycle:
            raise ValueError(f'min_tokens_per_cycle must be in 0..{self.tokens_per_cycle}, '
                             f'got {self.min_tokens_per_cycle}')


__all__ = ['Policy', 'SchedulerConfig']
