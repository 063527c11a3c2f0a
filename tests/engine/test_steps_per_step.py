"""``sim steps --per-step``: each step's scheduled tokens and drafts per request, against
vLLM 0.33.0's real scheduler.

The expectations are ``sched_oracle.py``'s answers (``tests/golden/steps/per_step/``:
``sched_cases.json`` is the oracle input, ``sched_cases.out.json`` its per-step records, cut to
the steps that scheduled anything), not our output.  They pin vLLM's spec-decode padding: a
request admitted with one token left is scheduled as 1 + K (K drafts that are never accepted)
when a running request was scheduled in the step or it has a cache hit (``pad_hit``,
``pad_running``), and not when the only requests scheduled before it were admitted in the same
step (``nopad_new``: the simulator used to pad there).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.oracle.keys import STEPS, from_oracle_config
from sim.commands.steps import run_steps_data

DIR = Path(__file__).resolve().parents[1] / "golden" / "steps" / "per_step"
CASES = {c["id"]: c for c in json.loads((DIR / "sched_cases.json").read_text())}
ANSWERS = {a["id"]: a for a in json.loads((DIR / "sched_cases.out.json").read_text())}


def step_case(case: dict) -> dict:
    """The oracle case as our step case (literal token ids)."""
    return {"config": from_oracle_config(case, STEPS),
            "requests": [{"id": r["id"], "prompt": r["tokens"]["ids"],
                          "arrival_step": r["arrival"], "max_tokens": r["max_tokens"]}
                         for r in case["requests"]]}


@pytest.mark.parametrize("cid", sorted(CASES))
def test_per_step_scheduled_and_draft_tokens_equal_vllm(cid):
    got = run_steps_data(step_case(CASES[cid]), cid, per_step=True)
    want = ANSWERS[cid]
    assert got["steps"] == want["steps"]
    for r, w in zip(got["requests"], want["requests"]):
        assert (r["id"], r["hit"], r["first_token_step"], r["finish_step"]) == (
            w["id"], w["hit"], w["first_token_step"], w["finish_step"])


def test_padding_shows_in_spec_tokens():
    steps = {s["step"]: s for s in run_steps_data(step_case(CASES["pad_hit"]), "pad_hit",
                                                  per_step=True)["steps"]}
    # b: 33-token prompt, 32 hit, 1 left -> 1 + K = 3 scheduled, 2 of them drafts
    assert steps[4]["scheduled"] == {"b": 3} and steps[4]["spec_tokens"] == {"b": 2}


def test_per_step_is_additive():
    """Without ``per_step`` the output is the per-request list, the same values."""
    case = step_case(CASES["pad_running"])
    plain = run_steps_data(case, "x")
    assert isinstance(plain, list)
    assert plain == run_steps_data(case, "x", per_step=True)["requests"]
