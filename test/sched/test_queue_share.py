"""
The waiting queue shared by several robots: each its guaranteed places, no eviction.

Each robot is guaranteed ``floor(max_waiting_requests / robots)`` places (at least 1); a robot
beyond its guarantee takes a free place only while the other robots' unused guaranteed places
stay free (``docs/design.md#several-robots``). One robot: the whole queue, today's refusal.
"""

import itertools

from hypothesis import given, settings, strategies as st
from oxygen_ros.sched.request_queue import queue_share, QueueFullError, RequestQueue
import pytest
from sched_plans import frame, make, run, text

LR = ('left', 'right')
FRAME_IDS = itertools.count()


def flood(sched, robot, robots, start=0):
    """Add requests of ``robot`` until one is refused; return the ids accepted and the refusal."""
    accepted = []
    for i in range(start, start + 100):
        try:
            sched.add_request(text(f'{robot}{i}', robot=robot), robots)
        except QueueFullError as exc:
            return accepted, str(exc)
        accepted.append(f'{robot}{i}')
    raise AssertionError('never refused')


def refusal(robot, waiting, own, kept, limit):
    return (f'queue full for robot {robot!r} ({waiting} requests waiting, {own} of them its '
            f'own; {kept} places kept for the other robots, max_waiting_requests {limit})')


def admit_all(sched, robot):
    """Admit every waiting request of ``robot`` onto one frame of it, and decode them out."""
    out = sched.schedule(frame(next(FRAME_IDS), robot=robot))
    assert not [r for r in sched.waiting if r.robot == robot]
    run(sched, out)
    for _ in range(20):
        if not sched.running:
            return
        run(sched, sched.schedule(None))
    raise AssertionError('never finished')


def test_queue_share_is_the_floor_of_the_bound_over_the_robots_at_least_one():
    assert [queue_share(16, n) for n in (1, 2, 3, 4, 5, 16, 17)] == [16, 8, 5, 4, 3, 1, 1]


def test_two_robots_a_flooder_stops_at_its_share_and_the_other_gets_its_own():
    sched = make(num_blocks=200, max_robots=2, max_waiting_requests=5)   # 2 each, 1 spare
    lefts, refused = flood(sched, 'left', LR)
    assert lefts == ['left0', 'left1', 'left2'] and refused == refusal('left', 3, 3, 2, 5)
    rights, refused = flood(sched, 'right', LR)
    assert rights == ['right0', 'right1']                       # its whole guarantee
    assert refused == refusal('right', 5, 2, 0, 5)             # nothing is free
    assert sched.num_waiting == 5 and 'right2' not in sched.requests
    admit_all(sched, 'right')                 # right's requests end; left's still wait
    assert [r.req_id for r in sched.waiting] == lefts
    assert flood(sched, 'left', LR, 10) == ([], refusal('left', 3, 3, 2, 5))   # kept for right
    admit_all(sched, 'left')
    assert flood(sched, 'left', LR, 20) == (['left20', 'left21', 'left22'],
                                            refusal('left', 3, 3, 2, 5))     # fills again
    sched.abort_request('left20')             # a cancel frees a place of left's own
    assert flood(sched, 'left', LR, 30)[0] == ['left30']


def test_three_robots_keep_a_share_each_and_a_lone_robot_takes_the_spare():
    robots = ('a', 'b', 'c')
    sched = make(num_blocks=300, max_robots=3, max_waiting_requests=16)   # 5 each, 1 spare
    a, refused = flood(sched, 'a', robots)
    assert len(a) == 6 and refused == refusal('a', 6, 6, 10, 16)
    b, refused = flood(sched, 'b', robots)
    assert len(b) == 5 and refused == refusal('b', 11, 5, 5, 16)   # the spare is a's
    c, refused = flood(sched, 'c', robots)
    assert len(c) == 5 and refused == refusal('c', 16, 5, 0, 16)
    admit_all(sched, 'b')
    assert flood(sched, 'a', robots, 10) == ([], refusal('a', 11, 6, 5, 16))
    assert flood(sched, 'c', robots, 10) == ([], refusal('c', 11, 5, 5, 16))
    # the share follows the robots: without c (its requests gone), 8 each
    for req_id in c:
        sched.abort_request(req_id)
    assert flood(sched, 'a', ('a', 'b'), 20) == (['a20', 'a21'], refusal('a', 8, 8, 8, 16))


def test_one_robot_is_refused_as_always_and_a_robot_must_share_the_queue():
    for robots in (None, ('',), ('left',)):
        sched = make(max_waiting_requests=2)
        robot = '' if robots is None else robots[0]
        assert len(flood(sched, robot, robots)[0]) == 2
        with pytest.raises(QueueFullError) as refused:
            sched.check_room(robot, robots)
        assert str(refused.value) == 'queue full (2 requests waiting, max_waiting_requests 2)'
        assert (refused.value.num_waiting, refused.value.limit, refused.value.robot) == \
            (2, 2, None)
    sched = make(max_waiting_requests=2)
    with pytest.raises(ValueError, match=r"robot 'top' does not share this queue "
                       r"\(robots: \['left', 'right'\]\)"):
        sched.add_request(text('t', robot='top'), LR)
    assert sched.num_waiting == 0 and 't' not in sched.requests


def test_a_robot_added_to_a_full_queue_waits_for_a_place_nobody_is_evicted():
    sched = make(num_blocks=300, max_robots=2, max_waiting_requests=4)
    lefts, refused = flood(sched, 'left', ('left',))            # alone: the whole queue
    assert len(lefts) == 4 and refused == 'queue full (4 requests waiting, ' \
        'max_waiting_requests 4)'
    assert flood(sched, 'right', LR) == ([], refusal('right', 4, 0, 0, 4))
    sched.abort_request(lefts[0])
    assert flood(sched, 'left', LR, 10) == ([], refusal('left', 3, 3, 2, 4))
    assert flood(sched, 'right', LR)[0] == ['right0']           # the place is right's


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_a_robot_within_its_share_is_never_refused(data):
    """
    Random adds and removals of 2-4 robots, a bound of one place each or more.

    A request of a robot within its share is accepted, one beyond it exactly while the
    others' unused guaranteed places stay free, and those places plus the waiting requests
    never exceed the bound.
    """
    robots = ('a', 'b', 'c', 'd')[:data.draw(st.integers(2, 4), 'robots')]
    limit = data.draw(st.integers(len(robots), 20), 'limit')
    share, queue, ids = queue_share(limit, len(robots)), RequestQueue(), iter(range(10**6))
    for _ in range(data.draw(st.integers(1, 80), 'steps')):
        waiting = list(queue)
        if waiting and data.draw(st.booleans(), 'remove'):
            queue.remove(data.draw(st.sampled_from(waiting), 'which'))
            continue
        robot = data.draw(st.sampled_from(robots), 'robot')
        own = sum(r.robot == robot for r in waiting)
        kept = sum(max(0, share - sum(r.robot == o for r in waiting))
                   for o in robots if o != robot)
        try:
            queue.add(text(f'r{next(ids)}', robot=robot), limit, robots)
        except QueueFullError as exc:
            assert own >= share and len(waiting) + 1 + kept > limit
            assert (exc.robot, exc.num_own, exc.num_kept) == (robot, own, kept)
        else:
            assert own < share or len(waiting) + 1 + kept <= limit
        assert len(queue) + sum(max(0, share - sum(r.robot == o for r in queue))
                                for o in robots) <= limit
