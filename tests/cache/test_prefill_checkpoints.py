"""Internal prefill checkpoints (vLLM 0.33.0 ``MambaSpec.num_prefill_checkpoint_blocks`` /
``prefill_checkpoint_alignment``): how a scenario gets them from its model, and what they do.

Hit lengths and chunk ends with checkpoints on are pinned against vLLM's real manager and
scheduler by the goldens (``tests/golden/cases/checkpoints/`` from the oracle's ``ckpt_cases``,
``tests/golden/steps/ckpt_*.yaml`` from ``sched_oracle.py``); these tests cover the wiring.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim.cache.config import CacheConfig
from sim.cache.kv_manager import KVCacheManager
from sim.cache.rules import prefill_checkpoint_valid
from sim.errors import ConfigError, InputError
from sim.config.scenario import load_scenario
from sim.engine.replica import build_deployment

ROOT = Path(__file__).resolve().parents[2]


def _mamba_specs(kv: KVCacheManager):
    return [s for s in kv.coordinator.specs if s.kind == "mamba"]


@pytest.mark.parametrize("start,end,ckpt,expect", [
    (0, 100, 48, True),       # chunk from 0: the exported column lies past the start column
    (16, 32, 24, False),      # the exported column (0) is the one the chunk starts from
    (4, 100, 48, False),      # start off the hash grid (unit 4 would allow it; unit 8 not)
    (0, 100, 100, False),     # checkpoint must be strictly inside the chunk
    (0, 100, 4, False),       # at least one hash unit into the chunk
])
def test_rule_matches_vllm_conditions(start, end, ckpt, expect):
    # answers of vLLM 0.33.0's is_mamba_prefill_checkpoint_valid (oracle venv), hash unit 8,
    # Mamba block 16, alignment 1
    assert prefill_checkpoint_valid(start, end, ckpt, 8, 16, 1) is expect


def test_alignment_none_means_no_checkpoint():
    assert prefill_checkpoint_valid(0, 100, 48, 8, 16, 0) is False
    assert prefill_checkpoint_valid(0, 100, 48, 8, 16, 16) is True
    assert prefill_checkpoint_valid(0, 100, 40, 8, 16, 16) is False   # 40 off the 16 grid


def test_case_config_keys_reach_every_mamba_group():
    cfg = CacheConfig(groups=("full", "mamba", "mamba"), block_size=16, hash_block_size=4,
                      num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=4)
    specs = [s for s in cfg.group_specs() if s.kind == "mamba"]
    assert [(s.prefill_checkpoint_blocks, s.prefill_checkpoint_alignment) for s in specs] == \
        [(1, 4), (1, 4)]
    kv = KVCacheManager(cfg)
    split = kv.split_policy()
    assert split.prefill_checkpoints and split.prefill_checkpoint_alignment == 4
    # off: vLLM's spec keeps alignment None, and the scheduler keeps splitting
    off = KVCacheManager(CacheConfig(groups=("full", "mamba"), block_size=16))
    assert not off.split_policy().prefill_checkpoints


@pytest.mark.parametrize("key,value", [("num_prefill_checkpoint_blocks", -1),
                                       ("prefill_checkpoint_alignment", 0)])
def test_bad_case_values_are_refused(key, value):
    with pytest.raises(ConfigError, match=key):
        CacheConfig(**{key: value})


def test_final_chunk_runs_through_the_checkpoint():
    """athena's shape (block 4,416, unit 64, legacy EAGLE drop): without checkpoints the final
    chunk stops at the prompt checkpoint 58,304; with them it runs to the end in one pass
    (oracle ckpt_cases athena_L0_ck0 / ck1)."""
    def ends(n: int) -> list[int]:
        kv = KVCacheManager(CacheConfig(groups=("full", "mamba"), block_size=4416,
                                        hash_block_size=64, eagle=True, num_blocks=4096,
                                        prefix_cache_retention_interval=0,
                                        num_prefill_checkpoint_blocks=n))
        split = kv.split_policy()
        out, done = [], 0
        while done < 58400:
            got = split.split(58400, 58400, done, 0, min(8192, 58400 - done), 0, 8192, 0)
            done += got
            out.append(done)
        return out
    assert ends(0)[-3:] == [52992, 58304, 58400]
    assert ends(1)[-2:] == [52992, 58400]


def _deploy(tmp_path: Path, model: str, extra: str = "", gpu: str = "H200"):
    text = (ROOT / "scenarios" / "athena.yaml").read_text()
    sc = load_scenario(ROOT / "scenarios" / "athena.yaml",
                       overrides={"model": model, "gpu.type": gpu, "cache.hash_block_size": 16,
                                  "speculative.method": None if model != "nemotron-3-super-120b"
                                  else "mtp",
                                  **({} if not extra else dict(
                                      (k, yaml.safe_load(v)) for k, v in
                                      (kv.split("=", 1) for kv in extra.split(","))))})
    assert text   # (the base scenario exists)
    return build_deployment(sc)


def test_scenario_takes_checkpoints_from_the_model(tmp_path):
    # Nemotron (MambaMixer2): 1 block, alignment 1, on every Mamba group
    dep = _deploy(tmp_path, "nemotron-h-8b")
    assert {(s.prefill_checkpoint_blocks, s.prefill_checkpoint_alignment)
            for s in _mamba_specs(dep.kv)} == {(1, 1)}
    # Jamba (MambaMixer): none
    dep = _deploy(tmp_path, "jamba-1.5-mini")
    assert {s.prefill_checkpoint_blocks for s in _mamba_specs(dep.kv)} == {0}
    assert not dep.kv.split_policy().prefill_checkpoints


def test_gdn_checkpoints_follow_the_prefill_backend(tmp_path):
    dep = _deploy(tmp_path, "qwen3-next-80b-a3b")            # H200: FlashInfer
    assert dep.layout.block_size % 64 == 0
    assert {(s.prefill_checkpoint_blocks, s.prefill_checkpoint_alignment)
            for s in _mamba_specs(dep.kv)} == {(1, 64)}        # lcm(hash unit 16, 64)
    tri = _deploy(tmp_path, "qwen3-next-80b-a3b", "kv_cache.gdn_prefill_backend=triton")
    assert {s.prefill_checkpoint_blocks for s in _mamba_specs(tri.kv)} == {0}


def test_kv_cache_section_overrides_the_model(tmp_path):
    dep = _deploy(tmp_path, "nemotron-h-8b", "kv_cache.num_prefill_checkpoint_blocks=0")
    assert {s.prefill_checkpoint_blocks for s in _mamba_specs(dep.kv)} == {0}
    # the per-request Mamba reservation grows by the checkpoint block (vLLM 2 + K + 1)
    on = _deploy(tmp_path, "nemotron-h-8b")
    m_on = on.kv.coordinator.mamba_managers[0]
    m_off = dep.kv.coordinator.mamba_managers[0]
    assert m_on.max_blocks_per_request == m_off.max_blocks_per_request + 1


def test_bad_kv_cache_values_name_the_field(tmp_path):
    with pytest.raises(InputError, match="kv_cache.gdn_prefill_backend"):
        _deploy(tmp_path, "qwen3-next-80b-a3b", "kv_cache.gdn_prefill_backend=cutlass")
    with pytest.raises(InputError, match="kv_cache.prefill_checkpoint_alignment"):
        _deploy(tmp_path, "nemotron-h-8b", "kv_cache.prefill_checkpoint_alignment=0")
