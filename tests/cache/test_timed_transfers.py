"""The CPU tier's timed transfers (``TimedTransfers``): stores wait for the next step's
start, then cross the GPU -> host link one after the other in the order submitted; a
store flushed while it waits crosses at once, and the step's forward waits for it."""
from __future__ import annotations

from librt.vecs import vec
from mypy_extensions import i64

from sim.cache.hashing import PrefixHasher
from sim.cache.offload_jobs import Job, ReqOffload, TimedTransfers
from sim.cache.request import CacheRequest


def _jobs(n: int) -> list[Job]:
    rs = ReqOffload(CacheRequest("r", [(1, 0, 64)], PrefixHasher(16)), 1, 1, False)
    return [Job(j, rs, vec[i64]([j]), True) for j in range(n)]


def test_stores_start_with_the_next_step_in_order():
    w = TimedTransfers(1e9, 1e9)            # (1 byte a ns each way)
    a, b, c = _jobs(3)
    for job in (a, b, c):
        w.store(job, 100, 0)
    assert w.waiting_to_start() and a.seen == -1
    n = w.start_step(1000)
    assert n == 3 and w.started[:n] == [a, b, c]
    assert (a.due, b.due, c.due) == (1100, 1200, 1300)
    assert not w.waiting_to_start() and w.start_step(2000) == 0


def test_a_waiting_store_flushed_crosses_at_once_the_rest_keep_their_order():
    w = TimedTransfers(1e9, 1e9)
    a, b, c, d = _jobs(4)
    for job in (a, b, c, d):
        w.store(job, 100, 0)
    w.flush(c, 500)                          # (waiting: submitted now, the step waits)
    assert c.due == c.seen == 600 and w.stall_ns() == 100
    n = w.start_step(1000)
    assert n == 3 and w.started[:n] == [a, b, d]
    assert (a.due, b.due, d.due) == (1100, 1200, 1300)
    w.flush(b, 1050)                         # (already crossing: only waited for)
    assert b.due == 1200 and w.stall_ns() == 150
