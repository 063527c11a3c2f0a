"""The one key table between our case keys and the vLLM oracle's (``sim/oracle/keys.py``).

The tests that read the oracle's own files skip where the oracle folder is absent."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sim.oracle.keys import (
    KEYS,
    KV,
    STEPS,
    OracleKeyError,
    from_oracle_config,
    oracle_keys,
    to_oracle_config,
    unmapped_oracle_keys,
)
from sim.oracle.worker import default_oracle_dir

ORACLE = default_oracle_dir()
needs_oracle = pytest.mark.skipif(not (ORACLE / "oracle.py").is_file(),
                                  reason=f"vLLM oracle folder not found ({ORACLE})")


def test_each_key_is_named_once_per_side():
    assert len({k.ours for k in KEYS}) == len(KEYS)
    for oracle in (KV, STEPS):
        names = list(oracle_keys(oracle).values())
        assert len(set(names)) == len(names), oracle


def test_the_drivers_name_the_same_setting_differently():
    cfg = {"groups": ["full", "mamba"], "block_size": 16, "max_num_batched_tokens": 64,
           "hash_block_size": None, "prefix_cache_retention_interval": 0}
    assert to_oracle_config(cfg, KV) == {"layout": ["full", "mamba"], "block": 16,
                                         "max_num_scheduled_tokens": 64, "retention": 0}
    assert to_oracle_config(cfg, STEPS)["max_num_batched_tokens"] == 64
    # a key one driver lacks is refused, naming it
    with pytest.raises(OracleKeyError, match=r"config\.num_hash_lookahead_tokens.*sched_oracle"):
        to_oracle_config({"num_hash_lookahead_tokens": 1}, STEPS)
    with pytest.raises(OracleKeyError, match=r"config\.max_num_seqs"):
        to_oracle_config({"max_num_seqs": 4}, KV)
    with pytest.raises(OracleKeyError, match=r"config\.prompt_checkpoint"):
        to_oracle_config({"prompt_checkpoint": "seed"}, KV)


def test_internal_prefill_checkpoints_keep_vllms_names_in_both_drivers():
    cfg = {"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 16}
    for oracle in (KV, STEPS):
        assert to_oracle_config(cfg, oracle) == cfg
        assert from_oracle_config(cfg, oracle) == cfg
    # absent from an oracle case: not written back (vLLM's default, off)
    assert "num_prefill_checkpoint_blocks" not in from_oracle_config({"block": 4}, KV,
                                                                     defaults=True)


def test_back_translation_writes_oracle_py_defaults_in_table_order():
    cfg = from_oracle_config({"lookahead": 1, "block": 32, "hash": 8}, KV, defaults=True)
    assert list(cfg)[:4] == ["groups", "block_size", "hash_block_size", "eagle"]
    assert cfg["block_size"] == 32 and cfg["num_hash_lookahead_tokens"] == 1
    assert cfg["num_blocks"] == 256 and cfg["max_num_batched_tokens"] == 1 << 20
    assert "mamba_block_size" not in cfg          # its default is the block size: left out
    assert unmapped_oracle_keys({"block": 4, "max_hit": 3, "id": "x"}, KV, {"id"}) == {"max_hit"}


@needs_oracle
@pytest.mark.parametrize("oracle", [KV, STEPS])
def test_every_oracle_name_in_the_table_is_a_key_the_driver_reads(oracle):
    src = (ORACLE / f"{oracle}.py").read_text()
    if oracle == KV:   # (the keys tools/oracle_groups.py adds on top of oracle.py)
        src += (Path(__file__).resolve().parents[2] / "tools" / "oracle_groups.py").read_text()
    read = set(re.findall(r"""case(?:\.get\(|\[)["'](\w+)["']""", src))
    assert set(oracle_keys(oracle).values()) <= read


@needs_oracle
def test_the_oracles_shipped_step_cases_round_trip():
    n = 0
    for path in sorted(ORACLE.glob("sched*_cases.json")):
        for case in json.loads(path.read_text()):
            cfg_keys = set(case) - {"id", "requests", "policy", "kv_events", "max_steps"}
            assert not unmapped_oracle_keys(case, STEPS, {"id", "requests", "policy",
                                                          "kv_events", "max_steps"}), path
            ours = from_oracle_config(case, STEPS)
            assert to_oracle_config(ours, STEPS) == {k: case[k] for k in cfg_keys}
            n += 1
    assert n >= 15
