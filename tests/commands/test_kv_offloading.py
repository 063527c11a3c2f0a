"""The CPU tier in ``sim run`` (``kv_offloading:``, sim/config/kv_offloading.py): the
section, a run without it byte for byte, the outputs it adds, its transfers on the host
links, and where vLLM 0.33.0's connector stops."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from sim.cache.offload_stop import ConnectorAssertion
from sim.config.scenario import ScenarioError, load_scenario
from sim.rundir.records import OFFLOAD_COLUMNS, OFFLOAD_MEMORY_COLUMNS, OFFLOAD_SUMMARY_FIELDS
from sim.commands.run import simulate, write_run

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "athena-tiny.yaml"
# a GPU pool small enough that the two system prompts leave it; MambaMixer2's internal
# prefill checkpoints off (with them and a hash unit under the block, vLLM's connector
# stops on these arrivals: test_where_vllms_connector_fails_the_run_stops)
SMALL = {"kv_cache.num_gpu_blocks_override": 30, "kv_cache.num_prefill_checkpoint_blocks": 0}


def _run(tmp_path: Path, name: str, **sets):
    sc = load_scenario(TINY, {**SMALL, **sets})
    dep, rows, summary = simulate(sc)
    write_run(tmp_path / name, sc, dep, rows, summary, report=False)
    return tmp_path / name, dep, summary


@pytest.mark.parametrize("sets,field", [
    ({"kv_offloading.eviction_policy": "mru"}, "kv_offloading.eviction_policy"),
    ({"kv_offloading.size_gb": -1}, "kv_offloading.size_gb"),
    ({"kv_offloading.block_size": 96, "kv_offloading.blocks_per_chunk": 2},
     "kv_offloading.block_size"),
    ({"kv_offloading.load_bandwidth_gb_s": 0}, "kv_offloading.load_bandwidth_gb_s"),
    ({"kv_offloading.size_gb": "lots"}, "kv_offloading.size_gb"),
    ({"kv_offloading.nope": 1}, "kv_offloading.nope"),
])
def test_a_bad_section_names_the_field(sets, field):
    with pytest.raises(ScenarioError, match=field.replace(".", r"\.")):
        load_scenario(TINY, sets)


def test_size_zero_is_the_run_without_a_tier(tmp_path):
    a, _, _ = _run(tmp_path, "none")
    b, dep, _ = _run(tmp_path, "zero", **{"kv_offloading.size_gb": 0})
    assert dep.offload is None
    for f in ("requests.csv", "memory.csv"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    strip = lambda p: {k: v for k, v in json.loads((p / "summary.json").read_text()).items()
                       if k not in ("wall_s", "sim_requests_per_s")}
    assert strip(a) == strip(b)


def test_the_tier_adds_its_columns_and_fields(tmp_path):
    out, dep, summary = _run(tmp_path, "on", **{"kv_offloading.size_gb": 1})
    rows = list(csv.DictReader((out / "requests.csv").open()))
    assert list(rows[0])[-len(OFFLOAD_COLUMNS):] == list(OFFLOAD_COLUMNS)
    cpu = [int(r["cpu_hit_tokens"]) for r in rows]
    assert sum(cpu) > 0 and summary["cpu_hit_tokens"] == sum(cpu)
    assert summary["cpu_token_hit_rate"] == sum(cpu) / summary["prompt_tokens"]
    assert sum(int(r["cpu_no_state_tokens"]) for r in rows) == \
        summary["miss_cpu_no_state_tokens"]
    keys = list(summary)
    assert keys[-2:] == ["wall_s", "sim_requests_per_s"]
    assert tuple(keys[-2 - len(OFFLOAD_SUMMARY_FIELDS):-2]) == OFFLOAD_SUMMARY_FIELDS
    conn = dep.offload
    # 1 GiB over 48-token pool blocks of one GPU, each chunk rounded up to 4 KiB pages
    assert summary["host_chunks"] == (1 << 30) // summary["host_chunk_bytes"]
    assert summary["host_chunk_bytes"] % 4096 == 0 and summary["host_chunk_bytes"] >= dep.block_bytes
    assert summary["offload_loaded_bytes"] == conn.loaded_blocks * dep.block_bytes > 0
    assert summary["offload_stored_bytes"] >= summary["offload_loaded_bytes"]
    assert 0 < summary["host_chunks_peak"] <= summary["host_chunks"]
    mem = list(csv.reader((out / "memory.csv").open()))
    assert mem[0][-1] == OFFLOAD_MEMORY_COLUMNS[0]
    assert max(int(r[-1]) for r in mem[1:]) <= summary["host_chunks_peak"]


def test_loads_take_their_bytes_time_on_the_host_link(tmp_path):
    _, _, fast = _run(tmp_path, "fast", **{"kv_offloading.size_gb": 1})
    _, _, slow = _run(tmp_path, "slow", **{"kv_offloading.size_gb": 1,
                                           "kv_offloading.load_bandwidth_gb_s": 0.01})
    assert fast["cpu_hit_tokens"] > 0
    # at 10 MB/s a loaded block (~96 KB) takes ~10 ms: the loading requests wait for it
    assert slow["mean_ttft_ms"] > fast["mean_ttft_ms"] + 5


def test_the_tier_needs_vllms_policy():
    sc = load_scenario(TINY, {**SMALL, "kv_offloading.size_gb": 1, "cache.policy": "ideal"})
    from sim.errors import ConfigError

    with pytest.raises(ConfigError, match="kv_offloading.size_gb.*cache.policy vllm"):
        simulate(sc)


def test_where_vllms_connector_fails_the_run_stops():
    sc = load_scenario(TINY, {"kv_cache.num_gpu_blocks_override": 30,
                              "kv_offloading.size_gb": 1})
    with pytest.raises(ConnectorAssertion, match="vLLM 0.33.0 stops here.*partial-tail"):
        simulate(sc)


def test_a_fleet_gives_each_replica_its_own_tier(tmp_path):
    """replicas: 1 with a tier is the run alone (every column, then ``replica``); with two
    replicas each has a tier of size_gb, and the summary's tier fields are the replicas'
    summed, as its pool_bytes is."""
    tier = {"kv_offloading.size_gb": 1}
    alone, _, s_alone = _run(tmp_path, "alone", **tier)
    one, _, s_one = _run(tmp_path, "one", **tier, **{"cluster.replicas": 1})
    a = list(csv.reader((alone / "requests.csv").open()))
    b = list(csv.reader((one / "requests.csv").open()))
    cols = b[0]
    assert cols[-len(OFFLOAD_COLUMNS):] == list(OFFLOAD_COLUMNS) and "replica" in cols
    keep = [cols.index(c) for c in a[0]]
    assert [[r[i] for i in keep] for r in b] == a
    mem_a = list(csv.reader((alone / "memory.csv").open()))
    mem_b = list(csv.reader((one / "memory.csv").open()))
    assert mem_b[0] == mem_a[0] + ["replica"] and mem_a[0][-1] == OFFLOAD_MEMORY_COLUMNS[-1]
    assert [r[:-1] for r in mem_b] == mem_a
    assert s_alone["cpu_hit_tokens"] > 0       # (the tier serves here)
    for k in OFFLOAD_SUMMARY_FIELDS:
        assert s_one[k] == s_alone[k], k
    two, dep, s_two = _run(tmp_path, "two", **tier, **{"cluster.replicas": 2})
    conns = [r.dep.offload for r in dep.replicas]
    assert len(conns) == 2 and conns[0] is not conns[1]
    assert s_two["host_chunks"] == sum(c.pool.num_chunks for c in conns)
    assert s_two["kv_offloading_size_bytes"] == 2 * s_alone["kv_offloading_size_bytes"]
    rows = list(csv.DictReader((two / "requests.csv").open()))
    assert s_two["cpu_hit_tokens"] == sum(int(r["cpu_hit_tokens"]) for r in rows
                                          if r["cpu_hit_tokens"] != "")
