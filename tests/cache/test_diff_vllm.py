"""Random differential test: our cache model against vLLM 0.33.0's real KV-cache manager.

Drives ``tools/diff_vllm.py`` (see its docstring) on a small fixed-seed sample.  The oracle
lives in a separate venv (``$HOME/.vllm-oracle/venv/bin/python``, or ``$VLLM_ORACLE_PYTHON``)
built by the oracle folder's ``setup.sh`` (``$VLLM_ORACLE_DIR``, see ``tools/oracle_worker.py``); without it the differential tests are skipped.
The generator and mapping tests below need no oracle.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "diff_vllm.py"


def _load_tool():
    spec = importlib.util.spec_from_file_location("diff_vllm", TOOL)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("diff_vllm", mod)
    spec.loader.exec_module(mod)
    return mod


dv = _load_tool()

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
    ours = dv.to_ours(spec)
    assert [r["prompt"] for r in ours["requests"]] == ["S:6 P:3", "S:6 C:2", "S:4",
                                                       "S:6 P:3 T1:2"]
    case = dv.to_oracle(spec)
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
            results = run_case_data(dv.to_ours(spec), source=f"case {i}")
        except CaseError:
            continue
        assert len(results) == len(spec["requests"])
        ran += 1
    assert ran >= 30


# ---------------------------------------------------------------------- with oracle --
@pytest.fixture(scope="module")
def worker():
    why = dv.oracle_unavailable("oracle")
    if why:
        pytest.skip(why)
    w = dv.OracleWorker(dv.default_oracle_python(), dv.DEFAULT_ORACLE_DIR.resolve())
    yield w
    w.close()


def _describe(summary) -> str:
    out = []
    for rep in summary.reports[:5]:
        v = rep["verdict"]
        out.append(f"{rep['label']}: " + "; ".join(
            f"{m.field}@{m.request} ours={m.ours!r} oracle={m.oracle!r}" for m in v.mismatches))
        out.append(dv.case_yaml(rep["spec"], rep["answer"], rep["label"]))
    return "\n".join(out)


@pytest.mark.parametrize("profile", dv.PROFILES)
def test_random_cases_match_vllm(worker, profile):
    summary = dv.run_diff(SEED, N_CASES, worker, profile=profile)
    assert summary.lookups >= N_CASES, "too few lookups compared"
    assert summary.mismatch_cases == 0, (
        f"{summary.mismatch_cases} of {summary.cases} cases differ from vLLM "
        f"({summary.by_field}); rerun: python tools/diff_vllm.py --seed {SEED} --cases "
        f"{N_CASES} --profile {profile} --shrink\n" + _describe(summary))


def test_differential_has_teeth(worker):
    """Our side with the pre-fix prompt-checkpoint rule must be caught."""
    summary = dv.run_diff(SEED, 30, worker, ours_override={"prompt_checkpoint": "seed"})
    assert summary.mismatch_cases > 0
