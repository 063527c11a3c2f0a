"""``scheduler.policy: priority`` against vLLM 0.33.0's real Scheduler.

``tests/golden/steps/prio_*.yaml`` (``tools/make_priority_goldens.py``) hold random step
cases with preemption under ``policy: priority``, the oracle's own priority examples and
three cases where a victim's tokens go back to the budget; ``expect`` is the oracle's
answer.  ``test_golden_steps.py`` runs every one of them through ``sim steps``; this file
checks that the set is what it claims: enough oracle cases, each preempting, and answers
that FCFS would not give (the policy is what they test).
"""
from __future__ import annotations

from pathlib import Path

import yaml

from sim.commands.steps import run_steps_data

DIR = Path(__file__).resolve().parents[1] / "golden" / "steps"
RANDOM = sorted(DIR.glob("prio_s*.yaml"))
ALL = sorted(DIR.glob("prio_*.yaml"))


def _load(p: Path) -> dict:
    return yaml.safe_load(p.read_text())


def _mismatches(data: dict, source: str) -> int:
    got = {r["id"]: r for r in run_steps_data(data, source)}
    return sum(got[rid].get(k) != v for rid, want in data["expect"].items()
               for k, v in want.items())


def test_at_least_50_oracle_cases_with_preemption_under_priority():
    assert len(RANDOM) >= 50, "regenerate with tools/make_priority_goldens.py"
    for p in RANDOM:
        d = _load(p)
        assert d["config"]["policy"] == "priority", p.name
        assert "sched_oracle" in d["source"] and "vllm 0.33.0" in d["source"], p.name
        assert any(e["preemptions"] > 0 for e in d["expect"].values()), p.name
        assert all("priority" in r for r in d["requests"]), p.name
        assert len({r["priority"] for r in d["requests"]}) > 1 or len(d["requests"]) == 1


def test_every_priority_golden_matches_ours_and_most_fail_under_fcfs():
    assert len(ALL) > len(RANDOM)   # the oracle's examples and the crafted cases too
    differs = 0
    n_prio = 0
    for p in ALL:
        d = _load(p)
        assert _mismatches(d, str(p)) == 0, p.name
        if d["config"]["policy"] != "priority":
            continue
        n_prio += 1
        d["config"]["policy"] = "fcfs"
        differs += _mismatches(d, str(p)) > 0
    assert differs >= 0.7 * n_prio, f"only {differs} of {n_prio} depend on the policy"
