"""A request's CPU-tier state reused for a new request (``ReqOffload.reuse``, the
connector keeping a few states done with) is as a new one: every field a new state has, with
its value, and none of the old request's keys, jobs, tables or recency."""
from __future__ import annotations

import pytest
from librt.vecs import vec
from mypy_extensions import i64

from sim.cache.block_pool import Block
from sim.cache.hashing import PrefixHasher
from sim.cache.offload_jobs import ReqOffload
from sim.cache.request import CacheRequest

FIELDS = ("pk", "tables", "next_stored", "hit_end", "num_local", "jobs", "tail", "loaded",
          "finished", "signaled", "loading", "swept", "fresh", "step_tokens", "sched_step",
          "seen_keys", "seen_pos", "seen", "inserted", "reused", "store_misses", "applied",
          "lru_rank", "pos")


def state(rs: ReqOffload) -> dict:
    out = {}
    for f in FIELDS:
        v = getattr(rs, f)
        if f == "pk":
            v = [list(x) for x in v]
        elif f in ("jobs", "seen_keys", "seen_pos"):
            v = list(v)
        elif f == "tables":
            v = [list(t) for t in v]
        elif isinstance(v, (list, set)):
            v = type(v)(v)
        out[f] = v
    return out


@pytest.mark.parametrize("arc", [False, True])
def test_a_reused_state_is_as_new(arc):
    hasher = PrefixHasher(16)
    old = ReqOffload(CacheRequest("old", [(1, 0, 64)], hasher), 3, 2, arc)
    # (the old request's life: keys, tables, jobs, observations, recency, flags)
    old.pk[0] = vec[i64]([5, 6, 7])
    old.pk[1] = vec[i64]([9])
    old.tables[1] = [Block(3), Block(4)]
    old.next_stored[0] = 2
    old.hit_end[2] = 1
    old.num_local = 32
    old.add_job(7)
    old.tail = 48
    old.loaded = old.finished = old.signaled = old.loading = True
    old.swept = old.fresh = True
    old.step_tokens = 16
    old.sched_step = 4
    for k in range(20):                      # (past the linear search: a hash set made)
        old.observe(100 + k, 16 * (k + 1))
    assert old.seen is not None
    if arc:                                  # (an LRU pool's sets are shared, empty)
        old.inserted.add(100)
    old.applied = True
    old.lru_rank = 3
    old.set_pos(1, 16)
    new_req = CacheRequest("new", [(2, 0, 64)], hasher)
    old.reuse(new_req, arc)
    fresh = ReqOffload(CacheRequest("new", [(2, 0, 64)], hasher), 3, 2, arc)
    assert old.req is new_req
    assert state(old) == state(fresh)
    assert old.observe(100, 16)              # (the old request's keys are not seen)
