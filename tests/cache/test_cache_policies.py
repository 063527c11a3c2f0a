"""The cache-policy seam: a registry by name, each policy's own ``cache:`` keys, one
manager per deployment.  A throwaway policy registered here (one class, one registry
line) runs end to end through the scenario loader and the assembly."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from sim.cache.config import CacheConfig
from sim.cache.kv_manager import KVCacheManager
from sim.cache.policies import CACHE_POLICIES, CacheSwitches, PoolShape, VllmPolicy
from sim.errors import InputError
from sim.config.scenario import load_scenario
from sim.engine.replica import build_deployment

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "athena-tiny.yaml"


@dataclass(frozen=True)
class DenseOptions:
    """The throwaway policy's own key: how many pool blocks to hold back."""

    reserve_blocks: int = 0

    def validate(self, prefix: str) -> None:
        if self.reserve_blocks < 0:
            from sim.errors import ConfigError

            raise ConfigError(prefix + "reserve_blocks", f"must be >= 0, got {self.reserve_blocks}")


class DenseRetentionPolicy:
    """vLLM, but every Mamba state is retained (retention None) and the pool is smaller."""

    name = "dense-test"
    options = DenseOptions

    def build(self, switches: CacheSwitches, options: DenseOptions,
              shape: PoolShape) -> KVCacheManager:
        cfg = VllmPolicy().cache_config(switches, shape)
        return KVCacheManager(CacheConfig(
            groups=cfg.groups, block_size=cfg.block_size, hash_block_size=cfg.hash_block_size,
            eagle=cfg.eagle, num_blocks=shape.num_blocks - options.reserve_blocks,
            prefix_cache_retention_interval=None, max_model_len=cfg.max_model_len,
            num_hash_lookahead_tokens=cfg.num_hash_lookahead_tokens,
            mamba_num_speculative_blocks=cfg.mamba_num_speculative_blocks))


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(CACHE_POLICIES, "dense-test", DenseRetentionPolicy())


def test_a_registered_policy_builds_the_deployment(registered):
    sc = load_scenario(TINY, overrides={"cache": {"policy": "dense-test",
                                                  "hash_block_size": 16,
                                                  "reserve_blocks": 100}})
    assert sc.cache.options == DenseOptions(reserve_blocks=100)
    dep = build_deployment(sc)
    assert dep.kv.pool.num_blocks == dep.num_blocks - 100
    assert dep.kv.coordinator.retention is None
    stock = build_deployment(load_scenario(TINY))
    assert stock.kv.coordinator.retention == 0            # the scenario's serve default


def test_policy_keys_are_checked_by_their_policy(registered):
    with pytest.raises(InputError, match="cache.reserve_blocks: must be >= 0"):
        load_scenario(TINY, overrides={"cache": {"policy": "dense-test", "reserve_blocks": -1}})
    # a key of another policy is unknown to vllm
    with pytest.raises(InputError, match="cache.reserve_blocks: unknown key"):
        load_scenario(TINY, overrides={"cache": {"policy": "vllm", "reserve_blocks": 1}})


def test_unknown_policy_lists_the_registry():
    with pytest.raises(InputError, match=r"cache.policy: unknown policy 'lru2' \(known: [a-z, ]*\bvllm\b"):
        load_scenario(TINY, overrides={"cache": {"policy": "lru2"}})


def test_coordinator_factory_picks_by_layout():
    from sim.cache.coordinator import HybridCoordinator, UnitaryCoordinator

    one = KVCacheManager(CacheConfig(groups=("full",), block_size=16))
    two = KVCacheManager(CacheConfig(groups=("full", "mamba"), block_size=16))
    assert type(one.coordinator) is UnitaryCoordinator
    assert type(two.coordinator) is HybridCoordinator


def test_registry_imports_a_policy_when_first_used():
    """``CACHE_POLICIES`` names every policy; a run imports its own policy's module only
    (Marconi's brings numpy-heavy replay code), and any read returns the policy."""
    import subprocess
    import sys

    code = ("import sys\n"
            "import sim.commands.run\n"
            "from sim.cache.policies import CACHE_POLICIES\n"
            "assert sorted(CACHE_POLICIES) == ['ideal', 'marconi', 'none', 'vllm']\n"
            "assert 'sim.cache.policies.marconi' not in sys.modules\n"
            "p = CACHE_POLICIES['marconi']\n"
            "assert 'sim.cache.policies.marconi' in sys.modules and p.name == 'marconi'\n"
            "assert CACHE_POLICIES['marconi'] is p\n"
            "assert all(v.name == k for k, v in CACHE_POLICIES.items())\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
