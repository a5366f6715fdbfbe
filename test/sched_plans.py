"""Scheduler test helpers: small plans over a fake backend (no model)."""

from oxygen_ros.config import PrefixAttention
from oxygen_ros.parameters import declared_config
from oxygen_ros.sched.output import DecodeJob, RunnerOutput, SeedJob
from oxygen_ros.sched.request import FrameSpec, Request, RequestKind
from oxygen_ros.sched.scheduler import Policy, Scheduler, SchedulerConfig

ACTION_PROMPT = (2, 10, 11, 12, 13)
SUBTASK_PROMPT = (2, 10, 20, 21)
IMG = 32          # image tokens per frame in these tests
EOS = 1


def settings(**changes) -> SchedulerConfig:
    """Return the scheduler's declared settings with ``changes`` (as ``EngineConfig`` does)."""
    return declared_config(SchedulerConfig, 'scheduler', **{'block_size': 8, **changes})


def make(policy=Policy.OXYGEN, mode=PrefixAttention.CAUSAL_TEXT, num_blocks=64, k=3,
         eos_token_id=EOS, cost=None, **kw):
    """Return a scheduler of a pool of ``num_blocks`` 8-token blocks (no EOS: ``None``)."""
    cfg = settings(policy=policy, tokens_per_cycle=k, stop_on_eos=eos_token_id is not None,
                   **kw)
    return Scheduler(cfg, num_blocks=num_blocks, max_prefix_tokens=IMG + 8,
                     prefix_attention=mode, eos_token_id=EOS if eos_token_id is None else
                     eos_token_id, cost=cost)


def frame(i, deadline=None, prompt=ACTION_PROMPT, robot=''):
    action = Request(f'act{i}', RequestKind.ACTION, prompt, deadline=deadline)
    return FrameSpec(frame_id=i, num_image_tokens=IMG, num_images=2, action=action,
                     robot=robot)


def text(req_id, budget=6, prompt=SUBTASK_PROMPT, kind=RequestKind.TEXT, robot=''):
    return Request(req_id, kind, prompt, max_tokens=budget, robot=robot)


def run(sched, out, token_of=lambda req_id, n: 100 + n, timings=()):
    """Fake backend: every scheduled token is `token_of(req_id, index within request)`."""
    produced: dict[str, list[int]] = {}
    counts = {r.req_id: r.num_output_tokens for r in sched.running}
    for job in out.jobs:
        if isinstance(job, SeedJob):
            rows = [(r, 1) for r in job.req_ids]
        elif isinstance(job, DecodeJob):
            rows = list(zip(job.req_ids, job.num_tokens))
        else:
            continue
        for req_id, n in rows:
            for _ in range(n):
                produced.setdefault(req_id, []).append(token_of(req_id, counts[req_id]))
                counts[req_id] += 1
    return sched.update_from_output(
        out, RunnerOutput(out.cycle_id, {k: tuple(v) for k, v in produced.items()},
                          tuple(timings)))
