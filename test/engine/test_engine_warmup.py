"""
``Engine.warmup``'s text rounds: every context, then a burst's shape (full batch, whole budget).

What a burst needs is reached at configure (docs/robustness.md#soak): the decode batch of
``max_running_requests`` rows and the longest context, a suffix prefill of as many rows. A
budget the KV pool can never hold keeps the burst round to what it holds, as the robot's
requests would be (``warm_texts``).
"""

import numpy as np
from oxygen_ros.config import PrefixAttention
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.warm_texts import warm_texts
from oxygen_ros.observation import Observation
from oxygen_ros.sched.output import DecodeJob, SuffixJob
from oxygen_ros.transforms.prompt import TextTask
import pytest

CAMERAS = ('base_0_rgb', 'left_wrist_0_rgb')


def observation():
    rng = np.random.default_rng(0)
    images = {slot: rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for slot in CAMERAS}
    return Observation(images, np.zeros(8, np.float32), 'pick up the cup', 0)


def record_plans(engine):
    """Return the list every executed plan is appended to."""
    plans, execute = [], engine.backend.execute

    def recording(plan, frame, **kwargs):
        plans.append(plan)
        return execute(plan, frame, **kwargs)
    engine.backend.execute = recording
    return plans


@pytest.mark.parametrize('max_running', [4, 6])
def test_the_warm_up_runs_a_full_batch_of_the_whole_budget(tiny_models, tokenizer, max_running):
    engine = Engine(EngineConfig.create(preset='tiny', max_running_requests=max_running,
                                        max_waiting_requests=2),
                    model=tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERAS),
                    tokenizer=tokenizer)
    plans = record_plans(engine)
    engine.warmup(observation())
    jobs = [job for plan in plans for job in plan.jobs]
    decodes = [job for job in jobs if isinstance(job, DecodeJob)]
    assert max(len(job.req_ids) for job in decodes) == max_running
    assert max(len(job.rows) for job in jobs if isinstance(job, SuffixJob)) == max_running
    full = [job for job in decodes if len(job.req_ids) == max_running]
    budget = engine.decode_budget
    assert sum(max(job.num_tokens) for job in full) >= budget - 1 - 4  # most of it, batched
    assert engine.num_running == engine.num_waiting == 0         # nothing left behind
    assert engine.config.scheduler.max_waiting_requests == 2                # the bound is back
    assert engine.scheduler.kv.pool.num_used_blocks == 0


def test_a_budget_the_pool_can_never_hold_ends_the_submitting_only_where_asked(
        tiny_models, tokenizer):
    engine = Engine(EngineConfig(preset='tiny'),
                    model=tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERAS),
                    tokenizer=tokenizer)
    tasks = [TextTask.ANSWER] * 3
    with pytest.raises(ValueError, match='could never be admitted'):
        warm_texts(engine, observation(), ('',), tasks, 100_000)
    warm_texts(engine, observation(), ('',), tasks, 100_000, as_the_pool_holds=True)
    assert engine.num_running == engine.num_waiting == 0
    assert engine.config.scheduler.max_waiting_requests == 16  # the bound is back either way
    assert engine.step(observation()).action is not None
