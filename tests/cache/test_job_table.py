"""JobTable (the CPU tier's jobs in flight by id) against a dict: ids handed out in
order, completed in any order, looked up before, during and after; its list is trimmed
as the oldest complete, so a long run does not keep every id."""
from __future__ import annotations

import random

from librt.vecs import vec
from mypy_extensions import i64

from sim.cache.hashing import PrefixHasher
from sim.cache.offload_jobs import Job, JobTable, ReqOffload
from sim.cache.request import CacheRequest

_RS = ReqOffload(CacheRequest("r", [(1, 0, 16)], PrefixHasher(16)), 1, 1)


def _Job(jid: int) -> Job:
    return Job(jid, _RS, vec[i64](), True)


def test_job_table_equals_a_dict():
    rng = random.Random(3)
    for trial in range(30):
        t = JobTable()
        model: dict[int, object] = {}
        next_id = 0
        for step in range(3000):
            if rng.random() < 0.5 or not model:
                job = _Job(next_id)
                t.add(job)
                model[next_id] = job
                next_id += 1
            else:
                # (mostly the oldest, as transfers complete; sometimes any)
                jid = min(model) if rng.random() < 0.7 else rng.choice(list(model))
                t.remove(jid)
                del model[jid]
            assert len(t) == len(model)
            for jid in rng.sample(range(-2, next_id + 3), 5):
                assert t.get(jid) is model.get(jid)
        assert len(t.slots) <= max(128, 2 * (next_id - min(model, default=next_id)) + 1)
