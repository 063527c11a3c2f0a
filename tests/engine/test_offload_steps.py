"""The CPU tier (``kv_offloading``) in step cases, against vLLM 0.33.0's real
``OffloadingConnector``, CPU manager and ``Scheduler`` (``offload_oracle.py``).

* ``tests/golden/offload/*.yaml`` (``tools/make_offload_goldens.py``): step cases whose
  ``expect`` / ``expect_offload_steps`` are the oracle's answers, checked without the oracle;
* the random differential test (``tools/diff_steps.py --profile offload``) and the oracle's
  hand-written cases on both sides, where the oracle is installed (else skipped).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import tools.diff_steps as ds
from sim.oracle import step_case
from sim.oracle.harness import BOTH_STALL, BOTH_STOP, COMPARED
from sim.oracle.keys import OFFLOAD, to_oracle_config
from sim.oracle.worker import oracle_unavailable

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = sorted((ROOT / "tests" / "golden" / "offload").glob("*.yaml"))
HAND = ROOT / "tests" / "golden" / "offload" / "hand" / "cases.json"
SEED = 20260402
N_CASES = 20


def test_offload_goldens_present():
    assert len(GOLDEN) >= 20, "regenerate with tools/make_offload_goldens.py"


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_offload_golden(path):
    from sim.commands.steps import run_steps_data

    data = yaml.safe_load(path.read_text())
    got = run_steps_data(data, str(path), per_step=True)
    res = {r["id"]: r for r in got["requests"]}
    bad = [f"{rid}.{k}: got {res[rid].get(k)!r}, want {v!r}"
           for rid, want in data["expect"].items() for k, v in want.items()
           if step_case._plain(res[rid].get(k)) != v]
    ours = step_case.offload_steps_canonical(got["offload_steps"])
    want = data["expect_offload_steps"]
    if ours != want:
        a = {s["step"]: s for s in ours}
        b = {s["step"]: s for s in want}
        step = min(s for s in set(a) | set(b) if a.get(s) != b.get(s))
        bad.append(f"step {step}: got {a.get(step)}, want {b.get(step)}")
    assert not bad, f"{path.name}: " + "; ".join(bad[:5])


# ------------------------------------------------------------------ no oracle needed --
def test_generator_covers_both_shapes_eagle_and_the_tier():
    specs = [ds.gen_case(SEED, i, "offload") for i in range(200)]
    assert specs == [ds.gen_case(SEED, i, "offload") for i in range(200)]
    cfgs = [s["config"] for s in specs]
    assert {tuple(c["groups"]) for c in cfgs} >= {("full", "mamba"),
                                                  ("mamba", "mamba", "mamba", "full")}
    assert any(c.get("eagle") for c in cfgs) and any(not c.get("eagle") for c in cfgs)
    assert {c["eviction_policy"] for c in cfgs} == {"lru", "arc"}
    assert {c["transfer_steps"] for c in cfgs} == {0, 1, 2, 3}
    assert any(c.get("blocks_per_chunk") for c in cfgs)
    assert any(c.get("offload_block_size") for c in cfgs)
    assert any(c.get("num_prefill_checkpoint_blocks") == 1 for c in cfgs)
    assert all(step_case.driver(s) == OFFLOAD for s in specs)
    assert "offload" in ds.PROFILES and "offload" in ds.OFFLOAD_PROFILES


def test_the_tier_goes_to_the_offload_driver_with_our_chunk_bytes():
    spec = ds.gen_case(SEED, 0, "offload")
    case = step_case.to_oracle(spec)
    assert case["kv_offloading_size_bytes"] == spec["config"]["kv_offloading_size_bytes"]
    assert case["kv_bytes_per_block"] == 4096 and case["page_size_alignment"] == 4096
    assert to_oracle_config({"eagle_groups": [0], "transfer_steps": 2}, OFFLOAD) == \
        {"eagle_groups": [0], "transfer_steps": 2}
    # an oracle case's own chunk bytes are its stand-in pages, under one 4 KiB page
    hand = step_case.from_oracle_case(json.loads(HAND.read_text())[0])
    assert hand["config"]["kv_bytes_per_block"] == 1
    assert [q["segments"] for q in hand["requests"]][0] == [["S", 0, 96], ["P_p", 0, 8]]


def test_a_tier_of_zero_bytes_is_refused_and_a_missing_size_names_the_key():
    from sim.cache.case import CaseError
    from sim.commands.steps import run_steps_data

    base = {"config": {"block_size": 16, "num_blocks": 64},
            "requests": [{"id": "a", "prompt": "A:40", "max_tokens": 2}]}
    with pytest.raises(CaseError, match="kv_offloading_size_bytes"):
        run_steps_data({**base, "config": {**base["config"], "eviction_policy": "arc"}})
    with pytest.raises(CaseError, match="kv_offloading_size_bytes"):
        run_steps_data({**base, "config": {**base["config"], "kv_offloading_size_bytes": 0}})


def test_without_host_hits_the_tier_changes_no_step():
    """A host pool too small to hold any prompt: every step is the one without the tier
    (but EAGLE's lookahead hashes, which a KV connector turns off)."""
    from sim.commands.steps import run_steps_data

    base = {"config": {"groups": ["full", "mamba"], "block_size": 16, "num_blocks": 40},
            "requests": [{"id": "a", "prompt": "S:64 A:20", "max_tokens": 3},
                         {"id": "b", "prompt": "S:64 B:9", "arrival_step": 1, "max_tokens": 4},
                         {"id": "c", "prompt": "S:64 A:20", "arrival_step": 9,
                          "max_tokens": 2}]}
    off = run_steps_data(base)
    on = run_steps_data({**base, "config": {**base["config"],
                                            "kv_offloading_size_bytes": 4096}})
    assert [{k: v for k, v in r.items() if k not in ("gpu_hit", "external_hit")}
            for r in on] == off
    assert all(r["external_hit"] == 0 for r in on)


def test_a_compare_looks_at_the_tiers_fields():
    spec = ds.gen_case(SEED, 1, "offload")
    ours = step_case.run_ours(spec)
    assert "offload_steps" in ours and "finish_ties" in ours
    # the oracle's answer rebuilt from ours matches; one admission changed does not
    reqs = []
    for r in ours["results"]:
        o = dict(r, preemptions=[{}] * r["preemptions"], num_output_tokens=r["output_tokens"])
        reqs.append(o)
    steps = {s["step"]: {"step": s["step"], "scheduled": s["scheduled"],
                         "spec_tokens": s["spec_tokens"]} for s in ours["steps"]}
    for rec in ours["offload_steps"]:
        steps.setdefault(rec["step"], {"step": rec["step"], "scheduled": {},
                                       "spec_tokens": {}})["offload"] = rec
    ans = {"config": {}, "totals": {}, "requests": reqs, "steps": sorted(
        steps.values(), key=lambda s: s["step"])}
    assert step_case.compare(spec, ours, ans).mismatches == []
    reqs[0] = dict(reqs[0], external_hit=(reqs[0]["external_hit"] or 0) + 16)
    assert step_case.compare(spec, ours, ans).fields == ["external_hit"]


# ------------------------------------------------------------------ with the oracle --
def test_diff_against_the_offload_oracle(capsys):
    why = oracle_unavailable(OFFLOAD)
    if why:
        pytest.skip(why)
    rc = ds.main(["--seed", str(SEED), "--cases", str(N_CASES), "--profile", "offload",
                  "--show", "1", "--tables", "0"])
    out = capsys.readouterr().out
    assert "offload_oracle vs sim.commands.steps" in out and "mismatching cases: 0" in out, out[:12000]
    assert rc == 0


def test_the_oracles_hand_cases_match():
    why = oracle_unavailable(OFFLOAD)
    if why:
        pytest.skip(why)
    from sim.oracle.harness import run_both
    from sim.oracle.worker import start_oracle

    specs = [step_case.from_oracle_case(c) for c in json.loads(HAND.read_text())]
    oracle = start_oracle(OFFLOAD, workers=1)
    try:
        summ = run_both(step_case.tester(oracle=OFFLOAD), specs, oracle)
    finally:
        oracle.close()
    assert summ.compared == len(specs) - 1 and summ.declined[BOTH_STALL] == 1
    assert not summ.mismatches, [o.verdict.mismatches[:3] for o in summ.mismatches]


def test_both_stop_where_vllm_fails_its_assertion():
    """vLLM 0.33.0's connector asserts one partial-tail boundary per request and step; an
    internal prefill checkpoint's state (MambaMixer2) kept since an earlier step and the
    copy of the prompt's tail state break it, and its engine dies: we stop there too."""
    why = oracle_unavailable(OFFLOAD)
    if why:
        pytest.skip(why)
    from sim.oracle.worker import start_oracle

    spec = yaml.safe_load((ROOT / "tests" / "golden" / "offload" / "hand" / "stop.yaml").read_text())
    oracle = start_oracle(OFFLOAD, workers=1)
    try:
        ans = oracle.run([step_case.to_oracle(spec)])[0]
    finally:
        oracle.close()
    ours = step_case.run_ours(spec)
    assert "stopped" in ours and "vLLM 0.33.0 stops here" in ours["message"]
    assert step_case.compare(spec, ours, ans).status == BOTH_STOP
    assert COMPARED != BOTH_STOP


def test_we_stop_where_the_oracle_died():
    spec = yaml.safe_load((ROOT / "tests" / "golden" / "offload" / "hand" / "stop.yaml").read_text())
    ours = step_case.run_ours(spec)
    assert "stopped" in ours, ours
    assert spec["oracle_error"].startswith(f"step {ours['stopped']}: AssertionError")
    assert "partial-tail" in ours["message"] and "num_prefill_checkpoint_blocks" in ours["message"]
