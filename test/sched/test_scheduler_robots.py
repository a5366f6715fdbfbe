"""
Scheduler: the frames of several robots in one cycle, each robot's text on its own frames.

One plan per cycle over the frames of every robot due (``docs/design.md#several-robots``):
the action path stage by stage, text admitted per robot in arrival order (a robot not due
holds up nobody), one decode job for every robot's running requests, the action reserve
sized for every robot, room kept for a request the pool refused.
"""

import itertools

from hypothesis import given, settings, strategies as st
from oxygen_ros.config import PrefixAttention
from oxygen_ros.sched.cost import CostModel
from oxygen_ros.sched.output import JobKind, JobTiming, SegmentKind
from oxygen_ros.sched.request import Request, RequestKind, RequestStatus, TextContext
from oxygen_ros.sched.scheduler import Policy
import pytest
from sched_plans import ACTION_PROMPT, frame, IMG, make, run, SUBTASK_PROMPT, text

V, P, X, D, S, C = (JobKind.VISION, JobKind.PREFILL, JobKind.SUFFIX, JobKind.DENOISE,
                    JobKind.SEED, JobKind.DECODE)


def on_root(req_id, robot, budget=6, suffix=(30, 31, 32)):
    return Request(req_id, RequestKind.MEMORY, suffix, max_tokens=budget,
                   context=TextContext.ACTION_PREFIX, robot=robot)


def waiting(sched):
    return [r.req_id for r in sched.waiting]


@pytest.mark.parametrize('policy', list(Policy))
@pytest.mark.parametrize('mode', list(PrefixAttention))
def test_one_robot_plans_alike_however_many_robots_the_scheduler_could_serve(policy, mode):
    """A lone frame, a list of one frame, an engine sized for 3 robots: the same plans."""
    plans = []
    for as_list, max_robots in ((False, 1), (True, 1), (True, 3)):
        sched = make(policy=policy, mode=mode, num_blocks=200, k=2, eos_token_id=None,
                     max_robots=max_robots)
        outs = []
        for i in range(6):
            sched.add_request(text(f't{i}', budget=3 + i % 4))
            if i % 2:
                sched.add_request(on_root(f'm{i}', '', budget=4))
            out = sched.schedule([frame(i)] if as_list else frame(i))
            outs.append(out)
            run(sched, out)
        plans.append(outs)
    assert plans[0] == plans[1] == plans[2]
    assert plans[0][0].frame_id == 0 and plans[0][0].frame_ids == (0,)


@pytest.mark.parametrize('mode', list(PrefixAttention))
def test_the_action_paths_of_several_robots_come_stage_by_stage(mode):
    sched = make(mode=mode, num_blocks=100, max_robots=3)
    out = sched.schedule([frame(0, robot='a'), frame(1, robot='b'), frame(2, robot='c')])
    kinds = [j.kind for j in out.jobs]
    if mode is PrefixAttention.CAUSAL_TEXT:   # images, then prompts on them, of all three
        assert kinds == [V, V, V, P, P, P, P, P, P, D, D, D]
        prefills = out.jobs_of(P)
        assert [p.segment_kind for p in prefills] == [SegmentKind.IMAGE] * 3 + \
            [SegmentKind.TEXT] * 3
        assert [p.parent_seg_id for p in prefills[3:]] == [p.seg_id for p in prefills[:3]]
    else:
        assert kinds == [V, V, V, P, P, P, D, D, D]
    visions, denoises = out.jobs_of(V), out.jobs_of(D)
    assert [v.frame_id for v in visions] == [d.frame_id for d in denoises] == [0, 1, 2]
    for prefill in out.jobs_of(P):
        if prefill.emb_id is not None:
            assert prefill.emb_id == visions[prefill.frame_id].emb_id
    # each chunk reads its own frame's prefix only
    owner = {p.seg_id: p.frame_id for p in out.jobs_of(P)}
    assert [{owner[s] for s in d.seg_ids} for d in denoises] == [{0}, {1}, {2}]
    assert out.frame_ids == (0, 1, 2)
    with pytest.raises(ValueError, match=r'plan 1 holds frames \(0, 1, 2\): read frame_ids'):
        out.frame_id
    run(sched, out)
    assert sched.kv.num_used_blocks == 0


