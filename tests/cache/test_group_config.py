"""Per-group attention block sizes (``full@32``, ``swa:W@B``) and per-group EAGLE flags
(``eagle_groups: [i, ...]``, vLLM's ``KVCacheGroupSpec.is_eagle_group``) in ``config:``.

Equality with vLLM is checked by the goldens in ``tests/golden/cases/groups/`` (answers of
``tools/oracle_groups.py``, vLLM's real manager); these tests pin the config forms."""
from __future__ import annotations

import pytest

from sim.cache.case import run_case_data
from sim.cache.config import CacheConfig
from sim.errors import ConfigError


def test_attention_groups_take_their_own_block_size():
    cfg = CacheConfig.from_mapping({"groups": ["full@32", "swa:64@8", "mamba"],
                                    "block_size": 16, "mamba_block_size": 32})
    assert [(s.kind, s.block_size, s.window) for s in cfg.group_specs()] == [
        ("full", 32, 0), ("swa", 8, 64), ("mamba", 32, 0)]
    assert cfg.scheduler_block_size == 32 and cfg.hash_block_size == 8   # lcm, gcd


def test_two_full_groups_of_different_sizes():
    cfg = CacheConfig.from_mapping({"groups": ["full@32", "full"], "block_size": 16})
    assert [s.block_size for s in cfg.group_specs()] == [32, 16]


def test_a_hash_unit_that_does_not_divide_names_the_block_sizes():
    # each distinct size once, which ones the unit does not divide, and the nearest units
    # that divide them all
    with pytest.raises(ConfigError, match=r"16 must divide every group block size "
                                          r"\(here 8, 32 tokens; not 8\); use one that does, "
                                          r"e\.g\. 8$"):
        CacheConfig.from_mapping({"groups": ["full@32", "swa:64@8", "mamba"], "block_size": 16,
                                  "mamba_block_size": 32, "hash_block_size": 16})
    with pytest.raises(ConfigError, match=r"12 must divide every group block size "
                                          r"\(here 32 tokens\); use one that does, e\.g\. 8 "
                                          r"or 16$"):
        CacheConfig.from_mapping({"groups": ["full", "mamba"], "block_size": 32,
                                  "mamba_block_size": 32, "hash_block_size": 12})


@pytest.mark.parametrize("entry", ["mamba@16", "full@0", "full@x", "swa:8@", "full@-4"])
def test_bad_group_entries_are_refused(entry):
    with pytest.raises(ConfigError, match="groups"):
        CacheConfig.from_mapping({"groups": ["full", entry]})


@pytest.mark.parametrize("value", [[2], [0, 0], [], ["a"], [True], "some"])
def test_bad_eagle_groups_are_refused(value):
    with pytest.raises(ConfigError, match="eagle_groups"):
        CacheConfig.from_mapping({"groups": ["full", "swa:64"], "eagle_groups": value})


def test_eagle_flag_on_the_sliding_window_group_only():
    """Only the SWA group drops its trailing block: the full group keeps its 96 (vLLM's
    answer in tests/golden/cases/groups/g_full32_swa8_eagle_swa.yaml; all flagged gives 64, 64)."""
    def per_group(extra):
        data = {"config": {"groups": ["full@32", "swa:64@8"], "hash_block_size": 8,
                           "eagle": True, **extra},
                "requests": [{"id": "p", "prompt": "S:96 P:16"},
                             {"id": "c", "prompt": "S:96 C:8"}]}
        return next(r for r in run_case_data(data) if r["id"] == "c")["per_group"]

    assert per_group({"eagle_groups": [1]}) == [96, 64]
    assert per_group({}) == [64, 64]
