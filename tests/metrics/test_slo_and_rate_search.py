"""The scenario's ``slo:`` section (validated at load) and the rate search
(sim/commands/search.py, ``sim sweep --search rate``) on a hand-checked timeline."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from sim.config.scenario import ScenarioError, load_scenario
from sim.config.slo import SLOSection
from sim.commands.search import ABOVE, BELOW, FOUND, RateSearch, rate_overrides, search_rate

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "scenarios" / "athena-tiny.yaml"


def test_slo_section_is_typed_and_validated():
    sc = load_scenario(TINY, {"slo": {"ttft_ms": 500, "tpot_ms": 20.5}})
    assert sc.slo == SLOSection(ttft_ms=500, tpot_ms=20.5, e2e_ms=None) and sc.slo.active
    assert not load_scenario(TINY).slo.active
    for bad, field in (({"ttft_ms": -1}, "slo.ttft_ms"), ({"ttft_ms": 0}, "slo.ttft_ms"),
                       ({"tpot_ms": "fast"}, "slo.tpot_ms"), ({"e2e_s": 3}, "slo.e2e_s"),
                       ({"e2e_ms": float("inf")}, "slo.e2e_ms"), ([1], "slo")):
        with pytest.raises(ScenarioError, match=field.replace(".", r"\.")) as e:
            load_scenario(TINY, {"slo": bad})
        assert "\n" not in str(e.value)


def test_slo_error_names_the_file_line(tmp_path):
    data = yaml.safe_load(TINY.read_text())
    data["slo"] = {"ttft_ms": "soon"}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ScenarioError, match=r"s\.yaml:\d+: slo\.ttft_ms: must be a number"):
        load_scenario(p)


def test_slo_met_as_vllm_counts_a_good_request():
    slo = SLOSection(ttft_ms=100, tpot_ms=10)
    assert slo.met(0.1, 0.01, 99.0)            # equal to the bound: met
    assert not slo.met(0.100000001, 0.0, 0.0)   # one ns over
    assert slo.met(11_000_000 * 1e-9, 0.0, 0.0) and SLOSection(ttft_ms=11).met(0.011, 0, 0)
    assert not slo.met(0.05, 0.0101, 0.0)
    assert SLOSection(e2e_ms=1000).met(5.0, 5.0, 1.0)


def test_rate_overrides_scale_each_kind():
    assert rate_overrides({"kind": "system_prompt", "rate_per_s": 4.0}, 1.5) == \
        {"workload.rate_per_s": 6.0}
    assert rate_overrides({"kind": "multi_turn", "session_rate_per_s": 2.0}, 0.5) == \
        {"workload.session_rate_per_s": 1.0}
    assert rate_overrides({"kind": "mooncake", "path": "x"}, 4.0) == {"workload.time_scale": 0.25}
    assert rate_overrides({"kind": "jsonl", "time_scale": 2.0}, 2.0) == {"workload.time_scale": 1.0}


def _fake_run(limit: float):
    """Attainment 1 up to ``limit``, 0.5 above it."""
    def run(scale):
        a = 1.0 if scale <= limit else 0.5
        return {"slo_attainment": a, "arrival_rate": 10 * scale, "request_goodput": 9 * a}, scale
    return run


@pytest.mark.parametrize("limit", [0.3, 1.0, 1.7, 5.0, 33.0])
def test_bisection_brackets_the_limit(limit):
    cfg = RateSearch(attainment=0.9, tolerance=0.02)
    res = search_rate(_fake_run(limit), cfg)
    assert res.outcome == FOUND and res.best == res.scale
    met = [p.scale for p in res.probes if p.meets]
    missed = [p.scale for p in res.probes if not p.meets]
    assert res.scale == max(met) <= limit < min(missed) <= res.scale * 1.02


def test_search_bounds():
    cfg = RateSearch(min_scale=0.25, max_scale=8)
    up = search_rate(_fake_run(100.0), cfg)
    assert (up.outcome, up.scale) == (ABOVE, 8.0)
    down = search_rate(_fake_run(0.01), cfg)
    assert (down.outcome, down.scale) == (BELOW, None)
    assert [p.scale for p in down.probes] == [1.0, 0.5, 0.25]


# --- the search through `sim sweep` on a hand-checked timeline -------------------------
#
# Ten requests of one output token (prompt 8) arrive every 20 ms; a step takes 10 ms + 1 ms
# per request in it.  Alone, a request's prefill step takes 11 ms: TTFT 11 ms.  At rate
# scale s the gap is 20/s ms; while the gap is >= 11 ms each request finds the engine
# idle (TTFT 11: the SLO of 11 ms is met by all); past s = 20/11 every request but the
# first arrives while the previous one runs and waits (TTFT > 11 ms: 10% meet it).
LIMIT = 20 / 11


class HandCost:
    """A backend (``backends.base.StepBackend``): 10 ms a step + 1 ms per request in it."""

    jumps = True

    def step_time(self, plan):
        return 0.010 + 0.001 * len(plan.items)

    def time_from_sums(self, n, T, C, tC, TT):
        return 0.010 + 0.001 * n


@pytest.fixture
def hand_cost(monkeypatch):
    import sim.engine.replica as run_mod

    monkeypatch.setattr(run_mod, "cost_model", lambda sc, layout, gpu: HandCost())


def _sweep(tmp_path: Path, search: dict | None) -> Path:
    reqs = [{"id": f"r{i}", "arrival_s": 0.02 * i, "prompt": f"P{i}:8", "output_tokens": 1}
            for i in range(10)]
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reqs))
    base = {"name": "t", "model": "nemotron-h-8b",
            "kv_cache": {"tensor_parallel_size": 1, "num_gpu_blocks_override": 400},
            "cache": {"hash_block_size": 16}, "slo": {"ttft_ms": 11},
            "workload": {"kind": "jsonl", "path": "trace.jsonl"}}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    sweep = {"name": "cap", "base": "base.yaml",
             "grid": {"scheduler.max_num_seqs": [4, 8]}}
    if search is not None:
        sweep["search"] = search
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(sweep))
    return p


def test_sweep_search_finds_the_hand_computed_rate(tmp_path, hand_cost, capsys):
    from sim.commands.sweep import load_sweep, run_sweep

    sw = load_sweep(_sweep(tmp_path, {"attainment": 0.9, "tolerance": 0.01}))
    results = run_sweep(sw, tmp_path / "out", workers=1, report=False, verbose=True)
    for r in results:
        found = r["search"]
        assert found["outcome"] == FOUND
        met = [p["scale"] for p in found["probes"] if p["meets"]]
        missed = [p["scale"] for p in found["probes"] if not p["meets"]]
        assert found["scale"] == max(met) <= LIMIT < min(missed) <= found["scale"] * 1.01
        att = {p["scale"]: p["attainment"] for p in found["probes"]}
        assert set(att.values()) == {1.0, 0.1}
        # the point's run folder is the run at the rate found: every request within the SLO
        assert r["summary"]["slo_attainment"] == 1.0
    with open(tmp_path / "out" / "points.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["search_result"] for r in rows] == [FOUND, FOUND]
    assert float(rows[0]["max_rate_scale"]) <= LIMIT
    assert float(rows[0]["max_arrival_rate"]) == pytest.approx(50 * float(rows[0]["max_rate_scale"]),
                                                               rel=1e-5)
    with open(tmp_path / "out" / "search.csv") as f:
        probes = list(csv.DictReader(f))
    assert probes[0]["rate_scale"] == "1" and probes[0]["meets"] == "true"
    assert len(probes) == sum(int(r["search_runs"]) for r in rows)
    err = capsys.readouterr().err
    assert "p000 (max_num_seqs=4): rate x1 (50 req/s arriving): 100.0% meet the SLOs" in err
    assert "p001 (max_num_seqs=8): rate x2 (100 req/s arriving): 10.0% meet the SLOs" in err
    assert results[1]["search"]["line"].startswith("max rate x1.8")
    # the sweep report shows each point's max sustainable rate, from points.csv
    from reports.sweep_report import write_sweep_report

    write_sweep_report(tmp_path / "out")
    report = (tmp_path / "out" / "report.md").read_text()
    assert "max rate (req/s)" in report and "Max rate: the highest arrival rate" in report
    rates = [f"{float(r['max_arrival_rate']):,.2f}" for r in rows]
    assert all(x in report for x in rates)


def test_search_needs_slos_and_a_known_search(tmp_path):
    from sim.commands.sweep import SweepError, load_sweep

    p = _sweep(tmp_path, None)
    assert load_sweep(p).search is None
    assert load_sweep(p, search="rate").search == RateSearch()
    with pytest.raises(SweepError, match="--search: must be rate"):
        load_sweep(p, search="memory")
    with pytest.raises(SweepError, match=r"search\.attainment: must be a finite number"):
        load_sweep(_sweep(tmp_path, {"attainment": 2}))
    with pytest.raises(SweepError, match=r"search\.maxscale: unknown key"):
        load_sweep(_sweep(tmp_path, {"maxscale": 2}))
    p = _sweep(tmp_path, {"attainment": 0.5})
    data = yaml.safe_load((tmp_path / "base.yaml").read_text())
    del data["slo"]
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(SweepError, match="point p000 .* a rate search needs SLOs"):
        load_sweep(p, search="rate")