def test_text_is_admitted_onto_its_own_robots_frame_and_decodes_with_every_robots():
    sched = make(num_blocks=100, k=2, eos_token_id=None, max_robots=2)
    sched.add_request(text('a0', robot='a'))
    sched.add_request(on_root('b0', 'b'))
    sched.add_request(text('a1', robot='a', prompt=ACTION_PROMPT))
    out = sched.schedule([frame(0, robot='a'), frame(1, robot='b')])
    assert {d.req_id: d.frame_id for d in out.new_requests} == {'a0': 0, 'b0': 1, 'a1': 0}
    suffix, = out.jobs_of(X)
    root = out.jobs_of(D)[1].seg_ids
    assert suffix.rows[0].parent_seg_id == root[-1]           # b's root, not a's
    assert out.jobs_of(S)[0].req_ids == ('a0', 'b0', 'a1')
    decode, = out.jobs_of(C)
    assert decode.req_ids == ('a0', 'b0', 'a1')
    run(sched, out)
    # only robot b is due: a's requests still decode, in b's cycle, one job for all
    sched.add_request(text('b1', robot='b'))
    out = sched.schedule([frame(2, robot='b')])
    assert out.frame_ids == (2,) and [d.req_id for d in out.new_requests] == ['b1']
    decode, = out.jobs_of(C)
    assert decode.req_ids == ('a0', 'b0', 'a1', 'b1') and decode.num_tokens == (2, 2, 2, 1)
    run(sched, out)


def test_a_robot_not_due_holds_up_nobody_and_its_requests_keep_their_place():
    sched = make(num_blocks=100, k=5, eos_token_id=None, max_robots=2)
    sched.add_request(text('slow0', robot='slow'))
    sched.add_request(text('fast0', robot='fast'))
    sched.add_request(text('slow1', robot='slow'))
    out = sched.schedule([frame(0, robot='fast')])
    assert [d.req_id for d in out.new_requests] == ['fast0']
    assert waiting(sched) == ['slow0', 'slow1']               # in their order
    run(sched, out)
    sched.add_request(text('fast1', robot='fast'))
    out = sched.schedule(None)                                 # nobody due: nothing admitted
    assert out.new_requests == () and waiting(sched) == ['slow0', 'slow1', 'fast1']
    run(sched, out)
    out = sched.schedule([frame(1, robot='slow'), frame(2, robot='fast')])
    assert [d.req_id for d in out.new_requests] == ['slow0', 'slow1', 'fast1']   # arrival
    assert {d.req_id: d.frame_id for d in out.new_requests} == {
        'slow0': 1, 'fast1': 2, 'slow1': 1}
    run(sched, out)


def measured_cost():
    # 5 ms per image, 1 ms per prefill token, denoise 20 ms for one chunk and 30 ms for two
    # in one call, seed 1 ms per row, decode 10 ms per step at batch 1
    cost = CostModel(alpha=1.0)
    for timing in [JobTiming(V, 0.010, batch_size=2), JobTiming(P, 0.032, num_tokens=IMG),
                   JobTiming(D, 0.020), JobTiming(D, 0.030, batch_size=2),
                   JobTiming(S, 0.001, batch_size=1),
                   JobTiming(C, 0.040, batch_size=1, num_tokens=4)]:
        cost.observe(timing)
    return cost


def test_k_shrinks_for_the_tightest_deadline_and_its_frame_comes_first():
    sched = make(num_blocks=100, k=8, max_robots=2)
    sched.cost = measured_cost()
    sched.add_request(text('t', budget=30, robot='a'))
    frames = [frame(0, deadline=0.300, robot='a'), frame(1, deadline=0.200, robot='b')]
    out = sched.schedule(frames, now=0.0)
    assert out.frame_ids == (1, 0)
    assert [d.frame_id for d in out.jobs_of(D)] == [1, 0]
    # 4 images 20 ms + (2 x 37 + 4) prefill tokens 78 ms + two chunks 30 ms + seed 1 ms:
    # 129 ms of the 200 before b's deadline, 71 ms left: 7 steps of 10 ms
    assert out.tokens_per_cycle == 7
    assert out.jobs_of(C)[0].deadline == 0.200
    run(sched, out)
    # a robot not due whose tick comes sooner: its deadline counts too
    frames = [frame(2, deadline=0.300, robot='a'), frame(3, deadline=0.200, robot='b')]
    out = sched.schedule(frames, now=0.0, deadline=0.150)
    # 125 ms of action path (no new text), 25 ms left: 2 steps
    assert out.tokens_per_cycle == 2 and out.jobs_of(C)[0].deadline == 0.150
    run(sched, out)


