"""``cache.policy: none`` (prefix caching off) and ``cache.policy: ideal`` (the upper bound).

* ``none`` against vLLM 0.33.0's real scheduler with ``enable_prefix_caching=False``
  (``tests/golden/steps_nocache/``, written by ``tools/make_nocache_goldens.py``), and its
  rules: no hit, nothing cached, a Mamba group in mode ``none`` holds ``1 + K`` blocks,
  no align-mode split, the layout derived in mode ``none``.
* ``ideal``'s rules: the longest computed prefix on the hash-unit grid (outputs too), a
  state computed in a step is used from the next step on (hybrid), a pool that never runs
  out nor evicts and grows with use; ``checkpoints: vllm`` is ``vllm`` without the limit.
* Properties on random traces: ``none <= vllm <= ideal(checkpoints: vllm) <= ideal`` in hit
  tokens per request where memory does not bind, and no policy ever reports a hit on a
  prefix nobody computed before (every reused state exists).
"""
from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from sim.cache import kv_manager
from sim.cache.coordinator import (
    UNLIMITED_BLOCKS,
    IdealCoordinator,
    NoPrefixCacheCoordinator,
    UnlimitedBlockPool,
)
from sim.cache.config import CacheConfig
from sim.cache.hashing import PrefixHasher
from sim.cache.kv_manager import KVCacheManager
from sim.cache.policies import CACHE_POLICIES, CacheSwitches, PoolShape
from sim.cache.policies.ideal import IdealOptions
from sim.cache.policies.base import NoOptions
from sim.cache.prompt import StreamRegistry
from sim.errors import CapacityError, InputError
from sim.config.scenario import load_scenario
from sim.config.scheduler import SchedulerConfig
from sim.engine.engine import Engine
from sim.engine.scheduler import Scheduler, SimRequest
from sim.engine.replica import build_deployment
from sim.commands.run import simulate
from sim.commands.steps import run_steps_data

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "athena-tiny.yaml"
GOLDEN = ROOT / "tests" / "golden" / "steps_nocache"
GOLDENS = sorted(GOLDEN.glob("*.yaml"))


# --------------------------------------------------------------- none vs vLLM --
def _run_steps(data: dict, source: str, monkeypatch, enable_caching: bool) -> dict:
    monkeypatch.setattr(kv_manager, "KVCacheManager",
                        lambda cfg: KVCacheManager(cfg, enable_caching=enable_caching))
    return {r["id"]: r for r in run_steps_data(data, source)}


def test_nocache_goldens_present():
    assert len(GOLDENS) >= 30, "regenerate with tools/make_nocache_goldens.py"


