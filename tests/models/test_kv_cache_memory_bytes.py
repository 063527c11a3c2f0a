"""``kv_cache.kv_cache_memory_bytes`` (vLLM's ``--kv-cache-memory-bytes``): the pool from a
byte budget per GPU.  vLLM 0.33.0's worker skips the memory profile and hands the budget to
the planner, which sizes the pool as ``available_memory // bytes_per_block``; the
utilization is ignored.  Block sizes below are computed by hand from the model card."""
from __future__ import annotations

from pathlib import Path

import pytest

from sim.errors import ConfigError, InputError
from sim.config.scenario import ScenarioError, load_scenario
from sim.engine.replica import build_deployment

MOONCAKE = Path(__file__).resolve().parents[2] / "scenarios" / "mooncake-conversation.yaml"
GiB = 2**30
# Nemotron-H-8B, 1,088-token blocks: one attention page = 1,088 tokens x (K, V) x 8 KV heads
# x 128 x 2 bytes = 4,456,448 B; the scenario's EAGLE drafter adds one attention layer to
# the model's 4, so vLLM's hybrid planner groups layers by 5 (one attention group, the 24
# Mamba layers in 5 groups) and one pool block is 5 pages.
PAGE = 1088 * 2 * 8 * 128 * 2
BLOCK = 5 * PAGE


def deploy(**over):
    return build_deployment(load_scenario(MOONCAKE, over))


def test_blocks_are_the_budget_over_the_pool_block():
    assert PAGE == 4_456_448 and BLOCK == 22_282_240
    d = deploy(**{"kv_cache.kv_cache_memory_bytes": 4_000_000_000})
    assert d.block_bytes == BLOCK
    assert d.num_blocks == 179                 # 4e9 // 22,282,240 = 179 (179.5 floored)
    d = deploy(**{"kv_cache.kv_cache_memory_bytes": 16 * GiB})
    assert d.num_blocks == 16 * GiB // BLOCK == 771


def test_the_budget_ignores_gpu_memory_utilization():
    a = deploy(**{"kv_cache.kv_cache_memory_bytes": 8 * GiB, "gpu.gpu_memory_utilization": 0.5})
    b = deploy(**{"kv_cache.kv_cache_memory_bytes": 8 * GiB, "gpu.gpu_memory_utilization": 0.95})
    assert a.num_blocks == b.num_blocks == 8 * GiB // BLOCK
    assert deploy().num_blocks != a.num_blocks     # without it: the profiled budget


@pytest.mark.parametrize("value", [0, -5, 1.5, True, "16GiB"])
def test_bad_values_are_refused(value):
    with pytest.raises(ScenarioError, match=r"kv_cache\.kv_cache_memory_bytes: must be an integer"):
        load_scenario(MOONCAKE, {"kv_cache.kv_cache_memory_bytes": value})


def test_mutually_exclusive_with_the_block_override():
    with pytest.raises(ScenarioError, match=r"kv_cache\.kv_cache_memory_bytes: set either"):
        load_scenario(MOONCAKE, {"kv_cache.kv_cache_memory_bytes": 8 * GiB,
                                 "kv_cache.num_gpu_blocks_override": 100})


@pytest.mark.parametrize("value, why", [(BLOCK - 1, "holds no block"),
                                        (200 * GiB, "does not fit on H200")])
def test_budgets_without_a_block_or_beyond_the_gpu(value, why):
    with pytest.raises(ConfigError, match=rf"^kv_cache\.kv_cache_memory_bytes: .*{why}") as e:
        deploy(**{"kv_cache.kv_cache_memory_bytes": value})
    assert isinstance(e.value, InputError) and "\n" not in str(e.value)
