"""``sim explain`` on a fleet's run folder: the request's replica replayed alone on the
requests the router handed it (what it did in the fleet), plus where the router sent it,
what it believed, and, with hindsight, where else the prefix lived."""
from __future__ import annotations

import csv
from pathlib import Path

from sim.config.scenario import load_scenario
from sim.explain import explain, text
from sim.commands.run import simulate, write_run

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "scenarios" / "cluster" / "athena-fleet.yaml"


def test_a_fleet_request_is_explained_on_its_replica(tmp_path):
    sc = load_scenario(FLEET, {"workload.num_requests": 240, "cluster.replicas": 4,
                               "cluster.router.policy": "kv_router",
                               "cluster.hindsight": True})
    out = write_run(tmp_path / "run", sc, *simulate(sc), report=False)
    rows = [r for r in csv.DictReader(open(out / "requests.csv", newline=""))
            if not r["rejected"]]
    away = [r for r in rows if int(r["routed_away_tokens"]) > 0]
    hit = [r for r in rows if int(r["hit_tokens"]) > 0]
    for r in (away[:1] + hit[:1]):
        d = explain(out, r["request_id"], counterfactuals=False)
        assert d["hit"] == int(r["hit_tokens"])
        f = d["fleet"]
        assert f["replica"] == int(r["replica"]) and f["router"] == "kv_router"
        assert f["best_hit_tokens"] == int(r["best_hit_tokens"])
        words = text(d)
        assert f"sent it to replica {r['replica']} of 4" in words
    assert away, "no request was routed away from its prefix (the case needs one)"
    assert "tokens routed away" in text(explain(out, away[0]["request_id"],
                                                counterfactuals=False))


def test_without_hindsight_it_says_how_to_know_more(tmp_path):
    sc = load_scenario(FLEET, {"workload.num_requests": 60, "cluster.replicas": 2,
                               "cluster.router.policy": "least_outstanding"})
    out = write_run(tmp_path / "run", sc, *simulate(sc), report=False)
    rid = next(csv.DictReader(open(out / "requests.csv", newline="")))["request_id"]
    words = text(explain(out, rid, counterfactuals=False))
    assert "cluster.hindsight: true" in words
