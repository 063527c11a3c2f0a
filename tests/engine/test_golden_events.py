"""KV events goldens: vLLM 0.33.0's published events, step for step (sched_oracle.py).

Each ``tests/golden/events/*.yaml`` (``tools/make_event_goldens.py``) is a step case with
``enable_kv_cache_events: true`` and, as its expectation, the events vLLM's real scheduler
published in each step (``expect_kv_events``, the oracle's canonical form: positions for
hashes) and where it raised (``kv_events_error``: the ``IndexError`` of an announced hit,
with the events queued before it), plus its per-request answers where it ran to the end.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

DIR = Path(__file__).resolve().parents[1] / "golden" / "events"
FILES = sorted(DIR.glob("*.yaml"))


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_event_goldens_cover_the_brief():
    assert len(FILES) >= 50, "regenerate with tools/make_event_goldens.py"
    docs = [_load(p) for p in FILES]
    assert all("sched_oracle" in d["source"] for d in docs)
    errors = [d for d in docs if d["expect_kv_events"]["kv_events_error"]]
    assert len(errors) >= 5
    assert {e["expect_kv_events"]["kv_events_error"]["type"] for e in errors} == {"IndexError"}
    # the IndexError in an attention group (hash < block) and in a wider Mamba group
    assert {e["expect_kv_events"]["kv_events_error"]["group"] for e in errors} >= {0, 1}
    events = [e for d in docs for s in d["expect_kv_events"]["kv_events"] for e in s["events"]]
    assert sum(e["type"] == "BlockRemoved" for e in events) >= 50          # evictions
    assert any(e["type"] == "BlockStored" and not e["blocks"] for e in events)  # null blocks
    assert any(len(d["config"].get("groups", ())) > 2 for d in docs)         # groups > 2


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_event_golden(path):
    from sim.commands.steps import run_steps_data

    data = _load(path)
    got = run_steps_data(data, str(path), kv_events=True)
    want = data["expect_kv_events"]
    if got["kv_events"] != want["kv_events"]:
        ours = {s["step"]: s["events"] for s in got["kv_events"]}
        theirs = {s["step"]: s["events"] for s in want["kv_events"]}
        step = min(s for s in set(ours) | set(theirs) if ours.get(s) != theirs.get(s))
        pytest.fail(f"{path.name}: step {step}: ours {ours.get(step)} | vLLM {theirs.get(step)}")
    assert got["kv_events_error"] == want["kv_events_error"]
    res = {r["id"]: r for r in got["requests"]}
    bad = [f"{rid}.{k}: got {res[rid].get(k)!r}, want {v!r}"
           for rid, exp in (data.get("expect") or {}).items() for k, v in exp.items()
           if res[rid].get(k) != v]
    assert not bad, "; ".join(bad)


def test_diff_events_against_the_step_oracle(capsys):
    """Fresh cases of the ``events`` profile against vLLM's real scheduler (when its venv is
    here): every request field and the events of every step."""
    import tools.diff_steps as ds
    from sim.oracle.keys import STEPS
    from sim.oracle.worker import oracle_unavailable

    why = oracle_unavailable(STEPS)
    if why:
        pytest.skip(why)
    rc = ds.main(["--seed", "20250101", "--cases", "25", "--profile", "events", "--workers", "1",
                  "--show", "1", "--tables", "0"])
    out = capsys.readouterr().out
    assert "compared 25 cases" in out
    assert rc == 0, out[:12000]
