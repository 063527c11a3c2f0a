"""How much prefix keying and lookup a long shared prefix costs.

A 100,000-token prompt = 99,000-token shared system prompt + 1,000 private
tokens, hash unit 64 (1,562 units).  Keys are computed on demand
(sim/cache/hashing.py): building a request's keys costs one key per *run* (2
here), and each key the cache asks for costs one more.  Then the same
requests through the full cache model (lookup + prefill + free) on a
Nemotron-style layout.

    python bench/hash_bench.py [--requests 2000]
"""
from __future__ import annotations

import argparse
import time

from sim.cache.config import CacheConfig
from sim.cache.hashing import PrefixHasher
from sim.cache.kv_manager import KVCacheManager
from sim.cache.case import CaseSchedule, prefill


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--unit", type=int, default=64)
    args = ap.parse_args()
    unit, n_req = args.unit, args.requests
    SYS, shared, private = 1, 99_000, 1_000

    def runs(i):
        return [(SYS, 0, shared), (100 + i, 0, private)]

    hasher = PrefixHasher(unit)
    t0 = time.perf_counter()
    for i in range(n_req):
        keys = hasher.keys_of(runs(i))
    t_build = (time.perf_counter() - t0) / n_req
    t0 = time.perf_counter()
    for i in range(n_req):
        all_keys = hasher.keys_of(runs(i)).keys()
    t_all = (time.perf_counter() - t0) / n_req
    first = hasher.keys_of(runs(0)).keys()
    assert all_keys[: shared // unit] == first[: shared // unit] and all_keys[-1] != first[-1]
    print(f"prompt {shared + private:,} tokens, unit {unit}: {keys.count:,} keys")
    print(f"  build a request's keys : {t_build * 1e6:8.2f} us  (one key per run)")
    print(f"  every key, in order    : {t_all * 1e3:8.3f} ms  "
          f"({t_all / len(all_keys) * 1e6:.2f} us/key; the cache asks for far fewer)")

    cfg = CacheConfig(groups=("full", "mamba"), block_size=4416, hash_block_size=unit,
                      eagle=True, num_blocks=400, prefix_cache_retention_interval=0,
                      max_model_len=1 << 20)   # (the default 65,536 would reject the prompt)
    mgr = KVCacheManager(cfg)
    sched = CaseSchedule("scheduler", 0, 8192)
    t0 = time.perf_counter()
    hits = 0
    for i in range(n_req):
        req = mgr.make_request(f"r{i}", runs(i))
        lk = mgr.get_computed_blocks(req)
        hits += lk.hit
        prefill(mgr, req, lk, sched)
        mgr.free(req)
        mgr.new_step_starts()
    dt = time.perf_counter() - t0
    print("full cache model (hash + lookup + chunked prefill + free), A/M block 4416, "
          "retention 0, EAGLE drop:")
    print(f"  {n_req / dt:,.0f} requests/s, {dt / n_req * 1e3:.3f} ms per request, "
          f"mean hit {hits / n_req:,.0f} tokens")


if __name__ == "__main__":
    main()
