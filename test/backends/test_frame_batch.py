"""
Several robots' frames through one plan and one backend equal each robot served alone.

The scheduler plans one cycle over the frames of every robot due; the torch backend runs
their vision, prefills and denoise batched where shapes agree (``frame_batch.py``). Per
robot, the chunks (same noise) and the texts equal those of the robot alone on its own
scheduler and backend (float32, 1e-5, as OxyGen against isolated execution), whatever
camera counts, prompt lengths, text contexts, RTC guidance or control rates the robots have.
"""

from dataclasses import dataclass, field
import itertools

import numpy as np
from oxygen_ros.backends.frame_batch import plan_calls
from oxygen_ros.backends.interface import FrameInputs
from oxygen_ros.backends.torch_backend import TorchBackend
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.model.guidance import RtcGuidance
from oxygen_ros.parameters import declared_config
from oxygen_ros.sched.output import (
    DenoiseJob, JobKind, PrefillJob, SegmentKind, VisionJob)
from oxygen_ros.sched.request import FrameSpec, Request, RequestKind, TextContext
from oxygen_ros.sched.scheduler import Policy, Scheduler, SchedulerConfig
import pytest
import torch

BLOCK = 16


@dataclass
class Robot:
    """One robot's inputs, drawn once: per cycle its frame (or not due) and its text."""

    name: str
    cameras: int
    period: int                        # due every `period` cycles
    guided: bool = False               # RTC toward a made-up previous chunk
    frames: dict[int, tuple[tuple[int, ...], tuple[np.ndarray, ...], torch.Tensor]] = \
        field(default_factory=dict)
    texts: dict[int, list[Request]] = field(default_factory=dict)


def settings(**changes):
    """Return the scheduler's declared settings with ``changes`` (as ``EngineConfig`` does)."""
    return declared_config(SchedulerConfig, 'scheduler', **{'block_size': BLOCK, **changes})


def run_plan(backend, plan, inputs):
    """Run ``plan`` to its end; return what it yielded, in order, and its output."""
    steps, yielded = backend.execute(plan, inputs), []
    while True:
        try:
            yielded.append(next(steps))
        except StopIteration as done:
            return yielded, done.value


def frame_inputs(frame_id, images, noise, guidance=None):
    """Return a frame's inputs as the engine makes them: ``[1, N, 3, S, S]`` images."""
    return FrameInputs(frame_id, torch.from_numpy(np.stack(images))[None], noise, guidance)


def draw_robots(cfg, policy, cycles=6):
    rng = np.random.default_rng(7)
    gen = torch.Generator().manual_seed(7)
    size = cfg.vision.image_size
    robots = [Robot('a', 2, 1), Robot('b', 1, 2, guided=True), Robot('c', 2, 1)]
    ids = itertools.count()
    for robot in robots:
        for cycle in range(0, cycles, robot.period):
            prompt = tuple(int(t) for t in rng.integers(3, 5000, int(rng.integers(6, 20))))
            images = tuple(rng.uniform(-1, 1, (3, size, size)).astype(np.float32)
                           for _ in range(robot.cameras))
            noise = torch.randn((1, cfg.action_horizon, cfg.action_dim), generator=gen)
            robot.frames[cycle] = (prompt, images, noise)
            texts = []
            for _ in range(int(rng.integers(0, 3))):
                on_root = bool(rng.integers(0, 2))
                own = tuple(int(t) for t in rng.integers(3, 5000, int(rng.integers(2, 9))))
                texts.append(Request(
                    f'{robot.name}-{next(ids)}', RequestKind.TEXT, own,
                    max_tokens=int(rng.integers(1, 9)), robot=robot.name,
                    context=TextContext.ACTION_PREFIX if on_root else TextContext.OWN_PROMPT))
            robot.texts[cycle] = texts
    return robots


