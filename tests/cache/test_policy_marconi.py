"""``cache.policy: marconi`` and the two seams it plugs into: admission (which Mamba states
are kept) and eviction order (which cached free block goes first)."""
from __future__ import annotations

from pathlib import Path

import pytest

from sim.cache.block_pool import BlockPool, make_key
from sim.cache.case import CaseSchedule, prefill
from sim.cache.config import CacheConfig
from sim.cache.kv_manager import KVCacheManager
from sim.cache.policies import (CACHE_POLICIES, CacheSwitches, NoOptions, PoolShape,
                                VllmPolicy)
from sim.cache.policies.marconi import FlopAwareOrder, MarconiOptions, MarconiPolicy
from sim.cache.seams import EvictionOrder
from sim.cache.utility_pool import UtilityBlockPool
from sim.errors import InputError
from sim.config.scenario import load_scenario
from sim.marconi.costs import CostModel
from sim.marconi.tuning import ALPHA_GRID
from sim.engine.replica import build_deployment
from tests.entrypoints.sim_cli import run_sim

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "athena-tiny.yaml"
GROUPS = ("full", "mamba")
MAMBA_GID = 1


def marconi(alpha: float | str = 0.0, bootstrap: int = 500, blocks: int = 512) -> KVCacheManager:
    return MarconiPolicy().build(
        CacheSwitches(hash_block_size=16),
        MarconiOptions(marconi_alpha=alpha, marconi_bootstrap_requests=bootstrap),
        PoolShape(groups=GROUPS, block_size=16, num_blocks=blocks))


def serve(kv: KVCacheManager, rid: str, runs: list, output: int = 0, chunk: int = 32) -> int:
    """One request alone: lookup, prefill in the scheduler's chunks of at most ``chunk``
    tokens, ``output`` decoded tokens one at a time, free.  Returns its hit."""
    req = kv.make_request(rid, runs)
    lookup = kv.get_computed_blocks(req)
    prefill(kv, req, lookup, CaseSchedule(max_num_batched_tokens=chunk))
    for j in range(output):
        req.append_run(900 + int(rid[1:]), j, 1)
        assert kv.allocate_slots(req, 1)
        req.num_computed_tokens += 1
        kv.new_step_starts()
    kv.free(req)
    return lookup.hit


def mamba_states(kv: KVCacheManager) -> int:
    return sum(1 for key in kv.pool.cached_items() if key & 31 == MAMBA_GID)


def branching(kv: KVCacheManager) -> list[int]:
    """A long conversation, then two followers sharing its first 100 tokens only."""
    return [serve(kv, "r1", [(1, 0, 160)], output=40),
            serve(kv, "r2", [(1, 0, 100), (2, 0, 60)]),
            serve(kv, "r3", [(1, 0, 100), (3, 0, 60)])]


