"""The torch backend reads the step plan and nothing else: handed plain copies of the
plan's items (no scheduler handle on them), it runs and verifies as before."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch not installed: pip install -e '.[torch]'")

from backends.base import StepItem, StepPlan  # noqa: E402
from backends.torch_backend import backend as TB  # noqa: E402
from sim.config.scenario import load_scenario  # noqa: E402
from sim.commands.run import simulate  # noqa: E402

TINY = Path(__file__).resolve().parents[2] / "scenarios" / "athena-tiny.yaml"


def _plain(plan: StepPlan) -> StepPlan:
    """A copy of ``plan`` made only of ``StepItem`` fields."""
    out = StepPlan()
    out.index, out.start_ns, out.finished = plan.index, plan.start_ns, list(plan.finished)
    for it in plan.items:
        c = StepItem(it.tokens, it.out_stream, it.num_tokens, it.context, it.is_prefill,
                     it.spec_tokens, it.new_hit, it.padded)
        c.accepted, c.kept, c.finishes = it.accepted, it.kept, it.finishes
        c.first_prefill = it.first_prefill
        out.items.append(c)
    return out


def test_the_torch_backend_runs_from_plain_step_items(monkeypatch):
    orig = TB.TorchBackend.step_time
    seen = {"items": 0, "decode": 0, "finished": 0, "finishing": 0}

    def plain_step(self, plan):
        copy = _plain(plan)
        assert all(type(c) is StepItem and not hasattr(c, "req") for c in copy.items)
        seen["items"] += len(copy.items)
        seen["decode"] += sum(1 for c in copy.items if not c.is_prefill)
        seen["finished"] += len(copy.finished)
        seen["finishing"] = sum(1 for c in copy.items if c.finishes)   # (the last plan's)
        return orig(self, copy)

    monkeypatch.setattr(TB.TorchBackend, "step_time", plain_step)
    sc = load_scenario(TINY, {"backend.kind": "torch", "backend.verify": True,
                              "workload.num_requests": 6})
    dep, rows, summary = simulate(sc)
    recs = dep.verify
    # every request is reported finished in the plan after its last step, except those
    # whose last step is the run's last (how many: the torch backend's measured step times
    # decide how requests batch, so this count varies with the machine's load)
    assert len(rows) == 6 and seen["decode"] > 20 and seen["finished"] >= 1
    assert seen["finished"] + seen["finishing"] == 6
    assert sorted(v.kind for v in recs) == ["decode"] * 6 + ["prefill"] * 6
    assert any(v.resumed_at > 0 for v in recs)
    assert max(v.max_abs_err for v in recs) < TB.TOLERANCE["float32"]


def test_finished_requests_are_forgotten_at_the_next_plan():
    """The plan's ``finished`` ids drop what the backend keeps per request."""
    sc = load_scenario(TINY, {"backend.kind": "torch", "workload.num_requests": 2})
    from sim.engine.replica import build_deployment

    b = TB.build_backend(sc, build_deployment(sc))
    assert b.jumps is False
    b.running["r0"] = object()
    b.resumed_at["r0"] = 5
    b.running["r1"] = object()
    plan = StepPlan()
    plan.finished.append("r0")
    assert b.step_time(plan) >= 0.0
    assert "r0" not in b.running and "r0" not in b.resumed_at and "r1" in b.running
