"""The host pool's LRU (``sim/cache/offload_pool.LRUPolicy``: a list linked through the
slots in finish-rank order, a waiting list of running requests' ranks released into a heap
only when an eviction could take one) against brute force: through random stores, completions, loads and finishes of
many interleaved requests, every eviction takes exactly the least-ranked evictable keys
not offered in that call."""
from __future__ import annotations

import random

import pytest
from librt.vecs import vec
from mypy_extensions import i64

from sim.cache.block_pool import GROUP_BITS
from sim.cache.offload_pool import AccessState, HostPool


def expected_evictions(pool: HostPool, keys: list[int], ends: list[int]) -> list[int] | None:
    """The keys an offer of ``keys`` must evict: the least-ranked evictable keys not
    offered, as many as the new keys do not fit (None: too few)."""
    lru = pool.lru
    assert lru is not None
    new = [k for k in dict.fromkeys(keys) if pool.ref_of(k) == -2]
    need = len(new) - (pool.num_chunks - pool.used)
    if need <= 0 or not new:
        return []
    offered = set(keys)
    cands = sorted((lru.rank[s], pool.skey[s]) for s in range(len(pool.skey))
                   if pool.skey[s] >= 0 and lru.ev[s] and pool.skey[s] not in offered)
    if len(cands) < need:
        return None
    return sorted(k for _, k in cands[:need])


@pytest.mark.parametrize("seed", range(6))
def test_evictions_take_the_least_ranked(seed):
    rng = random.Random(seed)
    pool = HostPool(24, "lru")
    running: dict[int, AccessState] = {}
    # (each request's prompt: its branch at each position of a shared tree -- one prefix
    # key a position, as a real prompt has)
    branch: dict[int, list[int]] = {}
    pending: list[list[int]] = []        # store jobs in flight (their keys)
    loads: list[list[int]] = []
    nreq = 0
    evictions = 0
    for _step in range(1500):
        op = rng.random()
        if op < 0.15 or not running:
            running[nreq] = AccessState()
            branch[nreq] = [rng.randrange(2) for _ in range(10)]
            nreq += 1
        rid = rng.choice(list(running))
        st = running[rid]
        if op < 0.55:
            # a sweep or a boundary store: a few prefix positions of a shared tree
            base = rng.randrange(6)
            n = rng.randint(1, 4)
            keys, ends = [], []
            for i in range(n):
                pos = (base + i + 1) * 16
                pk = 1000 + (base + i) * 7 + branch[rid][base + i]     # two branches
                keys.append((pk << GROUP_BITS) | rng.randrange(2))
                ends.append(pos)
            want = expected_evictions(pool, keys, ends)
            ok = pool.offer(vec[i64](keys), vec[i64](ends), st)
            if want is None:
                assert not ok
                continue
            assert ok
            assert sorted(pool.evicted_now) == want
            evictions += len(want)
            if len(pool.offered):
                pending.append(list(pool.offered))
        elif op < 0.75 and pending:
            pool.complete_store(vec[i64](pending.pop(rng.randrange(len(pending)))))
        elif op < 0.82:
            ready = [pool.skey[s] for s in range(len(pool.skey))
                     if pool.skey[s] >= 0 and pool.sref[s] >= 0]
            mine = {(1000 + i * 7 + b) for i, b in enumerate(branch[rid])}
            ready = [k for k in ready if k >> GROUP_BITS in mine]
            if ready:
                ks = rng.sample(ready, min(2, len(ready)))
                # (the key's end token: its prefix position, as the connector gives it)
                ends = [pool.spos[pool.index.only(k)] for k in ks]
                pool.prepare_load(vec[i64](ks), st, vec[i64](ends))
                loads.append(ks)
        elif op < 0.88 and loads:
            pool.complete_load(vec[i64](loads.pop(0)))
        else:
            pool.request_finished(running.pop(rid))
    assert evictions > 100      # (the pool was under pressure)


def test_a_finish_skips_a_key_evicted_since_it_was_observed():
    """A request's finish re-ranks the keys it observed that are still resident: one
    evicted since (its slot now another key's) is skipped, and the key now in its slot
    keeps its rank."""
    pool = HostPool(2, "lru")
    a, b, c = AccessState(), AccessState(), AccessState()
    k1, k2, k3, k4 = ((pk << GROUP_BITS) for pk in (11, 12, 13, 14))

    def store(st, key, end):
        assert pool.offer(vec[i64]([key]), vec[i64]([end]), st)
        pool.complete_store(vec[i64]([key]))

    store(a, k1, 16)
    store(b, k2, 16)
    store(b, k3, 32)               # (evicts k1, a's; k3 takes its slot)
    assert list(pool.evicted_now) == [k1]
    pool.request_finished(a)       # (k1 is gone: k3, in its old slot, keeps b's rank)
    store(c, k4, 16)
    assert list(pool.evicted_now) == [k3]     # (b's deeper key is its older)
