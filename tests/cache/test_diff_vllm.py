"""Random differential test: our cache model against vLLM 0.33.0's real KV-cache manager.

Drives ``tools/diff_vllm.py`` (see its docstring) on a small fixed-seed sample.  The oracle
lives in a separate venv (``$HOME/.vllm-oracle/venv/bin/python``, or ``$VLLM_ORACLE_PYTHON``)
built by the oracle folder's ``setup.sh`` (``$VLLM_ORACLE_DIR``, see ``sim/oracle/worker.py``);
without it the differential tests are skipped.  The generator and mapping tests below need no
oracle.
"""
from __future__ import annotations

import json

import pytest

import tools.diff_vllm as dv
from sim.oracle import kv_case
from sim.oracle.keys import KV
from sim.oracle.worker import oracle_unavailable, start_oracle

SEED = 20240601
N_CASES = 60


# ------------------------------------------------------------------ no oracle needed --
def test_generator_is_reproducible():
    a = [dv.gen_case(SEED, i) for i in range(20)]
    b = [dv.gen_case(SEED, i) for i in range(20)]
    assert a == b
    assert dv.gen_case(SEED, 3) == a[3]  # case i depends only on (seed, i)
    assert a != [dv.gen_case(SEED + 1, i) for i in range(20)]


def test_both_sides_see_the_same_token_structure():
    spec = {"config": {"groups": ["full", "mamba"], "block_size": 4},
            "requests": [[("S", 0, 6), ("P", 0, 3)], [("S", 0, 6), ("C", 0, 2)],
                         [("S", 0, 4)], [("S", 0, 6), ("P", 0, 3), ("T1", 0, 2)]]}
    ours = kv_case.to_ours(spec)
    assert [r["prompt"] for r in ours["requests"]] == ["S:6 P:3", "S:6 C:2", "S:4",
                                                       "S:6 P:3 T1:2"]
    case = kv_case.to_oracle(spec)
    prod, cons = case["producer"]["ids"], case["consumer"]["ids"]
    c2, c3 = case["consumers"][0]["ids"], case["consumers"][1]["ids"]
    assert prod[:6] == cons[:6] and prod[6] != cons[6]
    assert c2 == prod[:4] and c3[:9] == prod
    assert len(set(prod + cons[6:] + c3[9:])) == len(prod) + 2 + 2  # private ids are unique
    assert case["block"] == 4 and case["layout"] == ["full", "mamba"]


def test_generated_cases_run_on_our_side():
    from sim.cache.case import CaseError, run_case_data

    ran = 0
    for i in range(40):
        spec = dv.gen_case(SEED, i, "stress" if i % 2 else "default")
        try:
            results = run_case_data(kv_case.to_ours(spec), source=f"case {i}")
        except CaseError:
            continue
        assert len(results) == len(spec["requests"])
        ran += 1
    assert ran >= 30


def test_ckpt_profile_turns_internal_checkpoints_on_in_most_cases():
    cfgs = [dv.gen_case(SEED, i, "ckpt")["config"] for i in range(200)]
    on = [c for c in cfgs if c.get("num_prefill_checkpoint_blocks") == 1]
    assert len(on) >= 100
    aligns = [c.get("prefill_checkpoint_alignment", 1) for c in on]
    assert aligns.count(1) > len(on) / 2 and 16 in aligns
    assert any(a not in (1, 16) for a in aligns)          # the hash unit
    # the same cases as the default profile otherwise, and not part of the default mix
    base = dv.gen_case(SEED, 5)
    ck = dv.gen_case(SEED, 5, "ckpt")
    ckpt_keys = ("num_prefill_checkpoint_blocks", "prefill_checkpoint_alignment")
    assert {k: v for k, v in ck["config"].items() if k not in ckpt_keys} == base["config"]
    assert ck["requests"] == base["requests"]
    assert not any("num_prefill_checkpoint_blocks" in dv.gen_case(SEED, i)["config"]
                   for i in range(200))
    # both keys reach the oracle under vLLM's names
    case = kv_case.to_oracle({"config": on[0], "requests": [[("S", 0, 8)], [("S", 0, 8)]]})
    assert case["num_prefill_checkpoint_blocks"] == 1


# ---------------------------------------------------------------------- with oracle --
@pytest.fixture(scope="module")
def worker():
    why = oracle_unavailable(KV)
    if why:
        pytest.skip(why)
    w = start_oracle(KV, batch=200)
    yield w
    w.close()


def _describe(summary, profile: str) -> str:
    out = []
    for o in summary.mismatches[:5]:
        label = dv.label(SEED, o.index, profile)
        out.append(f"{label}: " + "; ".join(
            f"{m.field}@{m.request} ours={m.ours!r} oracle={m.oracle!r}"
            for m in o.verdict.mismatches))
        out.append(dv.case_yaml(o.spec, o.answer, label))
    return "\n".join(out)


@pytest.mark.parametrize("profile", [p for p in dv.PROFILES if p not in dv.OPT_IN_PROFILES])
def test_random_cases_match_vllm(worker, profile):
    summary = dv.run_diff(SEED, N_CASES, worker, profile=profile)
    assert summary.checked >= N_CASES, "too few lookups compared"
    assert not summary.mismatches, (
        f"{len(summary.mismatches)} of {summary.cases} cases differ from vLLM "
        f"({dict(summary.cases_by_field)}); rerun: python tools/diff_vllm.py --seed {SEED} "
        f"--cases {N_CASES} --profile {profile} --shrink\n" + _describe(summary, profile))


def test_differential_has_teeth(worker):
    """Our side with the pre-fix prompt-checkpoint rule must be caught."""
    summary = dv.run_diff(SEED, 30, worker, ours_override={"prompt_checkpoint": "seed"})
    assert summary.mismatches


def test_shrink_keeps_the_mismatch_and_makes_the_case_smaller(worker):
    """The harness's greedy shrink on a real mismatch (the pre-fix rule on our side)."""
    from sim.oracle.harness import rerun, shrink

    override = {"prompt_checkpoint": "seed"}
    summary = dv.run_diff(SEED, 30, worker, ours_override=override)
    o = min(summary.mismatches, key=lambda o: len(o.spec["requests"]))
    t = dv.tester(override)
    fld = o.verdict.mismatches[0].field
    small = shrink(t, o.spec, fld, worker, max_rounds=60)
    assert fld in rerun(t, small, worker).verdict.fields
    assert (len(small["requests"]), sum(s[2] for r in small["requests"] for s in r)) < \
        (len(o.spec["requests"]), sum(s[2] for r in o.spec["requests"] for s in r))


def test_main_prints_the_summary(worker, capsys, tmp_path):
    rc = dv.main(["--seed", str(SEED), "--cases", "12", "--quiet", "--keep", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "cases: 12 (" in out and "mismatching cases: 0" in out
    assert len(json.loads((tmp_path / "cases.json").read_text())) == 12
