"""What a fleet adds to a run folder, and the fleet's summary.

* ``requests.csv``: the ``replica`` column (after the single-replica columns);
* ``summary.json``: every single-replica field, for the fleet as a whole (counts, tokens
  and pool bytes summed over the replicas, latencies over all requests, peaks summed
  replica by replica: the most each held, not at one instant), then the fleet's own:
  ``replicas``, ``router``, the imbalance of the replicas' loads (max / mean of requests
  and of prompt tokens routed) and ``per_replica`` (one mapping a replica);
* ``replicas.csv``: one row per replica (``REPLICA_COLUMNS``);
* ``memory.csv``: every replica's step rows in time order, with a ``replica`` column.
With one replica every single-replica field equals the run without ``cluster``.
"""
from __future__ import annotations

import csv
from array import array
from pathlib import Path
from typing import Any, Sequence

from sim.rundir.stats import percentiles

REPLICA_COLUMNS = ("replica", "gpu", "requests", "rejected_requests", "prompt_tokens",
                   "hit_tokens", "token_hit_rate", "ttft_p50_s", "ttft_p99_s", "busy_s",
                   "busy_fraction", "num_gpu_blocks", "pool_bytes", "evictions",
                   "preemptions", "steps")
FLEET_FIELDS = ("replicas", "router", "imbalance_requests", "imbalance_prompt_tokens",
                # the router's beliefs (routers that predict a hit) and, with hindsight,
                # its regret (``routing_fields``)
                "over_predicted_share", "under_predicted_share", "mean_over_prediction_tokens",
                "over_predicted_tokens", "regret_tokens", "regret_token_rate",
                "best_token_hit_rate", "routed_away_tokens", "routed_away_token_rate",
                "per_replica")


