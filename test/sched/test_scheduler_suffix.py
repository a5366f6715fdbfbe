"""Scheduler: text requests as causal suffixes on the frame's action prefix (the root)."""

from oxygen_ros.config import PrefixAttention
from oxygen_ros.sched.cost import CostModel
from oxygen_ros.sched.output import JobKind, JobTiming, SegmentKind, SuffixJob
from oxygen_ros.sched.request import FrameSpec, Request, RequestKind, TextContext
from oxygen_ros.sched.scheduler import Policy
import pytest
from sched_plans import ACTION_PROMPT, frame, IMG, make, run

MEMORY_SEED = (30, 31, 32)
QUESTION = (40, 41, 42, 43, 44, 45)


def on_root(req_id, suffix=MEMORY_SEED, budget=6, kind=RequestKind.MEMORY, adapter=False):
    return Request(req_id, kind, suffix, max_tokens=budget,
                   context=TextContext.ACTION_PREFIX, use_adapter=adapter)


@pytest.mark.parametrize('mode', list(PrefixAttention))
def test_one_root_per_frame_and_one_batched_suffix_job(mode):
    sched = make(mode=mode, k=3)
    sched.add_request(on_root('mem', adapter=True))
    sched.add_request(on_root('ask', QUESTION, kind=RequestKind.TEXT))
    out = sched.schedule(frame(0))
    prefills = out.jobs_of(JobKind.PREFILL)
    # the action's prefix only: images + action prompt, whatever the mode
    assert sum(p.num_tokens for p in prefills) == IMG + len(ACTION_PROMPT)
    assert len(out.jobs_of(JobKind.VISION)) == 1
    suffix, = out.jobs_of(JobKind.SUFFIX)
    kinds = [j.kind for j in out.jobs]
    assert kinds.index(JobKind.DENOISE) < kinds.index(JobKind.SUFFIX) < kinds.index(JobKind.SEED)
    root = out.jobs_of(JobKind.DENOISE)[0].seg_ids
    assert [(r.req_id, r.prompt_token_ids, r.use_adapter) for r in suffix.rows] == [
        ('mem', MEMORY_SEED, True), ('ask', QUESTION, False)]
    assert {r.parent_seg_id for r in suffix.rows} == {root[-1]}
    assert suffix.num_tokens == len(MEMORY_SEED) + len(QUESTION)
    mem, ask = out.new_requests
    assert mem.seg_ids == root + (suffix.rows[0].seg_id,) and mem.use_adapter
    assert ask.seg_ids == root + (suffix.rows[1].seg_id,) and not ask.use_adapter
    assert mem.num_prefix_tokens == IMG + len(ACTION_PROMPT) + len(MEMORY_SEED)
    # a suffix has blocks of its own, never shared with the root or another suffix
    blocks = [b for r in suffix.rows for b in r.block_ids]
    assert len(blocks) == len(set(blocks))
    assert not set(blocks) & {b for p in prefills for b in p.block_ids}
    run(sched, out)
    # the action let go of the root; the two requests hold it and their suffixes
    root_seg = sched.kv.lookup(next(s.key for s in sched.kv._segments.values()
                                    if s.seg_id == root[-1]))
    assert root_seg.ref_cnt == 2
    assert {s.key.kind for s in sched.kv._segments.values()} >= {SegmentKind.SUFFIX}
    sched.kv.check_consistency()


def test_the_root_is_freed_with_its_last_reader_and_decoding_crosses_frames():
    sched = make(mode=PrefixAttention.BIDIRECTIONAL, k=2, eos_token_id=None)
    sched.add_request(on_root('a', budget=6))
    run(sched, sched.schedule(frame(0)))
    sched.add_request(on_root('b', budget=2))
    out = sched.schedule(frame(1))
    decode, = out.jobs_of(JobKind.DECODE)
    assert decode.req_ids == ('a', 'b') and decode.num_tokens == (2, 1)
    run(sched, out)
    assert {s.key.frame_id for s in sched.kv._segments.values()} == {0}   # b finished
    run(sched, sched.schedule(frame(2)))
    assert sched.kv.num_segments == 0 and sched.kv.num_used_blocks == 0


