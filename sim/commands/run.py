"""``sim run``: build the deployment a scenario describes (``sim/engine/replica.py``), replay
its traffic, and write the run folder (requests.csv, summary.json, run.json, memory.csv,
report.md + figures; their contents: ``sim/rundir``).  The notebook API's ``sim.run``
(``sim/entrypoints/api.py``) calls the same functions.

Everything written goes to a temporary folder first and is renamed into place
at the end, so a failed run leaves no partial output.
"""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Callable

from sim.rundir.atomic import atomic_folder
from sim.cache.prompt import StreamRegistry
from sim.errors import CapacityError, ConfigError
from sim.config.scenario import Scenario
from sim.engine.engine import Engine
from sim.engine.scheduler import Scheduler
from sim.rundir.records import REQUEST_COLUMNS
from sim.rundir import requests_csv
from sim.rundir.request_table import RequestColumns, RequestTable
from sim.engine.replica import (Deployment, with_tier_columns, quiet_gc, build_deployment,
                                build_engine, why_rejected)
from sim.rundir.memory import memory_fields, write_memory_csv
from sim.rundir.summary import offload_summary, run_header, summarize


@contextlib.contextmanager
def as_input_errors(scenario, overrides: dict | None):
    """``with as_input_errors(scenario, overrides): simulate(...)``: what goes wrong once
    the deployment is built and the workload read, as the one-line ``InputError`` sim run
    prints (``sim run`` and ``sim.run`` alike): a workload's or trace's error, a field
    only the built layout can check (named at its line or ``--set``), a capacity
    error, each after the scenario's path."""
    from sim.errors import InputError
    from sim.config.scenario import scenario_message
    from workloads import WorkloadError

    try:
        yield
    except WorkloadError as e:
        raise InputError(f"{scenario}: {e}" if str(e).startswith("workload") else
                         f"{scenario}: workload: {e}") from None
    except ConfigError as e:
        raise InputError(scenario_message(scenario, e, overrides)) from None
    except ValueError as e:
        raise InputError(f"{scenario}: {e}") from None


def simulate(sc: Scenario, progress: Callable[[int], None] | None = None, jump: bool = True,
             fast_decode: bool = True, plant: str | None = None,
             prepare: Callable[[Deployment, Scheduler, Engine], None] | None = None,
             replayed: Callable[[Deployment], None] | None = None, traces=None):
    """Run the scenario; returns (deployment, records, summary dict).  ``records`` are the
    served requests in arrival order, ``deployment.records`` every request, those refused
    on arrival included (what ``write_run`` writes): both ``sim.rundir.request_table.RequestTable``,
    a read-only sequence of ``RequestRecord`` (len, indexing, iteration, ``==`` with a
    list of records) kept column by column, a record built each time one is read
    (``column(name)`` reads one field of every request without building any).
    ``prepare(dep, sched, engine)`` runs once the parts are built, before the replay
    (``sim explain`` watches one request's admission there and stops the replay);
    ``replayed(dep)`` once the replay is over and some request finished, before the
    requests are put in arrival order and summarized (``sim run`` hands its report
    workers the memory figure's inputs there: ``memory_prelude``).  ``traces``: the
    workload records to replay instead of the scenario's workload (an iterable of
    ``workloads.TraceRequest`` in arrival order)."""
    from workloads import build_workload

    if getattr(sc, "cluster", None) is not None:   # a fleet (sim/cluster)
        if prepare is not None:
            raise ConfigError("cluster", "this command replays one replica; a fleet is "
                              "replayed by sim run")
        from sim.cluster.fleet import run_fleet

        return run_fleet(sc, progress, jump, fast_decode, plant, replayed, traces)
    t_wall = time.perf_counter()
    dep = build_deployment(sc)
    kept = RequestColumns()          # the finished requests' rows, column by column
    if traces is None:
        traces = build_workload(sc.workload, sc.seed, sc.path.parent)
    sched, maker, sampler, rec, backend, eng = build_engine(
        sc, dep, StreamRegistry(), kept.add, kept.add_batch, plant, jump, fast_decode,
        progress=progress)
    if prepare is not None:
        prepare(dep, sched, eng)
    with quiet_gc():
        eng.run(traces)     # (the engine's progress guard raises a CapacityError)
    if dep.kv_events is not None:
        dep.kv_events.finish()
    if not rec.pending and not kept.n and eng.rejected:   # (no request finished)
        raise CapacityError(f"every request was rejected ({len(eng.rejected):,}); the first: "
                            f"{why_rejected(sched, eng.rejected[0])}")
    if replayed is not None:
        replayed(dep)
    for r in eng.rejected:
        rec.reject(r)
    rec.flush()
    dep.records = kept.table(sc.slo)
    if rec.tier is not None:         # the CPU tier's per-request columns
        dep.records = with_tier_columns(dep.records, [rec.tier])
    rows = dep.records.served()
    wall = time.perf_counter() - t_wall
    summary = summarize(sc, dep, rows, eng, sched, wall)
    if dep.offload is not None:
        summary = offload_summary(sc, dep, rows, summary)
    if sc.backend.kind == "torch":   # the torch backend's resume-vs-scratch checks
        stats = backend.stats  # type: ignore[attr-defined]
        recs = stats.records
        resumed = [v for v in recs if v.resumed_at > 0]
        summary["verify_requests"] = len(recs)
        summary["verify_resumed"] = len(resumed)
        summary["verify_max_abs_err"] = max((v.max_abs_err for v in recs), default=0.0)
        summary["torch_forward_s"] = stats.forward_s
        dep.verify = recs
    return dep, rows, summary




