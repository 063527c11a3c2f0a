"""vLLM's own scheduler tests, translated: per-step tokens and drafts equal vLLM 0.33.0's.

``tests/golden/steps/vllm_test_*.yaml`` (``tools/make_step_goldens.py --vllm-tests``) are step
cases whose per-request answers ``test_golden_steps.py`` checks.  What the vLLM tests assert is
per step, though (a prefix-cache hit admitted beside a running speculative decode is padded to
1 + K drafts; one admitted beside a prefill chunk is not; a prefill chunk never carries drafts),
so here every step in which the real scheduler scheduled anything is compared too: the tokens
and draft tokens per request, from the oracle's own answers
(``tests/golden/cases/vllm_tests/sched.out.json``, ``sched_oracle.py --file sched_cases.json``).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

TESTS = Path(__file__).resolve().parents[1]
FILES = sorted((TESTS / "golden" / "steps").glob("vllm_test_*.yaml"))
ANSWERS = {a["id"]: a for a in json.loads(
    (TESTS / "golden" / "cases" / "vllm_tests" / "sched.out.json").read_text())}
FIELDS = ("step", "scheduled", "spec_tokens")


def test_vllm_test_step_goldens_present():
    assert len(FILES) >= 7, "regenerate with tools/make_step_goldens.py --vllm-tests"
    assert {p.stem for p in FILES} == set(ANSWERS)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_scheduled_and_draft_tokens_per_step(path):
    from sim.commands.steps import run_steps_data

    got = run_steps_data(yaml.safe_load(path.read_text()), str(path), per_step=True)["steps"]
    want = [{k: s[k] for k in FIELDS} for s in ANSWERS[path.stem]["steps"] if s["scheduled"]]
    assert [{k: s[k] for k in FIELDS} for s in got] == want