def test_the_cost_model_keeps_denoise_times_per_number_of_chunks():
    cost = measured_cost()
    assert (cost.denoise(1), cost.denoise(2)) == (0.020, 0.030)
    assert cost.denoise(4) == pytest.approx(0.060)             # linear above the largest
    assert CostModel().denoise(2) is None
    assert cost.action_path(0, 0, 0, 0, num_chunks=0) == 0.0


def test_the_action_reserve_holds_an_action_prefix_for_every_robot():
    sched = make(num_blocks=100, max_robots=3)
    assert sched.prefix_blocks == 6                             # 5 blocks of 8 + 1 (causal)
    assert sched.action_reserve_blocks == 18
    with pytest.raises(ValueError, match=r'cannot hold 6 action prefixes \(two for each of 3 '
                                         r'robots\) of 40 tokens \(6 blocks each\)'):
        make(num_blocks=36, max_robots=3)
    # a request is refused at once if it could never fit beside every robot's action path
    with pytest.raises(ValueError, match='the pool has 63 beside the action path'):
        sched.add_request(text('never', budget=8 * 60))
    with pytest.raises(ValueError, match='max_robots must be >= 1, got 0'):
        make(max_robots=0)


def test_bad_cycles_are_refused_and_change_nothing():
    sched = make(num_blocks=100, max_robots=2)
    sched.add_request(text('t', robot='a'))
    for frames, message in [
            ([frame(0, robot='a'), frame(1, robot='a')], r"robots \['a', 'a'\]"),
            ([frame(0, robot='a'), frame(0, robot='b')], r'distinct ids, got \[0, 0\]'),
            ([frame(0, robot=r) if r == 'a' else frame(i, robot=r)
              for i, r in enumerate('abc')], 'max_robots is 2')]:
        with pytest.raises(ValueError, match=message):
            sched.schedule(frames)
    assert waiting(sched) == ['t'] and sched.kv.num_used_blocks == 0
    run(sched, sched.schedule([frame(5, robot='a')]))
    assert waiting(sched) == []


def test_isolated_serves_each_robots_frame_and_text_one_after_another():
    sched = make(policy=Policy.ISOLATED, num_blocks=200, max_robots=2)
    sched.add_request(text('b0', robot='b', budget=3))
    sched.add_request(text('a0', robot='a', budget=2))
    out = sched.schedule([frame(0, robot='a'), frame(1, robot='b')])
    # every job a private full prefix of its own (the baseline), frame by frame
    assert [j.kind for j in out.jobs] == [V, P, D, V, P, D, V, P, S, C, V, P, S, C]
    assert [j.frame_id for j in out.jobs_of(V)] == [0, 1, 1, 0]
    assert {d.req_id: d.frame_id for d in out.new_requests} == {'b0': 1, 'a0': 0}
    finished = run(sched, out)
    assert {r.req_id: r.num_output_tokens for r in finished} == {'b0': 3, 'a0': 2}
    assert sched.kv.num_used_blocks == 0


def test_a_request_the_pool_refused_keeps_room_so_a_rare_robot_is_not_starved():
    """
    A robot due every 4th cycle asks for a long text while another fills the pool each cycle.

    Without the claim the frequent robot would take every block freed before the rare one's
    next frame; with it, the frequent robot's later requests wait once they would eat the
    room the claim needs, and the rare one is admitted on one of its next frames.
    """
    sched = make(num_blocks=60, k=1, eos_token_id=None, max_robots=2, max_waiting_requests=64)
    ids = itertools.count()
    admitted_at, refused_at = {}, None
    for cycle in range(200):
        sched.add_request(text(f'fast{cycle}', robot='fast', budget=33))
        if cycle == 2:
            sched.add_request(text('long', robot='slow', budget=8 * 20 + 1))
        frames = [frame(next(ids), robot='fast')]
        if cycle % 4 == 0:
            frames.append(frame(next(ids), robot='slow'))
        out = sched.schedule(frames)
        assert len(out.jobs_of(D)) == len(frames)               # every robot's action
        admitted_at.update({d.req_id: cycle for d in out.new_requests})
        if cycle >= 4 and 'long' in waiting(sched) and refused_at is None:
            refused_at = cycle
        run(sched, out)
        assert sched.kv.num_free_blocks >= sched.action_reserve_blocks
        sched.kv.check_consistency()
        if 'long' in admitted_at:
            break
    assert refused_at == 4 and 'long' in admitted_at, 'the rare robot starved'
    # the pool was full: the long request waited for the running ones to end (33 cycles
    # at k = 1) and came in on the rare robot's next frame after
    assert admitted_at['long'] - refused_at <= 33 + 4
    # the frequent robot's requests came in as long as the pool had room
    assert [admitted_at[f'fast{i}'] for i in range(4)] == [0, 1, 2, 3]


