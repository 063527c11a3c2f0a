"""A request's CPU-tier state reused for a new request (``ReqOffload.reuse``, the
connector keeping a few states done with) is as a new one: every field a new state has, with
its value, and none of the old request's keys, jobs, tables or recency."""
from __future__ import annotations

import pytest
from librt.vecs import vec
from mypy_extensions import i64

from sim.cache.block_pool import Block
from sim.cache.hashing import PrefixHasher
from sim.cache.offload_jobs import Job, ReqOffload
from sim.cache.offload_pool import SCAN_KEYS
from sim.cache.request import CacheRequest

FIELDS = ("pk", "pk0", "tables", "next_stored", "hit_end", "num_local", "jobs", "tail", "loaded",
          "finished", "signaled", "loading", "swept", "fresh", "step_tokens", "sched_step", "listed",
          "seen_keys", "seen_pos", "n_seen", "seen", "inserted", "reused", "store_misses", "applied",
          "lru_rank", "pos")


def state(rs: ReqOffload) -> dict:
    out = {}
    for f in FIELDS:
        v = getattr(rs, f)
        if f == "pk":
            v = [list(x) for x in v]
        elif f in ("pk0", "jobs", "next_stored", "hit_end"):
            v = list(v)
        elif f in ("seen_keys", "seen_pos"):     # (buffers kept: their first n_seen)
            v = list(v)[:rs.n_seen]
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
    old.set_keys(0, vec[i64]([5, 6, 7]))
    old.set_keys(1, vec[i64]([9]))
    assert list(old.keys_of(0)) == [5, 6, 7] and list(old.keys_of(1)) == [9]
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
    old.listed = True
    for k in range(SCAN_KEYS + 4):           # (past the linear search: a hash set made)
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
    assert list(old.keys_of(0)) == [] and list(old.keys_of(1)) == []
    assert old.observe(100, 16)              # (the old request's keys are not seen)


JOB_FIELDS = ("jid", "rs", "rid", "keys", "store", "fenced", "deferred", "chunks", "blocks",
              "due", "seen", "nbytes", "groups")


def test_a_reused_job_is_as_new():
    """A completed transfer job the connector keeps (``Job.reuse``) is, for its next
    job, what a new ``Job`` is: none of the old job's blocks, times, bytes or log."""
    hasher = PrefixHasher(16)
    rs_old = ReqOffload(CacheRequest("old", [(1, 0, 64)], hasher), 2, 1, False)
    rs_new = ReqOffload(CacheRequest("new", [(2, 0, 64)], hasher), 2, 1, False)
    job = Job(3, rs_old, vec[i64]([1, 2, 3]), True)
    job.fenced = vec[i64]([7, 8])
    job.deferred = vec[i64]([9])
    job.blocks = 5
    job.due = job.seen = 40
    job.nbytes = 1 << 20
    job.groups = {"0": {"chunks": 3}}
    keys = vec[i64]([11])
    job.reuse(8, rs_new, keys, False)
    fresh = Job(8, rs_new, keys, False)

    def fields(j):
        return {f: (list(v) if f in ("keys", "fenced", "deferred") else v)
                for f in JOB_FIELDS for v in [getattr(j, f)]}
    assert fields(job) == fields(fresh)
