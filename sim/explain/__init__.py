"""``sim explain``: why one request reused what it reused (issue #17).

``explain(path, request)`` answers for a ``sim case`` file or a ``sim run`` folder: it
replays the case or the run (``run.json`` records the scenario as it ran: overrides and
seed) up to the request's first admission and stops there (``replay``), reads the lookup
off the live cache (``facts``), re-evaluates it with each of three switches flipped
(``counterfactuals``) and returns the dict ``render`` documents; ``render.text`` puts it
in plain words.  Nothing is recorded in ordinary runs for this.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from sim.explain.counterfactuals import evaluate
from sim.explain.render import as_dict, text
from sim.explain.replay import ExplainError, Lookup, case_lookup, run_lookup

__all__ = ["ExplainError", "explain", "text"]


def explain(path: str | Path, request: str | None = None, counterfactuals: bool = True,
            hash_unit: int | None = None, retention: int | None | str = "auto") -> dict:
    """The explanation of ``request`` in the case file or run folder at ``path`` (a case
    file's last request when None).  Bad input raises an ``InputError``."""
    path = Path(path)
    if path.is_dir() or path.name == "run.json":
        folder = path if path.is_dir() else path.parent
        if request is None:
            raise ExplainError(f"{folder}: name the request to explain (a request_id of its "
                               f"requests.csv)")
        return _explain_run(folder, request, counterfactuals, hash_unit, retention)
    return _explain_case(path, request, counterfactuals, hash_unit, retention)


def _explain_case(path: Path, request, counterfactuals, hash_unit, retention) -> dict:
    from sim.commands.case_files import load_case_file

    data = load_case_file(path)
    src = str(path)
    rid, lk = case_lookup(data, src, request)

    def lookup(setting, case_field, value):
        _, got = case_lookup(data, src, rid, {case_field: value}, facts=False)
        return _hit(got)

    whatifs = (evaluate(lk.facts.settings, lookup, hash_unit, retention)
               if counterfactuals and lk.facts is not None and lk.facts.cache == "vllm" else [])
    return as_dict(rid, "case", src, lk, whatifs)


def _hit(lk: Lookup) -> tuple[int | None, str | None]:
    if lk.hit is not None:
        return lk.hit, None
    return None, (f"refused on arrival: {lk.refused}" if lk.refused else lk.error)


def run_scenario(folder: Path, overrides: dict | None = None, facts: bool = True):
    """The scenario a run folder's ``run.json`` records, as ``sim explain`` replays it:
    KV events off (they change no hit), miss attribution on for the facts (its eviction
    log and clock say who evicted what, when) and off for a what-if (only the hit)."""
    from sim.rundir.provenance import load_run_record

    rec = folder / "run.json"
    if not rec.is_file() or not (folder / "requests.csv").is_file():
        raise ExplainError(f"{folder}: not a run folder (no run.json and requests.csv; "
                           f"sim run writes one)")
    from sim.errors import InputError
    from sim.config.loader import read_text

    try:
        raw = json.loads(read_text(rec)).get("scenario")
    except (InputError, ValueError, AttributeError):
        raw = None
    over = dict(overrides or {})
    if isinstance(raw, dict) and raw.get("kv_events"):
        key = ("kv_events.enable_kv_cache_events" if isinstance(raw["kv_events"], dict)
               else "kv_events")
        over[key] = False
    over["attribution"] = facts
    return load_run_record(rec, over)


def _request_ids(folder: Path) -> list[str]:
    from sim.config.loader import open_input

    with open_input(folder / "requests.csv", ExplainError, text=True, newline="") as f:
        return [row["request_id"] for row in csv.DictReader(f)]


def _explain_run(folder: Path, request: str, counterfactuals, hash_unit, retention) -> dict:
    sc = run_scenario(folder)
    ids = _request_ids(folder)
    if request not in ids:
        near = ", ".join(ids[:3]) + (", ..." if len(ids) > 3 else "")
        raise ExplainError(f"{folder}: no request {request!r} in requests.csv ({near})")
    if getattr(sc, "cluster", None) is not None:
        return _explain_fleet(folder, sc, request, counterfactuals, hash_unit, retention)
    lk = run_lookup(sc, request)

    def lookup(setting, case_field, value):
        over = {f"cache.{setting}": value}
        return _hit(run_lookup(run_scenario(folder, over, facts=False), request, facts=False))

    whatifs = (evaluate(lk.facts.settings, lookup, hash_unit, retention)
               if counterfactuals and lk.facts is not None and lk.facts.cache == "vllm" else [])
    return as_dict(request, "run", str(folder), lk, whatifs)


FLEET_COLUMNS = ("replica", "routed_hit_tokens", "arrival_hit_tokens", "best_hit_tokens",
                 "best_replica", "routed_away_tokens")


def _explain_fleet(folder: Path, sc, request: str, counterfactuals, hash_unit,
                   retention) -> dict:
    """A fleet's request: the fleet is replayed (the same bytes as the run), then the
    request's replica alone on the requests the router handed it, at the instants it did
    (exactly what that replica did in the fleet: ``tests/cluster/test_fleet.py``), up to
    the request's lookup; the answer gains where the router sent it, what it believed,
    and (with ``cluster.hindsight``) where else the prefix lived."""
    import dataclasses

    from sim.cluster.fleet import replica_scenarios
    from sim.config.loader import open_input
    from sim.commands.run import simulate
    from workloads import build_workload

    with open_input(folder / "requests.csv", ExplainError, text=True, newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["request_id"] == request)
    fleet = {c: (int(row[c]) if row.get(c, "") not in ("", None) else None)
             for c in FLEET_COLUMNS}
    fleet["router"] = sc.cluster.router.policy
    fleet["replicas"] = sc.cluster.replicas
    dep, _, _ = simulate(dataclasses.replace(sc, attribution=False))
    table = dep.records
    ids = table.column("request_id")
    which = table.column("replica")
    arrivals = table.column("arrival_s")
    k = fleet["replica"] if fleet["replica"] is not None else which[list(ids).index(request)]
    records = {r.request_id: r for r in build_workload(sc.workload, sc.seed, sc.path.parent)}
    cut = [dataclasses.replace(records[ids[j]], arrival_s=arrivals[j], after=None,
                               think_s=0.0, index=-1)
           for j in range(len(ids)) if which[j] == k]
    scenarios = replica_scenarios(sc)
    alone = dataclasses.replace(scenarios[k], cluster=None)
    lk = run_lookup(alone, request, traces=cut)

    def lookup(setting, case_field, value):
        from sim.config.scenario import apply_overrides, scenario_from_mapping

        raw = {key: v for key, v in alone.raw.items() if key != "cluster"}
        flipped = scenario_from_mapping(apply_overrides(raw, {f"cache.{setting}": value}),
                                        alone.path)
        flipped = dataclasses.replace(flipped, attribution=False)
        return _hit(run_lookup(flipped, request, facts=False, traces=cut))

    whatifs = (evaluate(lk.facts.settings, lookup, hash_unit, retention)
               if counterfactuals and lk.facts is not None and lk.facts.cache == "vllm" else [])
    out = as_dict(request, "run", str(folder), lk, whatifs)
    out["fleet"] = fleet
    return out