def serve(model, mode, policy, robots, cycles=6):
    """Serve ``robots`` together; return chunks by (robot, cycle), texts, and the timings."""
    cfg = model.cfg
    sched = Scheduler(settings(policy=policy, tokens_per_cycle=2, stop_on_eos=False,
                               max_robots=len(robots), max_waiting_requests=64),
                      num_blocks=600, max_prefix_tokens=cfg.prefix_tokens(2),
                      prefix_attention=mode, eos_token_id=1)
    backend = TorchBackend(model, 600, BLOCK)
    chunks, texts, timings, calls = {}, {}, [], []
    cycle = 0
    while cycle < cycles or sched.requests:
        specs, inputs, due = [], [], {}
        for robot in robots:
            for req in robot.texts.get(cycle, []) if cycle < cycles else []:
                sched.add_request(Request(req.req_id, req.kind, req.prompt_token_ids,
                                          max_tokens=req.max_tokens, context=req.context,
                                          robot=req.robot))
            if cycle in robot.frames:
                prompt, images, noise = robot.frames[cycle]
                fid = cycle * 10 + ord(robot.name) - ord('a')
                action = Request(f'act{fid}', RequestKind.ACTION, prompt)
                specs.append(FrameSpec(fid, len(images) * cfg.image_tokens_per_camera,
                                       len(images), action, robot=robot.name))
                guidance = None
                if robot.guided and cycle:
                    target = np.linspace(-1, 1, cfg.action_horizon * cfg.action_dim).reshape(
                        cfg.action_horizon, cfg.action_dim)
                    guidance = RtcGuidance.from_numpy(
                        target, np.linspace(1, 0, cfg.action_horizon), 5.0)
                inputs.append(frame_inputs(fid, images, noise, guidance))
                due[fid] = (robot.name, cycle)
        plan = sched.schedule(specs)
        handed, out = run_plan(backend, plan, inputs)
        assert sorted(fid for fid, _ in handed) == sorted(due) and set(out.chunks) == set(due)
        assert all(out.chunks[fid] is chunk for fid, chunk in handed)
        chunks.update({due[fid]: a[0].numpy().copy() for fid, a in out.chunks.items()})
        timings += out.runner.timings
        calls.append(plan_calls(plan.jobs, {f.frame_id: f for f in inputs}))
        for req in sched.update_from_output(plan, out.runner):
            texts[req.req_id] = tuple(req.output_token_ids)
        cycle += 1
        assert cycle < 100
    assert sched.kv.num_used_blocks == 0
    return chunks, texts, timings, calls


@pytest.mark.parametrize('policy', list(Policy))
@pytest.mark.parametrize('mode', list(PrefixAttention))
def test_robots_served_together_equal_each_robot_alone(mode, policy, tiny_models):
    model = tiny_models(mode, CAMERA_SLOTS[:2])
    robots = draw_robots(model.cfg, policy)
    together, texts, timings, _ = serve(model, mode, policy, robots)
    alone_chunks, alone_texts = {}, {}
    for robot in robots:
        chunks, robot_texts, _, _ = serve(model, mode, policy, [robot])
        alone_chunks.update(chunks)
        alone_texts.update(robot_texts)
    assert set(together) == set(alone_chunks) and len(together) == 6 + 3 + 6
    for key, chunk in together.items():
        np.testing.assert_allclose(chunk, alone_chunks[key], atol=1e-5, rtol=0, err_msg=key)
    assert texts == alone_texts
    assert len(texts) == sum(len(t) for robot in robots for t in robot.texts.values())
    # the chunks and texts depend on their robot's inputs (else equality would prove little)
    assert len({c.tobytes() for c in together.values()}) == len(together)
    assert len(set(texts.values())) >= len(texts) // 2
    if policy is Policy.OXYGEN:   # and the batched calls did run
        batched = {t.kind for t in timings if t.batch_size > 1 and t.kind in (
            JobKind.VISION, JobKind.PREFILL, JobKind.DENOISE)}
        assert batched == {JobKind.VISION, JobKind.PREFILL, JobKind.DENOISE}
        # three chunks at first, then b's guided alone beside a's and c's
        assert {t.batch_size for t in timings if t.kind is JobKind.DENOISE} == {1, 2, 3}