class MergedSampler:
    """The replicas' step samplers read as one (``sim.rundir.summary.latency_fields`` reads the
    inter-token latencies of all of them; the peaks are each replica's, summed)."""

    def __init__(self, samplers: list):
        self.samplers = samplers

    @property
    def itl_count(self) -> int:
        return sum(s.itl_count for s in self.samplers)

    @property
    def itl_sum_ns(self) -> int:
        return sum(s.itl_sum_ns for s in self.samplers)

    @property
    def itl_sparse(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for s in self.samplers:
            for k, v in s.itl_sparse.items():
                out[k] = out.get(k, 0) + v
        return out

    def itl_dense_bytes(self) -> bytes:
        import numpy as np

        parts = [np.frombuffer(s.itl_dense_bytes(), dtype="<i8") for s in self.samplers]
        n = max((len(p) for p in parts), default=0)
        total = np.zeros(n, dtype="<i8")
        for p in parts:
            total[:len(p)] += p
        return total.tobytes()

    @property
    def occupied_peak(self) -> int:
        return sum(s.occupied_peak for s in self.samplers)

    @property
    def in_use_peak(self) -> int:
        return sum(s.in_use_peak for s in self.samplers)


def with_replica_column(table, replica_of: array):
    """The fleet's request table with the replica of each request (by arrival order)."""
    return table.with_column("replica", replica_of[:len(table)])


def with_routing_columns(table, door):
    """The table with what the router believed (``routed_hit_tokens``, when the router
    predicts a hit) and, with ``cluster.hindsight``, every replica's hit at the arrival:
    the chosen replica's (``arrival_hit_tokens``: its hit had it been admitted then), the
    best (``best_hit_tokens``, on ``best_replica``) and the tokens the request missed
    although another replica held them in every group (``routed_away_tokens``: the best
    of the replicas not chosen, less the hit).  Rejected requests: blank."""
    n = len(table)
    hits = table.column("hit_tokens")
    rejected = table.column("rejected")

    def col(a: array) -> list:
        return ["" if rejected[k] else (a[k] if k < len(a) else "") for k in range(n)]

    if door.predicts:
        table = table.with_column("routed_hit_tokens", col(door.predicted))
    if door.oracle is not None:
        table = table.with_column("arrival_hit_tokens", col(door.at_arrival))
        table = table.with_column("best_hit_tokens", col(door.best))
        table = table.with_column("best_replica", col(door.best_at))
        table = table.with_column("routed_away_tokens", [
            "" if rejected[k] else max(door.others[k] - hits[k], 0) for k in range(n)])
    return table


def routing_fields(rows) -> dict:
    """summary.json's fields on the router's beliefs and its regret (those its run has)."""
    from sim.rundir.summary import column

    out: dict = {}
    names = rows.names() if hasattr(rows, "names") else []
    hit = list(column(rows, "hit_tokens"))
    prompt = sum(column(rows, "prompt_tokens"))
    n = len(hit)
    if "routed_hit_tokens" in names:
        pred = list(column(rows, "routed_hit_tokens"))
        over = [p - h for p, h in zip(pred, hit) if p > h]
        under = [h - p for p, h in zip(pred, hit) if p < h]
        out["over_predicted_share"] = len(over) / n if n else 0.0
        out["under_predicted_share"] = len(under) / n if n else 0.0
        out["mean_over_prediction_tokens"] = sum(over) / len(over) if over else 0.0
        out["over_predicted_tokens"] = sum(over)
    if "best_hit_tokens" in names:
        best = list(column(rows, "best_hit_tokens"))
        regret = [max(b - h, 0) for b, h in zip(best, hit)]
        away = sum(column(rows, "routed_away_tokens"))
        out["regret_tokens"] = sum(regret)
        out["regret_token_rate"] = sum(regret) / prompt if prompt else 0.0
        out["best_token_hit_rate"] = sum(best) / prompt if prompt else 0.0
        out["routed_away_tokens"] = away
        out["routed_away_token_rate"] = away / prompt if prompt else 0.0
    return out


def _ratio(values: Sequence[float]) -> float:
    m = sum(values) / len(values) if values else 0.0
    return max(values) / m if m > 0 else 0.0


def fleet_summary(sc, fdep, rows) -> dict:
    """summary.json of a fleet: ``SUMMARY_FIELDS`` for the fleet, then ``FLEET_FIELDS``."""
    from sim.rundir.summary import ttfts_makespan, pool_fields, summarize

    reps = fdep.replicas
    each = [pool_fields(r.dep, r.engine, r.sched) for r in reps]
    pool = {k: sum(e[k] for e in each) for k in each[0]}
    for k in ("block_size", "hash_block_size"):      # (replica 0's: replicas.csv has each)
        pool[k] = each[0][k]
    summary = summarize(sc, fdep, rows, None, None, fdep.wall_s, pool)
    _, makespan = ttfts_makespan(rows)
    per = per_replica(fdep, rows, makespan)
    summary["replicas"] = len(reps)
    summary["router"] = fdep.router
    summary["imbalance_requests"] = _ratio([p["requests"] + p["rejected_requests"] for p in per])
    summary["imbalance_prompt_tokens"] = _ratio([p["prompt_tokens"] for p in per])
    summary.update(routing_fields(rows))
    routed_away_class(summary, rows)
    summary["per_replica"] = per
    return summary


# the replica-view classes a routed-away token is taken from, in order
TAKEN_FROM = ("compulsory", "capacity", "checkpoint", "in_flight", "speculative")


def routed_away_class(summary: dict, rows) -> None:
    """With hindsight and miss attribution, the fleet's miss classes: tokens a request
    missed although another replica held them in every group at its arrival are the
    ``routed_away`` class, taken out of the classes its replica saw them in (compulsory
    first: never computed *there*, then capacity, checkpoint, in flight, speculative).
    ``summary.json``'s ``miss_*`` totals become the fleet's (``reusable`` too: what was
    computed anywhere before); requests.csv keeps each replica's view per request."""
    from sim.rundir.summary import column

    names = rows.names() if hasattr(rows, "names") else []
    if "routed_away_tokens" not in names or summary.get("miss_compulsory_tokens") is None:
        return
    cols = {c: list(column(rows, f"{c}_tokens")) for c in TAKEN_FROM}
    taken = {c: 0 for c in TAKEN_FROM}
    total = 0
    for k, ra in enumerate(column(rows, "routed_away_tokens")):
        left = ra if isinstance(ra, int) else 0
        for c in TAKEN_FROM:
            if left <= 0:
                break
            v = cols[c][k]
            t = min(left, v) if isinstance(v, int) else 0
            taken[c] += t
            left -= t
            total += t
    prompt = summary["prompt_tokens"]
    for c in TAKEN_FROM:
        summary[f"miss_{c}_tokens"] -= taken[c]
        summary[f"miss_{c}_rate"] = summary[f"miss_{c}_tokens"] / prompt if prompt else 0.0
    summary["reusable_tokens"] += taken["compulsory"]
    summary["reusable_token_rate"] = summary["reusable_tokens"] / prompt if prompt else 0.0
    summary["miss_routed_away_tokens"] = total
    summary["miss_routed_away_rate"] = total / prompt if prompt else 0.0


def per_replica(fdep, rows, makespan: float) -> list[dict]:
    """One mapping a replica (``REPLICA_COLUMNS``), from the served rows' ``replica``."""
    from sim.rundir.summary import column

    reps = fdep.replicas
    k = len(reps)
    which = column(rows, "replica")
    prompt = column(rows, "prompt_tokens")
    hits = column(rows, "hit_tokens")
    ttft = column(rows, "ttft_s")
    req = [0] * k
    pt = [0] * k
    ht = [0] * k
    tt: list[list[float]] = [[] for _ in range(k)]
    for i, p, h, t in zip(which, prompt, hits, ttft):
        req[i] += 1
        pt[i] += p
        ht[i] += h if h != "" else 0
        tt[i].append(t)
    out = []
    for r in reps:
        i = r.index
        p50, p99 = percentiles(sorted(tt[i]), (50, 99)) if tt[i] else (0.0, 0.0)
        busy = r.engine.busy_ns * 1e-9
        out.append({
            "replica": i, "gpu": f"{r.scenario.gpu.count} x {r.scenario.gpu.type}",
            "requests": req[i], "rejected_requests": len(r.engine.rejected),
            "prompt_tokens": pt[i], "hit_tokens": ht[i],
            "token_hit_rate": ht[i] / pt[i] if pt[i] else 0.0,
            "ttft_p50_s": p50, "ttft_p99_s": p99, "busy_s": busy,
            "busy_fraction": busy / makespan if makespan > 0 else 0.0,
            "num_gpu_blocks": r.dep.num_blocks, "pool_bytes": r.dep.num_blocks * r.dep.block_bytes,
            "evictions": r.dep.kv.evicted_keys, "preemptions": r.sched.preemptions,
            "steps": r.engine.steps,
        })
    return out


def write_replicas_csv(path: Path, per: list[dict]) -> None:
    """``replicas.csv``: one row per replica (floats with six significant digits)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(REPLICA_COLUMNS)
        for p in per:
            w.writerow([f"{p[c]:.6g}" if isinstance(p[c], float) else p[c]
                        for c in REPLICA_COLUMNS])


def memory_fields(fdep) -> list[tuple[str, Sequence[Any]]]:
    """memory.csv's fields for a fleet: every replica's rows (``sim.rundir.memory.memory_fields``),
    merged in time order (replica order on ties), then the ``replica`` column."""
    import numpy as np

    from sim.rundir import requests_csv
    from sim.rundir.records import MemoryFields
    from sim.rundir.memory import memory_fields as one

    parts = [(r.index, one(r.sampler)) for r in fdep.replicas]
    cols = len(parts[0][1])
    data = []
    for c in range(cols):
        arrays = [np.asarray(f[c][1], dtype="d" if c == 0 else "q") for _, f in parts]
        data.append(np.concatenate(arrays) if arrays else np.zeros(0))
    which = np.concatenate([np.full(len(f[0][1]), i, dtype="q") for i, f in parts])
    order = np.lexsort((which, data[0]))
    out = [(requests_csv.FLOAT_FIELD, array("d", data[0][order].tobytes()))]
    for c in range(1, cols):
        out.append((requests_csv.INT_FIELD, array("q", data[c][order].astype("q").tobytes())))
    out.append((requests_csv.INT_FIELD, array("q", which[order].tobytes())))
    return MemoryFields(parts[0][1].names + ("replica",), out)
