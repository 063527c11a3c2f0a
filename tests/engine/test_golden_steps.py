"""Step goldens: vLLM 0.33.0's real scheduler (sched_oracle.py) step for step.

Each ``tests/golden/steps/*.yaml`` (``tools/make_step_goldens.py``) is a step case with the
oracle's per-request answers; `sim steps` runs the same engine and scheduler as `sim run`
with one time unit per step.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

DIR = Path(__file__).resolve().parents[1] / "golden" / "steps"
FILES = sorted(DIR.glob("*.yaml"))


def test_step_goldens_present():
    assert len(FILES) >= 14, "regenerate with tools/make_step_goldens.py"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_step_golden(path):
    from sim.commands.steps import run_steps_data

    data = yaml.safe_load(path.read_text())
    got = {r["id"]: r for r in run_steps_data(data, str(path))}
    bad = []
    for rid, want in data["expect"].items():
        for key, value in want.items():
            if got[rid].get(key) != value:
                bad.append(f"{rid}.{key}: got {got[rid].get(key)!r}, want {value!r}")
    assert not bad, f"{path.name}: " + "; ".join(bad)