@pytest.mark.parametrize("path", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_none_equals_vllm_with_prefix_caching_off(path, monkeypatch):
    data = yaml.safe_load(path.read_text())
    assert "enable_prefix_caching=False" in data["source"]
    got = _run_steps(data, str(path), monkeypatch, enable_caching=False)
    bad = [f"{rid}.{k}: got {got[rid].get(k)!r}, want {v!r}"
           for rid, want in data["expect"].items() for k, v in want.items()
           if got[rid].get(k) != v]
    assert not bad, f"{path.name}: " + "; ".join(bad)


def test_the_goldens_tell_caching_off_from_align_mode(monkeypatch):
    """Replayed with prefix caching on (align mode), the same cases differ from vLLM's
    caching-off answers: the goldens test what turning caching off changes."""
    differ = []
    for path in GOLDENS:
        data = yaml.safe_load(path.read_text())
        data["config"] = dict(data["config"], mamba_cache_mode="align")
        try:
            got = _run_steps(data, str(path), monkeypatch, enable_caching=True)
        except CapacityError:    # align mode's 2 + K Mamba blocks never fit that pool
            differ.append(path.stem)
            continue
        if any(got[rid].get(k) != v for rid, want in data["expect"].items()
               for k, v in want.items()):
            differ.append(path.stem)
    assert {"nc_shared", "nc_preempt", "nc_full_only"} <= set(differ)
    assert len(differ) >= len(GOLDENS) // 2


# ------------------------------------------------------------------ none rules --
SW = CacheSwitches(hash_block_size=8, prefix_cache_retention_interval=0)


def _shape(groups=("full", "mamba"), num_blocks=512, k=0, eagle=False,
           ckpt=(0, 1)) -> PoolShape:
    return PoolShape(groups=groups, block_size=32, num_blocks=num_blocks, uses_eagle=eagle,
                     num_speculative_tokens=k, num_prefill_lookahead=1 if eagle else 0,
                     prefill_checkpoints=ckpt)


def _req(kv: KVCacheManager, rid: str, runs: list) -> object:
    return kv.make_request(rid, runs)


def _prefill(kv: KVCacheManager, req, chunk: int = 1 << 30) -> int:
    """Admit ``req`` (lookup, then chunks of ``chunk`` tokens), one step per chunk."""
    kv.new_step_starts()
    look = kv.get_computed_blocks(req)
    req.num_computed_tokens = 0
    n = min(chunk, req.num_tokens - look.hit)
    assert kv.allocate_slots(req, n, look.hit, look.blocks if look.hit else None)
    req.num_computed_tokens = look.hit + n
    while req.num_computed_tokens < req.num_tokens:
        kv.new_step_starts()
        n = min(chunk, req.num_tokens - req.num_computed_tokens)
        assert kv.allocate_slots(req, n)
        req.num_computed_tokens += n
    return look.hit


def test_none_never_hits_and_caches_nothing():
    kv = CACHE_POLICIES["none"].build(SW, NoOptions(), _shape())
    assert type(kv.coordinator) is NoPrefixCacheCoordinator
    a = _req(kv, "a", [(1, 0, 300)])
    assert _prefill(kv, a, 100) == 0
    kv.free(a)
    b = _req(kv, "b", [(1, 0, 300), (2, 0, 50)])
    look = kv.get_computed_blocks(b)
    assert (look.hit, look.junction, look.full_alone) == (0, 0, 0)
    assert kv.per_group_hits(b) == [0, 0]
    assert kv.pool.cached_items() == {}          # no block ever carried a key
    assert not kv.needs_aligned_split
    assert kv.states_written(a) == 0


@pytest.mark.parametrize("k", [0, 2])
@pytest.mark.parametrize("groups", [("full", "mamba"), ("full", "mamba", "mamba")])
def test_none_mamba_holds_the_running_state_and_k_blocks(groups, k):
    """Mode none: 1 + K Mamba blocks per group from the first chunk to the finish, whatever
    the length (vLLM's Mamba block is max_model_len tokens then); attention grows by blocks."""
    kv = CACHE_POLICIES["none"].build(SW, NoOptions(), _shape(groups=groups, k=k, eagle=k > 0))
    width = len(groups) - 1
    free0 = kv.pool.num_free()
    a = _req(kv, "a", [(1, 0, 1000)])
    kv.allocate_slots(a, 10)
    assert free0 - kv.pool.num_free() == 1 + (1 + k) * width
    assert kv.group_blocks(a, "mamba") and len(kv.group_blocks(a, "mamba")) == 1 + k
    a.num_computed_tokens = 10
    for n in (90, 300, 600):
        kv.allocate_slots(a, n)
        a.num_computed_tokens += n
        mamba = kv.group_blocks(a, "mamba")
        assert len(mamba) == 1 + k and not any(b.is_null for b in mamba)
        assert free0 - kv.pool.num_free() == -(-a.num_computed_tokens // 32) + (1 + k) * width
    assert kv.blocks_per_request(1000) == 32 + (1 + k) * width   # vLLM's per-request pages
    kv.free(a)
    assert kv.pool.num_free() == free0


def test_a_caching_coordinator_still_requires_align_mode():
    with pytest.raises(AssertionError, match="requires mamba_cache_mode='align'"):
        KVCacheManager(CacheConfig(groups=("full", "mamba"), block_size=16,
                                   mamba_cache_mode="none"))
    kv = KVCacheManager(CacheConfig(groups=("full", "mamba"), block_size=16,
                                    mamba_cache_mode="none"), enable_caching=False)
    assert kv.coordinator.mamba_managers[0].max_blocks_per_request == 1


def test_none_ignores_the_mtp_check_that_only_concerns_caching():
    """vLLM checks scheduler_block_size >= num_speculative_tokens only with caching on."""
    cfg = CacheConfig(groups=("full", "mamba"), block_size=4, eagle=True,
                      num_prefill_lookahead=8, mamba_num_speculative_blocks=8)
    with pytest.raises(ValueError, match="multi-module MTP"):
        KVCacheManager(cfg)
    KVCacheManager(replace(cfg, mamba_cache_mode="none"), enable_caching=False)


def test_none_deployment_derives_the_layout_in_mode_none():
    dep = build_deployment(load_scenario(TINY, overrides={"cache": {"policy": "none"}}))
    assert dep.layout.mamba_cache_mode == "none"
    assert dep.layout.mamba_block_size is None
    stock = build_deployment(load_scenario(TINY))
    assert stock.layout.mamba_cache_mode == "align"
    assert not dep.kv.needs_aligned_split and stock.kv.needs_aligned_split


# ----------------------------------------------------------------- ideal rules --
def _ideal(groups=("full", "mamba"), checkpoints="every_unit", **kw) -> KVCacheManager:
    return CACHE_POLICIES["ideal"].build(SW, IdealOptions(checkpoints), _shape(groups, **kw))


def test_ideal_hits_the_longest_computed_prefix_on_the_unit_grid():
    kv = _ideal()
    assert type(kv.coordinator) is IdealCoordinator and kv.hash_block_size == 8
    a = _req(kv, "a", [(1, 0, 100)])
    _prefill(kv, a, 37)                       # chunks off every grid
    kv.free(a)
    kv.new_step_starts()
    b = _req(kv, "b", [(1, 0, 70), (2, 0, 30)])
    assert kv.get_computed_blocks(b).hit == 64          # 70 floored to the unit
    c = _req(kv, "c", [(1, 0, 100)])                    # a's whole prompt again:
    assert kv.get_computed_blocks(c).hit == 96          # below its last token, on the grid
    d = _req(kv, "d", [(1, 0, 100), (3, 0, 9)])
    look = kv.get_computed_blocks(d)
    assert (look.hit, look.full_alone) == (96, 96)      # a computed 100 tokens: 96 on grid
    assert kv.per_group_hits(d) == [96, 96]
    e = _req(kv, "e", [(4, 0, 50)])
    assert kv.get_computed_blocks(e).hit == 0


def test_ideal_reuses_the_answer_a_follow_up_resends():
    """vLLM keeps no Mamba state inside an answer; the ideal cache has one at every unit."""
    sw = CacheSwitches(hash_block_size=8, prefix_cache_retention_interval=0)
    kvs = {p: CACHE_POLICIES[p].build(sw, o, _shape()) for p, o in
           (("vllm", NoOptions()), ("ideal", IdealOptions()))}
    hits = {}
    for name, kv in kvs.items():
        a = _req(kv, "a", [(1, 0, 100)])
        _prefill(kv, a, 64)
        for _ in range(40):                            # decode 40 tokens, one a step
            kv.new_step_starts()
            a.append_run(9, a.num_tokens - 100, 1)
            assert kv.allocate_slots(a, 1)
            a.num_computed_tokens += 1
        kv.free(a)
        kv.new_step_starts()
        b = _req(kv, "b", [(1, 0, 100), (9, 0, 40), (2, 0, 20)])
        hits[name] = kv.get_computed_blocks(b).hit
    assert hits["ideal"] == 136                 # a computed 140 tokens: 17 units
    assert hits["vllm"] < 100                   # vLLM: no state inside the answer


def test_ideal_states_of_a_step_are_used_from_the_next_step():
    """A hybrid model's state exists once the step computing it has run; attention alone
    (vLLM's full attention too) may use blocks scheduled in the same step."""
    for groups, sw, same_step in ((("full", "mamba"), SW, 0),
                                  (("full",), CacheSwitches(), 96)):
        kv = CACHE_POLICIES["ideal"].build(sw, IdealOptions(), _shape(groups))
        a = _req(kv, "a", [(1, 0, 100)])
        kv.new_step_starts()
        assert kv.allocate_slots(a, 100)             # scheduled (and indexed) this step
        b = _req(kv, "b", [(1, 0, 100), (2, 0, 10)])
        assert kv.get_computed_blocks(b).hit == same_step
        kv.new_step_starts()                         # a's step has run
        assert kv.get_computed_blocks(b).hit == 96


def test_ideal_pool_never_runs_out_and_grows_with_use():
    kv = _ideal(num_blocks=8)                         # the provisioned pool: 7 usable
    pool = kv.pool
    assert isinstance(pool, UnlimitedBlockPool)
    assert kv.usable_blocks == UNLIMITED_BLOCKS - 1
    reqs = []
    for i in range(50):                                # 50 x 500 tokens at once
        r = _req(kv, f"r{i}", [(10 + i, 0, 500)])
        assert kv.allocate_slots(r, 500, full_sequence_must_fit=True)
        reqs.append(r)
    held = 50 * (16 + 1)
    assert UNLIMITED_BLOCKS - 1 - pool.num_free() == held
    assert held < len(pool.blocks) <= 2 * held + 2    # lazily made, at most doubled
    for r in reqs:
        kv.free(r)
    assert pool.num_free() == UNLIMITED_BLOCKS - 1


def test_ideal_vllm_checkpoints_never_evicts_where_vllm_must():
    """Many distinct prompts through a small pool: vLLM evicts and loses hits on the
    replay; with ``checkpoints: vllm`` nothing is evicted and every replay hits as vLLM
    does with a pool large enough."""
    out = {}
    for name, kv in (("vllm", CACHE_POLICIES["vllm"].build(SW, NoOptions(),
                                                           _shape(num_blocks=60))),
                     ("big", CACHE_POLICIES["vllm"].build(SW, NoOptions(),
                                                          _shape(num_blocks=5000))),
                     ("ideal_vllm", _ideal(checkpoints="vllm", num_blocks=60))):
        hits = []
        for rnd in range(2):
            for i in range(12):
                r = _req(kv, f"r{rnd}.{i}", [(20 + i, 0, 200), (100 + rnd, 0, 10)])
                hits.append(_prefill(kv, r, 96))
                kv.free(r)
        out[name] = (hits, kv.pool.evicted_keys)
    assert out["vllm"][1] > 0 and out["ideal_vllm"][1] == 0 and out["big"][1] == 0
    assert out["ideal_vllm"][0] == out["big"][0]
    assert sum(out["ideal_vllm"][0]) > sum(out["vllm"][0])


def test_ideal_options_are_checked():
    sc = load_scenario(TINY, overrides={"cache": {"policy": "ideal", "checkpoints": "vllm"}})
    assert sc.cache.options == IdealOptions("vllm")
    assert load_scenario(TINY, overrides={"cache": {"policy": "ideal"}}).cache.options == \
        IdealOptions("every_unit")
    with pytest.raises(InputError, match="cache.checkpoints: must be every_unit or vllm, "
                                         "got 'sparse'"):
        load_scenario(TINY, overrides={"cache": {"policy": "ideal", "checkpoints": "sparse"}})
    with pytest.raises(InputError, match="cache.checkpoints: unknown key"):
        load_scenario(TINY, overrides={"cache": {"policy": "vllm", "checkpoints": "vllm"}})


def test_the_three_policies_end_to_end():
    """athena-tiny (memory does not bind): none 0, vllm = ideal(checkpoints: vllm) request
    by request, ideal at least as much and more in total; requests never wait for blocks."""
    hits, runs = {}, {}
    for key, cache in (("none", {"policy": "none"}), ("vllm", {}),
                       ("ideal_vllm", {"policy": "ideal", "checkpoints": "vllm"}),
                       ("ideal", {"policy": "ideal"})):
        dep, rows, s = simulate(load_scenario(TINY, overrides={"cache": cache}))
        hits[key] = {r.request_id: r.hit_tokens for r in rows}
        runs[key] = s
    assert runs["vllm"]["evictions"] == 0
    assert set(hits["none"].values()) == {0}
    assert hits["vllm"] == hits["ideal_vllm"]
    assert all(hits["ideal"][r] >= h for r, h in hits["vllm"].items())
    assert sum(hits["ideal"].values()) > sum(hits["vllm"].values())
    assert runs["ideal"]["preemptions"] == 0


# ------------------------------------------------------ properties on random traces --
from sim.commands.steps import UNIT_S, StepArrival as _Trace  # noqa: E402  (the engine's arrival)


def _random_workload(rng: random.Random, sequential: bool) -> list[tuple]:
    """(rid, runs, arrival step, max_tokens): sessions of turns over shared system prompts;
    a turn resends the previous turn's prompt and answer, then a new message."""
    systems = [(1000 + s, 0, rng.randint(0, 150)) for s in range(3)]
    out = []
    step = 0
    for s in range(rng.randint(3, 6)):
        prev: list = [systems[rng.randrange(3)]]
        prev = [r for r in prev if r[2]]
        for t in range(rng.randint(1, 4)):
            rid = f"s{s}t{t}"
            runs = prev + [(2000 + 10 * s + t, 0, rng.randint(1, 120))]
            mt = rng.randint(1, 40)
            out.append((rid, runs, step, mt))
            prev = runs + [("out", rid, mt)]
            step += 100_000 if sequential else rng.randint(0, 30)
    return sorted(out, key=lambda x: x[2])


def _replay(policy: str, options, sw: CacheSwitches, shape: PoolShape, k: int,
            workload: list[tuple], budget: int) -> tuple[dict, KVCacheManager, list]:
    """Run the engine over ``workload`` with ``policy``; returns each request's hit, the
    manager, and the problems found by the serve check (a hit on a prefix that no request
    had computed in an earlier step)."""
    kv = CACHE_POLICIES[policy].build(sw, options, shape)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8,
                                      num_speculative_tokens=k), kv,
                      accepted_per_step=k / 2, eagle_family=shape.uses_eagle)
    streams = StreamRegistry()
    truth_hasher = PrefixHasher(kv.hash_block_size, 0)   # content keys, no lookahead
    truth: set[int] = set()
    problems: list[str] = []
    reqs: dict[str, SimRequest] = {}
    by_id = {w[0]: w for w in workload}

    def runs_of(runs):
        return [(streams.id(f"out/{r[1]}"), 0, r[2]) if r[0] == "out" else r for r in runs]

    def make(trace, index):
        rid, runs, _, mt = by_id[trace.request_id]
        r = SimRequest(kv.make_request(rid, runs_of(runs)), mt, index)
        r.out_stream = streams.id(f"out/{rid}")
        reqs[rid] = r
        return r

    class Backend:
        """One time unit a step.  Adds what the previous step computed (its accepted drafts
        are in the sequence by now), then checks each new hit against it."""

        jumps = False
        last: list = []          # (request, tokens computed after the previous step)

        def step_time(self, plan):
            h = kv.hash_block_size
            for c, done in self.last:
                keys = truth_hasher.keys_of(c.runs)
                truth.update(keys.key(i) for i in range(min(done // h, keys.count)))
            for it in plan.items:
                c = it.tokens
                if it.new_hit:
                    assert it.new_hit <= c.num_tokens - 1
                    keys = truth_hasher.keys_of(c.runs)
                    if keys.key(it.new_hit // h - 1) not in truth:
                        problems.append(f"{c.request_id}: hit {it.new_hit} never computed")
            # a decode step computes the verified token and the accepted drafts
            self.last = [(it.tokens, it.context + it.kept) for it in plan.items]
            return UNIT_S

        def time_from_sums(self, n, T, C, TC, TT):
            return UNIT_S

    eng = Engine(sched, Backend(), make, lambda r: None, jump=False)
    eng.run(_Trace(rid, step * UNIT_S, [], mt) for rid, _, step, mt in workload)
    assert eng.finished == len(workload)
    return {rid: r.hit_tokens for rid, r in reqs.items()}, kv, problems


def _random_config(rng: random.Random) -> tuple[CacheSwitches, PoolShape, int]:
    block = rng.choice([16, 32])
    eagle = rng.random() < 0.5
    k = rng.choice([1, 2]) if eagle else 0
    sw = CacheSwitches(
        hash_block_size=rng.choice([block, block // 2, block // 4]),
        enable_mamba_shared_prefix_checkpoint=rng.random() < 0.5,
        prefix_cache_retention_interval=rng.choice([0, None]),
        disable_lookahead_block_hashes=rng.random() < 0.5)
    shape = PoolShape(groups=rng.choice([("full", "mamba"), ("full", "mamba", "mamba")]),
                      block_size=block, num_blocks=4096, uses_eagle=eagle,
                      num_speculative_tokens=k, num_prefill_lookahead=1 if eagle else 0,
                      prefill_checkpoints=rng.choice([(0, 1), (1, 1)]))
    return sw, shape, k


POLICIES = (("none", NoOptions()), ("vllm", NoOptions()),
            ("ideal_vllm", IdealOptions("vllm")), ("ideal", IdealOptions("every_unit")))


@pytest.mark.parametrize("seed", range(20))
def test_hits_are_ordered_none_vllm_ideal_vllm_ideal(seed):
    """Requests one after another, memory not binding: none <= vllm = ideal(checkpoints:
    vllm) <= ideal for every request, and every hit was computed before."""
    rng = random.Random(f"ordered:{seed}")
    sw, shape, k = _random_config(rng)
    workload = _random_workload(rng, sequential=True)
    budget = rng.choice([48, 64, 8192])
    hits = {}
    for key, opts in POLICIES:
        policy = "ideal" if key.startswith("ideal") else key
        hits[key], kv, problems = _replay(policy, opts, sw, shape, k, workload, budget)
        assert not problems, (key, problems)
        assert kv.pool.evicted_keys == 0
    for rid in hits["vllm"]:
        chain = [hits[key][rid] for key, _ in POLICIES]
        assert chain[0] == 0 and chain[1] == chain[2] <= chain[3], (rid, chain)
    assert sum(hits["ideal"].values()) > 0


@pytest.mark.parametrize("seed", range(16))
def test_no_policy_reports_a_hit_nobody_computed(seed):
    """Overlapping requests, and for vllm a pool that binds: every hit of every policy is
    on a prefix computed in an earlier step; the ideal pools never evict nor preempt."""
    rng = random.Random(f"served:{seed}")
    sw, shape, k = _random_config(rng)
    workload = _random_workload(rng, sequential=False)
    for key, opts in POLICIES:
        policy = "ideal" if key.startswith("ideal") else key
        tight = replace(shape, num_blocks=rng.choice([40, 80, 4096])) if key == "vllm" \
            else shape
        hits, kv, problems = _replay(policy, opts, sw, tight, k, workload, 64)
        assert not problems, (key, problems)
        if key.startswith("ideal"):
            assert kv.pool.evicted_keys == 0


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("alpha", [0.0, 1.0])
def test_marconi_reports_no_hit_nobody_computed(seed, alpha):
    """The same serve check for ``cache.policy: marconi`` (its own admission and utility
    eviction on vLLM's pool), on pools that bind and that do not."""
    from sim.cache.policies.marconi import MarconiOptions

    rng = random.Random(f"marconi-served:{seed}")
    sw, shape, k = _random_config(rng)
    workload = _random_workload(rng, sequential=False)
    tight = replace(shape, num_blocks=rng.choice([40, 80, 4096]))
    hits, kv, problems = _replay("marconi", MarconiOptions(marconi_alpha=alpha), sw, tight, k,
                                 workload, 64)
    assert not problems, problems
    assert len(hits) == len(workload) and sum(hits.values()) > 0
