"""
Scheduler: job programs of both policies, budgets, EOS, cancellation, deadline, full pool.

Admission: one bounded waiting queue, first come first served.
"""

import math

from oxygen_ros.config import PrefixAttention
from oxygen_ros.sched.cost import CostModel
from oxygen_ros.sched.output import (
    DecodeJob, DenoiseJob, JobKind, JobTiming, PrefillJob, RunnerOutput, SeedJob, SegmentKind,
    VisionJob)
from oxygen_ros.sched.request import FinishReason, Request, RequestKind, RequestStatus
from oxygen_ros.sched.request_queue import QueueFullError
from oxygen_ros.sched.scheduler import Policy
import pytest
from sched_plans import ACTION_PROMPT, EOS, frame, IMG, make, run, SUBTASK_PROMPT, text


def test_oxygen_causal_text_shares_the_image_segment_and_decodes_after_the_action():
    sched = make()
    sched.add_request(text('t0'))
    out = sched.schedule(frame(0))
    kinds = [type(j).__name__ for j in out.jobs]
    assert kinds == ['VisionJob', 'PrefillJob', 'PrefillJob', 'DenoiseJob', 'PrefillJob',
                     'SeedJob', 'DecodeJob']
    vision, img, act_txt, denoise, sub_txt, seed, decode = out.jobs
    assert img.segment_kind is SegmentKind.IMAGE and img.emb_id == vision.emb_id
    assert img.num_tokens == IMG and img.block_ids == (1, 2, 3, 4)
    assert act_txt.segment_kind is SegmentKind.TEXT and act_txt.parent_seg_id == img.seg_id
    assert act_txt.prompt_token_ids == ACTION_PROMPT and act_txt.emb_id is None
    assert denoise.seg_ids == (img.seg_id, act_txt.seg_id)
    assert sub_txt.parent_seg_id == img.seg_id and sub_txt.num_tokens == len(SUBTASK_PROMPT)
    new, = out.new_requests
    assert new.seg_ids == (img.seg_id, sub_txt.seg_id)
    assert new.num_prefix_tokens == IMG + len(SUBTASK_PROMPT)
    assert len(new.block_ids) == 1               # budget 6 -> 5 fed tokens -> one 8-slot block
    assert seed.req_ids == ('t0',)
    assert decode.req_ids == ('t0',) and decode.num_tokens == (2,)   # k=3, seed is one of them
    run(sched, out)
    # the action let go of its prompt segment; the image segment lives on for the subtask
    assert sched.kv.num_segments == 2
    assert 'act0' not in sched.requests
    sched.kv.check_consistency()


def test_bidirectional_shares_only_identical_prompts_but_encodes_images_once():
    sched = make(mode=PrefixAttention.BIDIRECTIONAL)
    sched.add_request(text('same', prompt=ACTION_PROMPT))
    sched.add_request(text('other'))
    out = sched.schedule(frame(0))
    prefills = out.jobs_of(JobKind.PREFILL)
    assert [p.segment_kind for p in prefills] == [SegmentKind.FULL, SegmentKind.FULL]
    assert [p.num_tokens for p in prefills] == [IMG + 5, IMG + 4]
    assert len(out.jobs_of(JobKind.VISION)) == 1
    assert {p.emb_id for p in prefills} == {out.jobs_of(JobKind.VISION)[0].emb_id}
    same, other = out.new_requests
    assert same.seg_ids == out.jobs_of(JobKind.DENOISE)[0].seg_ids   # whole prefix shared


def test_isolated_gives_every_job_its_own_vision_and_prefill_and_decodes_to_completion():
    sched = make(policy=Policy.ISOLATED)
    sched.add_request(text('t0', budget=6))
    sched.add_request(text('m0', budget=4, kind=RequestKind.MEMORY))
    out = sched.schedule(frame(0))
    kinds = [j.kind for j in out.jobs]
    V, P, D, S, C = (JobKind.VISION, JobKind.PREFILL, JobKind.DENOISE, JobKind.SEED,
                     JobKind.DECODE)
    assert kinds == [V, P, D, V, P, S, C, V, P, S, C]
    assert len({j.emb_id for j in out.jobs_of(JobKind.VISION)}) == 3
    assert all(p.segment_kind is SegmentKind.FULL for p in out.jobs_of(JobKind.PREFILL))
    decodes = out.jobs_of(JobKind.DECODE)
    assert [(d.req_ids, d.num_tokens) for d in decodes] == [(('t0',), (5,)), (('m0',), (3,))]
    finished = run(sched, out)
    assert [(r.req_id, r.num_output_tokens, r.finish_reason) for r in finished] == [
        ('t0', 6, FinishReason.LENGTH), ('m0', 4, FinishReason.LENGTH)]
    assert sched.kv.num_used_blocks == 0