def test_marconi_admits_fewer_states_and_keeps_the_branch_point():
    dense = KVCacheManager(CacheConfig(groups=GROUPS, block_size=16, num_blocks=512,
                                       prefix_cache_retention_interval=None))
    m = marconi()
    # vLLM with dense retention (a state wherever a chunk or a decode step crosses a
    # block, the paper's "vLLM+") hits r2 at its last chunk end inside the shared prefix
    assert branching(dense) == [0, 96, 96]
    # Marconi kept r1's prompt end and sequence end only: r2 misses, and its branch point
    # (the junction, floored to the 16-token block) is admitted, so r3 hits there
    assert branching(m) == [0, 0, 96]
    assert mamba_states(m) < mamba_states(dense)
    mamba_keys = {k >> 5 for k in m.pool.cached_items() if k & 31 == MAMBA_GID}
    r3 = m.make_request("x", [(1, 0, 100), (3, 0, 60)])
    assert r3.block_hashes.key(96 // 16 - 1) in mamba_keys          # the junction block
    r1 = m.make_request("y", [(1, 0, 160), (901, 0, 40)])
    # r1's sequence end (its last block-aligned state, 192) stayed; its earlier decode
    # state (176) was taken back
    assert r1.block_hashes.key(192 // 16 - 1) in mamba_keys
    assert r1.block_hashes.key(176 // 16 - 1) not in mamba_keys


def test_marconi_sequence_end_serves_the_next_turn():
    m = marconi()
    stock = VllmPolicy().build(CacheSwitches(hash_block_size=16), None,
                               PoolShape(groups=GROUPS, block_size=16, num_blocks=512))
    turn2 = [(1, 0, 160), (901, 0, 40), (5, 0, 30)]
    for kv in (m, stock):
        serve(kv, "r1", [(1, 0, 160)], output=40)
    assert serve(m, "r2", turn2) == 192           # the finished sequence's state
    assert serve(stock, "r2", turn2) == 144       # retention 0 keeps the prompt's only


def _pool_with_two_cached(pool: BlockPool) -> tuple[int, int]:
    """Two cached free blocks: a long prefix released first, a short one after it."""
    long_b, short_b = pool.get_new_blocks(2)
    pool.insert_key(make_key(111, 0), long_b, 4096)
    pool.insert_key(make_key(222, 0), short_b, 16)
    pool.free_blocks([long_b])
    pool.free_blocks([short_b])
    return make_key(111, 0), make_key(222, 0)


@pytest.mark.parametrize("alpha, evicted", [(None, "long"), (0.0, "long"), (2.0, "short")])
def test_eviction_by_utility_where_lru_disagrees(alpha, evicted):
    costs = CostModel(kv_bytes_per_token=1, state_bytes=16, flops_per_token=1.0,
                      attn_flops_per_context_token=1.0)
    pool = (BlockPool(6, 16) if alpha is None
            else UtilityBlockPool(6, 16, 0, FlopAwareOrder(6, costs, alpha)))
    long_key, short_key = _pool_with_two_cached(pool)
    pool.get_new_blocks(4)          # 3 uncached free blocks, so one cached block goes
    left = set(pool.cached_items())
    # LRU (and alpha 0, recency alone) evicts the older block; with alpha 2 the short
    # prefix's low FLOPs per byte outweighs its recency
    assert left == ({short_key} if evicted == "long" else {long_key})


def test_alpha_is_tuned_on_the_bootstrap_window_deterministically():
    def run() -> tuple[float, dict]:
        m = marconi("auto", bootstrap=4, blocks=24)
        order = m.pool.order
        for k in range(6):
            serve(m, f"r{k + 1}", [(1 + k % 2, 0, 64 + 32 * k), (10 + k, 0, 48)], output=8)
            if k < 3:
                assert order.rule.alpha == 0.0       # alpha 0 until the window is in
        return order.rule.alpha, _tuner(m).rates

    alpha, rates = run()
    assert tuple(rates) == ALPHA_GRID                # every alpha of the paper's grid tried
    assert alpha in ALPHA_GRID and rates[alpha] == max(rates.values())
    assert alpha == min(a for a in ALPHA_GRID if rates[a] == rates[alpha])   # ties: smaller
    assert run() == (alpha, rates)


def _tuner(kv: KVCacheManager):
    for m in kv.coordinator.mamba_managers:
        return m.admission.tuner
    raise AssertionError("no Mamba group")


@pytest.mark.parametrize("key, value, msg", [
    ("marconi_alpha", -1, "must be auto or a number >= 0"),
    ("marconi_alpha", "fast", "must be auto or a number >= 0"),
    ("marconi_bootstrap_requests", 0, "must be an integer >= 1"),
])
def test_bad_marconi_options(key, value, msg):
    with pytest.raises(InputError, match=f"cache.{key}: {msg}"):
        load_scenario(TINY, overrides={"cache": {"policy": "marconi", key: value}})


def test_bad_marconi_option_exits_2(tmp_path):
    out = tmp_path / "run"
    assert run_sim("run", str(TINY), "--out", str(out), "-q", "--set", "cache.policy=marconi",
                   "--set", "cache.marconi_alpha=-0.5", cwd=ROOT) == 2
    assert not out.exists()


def test_marconi_keys_belong_to_marconi():
    with pytest.raises(InputError, match="cache.marconi_alpha: unknown key"):
        load_scenario(TINY, overrides={"cache": {"marconi_alpha": 1.0}})


class MostRecentFirst(EvictionOrder):
    """A throwaway eviction order: the most recently released cached block goes first."""

    def __init__(self) -> None:
        self.stack: list[int] = []

    def released(self, block_id: int, tokens: int) -> None:
        self.stack.append(block_id)

    def taken(self, block_id: int) -> None:
        self.stack.remove(block_id)

    def victims(self, k: int) -> list[int]:
        out = self.stack[-k:][::-1]
        del self.stack[-k:]
        return out


class MruPolicy:
    """One file's worth: vLLM's rules with the eviction seam swapped for MRU."""

    name = "mru-test"
    options = NoOptions

    def build(self, switches, options, shape):
        order = MostRecentFirst()
        return KVCacheManager(VllmPolicy().cache_config(switches, shape),
                              pool_factory=lambda n, h, la: UtilityBlockPool(n, h, la, order))


def test_a_throwaway_policy_swaps_the_eviction_seam(monkeypatch):
    monkeypatch.setitem(CACHE_POLICIES, "mru-test", MruPolicy())   # the one registry line
    dep = build_deployment(load_scenario(TINY, overrides={"cache": {"policy": "mru-test"}}))
    assert type(dep.kv.pool) is UtilityBlockPool
    pool = dep.kv.pool
    long_key, short_key = _pool_with_two_cached(pool)
    pool.get_new_blocks(pool.num_free() - 1)
    assert set(pool.cached_items()) == {long_key}     # the most recent (short) went first
