"""The lookup's own record of full attention's hit alone equals a separate
per-group lookup (the scheduler uses it for ``attention_hit_tokens``)."""
from __future__ import annotations

import random

import pytest

from sim.cache.case import CaseSchedule, prefill
from sim.cache.config import CacheConfig
from sim.cache.kv_manager import KVCacheManager


@pytest.mark.parametrize("groups,eagle,lookahead", [
    (("full", "mamba"), True, 0),
    (("full", "mamba", "mamba", "mamba"), False, 0),
    (("full", "full", "mamba"), True, 3),
    (("full", "swa:64", "mamba"), True, 0),
    (("full",), True, 0),                 # unitary: not recorded, the scheduler recomputes
])
def test_full_alone_equals_per_group_hits(groups, eagle, lookahead):
    rng = random.Random(len(groups) * 10 + lookahead)
    cfg = CacheConfig(groups=groups, block_size=64, hash_block_size=None if len(groups) == 1 else 16, eagle=eagle,
                      num_blocks=60, num_hash_lookahead_tokens=lookahead,
                      prefix_cache_retention_interval=0)
    mgr = KVCacheManager(cfg)
    sched = CaseSchedule("scheduler", 0, 96)
    seen = 0
    for i in range(150):
        runs = [(rng.randint(1, 3), 0, rng.randint(1, 400)), (100 + i, 0, rng.randint(1, 120))]
        req = mgr.make_request(f"r{i}", runs)
        lk = mgr.get_computed_blocks(req)
        per = mgr.per_group_hits(req, kinds=("full",))
        alone = max(h for h, sp in zip(per, mgr.coordinator.specs) if sp.kind == "full")
        if len(groups) == 1:
            assert lk.full_alone == -1
        else:
            assert lk.full_alone == alone
            seen += alone > 0
        prefill(mgr, req, lk, sched)
        mgr.free(req)
        mgr.new_step_starts()
    assert len(groups) == 1 or seen > 20