@pytest.mark.parametrize('budget,k', [(6, 3), (7, 3), (10, 1), (5, 5), (1, 4), (30, 5)])
def test_text_finishes_after_ceil_budget_over_k_cycles(budget, k):
    sched = make(k=k, eos_token_id=None)
    sched.add_request(text('t', budget=budget))
    cycles = 0
    while True:
        cycles += 1
        finished = run(sched, sched.schedule(frame(cycles)))
        if finished:
            break
        assert cycles < 100
    req, = finished
    assert cycles == math.ceil(budget / k)
    assert req.output_token_ids == [100 + i for i in range(budget)]
    assert req.status is RequestStatus.FINISHED_LENGTH
    assert sched.kv.num_used_blocks == 0 and sched.kv.num_segments == 0


def test_eos_retires_early_and_frees_blocks():
    sched = make(k=4)
    sched.add_request(text('t', budget=20))
    finished = run(sched, sched.schedule(frame(0)), token_of=lambda r, n: EOS if n == 2 else 50)
    req, = finished
    assert req.output_token_ids == [50, 50, EOS]
    assert req.finish_reason is FinishReason.STOP
    assert sched.kv.num_used_blocks == 0
    out = sched.schedule(frame(1))
    assert out.finished_req_ids == frozenset({'t'})
    assert not out.jobs_of(JobKind.DECODE)


def test_requests_of_different_frames_decode_in_one_batch():
    sched = make(k=2, eos_token_id=None)
    sched.add_request(text('a', budget=6))
    run(sched, sched.schedule(frame(0)))
    sched.add_request(text('b', budget=6))
    out = sched.schedule(frame(1))
    decode, = out.jobs_of(JobKind.DECODE)
    assert decode.req_ids == ('a', 'b') and decode.num_tokens == (2, 1)
    new, = out.new_requests
    assert new.frame_id == 1
    assert sched.requests['a'].frame_id == 0
    run(sched, out)
    # frame 0's image segment is still held by 'a', frame 1's by 'b'
    assert {s.key.frame_id for s in sched.kv._segments.values()} == {0, 1}


def test_cancellation_frees_everything():
    sched = make()
    sched.add_request(text('t', budget=20))
    sched.add_request(text('w', budget=20))
    run(sched, sched.schedule(frame(0)))
    sched.add_request(text('queued'))
    assert sched.abort_request('t').status is RequestStatus.FINISHED_ABORTED
    assert sched.abort_request('queued').status is RequestStatus.FINISHED_ABORTED
    assert sched.abort_request('unknown') is None
    out = sched.schedule(frame(1))
    assert out.finished_req_ids == frozenset({'t'})
    assert out.new_requests == ()
    assert out.jobs_of(JobKind.DECODE)[0].req_ids == ('w',)
    run(sched, out)
    sched.drop_all('engine shut down')
    assert sched.kv.num_used_blocks == 0 and sched.kv.num_segments == 0
    assert not sched.requests and not sched.running
    sched.kv.check_consistency()


def test_deadline_shrinks_k_with_measured_times():
    cost = CostModel(alpha=1.0)
    sched = make(mode=PrefixAttention.CAUSAL_TEXT, k=8, min_tokens_per_cycle=1, cost=cost)
    for timing in [JobTiming(JobKind.VISION, 0.010, batch_size=2),     # 5 ms per image
                   JobTiming(JobKind.PREFILL, 0.032, num_tokens=IMG),  # 1 ms per token
                   JobTiming(JobKind.DENOISE, 0.020),
                   JobTiming(JobKind.SEED, 0.001, batch_size=1),
                   JobTiming(JobKind.DECODE, 0.040, batch_size=1, num_tokens=4)]:
        cost.observe(timing)
    sched.add_request(text('t', budget=30))
    # 100 ms period: 10 vision + (32+5+4) prefill + 20 denoise + 1 seed = 72 ms -> 28 ms left
    out = sched.schedule(frame(0, deadline=0.100), now=0.0)
    assert out.tokens_per_cycle == 2                     # floor(28 / 10)
    assert out.jobs_of(JobKind.DECODE)[0].num_tokens == (1,)
    run(sched, out)
    # a tight deadline never starves the action but k stays >= min_tokens_per_cycle
    out = sched.schedule(frame(1, deadline=0.050), now=0.0)
    assert out.tokens_per_cycle == 1 and out.jobs_of(JobKind.DENOISE)
    run(sched, out)
    # no deadline: the configured k
    out = sched.schedule(frame(2), now=0.0)
    assert out.tokens_per_cycle == 8


