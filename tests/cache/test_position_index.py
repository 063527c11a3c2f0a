"""``BlockPool.at_unit``: the keys mapped at each hash-unit position, per group, which
the Mamba state search and the partial-key walk of full attention read to pass over
positions where no key can match.

Two properties make it safe: the counts always equal a recount of the keys the blocks
hold (primary and extra keys, through caching, moving, evicting and uncaching), and a
replay whose walks may never pass over a position (every count raised far above zero)
gives the very same requests.csv rows."""
from __future__ import annotations

from pathlib import Path

import pytest
from librt.vecs import vec
from mypy_extensions import i64

from sim.cache.block_pool import GROUP_BITS, BlockPool
from sim.config.scenario import load_scenario
from sim.commands.run import simulate

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "scenarios" / "mooncake-conversation.yaml"
FLAG_ON = ROOT / "scenarios" / "athena-flag-on.yaml"
TINY = ROOT / "scenarios" / "athena-tiny.yaml"
NEVER_SKIP = 1 << 40     # a count no run takes back to zero


def recount(pool: BlockPool) -> dict[int, int]:
    """The keys mapped at each (unit, group) slot, counted from the blocks."""
    out: dict[int, int] = {}
    for b in pool.blocks:
        keyed = []
        if b.key >= 0:
            keyed.append((b.key, b.key_unit))
        if b.extra:
            keyed.extend((k, b.extra_units[k]) for k in b.extra)
        for key, unit in keyed:
            assert pool.contains(key, b.block_id)
            slot = (unit << GROUP_BITS) | (key & ((1 << GROUP_BITS) - 1))
            out[slot] = out.get(slot, 0) + 1
    return out


def counted(pool: BlockPool) -> dict[int, int]:
    ix = pool.at_unit
    return {i: ix[i] for i in range(len(ix)) if ix[i]}


def test_primary_and_extra_keys_are_counted_at_their_own_positions():
    pool = BlockPool(8, 4)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([11], [a], [0], 8, 2)           # a block of 8 tokens: unit 2
    pool.cache_partial_block(5, a, 6, 2)                    # an extra key at unit 1
    assert a.key_unit == 2 and a.extra_units == {(5 << GROUP_BITS) | 2: 1}
    assert counted(pool) == recount(pool) == {(2 << GROUP_BITS) | 2: 1,
                                              (1 << GROUP_BITS) | 2: 1}
    pool.move_keys(a, b)                                    # both keys, same positions
    assert counted(pool) == recount(pool) and b.key_unit == 2
    assert b.extra_units == {(5 << GROUP_BITS) | 2: 1}
    pool.uncache(b)
    assert counted(pool) == recount(pool) == {}


def test_an_eviction_takes_its_key_off_the_count():
    pool = BlockPool(3, 4)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([7, 9], [a, b], [0, 1], 4, 0)
    pool.free_blocks([b, a])
    assert counted(pool) == recount(pool) == {(1 << GROUP_BITS): 1, (2 << GROUP_BITS): 1}
    pool.get_new_blocks(1)                                  # reuses b: its key goes
    assert counted(pool) == recount(pool) == {(1 << GROUP_BITS): 1}


@pytest.mark.parametrize("scenario,sets", [
    (MOONCAKE, {"workload.num_requests": 400}),
    (FLAG_ON, {"workload.num_requests": 300}),
    (TINY, {"cache.policy": "marconi"}),
])
def test_counts_match_the_blocks_after_a_replay(scenario, sets):
    pools = []
    simulate(load_scenario(scenario, sets), prepare=lambda dep, s, e: pools.append(dep.kv.pool))
    pool = pools[0]
    assert counted(pool) == recount(pool)
    assert recount(pool)           # (the replay left keys in the pool)


@pytest.mark.parametrize("scenario,sets", [
    (MOONCAKE, {"workload.num_requests": 400}),
    (FLAG_ON, {"workload.num_requests": 300}),
])
def test_walks_that_pass_over_positions_find_what_full_walks_find(scenario, sets):
    def rows(never_skip: bool):
        def prepare(dep, sched, eng):
            if never_skip:
                dep.kv.pool.at_unit = vec[i64]([NEVER_SKIP] * (1 << 18))
        sc = load_scenario(scenario, sets)
        _, got, summary = simulate(sc, prepare=prepare)
        return list(got), summary["token_hit_rate"]
    fast, slow = rows(False), rows(True)
    assert fast == slow
    assert fast[1] > 0             # (hits were found: the walks had work to do)
