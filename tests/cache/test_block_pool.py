"""The free queue's order rules (vLLM 0.33.0 BlockPool / FreeKVCacheBlockQueue):
allocation pops the front; a freed block with a key goes to the back, one
without a key to the front; a hit on a free block takes it out of the queue."""
from __future__ import annotations

import pytest

from sim.cache.block_pool import Block, BlockPool


def _ids(blocks):
    return [b.block_id for b in blocks]


def test_fresh_pool_hands_out_blocks_in_id_order_after_the_null_block():
    pool = BlockPool(6, 4)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.free_block_ids() == [1, 2, 3, 4, 5] and pool.num_free() == 5
    assert _ids(pool.get_new_blocks(2)) == [1, 2]
    assert pool.free_block_ids() == [3, 4, 5] and pool.num_free() == 3


def test_keyed_blocks_go_to_the_back_unkeyed_to_the_front_in_order():
    pool = BlockPool(8, 4)
    a, b, c, d = pool.get_new_blocks(4)            # 1 2 3 4; queue 5 6 7
    pool.cache_full_blocks([11, 22], [a, b], [0, 1], 4, 0)   # a, b carry keys
    pool.free_blocks([d, c, b, a])                 # tail first, as a request frees
    # keyed b, a to the back in that order; unkeyed d, c to the front, keeping order
    assert pool.free_block_ids() == [4, 3, 5, 6, 7, 2, 1]
    assert pool.num_free() == 7


def test_free_blocks_each_equals_separate_calls():
    def run(together: bool) -> list[int]:
        pool = BlockPool(10, 4)
        bl = pool.get_new_blocks(6)
        pool.cache_full_blocks([10, 30, 50], bl, [0, 2, 4], 4, 0)
        lists = [[bl[1], bl[0]], [bl[3], bl[2]], [bl[5], bl[4]]]
        if together:
            pool.free_blocks_each(lists)
        else:
            for lst in lists:
                pool.free_blocks(lst)
        return pool.free_block_ids()
    assert run(True) == run(False) == [6, 4, 2, 7, 8, 9, 1, 3, 5]


def test_a_hit_takes_a_free_block_out_of_the_queue_and_eviction_drops_keys():
    pool = BlockPool(4, 4)
    a, b, c = pool.get_new_blocks(3)
    pool.cache_full_blocks([7], [a], [0], 4, 0)
    pool.free_blocks([a])
    assert pool.free_block_ids() == [1]
    assert pool.get_cached_block(7, [0]) == [a]
    pool.touch([a])                                # a hit re-references it
    assert pool.free_block_ids() == [] and a.ref_cnt == 1
    pool.free_blocks([a, b, c])                    # b, c unkeyed: front; a keyed: back
    assert pool.free_block_ids() == [2, 3, 1]
    got = pool.get_new_blocks(3)                   # reusing a evicts its key
    assert _ids(got) == [2, 3, 1] and pool.get_cached_block(7, [0]) is None
    assert pool.evicted_keys == 1
    with pytest.raises(ValueError, match="Cannot get 1 free blocks"):
        pool.get_new_blocks(1)


def test_move_keys_equals_remove_then_insert():
    """move_keys (with its one-dict-operation common case) leaves the pool as
    removing src's keys and inserting each on dst does: random keys, shared keys,
    extra (partial) keys."""
    import random

    def state(pool):
        m = {k: sorted(ids) for k, ids in pool.cached_items().items()}
        return m, [(b.key, b.key_tokens) for b in pool.blocks], \
            {b.block_id: sorted(b.extra) for b in pool.blocks if b.extra}

    rng = random.Random(4)
    for _ in range(300):
        pools = [BlockPool(12, 4), BlockPool(12, 4)]
        for p in pools:
            p.get_new_blocks(11)
        ops = []
        for _ in range(rng.randint(1, 12)):
            ops.append((rng.randint(1, 11), rng.randint(1, 6), rng.choice([4, 8, 12])))
        src, dst = rng.sample(range(1, 12), 2)
        for which, p in enumerate(pools):
            for bid, key, tokens in ops:
                p.insert_key(key << 5, p.blocks[bid], tokens)
            s, d = p.blocks[src], p.blocks[dst]
            if which == 0:
                p.move_keys(s, d)
            else:
                n = s.key_tokens
                for k in p.remove_keys(s):
                    p.insert_key(k, d, n)
        assert state(pools[0]) == state(pools[1])


def test_take_new_blocks_reuses_one_list_and_hands_out_what_get_new_blocks_would():
    """The cache managers' allocation (``take_new_blocks``: the pool's own list, its
    first n entries) pops, evicts and counts exactly as ``get_new_blocks``; the list is
    the same object each call, and what ``get_new_blocks`` returns is the caller's own."""
    def run(take: bool):
        pool = BlockPool(9, 4)
        got = []
        for n, keyed in ((3, True), (2, False), (4, True), (1, False), (5, True)):
            bl = list(pool.take_new_blocks(n)[:n]) if take else pool.get_new_blocks(n)
            got.append(_ids(bl))
            if keyed:
                pool.cache_full_blocks([100 * n + i for i in range(n)], bl,
                                       list(range(n)), 4, 0)
            pool.free_blocks(bl[::-1])
        return got, pool.free_block_ids(), pool.evicted_keys, list(pool.occupied)
    assert run(True) == run(False)
    pool = BlockPool(9, 4)
    first = pool.take_new_blocks(3)
    assert first is pool.take_new_blocks(1) and len(first) == 3   # (its entries past n stay)
    mine = pool.get_new_blocks(2)
    assert mine is not pool.fresh and len(mine) == 2
    with pytest.raises(ValueError, match="Cannot get 9 free blocks"):
        pool.take_new_blocks(9)