def measured_cost():
    # measured: 5 ms per image, 1 ms per prefill token, denoise 20 ms, seed 1 ms per row,
    # decode 10 ms per step at batch 1 (linear in the batch above it)
    cost = CostModel(alpha=1.0)
    for timing in [JobTiming(JobKind.VISION, 0.010, batch_size=2),
                   JobTiming(JobKind.PREFILL, 0.032, num_tokens=IMG),
                   JobTiming(JobKind.DENOISE, 0.020),
                   JobTiming(JobKind.SEED, 0.001, batch_size=1),
                   JobTiming(JobKind.DECODE, 0.040, batch_size=1, num_tokens=4)]:
        cost.observe(timing)
    return cost


def test_the_decode_job_carries_the_action_deadline():
    sched = make(mode=PrefixAttention.BIDIRECTIONAL, k=4, cost=measured_cost())
    sched.add_request(text('t', budget=30))
    out = sched.schedule(frame(0, deadline=1.5), now=1.0)
    assert out.jobs_of(JobKind.DECODE)[0].deadline == 1.5
    run(sched, out)
    # no deadline (the engine's caller gave none): the fixed k, every planned step runs
    out = sched.schedule(frame(1), now=2.0)
    assert out.jobs_of(JobKind.DECODE)[0].deadline is None
    assert out.tokens_per_cycle == 4


def test_admissions_stop_where_the_measured_times_leave_no_decode_step():
    sched = make(mode=PrefixAttention.CAUSAL_TEXT, num_blocks=128, k=4, cost=measured_cost())
    for i in range(4):  # each its own 4-token text segment: 4 ms prefill + 1 ms seed
        sched.add_request(text(f't{i}', budget=30, prompt=(2, 10, 30 + i, 21)))
    # action path: 10 vision + 37 prefill + 20 denoise = 67 ms of 100. With t0: 72 ms, and
    # t1 leaves 100 - 77 = 23 ms >= a decode step of 2 rows (20 ms); t2 would leave 18 ms
    # for a step of 3 rows (30 ms)
    out = sched.schedule(frame(0, deadline=0.100), now=0.0)
    assert [d.req_id for d in out.new_requests] == ['t0', 't1']
    assert waiting(sched) == ['t2', 't3']                 # still queued, in order
    assert out.jobs_of(JobKind.SEED)[0].req_ids == ('t0', 't1')
    run(sched, out)
    # a cycle that starts after its deadline still admits one: nobody waits forever
    out = sched.schedule(frame(1, deadline=1.0), now=1.2)
    assert [d.req_id for d in out.new_requests] == ['t2'] and waiting(sched) == ['t3']
    assert out.jobs_of(JobKind.DENOISE)
    run(sched, out)
    out = sched.schedule(frame(2), now=2.0)  # no deadline: no limit
    assert [d.req_id for d in out.new_requests] == ['t3']
    assert len(sched.running) == 4


def waiting(sched):
    return [r.req_id for r in sched.waiting]


def test_full_pool_keeps_text_waiting_in_order_while_actions_keep_flowing():
    # reserve = 5 blocks (40 tokens) + 1; 21 usable blocks: a request may need up to 6 + 3
    sched = make(num_blocks=22, k=1, eos_token_id=None)
    admitted, ever_waited = [], set()
    for i in range(12):
        sched.add_request(text(f't{i}', budget=24))      # 1 text block + 3 decode blocks
        out = sched.schedule(frame(i))
        assert out.jobs_of(JobKind.DENOISE), f'cycle {i}: action starved'
        admitted += [d.req_id for d in out.new_requests]
        ever_waited |= set(waiting(sched))
        run(sched, out)
        assert sched.kv.num_free_blocks >= sched.action_reserve_blocks
        sched.kv.check_consistency()
    assert admitted and ever_waited
    # first come first served: admitted in arrival order, the rest wait in it
    assert admitted + waiting(sched) == [f't{i}' for i in range(12)]
    assert all(sched.requests[r].status is RequestStatus.WAITING for r in waiting(sched))


def test_batch_limit_defers_and_no_frame_defers_but_keeps_decoding():
    sched = make(max_running_requests=1, k=1, eos_token_id=None)
    sched.add_request(text('a', budget=5))
    sched.add_request(text('b', budget=5))
    out = sched.schedule(frame(0))
    assert [d.req_id for d in out.new_requests] == ['a'] and waiting(sched) == ['b']
    run(sched, out)
    sched.add_request(text('c', budget=5))
    out = sched.schedule(None)                            # stale camera: no frame
    assert out.frame_id is None and not out.jobs_of(JobKind.DENOISE)
    assert out.new_requests == () and waiting(sched) == ['b', 'c']
    assert out.jobs_of(JobKind.DECODE)[0].req_ids == ('a',)
    run(sched, out)