def test_isolated_prefills_a_copy_of_the_root_per_request():
    sched = make(policy=Policy.ISOLATED, mode=PrefixAttention.BIDIRECTIONAL)
    sched.add_request(on_root('m0', budget=4))
    out = sched.schedule(frame(0))
    V, P, D, X, S, C = (JobKind.VISION, JobKind.PREFILL, JobKind.DENOISE, JobKind.SUFFIX,
                        JobKind.SEED, JobKind.DECODE)
    assert [j.kind for j in out.jobs] == [V, P, D, V, P, X, S, C]
    action_root, text_root = out.jobs_of(JobKind.PREFILL)
    assert action_root.prompt_token_ids == text_root.prompt_token_ids == ACTION_PROMPT
    assert action_root.seg_id != text_root.seg_id
    row, = out.jobs_of(JobKind.SUFFIX)[0].rows
    assert row.parent_seg_id == text_root.seg_id
    run(sched, out)
    assert sched.kv.num_used_blocks == 0


def test_a_frame_without_action_prefills_its_root_for_the_text_once():
    sched = make(mode=PrefixAttention.BIDIRECTIONAL)
    for i in range(2):
        sched.add_request(on_root(f'm{i}'))
    out = sched.schedule(FrameSpec(0, IMG, 2, None, prompt_token_ids=ACTION_PROMPT))
    root, = out.jobs_of(JobKind.PREFILL)
    assert root.prompt_token_ids == ACTION_PROMPT and not out.jobs_of(JobKind.DENOISE)
    assert len(out.jobs_of(JobKind.SUFFIX)[0].rows) == 2
    run(sched, out)
    # no root prompt known: requests on the action prefix wait, own-prompt ones do not
    sched.add_request(on_root('late'))
    sched.add_request(Request('own', RequestKind.TEXT, (2, 10), max_tokens=2))
    out = sched.schedule(FrameSpec(1, IMG, 2, None))
    assert [r.req_id for r in sched.waiting] == ['late']      # passed over, in its place
    assert [d.req_id for d in out.new_requests] == ['own']


def test_suffix_time_is_measured_apart_and_counted_in_admission():
    cost = CostModel(alpha=1.0)
    for timing in [JobTiming(JobKind.VISION, 0.010, batch_size=2),
                   JobTiming(JobKind.PREFILL, 0.037, num_tokens=IMG + 5),
                   JobTiming(JobKind.SUFFIX, 0.006, batch_size=1, num_tokens=3),
                   JobTiming(JobKind.DENOISE, 0.020),
                   JobTiming(JobKind.SEED, 0.001, batch_size=1),
                   JobTiming(JobKind.DECODE, 0.010, batch_size=1, num_tokens=1)]:
        cost.observe(timing)
    assert cost.prefill_s_per_token == pytest.approx(0.001)
    assert cost.suffix_s_per_token == pytest.approx(0.002)
    sched = make(mode=PrefixAttention.BIDIRECTIONAL, num_blocks=128, k=4, cost=cost)
    for i in range(3):
        sched.add_request(on_root(f'm{i}', budget=30))
    # 10 vision + 37 prefill + 20 denoise = 67 ms; each request adds 6 ms of suffix and
    # 1 ms of seed: m0 (74 ms) leaves 26 ms, m1 (81 ms) leaves 19 >= a 2-row step (20 ms)?
    # no: m1 is deferred
    out = sched.schedule(frame(0, deadline=0.100), now=0.0)
    assert [d.req_id for d in out.new_requests] == ['m0']
    assert [r.req_id for r in sched.waiting] == ['m1', 'm2']


def test_suffix_job_is_plain_data_and_bad_requests_are_refused():
    sched = make()
    sched.add_request(on_root('m'))
    out = sched.schedule(frame(0))
    job, = out.jobs_of(JobKind.SUFFIX)
    assert isinstance(job, SuffixJob)
    hash(job)
    with pytest.raises(ValueError, match='the suffix adapter needs the ACTION_PREFIX context'):
        Request('x', RequestKind.MEMORY, (2,), max_tokens=2, use_adapter=True)
    with pytest.raises(ValueError, match='an ACTION request reads its own prompt'):
        Request('a', RequestKind.ACTION, (2,), context=TextContext.ACTION_PREFIX)
