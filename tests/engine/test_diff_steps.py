"""Random differential test: our step engine against vLLM 0.33.0's real ``Scheduler``.

Drives ``tools/diff_steps.py`` (see its docstring) on a small fixed-seed sample.  The oracle
(``sched_oracle.py`` in the oracle folder, see ``tools/oracle_worker.py``) runs in its own venv
(``$HOME/.vllm-oracle/venv/bin/python``, or ``$VLLM_ORACLE_PYTHON``); without it the
differential test is skipped.  The generator / mapping tests need no oracle.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "diff_steps.py"


def _load_tool():
    spec = importlib.util.spec_from_file_location("diff_steps", TOOL)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("diff_steps", mod)
    spec.loader.exec_module(mod)
    return mod


ds = _load_tool()

SEED = 20250101
N_CASES = 25
MOONCAKE = Path(__file__).resolve().parents[2] / "data" / "traces" / "mooncake_fast25" / \
    "conversation_trace.jsonl"


# ------------------------------------------------------------------ no oracle needed --
def test_generator_is_reproducible():
    a = [ds.gen_case(SEED, i) for i in range(20)]
    assert a == [ds.gen_case(SEED, i) for i in range(20)]
    assert ds.gen_case(SEED, 7) == a[7]  # case i depends only on (seed, i)
    assert a != [ds.gen_case(SEED + 1, i) for i in range(20)]


def test_generator_covers_the_brief():
    specs = [ds.gen_case(SEED, i) for i in range(300)]
    cfgs = [s["config"] for s in specs]
    layouts = {tuple(c["groups"][:2]) + (len(c["groups"]),) for c in cfgs}
    assert ("full", "mamba", 2) in layouts and ("full", "mamba", 3) in layouts
    assert any(c["groups"][1].startswith("swa:") for c in cfgs)
    assert {c["block_size"] for c in cfgs} == {16, 32, 64}
    assert any(c.get("mamba_block_size", c["block_size"]) == 4 * c["block_size"] for c in cfgs)
    assert any(c.get("eagle") and c.get("eagle_lookahead_hashes") for c in cfgs)
    assert any(c.get("eagle") and not c.get("eagle_lookahead_hashes") for c in cfgs)
    assert {c.get("num_speculative_tokens", 0) for c in cfgs} == {0, 1, 2, 3}
    assert all(c.get("accepted_tokens", 0) <= c.get("num_speculative_tokens", 0) for c in cfgs)
    assert any(c["num_blocks"] <= 40 for c in cfgs) and any(c["num_blocks"] >= 1024 for c in cfgs)
    assert any(c["max_num_batched_tokens"] <= 256 for c in cfgs)
    assert {c.get("prefix_cache_retention_interval") for c in cfgs} == {None, 0}
    assert {bool(c.get("shared_prefix_checkpoint")) for c in cfgs} == {False, True}
    kinds = {q["kind"] for s in specs for q in s["requests"]}
    assert kinds == {"fresh", "replay", "turn", "private"}
    assert all(2 <= len(s["requests"]) <= 8 for s in specs)
    assert all(1 <= q["max_tokens"] <= 40 for s in specs for q in s["requests"])


def test_both_sides_get_the_same_token_ids():
    spec = ds.gen_case(SEED, 3)
    ours = ds.to_ours(spec)
    oracle = ds.to_oracle(spec)
    assert [r["prompt"] for r in ours["requests"]] == [r["tokens"]["ids"] for r in oracle["requests"]]
    assert [r["arrival_step"] for r in ours["requests"]] == [r["arrival"] for r in oracle["requests"]]
    # replays and multi-turn extensions share exactly their common prefix
    for q in spec["requests"]:
        if q["kind"] == "turn":
            ids = ds.token_ids(spec, q)
            assert any(ids[:len(ds.token_ids(spec, p))] == ds.token_ids(spec, p)
                       for p in spec["requests"] if p is not q)


def test_ours_runs_every_generated_case_and_yaml_is_runnable(tmp_path):
    import yaml

    from sim.steps import run_steps_file

    for i in range(15):
        spec = ds.gen_case(SEED, i)
        got = ds.run_ours(spec, timeout=30)
        assert "results" in got or "hang" in got, got
        path = tmp_path / f"{i}.yaml"
        path.write_text(ds.ours_yaml(spec, None))
        data = yaml.safe_load(path.read_text())
        assert data["requests"][0]["prompt"] == ds.prompt_notation(spec["requests"][0])
        if "results" in got:
            assert run_steps_file(path) == ds.run_ours(spec, literal=False)["results"]


def test_compare_maps_the_oracle_fields():
    spec = {"name": "t", "config": {"groups": ["full", "mamba"], "block_size": 16},
            "requests": [{"id": "a", "segments": [["s", 0, 20]], "arrival": 0, "max_tokens": 2,
                          "kind": "fresh"}]}
    mine = {"id": "a", "first_scheduled_step": 0, "hit": 0, "junction": 0, "chunk_ends": [16, 20],
            "chunk_end_steps": [0, 1], "first_token_step": 1, "finish_step": 2,
            "preemptions": 1, "output_tokens": 2}
    theirs = dict(mine, preemptions=[{"step": 1}], num_output_tokens=2)
    del theirs["output_tokens"]
    ans = {"config": {}, "requests": [theirs]}
    assert ds.compare(spec, {"results": [mine]}, ans) == ("compared", [])
    # a chunk list that goes on through the re-prefill after a preemption is labelled
    theirs2 = dict(theirs, chunk_ends=[16], chunk_end_steps=[0])
    _, mm = ds.compare(spec, {"results": [mine]}, dict(ans, requests=[theirs2]))
    assert {m[0] for m in mm} == {"chunk_ends@replay", "chunk_end_steps@replay"}


def test_mooncake_case_is_the_trace_on_the_seven_group_layout():
    spec = ds.mooncake_case(MOONCAKE, 40, start=2000, num_blocks=300)
    cfg = spec["config"]
    assert cfg["groups"] == ["full"] + ["mamba"] * 6 and cfg["block_size"] == 1088
    assert [q["id"] for q in spec["requests"]] == [f"r{i:07d}" for i in range(2000, 2040)]
    assert spec["requests"][0]["arrival"] == 0
    longest = max(sum(sg[2] for sg in q["segments"]) + q["max_tokens"]
                  for q in spec["requests"])
    assert cfg["max_model_len"] > longest
    ours = ds.run_ours(spec, timeout=120)
    res = ours["results"]
    assert len(res) == 40 and all(r["finish_step"] is not None for r in res)
    # the small pool makes the scheduler preempt (recompute) some requests
    assert sum(r["preemptions"] for r in res) > 0


# ------------------------------------------------------------------ with the oracle --
def test_mooncake_slice_matches_the_step_oracle(capsys):
    """A real trace slice (long prompts, seven groups, a pool small enough to preempt)."""
    why = ds.oracle_unavailable("sched_oracle")
    if why:
        pytest.skip(why)
    rc = ds.main(["--mooncake", str(MOONCAKE), "--cases", "60", "--start", "2000",
                  "--num-blocks", "300", "--show", "1", "--tables", "0", "--timeout", "120"])
    out = capsys.readouterr().out
    assert "compared 1 cases, 60 requests" in out
    assert rc == 0, out[:12000]


def test_diff_against_the_step_oracle(capsys):
    why = ds.oracle_unavailable("sched_oracle")
    if why:
        pytest.skip(why)
    py = ds.default_oracle_python()
    rc = ds.main(["--seed", str(SEED), "--cases", str(N_CASES), "--oracle-python", str(py),
                  "--classify", "--show", "1", "--tables", "1"])
    out = capsys.readouterr().out
    assert f"compared {N_CASES} cases" in out or "rejected by both" in out
    # the summary and the per-case class labels come first; one case in full after them
    assert rc == 0, out[:12000]