def test_the_waiting_queue_is_bounded_and_refuses_one_more():
    sched = make(max_waiting_requests=2)
    sched.add_request(text('a'))
    sched.add_request(text('b'))
    with pytest.raises(QueueFullError) as refused:
        sched.add_request(text('c'))
    assert str(refused.value) == 'queue full (2 requests waiting, max_waiting_requests 2)'
    assert waiting(sched) == ['a', 'b'] and 'c' not in sched.requests
    sched.abort_request('a')                             # a cancel frees its place
    sched.add_request(text('c'))
    run(sched, sched.schedule(frame(0)))                 # admission frees the others
    assert waiting(sched) == [] and sched.num_running == 2
    for i in range(2):
        sched.add_request(text(f'd{i}'))
    with pytest.raises(ValueError, match='max_waiting_requests must be >= 1, got 0'):
        make(max_waiting_requests=0)


def test_a_request_the_pool_could_never_hold_is_refused_at_once():
    # 63 usable blocks, reserve 6: 51 beside the action path; an own prefix may need 6
    sched = make()
    sched.add_request(text('fits', budget=8 * 45 + 1))     # 6 + 45 blocks
    with pytest.raises(ValueError, match=r'never: needs up to 52 KV blocks \(its prefix and a '
                       r'budget of 369 tokens\), the pool has 51 beside the action path: it '
                       r'could never be admitted'):
        sched.add_request(text('never', budget=8 * 46 + 1))
    assert waiting(sched) == ['fits']


def test_the_head_is_never_overtaken_so_it_waits_only_for_the_running_to_end():
    # room for one long request at a time; a short one behind it waits too (vLLM's FCFS)
    sched = make(num_blocks=30, k=2, eos_token_id=None)   # 29 usable, reserve 6: 17 beside
    sched.add_request(text('long', budget=8 * 10 + 1))      # 6 + 10 blocks
    run(sched, sched.schedule(frame(0)))
    sched.add_request(text('head', budget=8 * 10 + 1))
    sched.add_request(text('short', budget=2))              # would fit now, beside 'long'
    cycles = 1
    while 'long' in sched.requests:
        out = sched.schedule(frame(cycles))
        assert out.new_requests == () and waiting(sched) == ['head', 'short']
        run(sched, out)
        cycles += 1
    assert cycles == math.ceil(81 / 2)                      # long's budget at k = 2
    out = sched.schedule(frame(cycles))
    assert [d.req_id for d in out.new_requests] == ['head', 'short'] and waiting(sched) == []


def test_bad_requests_and_configs_are_rejected():
    sched = make()
    with pytest.raises(ValueError, match='ACTION requests come with their frame'):
        sched.add_request(Request('x', RequestKind.ACTION, (2,)))
    sched.add_request(text('dup'))
    with pytest.raises(ValueError, match="duplicate request id 'dup'"):
        sched.add_request(text('dup'))
    with pytest.raises(ValueError, match='empty prompt'):
        text('e', prompt=())
    with pytest.raises(ValueError, match='max_tokens must be >= 1'):
        text('z', budget=0)
    with pytest.raises(ValueError, match='cannot hold two action prefixes'):
        make(num_blocks=8)
    with pytest.raises(ValueError, match='tokens_per_cycle must be >= 1'):
        make(k=0)
    out = sched.schedule(frame(0))
    with pytest.raises(ValueError, match='runner output of cycle 99'):
        sched.update_from_output(out, RunnerOutput(99))


def test_plan_is_plain_data():
    sched = make()
    sched.add_request(text('t'))
    out = sched.schedule(frame(0))
    for job in out.jobs:
        assert isinstance(job, (VisionJob, PrefillJob, DenoiseJob, SeedJob, DecodeJob))
        hash(job)   # frozen, hashable: safe to hand to another thread


def test_a_decode_job_refuses_a_row_without_a_step():
    """The backend feeds each row its last sampled token next: a row of 0 steps has none."""
    assert DecodeJob(('a', 'b'), (2, 1), EOS).max_steps == 2
    for steps in ((2, 0), (1,), (1, 1, 1)):
        with pytest.raises(ValueError, match=rf'a decode job needs >= 1 step for each of its '
                                             rf'rows, got steps \({", ".join(map(str, steps))}'):
            DecodeJob(('a', 'b'), steps, EOS)