def memory_prelude(sc: Scenario, dep) -> tuple | None:
    """What the memory figure is drawn from, known once the replay is over: memory.csv's
    fields (kept on ``dep`` for the file), the pool and a block in bytes as the report
    reads them from summary.json (``pool_bytes``, ``pool_bytes / num_gpu_blocks``), and
    the scenario's name (summary.json's ``scenario``: the figure's title); None without a
    sampler or a pool (no memory figure)."""
    fields = _memory_of(dep)
    one = dep.replicas[0].dep if hasattr(dep, "replicas") else dep   # (a fleet: replica 0's)
    if fields is None or not one.num_blocks or not one.num_blocks * one.block_bytes:
        return None
    pool = float(one.num_blocks * one.block_bytes)
    return fields, pool, pool / one.num_blocks, sc.name


def _memory_of(dep) -> list | None:
    """memory.csv's fields of a run (``memory_fields`` of its sampler; None without
    one), built once and kept on ``dep``: the prelude and the file are the same object
    (``ReportWorkers.submit`` then does not send them twice)."""
    sampler = getattr(dep, "sampler", None)
    if getattr(dep, "memory", None) is None and sampler is not None:
        if hasattr(dep, "replicas"):    # a fleet: every replica's rows, and which
            from sim.cluster.outputs import memory_fields as fleet_memory

            dep.memory = fleet_memory(dep)
        else:
            dep.memory = memory_fields(sampler)
    return getattr(dep, "memory", None)


def write_run(out_dir: Path, sc: Scenario, dep, rows, summary, report: bool = True,
              extra: Callable[[Path], None] | None = None,
              command: list[str] | None = None, workers=None, git=None) -> Path:
    """Write the run folder atomically (temp folder, then rename); ``extra(folder)``
    may add files of its own before the folder moves into place.  ``run.json`` holds the
    report header plus what re-runs the run (``sim/rundir/provenance.py``); ``command`` is the
    command line recorded there.  ``workers``: report workers started before the run
    (``reports/workers.py``; ``sim run``) that draw the report while this process
    writes the rest; without them the report is drawn here.  ``git``: the commit's
    ``sim.rundir.provenance.GitProbe``, started before the run (else git runs here)."""
    with atomic_folder(out_dir, kind="run") as tmp:
        try:
            _write_files(tmp, sc, dep, rows, summary, command,
                         workers if report else None, git)
            if report and workers is None:
                from reports.rows import as_written, rows_of
                from reports.run_report import write_report   # (matplotlib: only here)

                # (the report's columns as requests.csv reads back: not read back)
                write_report(tmp,
                             rows=rows_of(as_written(getattr(dep, "records", None) or rows)))
            if getattr(dep, "kv_events", None) is not None:
                dep.kv_events.write(tmp)          # kv_events.jsonl (+ .msgpack)
            if report and workers is not None:
                workers.finish()                  # (the report whole before ``extra``)
            if extra is not None:
                extra(tmp)
        finally:
            if workers is not None:
                workers.close()     # (before the temporary folder is moved or removed)
    return Path(out_dir)


def _write_files(tmp: Path, sc: Scenario, dep, rows, summary, command, workers,
                 git=None) -> None:
    """summary.json, memory.csv, run.json, requests.csv.  With report workers, their
    parts are handed over first, with what they read of these files (the text of the
    two JSON files, memory.csv's fields, requests.csv's report columns: ``reports/rows.py``),
    so that they draw while the files are written."""
    from sim.rundir.provenance import run_record

    # wall_s and sim_requests_per_s measure this machine; every other field (and
    # every other file but run.json's command and commit) is byte-identical for the
    # same inputs and seed.
    # allow_nan=False: NaN is not JSON; a NaN here is a bug and must show
    summary_text = json.dumps(summary, indent=1, sort_keys=False, allow_nan=False) + "\n"
    run_text = json.dumps({**run_header(sc, dep), **run_record(sc, command, git)},
                          indent=1) + "\n"
    fields = _memory_of(dep)
    recs = getattr(dep, "records", None) or rows
    if workers is not None:
        from reports.rows import as_written

        # drawn meanwhile, from the report's columns of requests.csv as read back
        workers.submit(tmp, lambda: as_written(recs), (summary_text, run_text, fields))
    (tmp / "summary.json").write_text(summary_text)
    if fields is not None:
        write_memory_csv(tmp / "memory.csv", fields)
    (tmp / "run.json").write_text(run_text)
    if "per_replica" in summary:     # a fleet: one row per replica
        from sim.cluster.outputs import write_replicas_csv

        write_replicas_csv(tmp / "replicas.csv", summary["per_replica"])
    with open(tmp / "requests.csv", "w", newline="") as f:
        # column by column, a chunk of rows at a time: csv.writer's bytes (a list of
        # records has no storage kinds: every column formatted value by value)
        if isinstance(recs, RequestTable):
            requests_csv.write_table(f, recs.names(), recs)
        else:
            requests_csv.write_rows(f, list(REQUEST_COLUMNS), recs,
                                    ["o"] * len(REQUEST_COLUMNS))
