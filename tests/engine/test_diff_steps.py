"""Random differential test: our step engine against vLLM 0.33.0's real ``Scheduler``.

Drives ``tools/diff_steps.py`` (see its docstring) on a small fixed-seed sample.  The oracle
(``sched_oracle.py`` in the oracle folder, see ``sim/oracle/worker.py``) runs in its own venv
(``$HOME/.vllm-oracle/venv/bin/python``, or ``$VLLM_ORACLE_PYTHON``); without it the
differential test is skipped.  The generator / mapping tests need no oracle.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import tools.diff_steps as ds
from sim.oracle import step_case
from sim.oracle.harness import COMPARED, Verdict
from sim.oracle.keys import STEPS
from sim.oracle.segments import prompt_notation, stream_numbers, token_ids
from sim.oracle.worker import default_oracle_python, oracle_unavailable

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


def _ids(spec: dict, q: dict) -> list[int]:
    return token_ids(q["segments"], stream_numbers(r["segments"] for r in spec["requests"]))


def test_both_sides_get_the_same_token_ids():
    spec = ds.gen_case(SEED, 3)
    ours = step_case.to_ours(spec)
    oracle = step_case.to_oracle(spec)
    assert [r["prompt"] for r in ours["requests"]] == [r["tokens"]["ids"] for r in oracle["requests"]]
    assert [r["arrival_step"] for r in ours["requests"]] == [r["arrival"] for r in oracle["requests"]]
    # replays and multi-turn extensions share exactly their common prefix
    for q in spec["requests"]:
        if q["kind"] == "turn":
            ids = _ids(spec, q)
            assert any(ids[:len(_ids(spec, p))] == _ids(spec, p)
                       for p in spec["requests"] if p is not q)


def test_ours_runs_every_generated_case_and_yaml_is_runnable(tmp_path):
    import yaml

    from sim.commands.steps import run_steps_file

    for i in range(15):
        spec = ds.gen_case(SEED, i)
        got = step_case.run_ours(spec, timeout=30)
        assert "results" in got or "hang" in got, got
        path = tmp_path / f"{i}.yaml"
        path.write_text(ds.ours_yaml(spec, None))
        data = yaml.safe_load(path.read_text())
        assert data["requests"][0]["prompt"] == prompt_notation(spec["requests"][0]["segments"])
        if "results" in got:
            assert run_steps_file(path) == step_case.run_ours(spec, literal=False)["results"]


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
    assert step_case.compare(spec, {"results": [mine]}, ans) == Verdict(COMPARED, [], 1)
    # a chunk list that goes on through the re-prefill after a preemption is labelled
    theirs2 = dict(theirs, chunk_ends=[16], chunk_end_steps=[0])
    ans2 = dict(ans, requests=[theirs2])
    v = step_case.compare(spec, {"results": [mine]}, ans2)
    assert v.fields == ["chunk_end_steps@replay", "chunk_ends@replay"]
    # --assume replay-chunks looks past exactly that class
    opts = ds.Options().assuming(["replay-chunks"])
    assert step_case.compare(spec, {"results": [mine]}, ans2, opts.ignore).mismatches == []
    # a hang where vLLM ran out of steps too is a stall on both sides, not a mismatch
    assert step_case.compare(spec, {"hang": 5}, {"config": {}, "error": "max_steps 2000"}
                             ).status == "both_stall"


def test_ckpt_profile_turns_internal_checkpoints_on_in_most_cases():
    specs = [ds.gen_case(SEED, i, "ckpt") for i in range(200)]
    on = [s["config"] for s in specs if s["config"].get("num_prefill_checkpoint_blocks") == 1]
    assert len(on) >= 100
    aligns = [c.get("prefill_checkpoint_alignment", 1) for c in on]
    assert aligns.count(1) > len(on) / 2 and 16 in aligns and any(a not in (1, 16) for a in aligns)
    assert "ckpt" in ds.PROFILES and "ckpt" not in ds.OPT_IN_PROFILES   # checked in CI
    assert not any("num_prefill_checkpoint_blocks" in ds.gen_case(SEED, i)["config"]
                   for i in range(200))
    # the default case of the same index otherwise (a pool grown by the checkpoint blocks)
    base = ds.gen_case(SEED, 4)
    ck = ds.gen_case(SEED, 4, "ckpt")
    assert ck["requests"] == base["requests"] and ck["name"] == "k" + base["name"][1:]
    assert ck["config"]["groups"] == base["config"]["groups"]
    case = step_case.to_oracle(specs[[s["config"] for s in specs].index(on[0])])
    assert case["num_prefill_checkpoint_blocks"] == 1


def test_mooncake_case_is_the_trace_on_the_seven_group_layout():
    spec = ds.mooncake_case(MOONCAKE, 40, start=2000, num_blocks=300)
    cfg = spec["config"]
    assert cfg["groups"] == ["full"] + ["mamba"] * 6 and cfg["block_size"] == 1088
    assert [q["id"] for q in spec["requests"]] == [f"r{i:07d}" for i in range(2000, 2040)]
    assert spec["requests"][0]["arrival"] == 0
    longest = max(sum(sg[2] for sg in q["segments"]) + q["max_tokens"]
                  for q in spec["requests"])
    assert cfg["max_model_len"] > longest
    ours = step_case.run_ours(spec, timeout=120)
    res = ours["results"]
    assert len(res) == 40 and all(r["finish_step"] is not None for r in res)
    # the small pool makes the scheduler preempt (recompute) some requests
    assert sum(r["preemptions"] for r in res) > 0


# ------------------------------------------------------------------ with the oracle --
def test_mooncake_slice_matches_the_step_oracle(capsys):
    """A real trace slice (long prompts, seven groups, a pool small enough to preempt)."""
    why = oracle_unavailable(STEPS)
    if why:
        pytest.skip(why)
    rc = ds.main(["--mooncake", str(MOONCAKE), "--cases", "60", "--start", "2000",
                  "--num-blocks", "300", "--show", "1", "--tables", "0", "--timeout", "120"])
    out = capsys.readouterr().out
    assert "compared 1 cases, 60 requests" in out
    assert rc == 0, out[:12000]


@pytest.mark.parametrize("profile", ["default", "ckpt"])
def test_diff_against_the_step_oracle(capsys, profile):
    why = oracle_unavailable(STEPS)
    if why:
        pytest.skip(why)
    py = default_oracle_python()
    rc = ds.main(["--seed", str(SEED), "--cases", str(N_CASES), "--oracle-python", str(py),
                  "--profile", profile, "--classify", "--show", "1", "--tables", "1"])
    out = capsys.readouterr().out
    assert f"compared {N_CASES} cases" in out or "rejected by both" in out
    # the summary and the per-case class labels come first; one case in full after them
    assert rc == 0, out[:12000]