def frames_of(cameras, guided=()):
    return {i: FrameInputs(i, torch.zeros(1, n, 3, 4, 4), torch.zeros(1),
                           RtcGuidance(torch.zeros(1), torch.zeros(1), 1.0)
                           if i in guided else None)
            for i, n in enumerate(cameras)}


def prefill(frame_id, kind, seg_id):
    return PrefillJob(seg_id, frame_id, kind, (2,), (1,), 1, 0, None)


def test_plan_calls_batch_runs_of_distinct_frames_by_shape():
    frames = frames_of((2, 1, 2), guided={2})
    img, txt = SegmentKind.IMAGE, SegmentKind.TEXT
    jobs = [VisionJob(0, 0), VisionJob(1, 1), VisionJob(2, 2),
            prefill(0, img, 0), prefill(1, img, 1), prefill(2, img, 2),
            prefill(0, txt, 3), prefill(1, txt, 4), prefill(2, txt, 5),
            DenoiseJob('a0', 0, (0, 3)), DenoiseJob('a1', 1, (1, 4)), DenoiseJob('a2', 2, (2, 5)),
            prefill(0, txt, 6), prefill(0, txt, 7)]          # two prompts of one frame
    calls = plan_calls(jobs, frames)
    ids = [[(type(j).__name__[0], j.frame_id) for j in call] for call in calls]
    assert ids == [[('V', 0), ('V', 2)], [('V', 1)],                 # by camera count
                   [('P', 0), ('P', 2)], [('P', 1)], [('P', 0), ('P', 2)], [('P', 1)],
                   [('D', 0), ('D', 1)], [('D', 2)],                 # guided: alone
                   [('P', 0)], [('P', 0)]]                           # one frame twice: apart
    # the plain chunks first, batched, then a guided one (of the tightest deadline) alone
    denoise = [DenoiseJob(f'a{i}', i, (i,)) for i in (2, 0, 1)]
    assert [[j.frame_id for j in call] for call in plan_calls(denoise, frames)] == [[0, 1], [2]]
    # a one-frame plan: one job per call, as before
    one = [VisionJob(0, 0), prefill(0, img, 0), prefill(0, txt, 1), DenoiseJob('a', 0, (0, 1))]
    assert plan_calls(one, frames_of((2,))) == [(job,) for job in one]


def test_a_plan_without_a_frames_inputs_is_refused_before_anything_runs(tiny_models):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERA_SLOTS[:2])
    cfg = model.cfg
    sched = Scheduler(settings(max_robots=2), num_blocks=200,
                      max_prefix_tokens=cfg.prefix_tokens(2),
                      prefix_attention=PrefixAttention.BIDIRECTIONAL, eos_token_id=1)
    backend = TorchBackend(model, 200, BLOCK)
    specs = [FrameSpec(i, cfg.image_tokens_per_camera, 1,
                       Request(f'act{i}', RequestKind.ACTION, (2, 5, 6)), robot=r)
             for i, r in enumerate('ab')]
    plan = sched.schedule(specs)
    image = np.zeros((3, cfg.vision.image_size, cfg.vision.image_size), np.float32)
    noise = torch.zeros(1, cfg.action_horizon, cfg.action_dim)
    with pytest.raises(ValueError, match=r'plan 1 encodes frame 1 but got inputs of \[0\]'):
        run_plan(backend, plan, [frame_inputs(0, (image,), noise)])
    assert backend.num_live_segments == 0
    handed, out = run_plan(backend, plan, [frame_inputs(i, (image,), noise) for i in (1, 0)])
    assert sorted(out.chunks) == [0, 1] == sorted(fid for fid, _ in handed)
    with pytest.raises(ValueError, match=r'chunks of frames \[0, 1\]: read chunks'):
        out.actions
