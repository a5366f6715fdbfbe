"""KV block pool and manager: exact slot / reference-count accounting, sharing, exhaustion."""

import random

from hypothesis import given, settings, strategies as st
from oxygen_ros.kv.block_pool import BlockPool, NULL_BLOCK_ID
from oxygen_ros.kv.manager import KVCacheManager, SegmentSpec
import pytest


def test_pool_allocates_in_order_and_refuses_when_short():
    pool = BlockPool(5)
    assert pool.num_free_blocks == 4
    assert pool.allocate(3) == [1, 2, 3]
    assert pool.allocate(2) is None          # only block 4 is left: nothing taken
    assert pool.num_free_blocks == 1
    assert pool.free([2]) == 1
    assert pool.allocate(2) == [4, 2]        # freed blocks are reused last
    assert pool.peak_used_blocks == 4
    pool.check_consistency()


def test_pool_never_hands_out_the_null_block():
    pool = BlockPool(3)
    assert NULL_BLOCK_ID not in pool.allocate(2)
    with pytest.raises(ValueError, match='at least 2 blocks'):
        BlockPool(1)


def test_shared_segment_lives_until_last_holder_frees():
    kv = KVCacheManager(num_blocks=11, block_size=4)
    image = SegmentSpec(('img', 7), 8)                 # 2 blocks
    a = kv.allocate('action', [image, SegmentSpec(('txt', 7, 'act'), 5)])  # +2 blocks
    b = kv.allocate('subtask', [image, SegmentSpec(('txt', 7, 'sub'), 3)], 6)  # +1 +2 blocks
    assert a.segments[0] is b.segments[0]
    assert [s.seg_id for s in a.new_segments] == [0, 1]
    assert [s.seg_id for s in b.new_segments] == [2]   # the image segment was a hit
    assert a.segments[0].block_ids == (1, 2) and a.segments[1].block_ids == (3, 4)
    assert b.segments[1].block_ids == (5,) and b.block_ids == (6, 7)
    assert a.segments[0].ref_cnt == 2
    assert kv.num_used_blocks == 7 and kv.num_free_blocks == 3
    assert b.num_prefix_tokens == 11
    freed = kv.free('action')
    assert [s.key for s in freed] == [('txt', 7, 'act')]   # image still read by the subtask
    assert kv.lookup(('img', 7)).ref_cnt == 1
    assert kv.num_used_blocks == 5
    freed = kv.free('subtask')
    assert [s.key for s in freed] == [('txt', 7, 'sub'), ('img', 7)]
    assert kv.num_used_blocks == 0 and kv.num_segments == 0
    kv.check_consistency()


def test_full_pool_refuses_without_side_effects_and_keep_free_is_honoured():
    kv = KVCacheManager(num_blocks=6, block_size=4)      # 5 usable blocks
    assert kv.allocate('r1', [SegmentSpec('p1', 8)], 4) is not None   # 3 blocks
    assert kv.allocate('r2', [SegmentSpec('p2', 8)], 1, keep_free=0) is None  # needs 3 > 2
    assert kv.lookup('p2') is None and kv.num_free_blocks == 2
    assert kv.allocate('r2', [SegmentSpec('p2', 4)], 0, keep_free=2) is None  # would leave 1
    assert kv.allocate('r2', [SegmentSpec('p2', 4)], 0, keep_free=1) is not None
    kv.check_consistency()


def test_contradicting_chains_and_double_owners_are_errors():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    kv.allocate('a', [SegmentSpec('img', 4), SegmentSpec('txt', 2)])
    with pytest.raises(ValueError, match="'img' exists with 4 tokens"):
        kv.allocate('b', [SegmentSpec('img', 5)])
    with pytest.raises(ValueError, match="'txt' exists with 2 tokens after 'img'"):
        kv.allocate('b', [SegmentSpec('other', 4), SegmentSpec('txt', 2)])
    with pytest.raises(ValueError, match="owner 'a' already holds"):
        kv.allocate('a', [SegmentSpec('x', 1)])
    with pytest.raises(KeyError):
        kv.free('nobody')
    kv.check_consistency()


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_no_leak_after_1000_random_cycles(seed):
    rng = random.Random(seed)
    kv = KVCacheManager(num_blocks=64, block_size=8)
    live: list[str] = []
    for cycle in range(1000):
        frame = rng.randrange(8)
        if live and rng.random() < 0.45:
            kv.free(live.pop(rng.randrange(len(live))))
        else:
            chain = [SegmentSpec(('img', frame), 16)]
            if rng.random() < 0.7:
                prompt = rng.randrange(3)
                chain.append(SegmentSpec(('txt', frame, prompt), 3 + prompt))
            alloc = kv.allocate(f'r{cycle}', chain, rng.randrange(0, 30),
                                keep_free=rng.randrange(0, 4))
            if alloc is not None:
                live.append(f'r{cycle}')
        kv.check_consistency()
    for owner in live:
        kv.free(owner)
    assert kv.num_used_blocks == 0 and kv.num_segments == 0 and kv.num_owners == 0
    kv.check_consistency()
