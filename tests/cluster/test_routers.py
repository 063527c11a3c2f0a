"""Each router reproduces its upstream rule on hand-built cases (one test per rule), and
the hybrid-aware router predicts what replicas then reuse.

The hand-built cases give a router made-up loads and cache views (what each replica holds
of the prompt) and check the replica it names: thresholds, the balance trigger, cost ties,
temperature 0, the scorers' sums.  The end-to-end cases run fleets: ``hybrid_aware`` with
``view: oracle`` predicts exactly the hit each request then gets when nothing changes
between its arrival and its admission; with ``view: events`` (lag 0) it predicts what the
replica's own manager would have answered at the arrival on every request of athena and
of a Mooncake slice; on the athena fleet the attention-only precise router (``kv_router``,
``view: events``) over-predicts and ``hybrid_aware`` reuses at least as much.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from librt.vecs import vec
from mypy_extensions import i64

from sim.cache.config import CacheConfig
from sim.cache.kv_manager import KVCacheManager
from sim.cache.prompt import StreamRegistry
from sim.cluster.routers import ROUTERS
from sim.cluster.routers.base import RouteRequest
from sim.cluster.routers.selection import pick_by_cost
from sim.cluster.views import Prompt
from sim.config.scenario import load_scenario
from sim.commands.run import simulate, write_run


def fv(costs: list[float]):
    """Costs as the cost model hands them over (``ActiveSequences.costs``: a vec)."""
    return vec[float](costs)


ROOT = Path(__file__).resolve().parents[2]
ATHENA_FLEET = ROOT / "scenarios" / "cluster" / "athena-fleet.yaml"
MOONCAKE_FLEET = ROOT / "scenarios" / "cluster" / "mooncake-fleet.yaml"
BS = 16


@dataclass
class Load:
    outstanding: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    outstanding_tokens: int = 0


@dataclass
class View:
    hits: list[int]                         # hybrid hit per replica (tokens)
    blocks: list[int]                       # attention blocks per replica
    sizes: list[int] = field(default_factory=list)
    index = None                            # (no compiled answers: the methods below)

    def advance(self, now):
        pass

    def hybrid_hit(self, i, prompt, keys=None):
        return self.hits[i]

    def attention_blocks(self, i, prompt):
        return self.blocks[i]

    def attention_each(self, prompt, blocks=None):
        return vec[i64](self.blocks)

    def overlaps(self, now, prompt, blocks=None):
        return self.attention_each(prompt, blocks)

    def size(self, i):
        return self.sizes[i] if self.sizes else 0


class _Dep:
    def __init__(self, kv):
        self.kv = kv


class _Rep:
    def __init__(self, kv):
        self.dep = _Dep(kv)


class Fleet:
    def __init__(self, loads, view=None):
        kv = KVCacheManager(CacheConfig(groups=("full", "mamba"), block_size=BS,
                                        hash_block_size=BS, num_blocks=64))
        self.replicas = [_Rep(kv) for _ in loads]
        self.loads = loads
        self._view = view
        self.streams = StreamRegistry()

    def view(self, name, lag_ms=0.0):
        return self._view


@dataclass
class _Trace:
    segments: list
    prompt_tokens: int


def _req(fleet, tokens=160, t=0, stream="p"):
    segs = [(stream, 0, tokens)]
    r = RouteRequest("r", None, segs, tokens, 10, t, 0)
    r.prompt = Prompt(_Trace(segs, tokens), fleet.streams)
    return r


def _router(name, fleet, seed=0, **opts):
    pol = ROUTERS[name]
    return pol.build(pol.options(**opts), seed, fleet)


# ------------------------------------------------------------------ cache_aware (SGLang)

def test_cache_aware_balance_trigger_needs_both_thresholds():
    # gateway: abs 64, rel 1.5 -- 100 vs 30: imbalanced, the least loaded wins
    f = Fleet([Load(outstanding=100), Load(outstanding=30), Load(outstanding=31)])
    assert _router("cache_aware", f).choose(_req(f)) == 1
    # a difference of exactly 64 is not > 64: balanced, no match, least loaded fallback
    f = Fleet([Load(outstanding=96), Load(outstanding=33), Load(outstanding=32)])
    r = _router("cache_aware", f)
    assert r.choose(_req(f)) == 2
    # 2024 router: rel 1.0001 and abs 32 -- 40 vs 5 imbalanced
    f = Fleet([Load(outstanding=40), Load(outstanding=5)])
    assert _router("cache_aware", f, preset="sglang-router-2024").choose(_req(f)) == 1


def test_cache_aware_match_above_threshold_wins_else_fallback():
    f = Fleet([Load(), Load(), Load(outstanding=1)])
    r = _router("cache_aware", f, preset="sglang-router-2024")   # threshold 0.5
    first = _req(f, 160, t=0)
    assert r.choose(first) == 0                 # empty tree: smallest tree, lowest index
    # the same prompt again: matched 160/160 > 0.5 -> its owner, 0
    again = _req(f, 160, t=1)
    assert r.choose(again) == 0 and again.predicted == 160
    # a prompt sharing 80 of 161 tokens: 80/161 < 0.5 -> smallest tree (1 or 2: 1)
    other = RouteRequest("x", None, [("p", 0, 80), ("q", 0, 81)], 161, 10, 2, 0)
    assert r.choose(other) == 1 and other.predicted == 0
    # exactly at the threshold (80/160) is not above it: the fallback
    half = RouteRequest("y", None, [("p", 0, 80), ("z", 0, 80)], 160, 10, 3, 0)
    assert r.choose(half) == 2


def test_cache_aware_gateway_falls_back_to_the_least_loaded():
    f = Fleet([Load(outstanding=3), Load(outstanding=1), Load(outstanding=2)])
    r = _router("cache_aware", f)
    assert r.choose(_req(f)) == 1               # no match: least loaded, not smallest tree


# ------------------------------------------------------------------ kv_router (Dynamo)

def test_kv_router_cost_is_prefill_blocks_plus_decode_blocks():
    # prompt 160 tokens = 10 blocks of 16; overlaps 4 / 6 / 0 blocks
    f = Fleet([Load(), Load(), Load()], View([0, 0, 0], [4, 6, 0]))
    r = _router("kv_router", f)
    req = _req(f)
    # costs: 1.0 x (160 - 64) / 16 + 10 = 16;  (160 - 96) / 16 + 10 = 14;  10 + 10 = 20
    assert r.choose(req) == 1 and req.predicted == 96
    # overlap_score_weight 0: prefill ignored, decode blocks tie (10 each): the smallest
    # index tree wins
    f = Fleet([Load(), Load(), Load()], View([0, 0, 0], [4, 6, 0], sizes=[9, 5, 7]))
    assert _router("kv_router", f, overlap_score_weight=0.0).choose(_req(f)) == 1


def test_dynamo_ties_and_temperature():
    import random

    rng = random.Random(1)
    # temperature 0: the least cost; ties by the smallest tree, then at random
    assert pick_by_cost(fv([3.0, 2.0, 2.0]), [5, 4, 9].__getitem__, 0.0, rng) == 1
    picks = {pick_by_cost(fv([2.0, 2.0]), [4, 4].__getitem__, 0.0, rng) for _ in range(50)}
    assert picks == {0, 1}
    # temperature > 0: every worker can be drawn, the cheaper more often; all equal: uniform
    got = [pick_by_cost(fv([0.0, 1.0]), [0, 0].__getitem__, 1.0, rng) for _ in range(4000)]
    share = got.count(0) / len(got)
    import math
    assert abs(share - 1 / (1 + math.exp(-1))) < 0.03
    assert {pick_by_cost(fv([1.0, 1.0, 1.0]), [0, 0, 0].__getitem__, 0.5, rng)
            for _ in range(100)} == {0, 1, 2}


@pytest.mark.parametrize("workers", [2, 64])     # (64: past the holder masks' 62 bits)
def test_dynamo_load_counts_prefill_until_first_token_and_distinct_active_blocks(workers):
    # Dynamo's ActiveSequences: a worker's prefill tokens count each routed request's
    # uncached prompt until its first token; its decode blocks are the distinct prompt
    # blocks of its active requests (a block two requests share counts once)
    from sim.engine.active_sequences import ActiveSequences, least
    from sim.engine.request import SimRequest

    def v(keys):
        return vec[i64](keys)

    kv = Fleet([Load()]).replicas[0].dep.kv
    reqs = [SimRequest(kv.make_request(f"r{k}", [(1, 0, 32)]), 4, k) for k in range(3)]
    book = ActiveSequences(workers)
    rest = workers - 2                                     # (workers holding nothing)

    def decode(blocks):
        assert len(set(blocks)) == len(blocks)             # (a prompt's keys never repeat)
        got = list(book.decode_all(v(blocks)))
        assert got[2:] == [len(blocks)] * rest
        assert got == [book.decode_blocks(i, v(blocks)) for i in range(workers)]
        return got[:2]

    book.add(0, 0, reqs[0], 100, v([11, 12, 13]))
    book.add(0, 1, reqs[1], 40, v([11, 12, 14]))
    book.add(1, 2, reqs[2], 7, v([21]))
    assert list(book.prefill)[:2] == [140, 7]
    assert decode([]) == [4, 1]                            # 11, 12, 13, 14 | 21
    # a new prompt [11, 15]: 15 is new to both, 11 new to worker 1 only
    assert decode([11, 15]) == [5, 3]
    # held by both, by worker 0 alone, by both again, by none: runs of holders
    assert decode([11, 12, 21, 13, 14, 99]) == [4 + 2, 1 + 5]
    assert decode(list(range(300, 364))) == [4 + 64, 1 + 64]
    # costs: weight x (prefill + prompt - overlap) / block size + decode blocks (the
    # overlap given in whole blocks: worker 0 holds 2 of 16 tokens)
    got = book.costs(64, v([2, 0] + [0] * rest), v([11, 15]), 16, 1.0)
    assert list(got)[:2] == [(140 + 32) / 16 + 5, (7 + 64) / 16 + 3]
    assert least(fv([3.0, 1.0, 2.0, 1.0])) == [1, 3] and least(fv([2.5])) == [0]
    assert book.cost(1, 64, 8.0, v([11]), 16, 2.0) == 2.0 * (7 + 64 - 8.0) / 16 + 2
    # the first token of request 1 clears its prefill at the next refresh, not before
    reqs[1].first_token_ns = 5
    assert list(book.prefill)[:2] == [140, 7]
    book.refresh()
    assert list(book.prefill)[:2] == [100, 7]
    # finishing request 0 drops 13 and one holder of 11 and 12 (request 1 keeps them)
    book.finish(0, 0)
    assert decode([]) == [3, 1]
    assert decode([13, 21]) == [5, 2]
    book.finish(0, 1)
    book.finish(0, 1)                                      # (a second finish: nothing)
    assert decode([11, 21]) == [2, 2]
    book.finish(1, 2)
    assert decode([21]) == [1, 1]


def test_a_prompts_block_keys_never_repeat():
    # Dynamo's load counts take a prompt's block keys as distinct (``ActiveSequences``):
    # each key chains the prefix before it, so a prompt repeating one stream's tokens,
    # or a Mooncake record repeating a hash id, still has one key per block
    kv = Fleet([Load()]).replicas[0].dep.kv
    unit = kv.coordinator.hash_block_size
    req = kv.make_request("r", [(1, 0, 4 * unit)] * 3 + [(2, 0, 4 * unit)] * 2)
    keys = req.block_hashes
    for scale in (1, 2, 4):
        got = list(keys.block_keys(0, keys.count // scale, scale))
        assert len(got) == keys.count // scale >= 5 and len(set(got)) == len(got)


# ------------------------------------------------------------------ llmd_scorers (llm-d)

def test_llmd_weighted_scorers_with_precise_prefix():
    # precise prefix: blocks 2 / 8 / 0 -> min-max over the matched: 0 / 1 / 0 (no match)
    # queue: waiting 4 / 0 / 2 -> 0 / 1 / 0.5; kv usage 0.5 / 0.9 / 0.1 -> 0.5 / 0.1 / 0.9
    loads = [Load(waiting=4, kv_usage=0.5), Load(waiting=0, kv_usage=0.9),
             Load(waiting=2, kv_usage=0.1)]
    f = Fleet(loads, View([0] * 3, [2, 8, 0]))
    r = _router("llmd_scorers", f, view="events", metrics_lag_ms=0.0)
    req = _req(f)
    # totals: 3*0 + 2*0 + 2*0.5 = 1;  3*1 + 2*1 + 2*0.1 = 5.2;  0 + 1 + 1.8 = 2.8
    assert r.choose(req) == 1 and req.predicted == 8 * BS
    # prefix weight 0: 1 / 2.2 / 2.8 -> replica 2
    f = Fleet(loads, View([0] * 3, [2, 8, 0]))
    assert _router("llmd_scorers", f, view="events", prefix_weight=0.0,
                   metrics_lag_ms=0.0).choose(_req(f)) == 2


def test_llmd_queue_scorer_is_one_when_all_equal_and_ties_are_random():
    loads = [Load(waiting=3), Load(waiting=3)]
    seen = set()
    for seed in range(20):
        f = Fleet(loads, View([0, 0], [0, 0]))
        seen.add(_router("llmd_scorers", f, seed=seed, view="events").choose(_req(f)))
    assert seen == {0, 1}


def test_llmd_approximate_prefix_is_matched_over_prompt_blocks():
    f = Fleet([Load(), Load()])
    r = _router("llmd_scorers", f, metrics_lag_ms=0.0)
    first = _req(f)
    i = r.choose(first)
    # the same prompt again: 10/10 blocks on i (3 x 1 over the other's 0)
    again = _req(f, t=1)
    assert r.choose(again) == i and again.predicted == 160


# ------------------------------------------------------------------ hybrid_aware

def test_hybrid_aware_believes_the_reconciled_hit_and_breaks_ties_by_it():
    # attention overlap 8 / 6 / 0 blocks; only replica 1 kept a Mamba state (hit 96)
    f = Fleet([Load(), Load(), Load()], View([0, 96, 0], [8, 6, 0]))
    req = _req(f)
    # the default credit scores the blocks held (as kv_router), but believes the hit
    assert _router("hybrid_aware", f).choose(req) == 0 and req.predicted == 0
    f = Fleet([Load(), Load(), Load()], View([0, 96, 0], [8, 6, 0]))
    req = _req(f)
    assert _router("kv_router", f).choose(req) == 0 and req.predicted == 128
    # scoring the resumable hit alone (credit 0) goes where it resumes
    f = Fleet([Load(), Load(), Load()], View([0, 96, 0], [8, 6, 0]))
    req = _req(f)
    assert _router("hybrid_aware", f, attention_credit=0.0).choose(req) == 1
    assert req.predicted == 96
    # equal attention overlaps: attention-only routers tie (smaller tree: 0), the hybrid
    # router takes the one that resumes (1)
    f = Fleet([Load(), Load()], View([0, 96], [6, 6], sizes=[3, 9]))
    assert _router("kv_router", f).choose(_req(f)) == 0
    f = Fleet([Load(), Load()], View([0, 96], [6, 6], sizes=[3, 9]))
    req = _req(f)
    assert _router("hybrid_aware", f).choose(req) == 1 and req.predicted == 96


# ------------------------------------------------------------------ fleets, end to end

def _rows(folder: Path) -> list[dict]:
    return list(csv.DictReader(open(folder / "requests.csv", newline="")))


def test_oracle_predicts_the_hit_when_nothing_changes_before_admission(tmp_path):
    # sparse arrivals: every request finds its replica idle, so the lookup at admission
    # is the lookup at arrival
    sc = load_scenario(ATHENA_FLEET, {"workload.num_requests": 120,
                                      "workload.tenants": [
                                          {"name": "a", "num_system_prompts": 3,
                                           "system_prompt_tokens": [9000, 5000, 2000],
                                           "rate_per_s": 0.05}],
                                      "cluster.replicas": 3,
                                      "cluster.router": {"policy": "hybrid_aware",
                                                         "view": "oracle"}})
    out = write_run(tmp_path / "o", sc, *simulate(sc), report=False)
    rows = [r for r in _rows(out) if not r["rejected"]]
    assert len(rows) == 120 and sum(int(r["hit_tokens"]) for r in rows) > 0
    assert all(r["routed_hit_tokens"] == r["hit_tokens"] for r in rows)


@pytest.mark.parametrize("path, over", [
    (ATHENA_FLEET, {"workload.num_requests": 500}),
    (MOONCAKE_FLEET, {"workload.num_requests": 800}),
])
def test_events_view_predicts_what_the_oracle_would_at_arrival(tmp_path, path, over):
    sc = load_scenario(path, {**over, "cluster.router": {"policy": "hybrid_aware",
                                                         "view": "events"},
                              "cluster.hindsight": True, "kv_events": {"fix_emit": True}})
    out = write_run(tmp_path / "e", sc, *simulate(sc), report=False)
    rows = [r for r in _rows(out) if not r["rejected"]]
    assert rows and all(r["routed_hit_tokens"] == r["arrival_hit_tokens"] for r in rows)
    assert any(int(r["routed_hit_tokens"]) > 0 for r in rows)


def test_attention_only_routers_over_predict_and_hybrid_aware_reuses_as_much(tmp_path):
    got = {}
    for policy in ("kv_router", "hybrid_aware"):
        sc = load_scenario(ATHENA_FLEET, {"workload.num_requests": 800,
                                          "cluster.router.policy": policy})
        _, _, s = simulate(sc)
        got[policy] = s
    kv, ha = got["kv_router"], got["hybrid_aware"]
    assert kv["over_predicted_share"] > 0.1 and kv["mean_over_prediction_tokens"] > 0
    assert ha["over_predicted_share"] == 0.0
    assert ha["hit_tokens"] >= kv["hit_tokens"]