def test_a_stale_robot_keeps_decoding_its_running_text_while_the_others_act():
    sched = make(num_blocks=100, k=2, eos_token_id=None, max_robots=2)
    sched.add_request(text('b0', robot='b', budget=7))
    run(sched, sched.schedule([frame(0, robot='a'), frame(1, robot='b')]))   # 2 tokens
    sched.add_request(text('b1', robot='b'))
    ended = {}
    for i in range(2, 6):                                       # b's input went stale
        out = sched.schedule([frame(i, robot='a')])
        assert out.frame_ids == (i,) and len(out.jobs_of(D)) == 1
        assert waiting(sched) == ['b1']                         # waits for b's next frame
        ended.update({r.req_id: i for r in run(sched, out)})
    assert ended == {'b0': 4}                                   # 2 + 2 + 2 + 1 tokens
    assert sched.requests['b1'].status is RequestStatus.WAITING


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_cycles_of_several_robots_keep_every_invariant(data):
    """
    Random robots due, random text of random robots: every invariant holds.

    Every due robot gets its action, the reserve holds, each robot's text comes in in its
    arrival order, and all of it ends.
    """
    robots = ('a', 'b', 'c')
    policy = data.draw(st.sampled_from(list(Policy)), 'policy')
    mode = data.draw(st.sampled_from(list(PrefixAttention)), 'mode')
    sched = make(policy=policy, mode=mode, num_blocks=data.draw(st.integers(40, 140), 'pool'),
                 k=data.draw(st.integers(1, 4), 'k'), eos_token_id=None, max_robots=3,
                 max_waiting_requests=64)
    arrived = {r: [] for r in robots}
    admitted = {r: [] for r in robots}
    ids, req_ids = itertools.count(), itertools.count()

    def cycle(due):
        frames = {r: frame(next(ids), robot=r) for r in due}
        out = sched.schedule(list(frames.values()))
        assert {d.frame_id for d in out.jobs_of(D)} == {f.frame_id for f in frames.values()}
        for new in out.new_requests:
            robot = sched.requests[new.req_id].robot
            assert new.frame_id == frames[robot].frame_id
            admitted[robot].append(new.req_id)
        run(sched, out)
        assert sched.kv.num_free_blocks >= sched.action_reserve_blocks
        sched.kv.check_consistency()

    for _ in range(data.draw(st.integers(1, 25), 'cycles')):
        for robot in data.draw(st.lists(st.sampled_from(robots), max_size=3), 'arrivals'):
            budget = data.draw(st.integers(1, 40), 'budget')
            req = on_root(f'r{next(req_ids)}', robot, budget) if data.draw(st.booleans()) \
                else text(f'r{next(req_ids)}', budget, SUBTASK_PROMPT, robot=robot)
            try:
                sched.add_request(req)
            except ValueError as exc:                           # could never be held
                assert 'could never be admitted' in str(exc)
                continue
            arrived[robot].append(req.req_id)
        cycle(data.draw(st.lists(st.sampled_from(robots), unique=True), 'due'))
    for robot in robots:                                        # first come first served
        assert admitted[robot] == arrived[robot][:len(admitted[robot])]
    for _ in range(1000):                                       # every robot due: all ends
        if not sched.requests:
            break
        cycle(robots)
    assert not sched.requests and sched.kv.num_used_blocks == 0
    assert admitted == arrived
