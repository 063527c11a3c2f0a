"""Sweeps: a base scenario plus axes, every point an independent simulation.

A sweep file::

    name: flag-onoff
    base: ../athena.yaml                 # relative to this file
    set: {workload.num_requests: 1000}   # applied to every point (optional)
    grid:                                # cartesian product of dotted scenario fields
      cache.enable_mamba_shared_prefix_checkpoint: [false, true]
      cache.hash_block_size: [64, 192]
    points:                              # and/or named points
      - {name: dense, set: {cache.prefix_cache_retention_interval: null}}
    search: {attainment: 0.9}            # optional: each point's max sustainable rate

Output folder: ``points.csv`` (one row per point: id, label, status, error, each axis,
each summary metric except the two wall-clock ones), ``points/<id>/`` (each point's run
folder) and the sweep report.  With ``search:`` (or ``sim sweep --search rate``) every
point is a bisection of its arrival rate (``sim/commands/search.py``): ``points.csv`` ends with
the answer, ``search.csv`` lists every run, and a point's folder is the run at the rate
found.  Points run in a local process pool or on Ray; results
are identical byte for byte whichever executor runs them, and a failed point is
recorded with its error without losing the others.

Bounds: a sweep has at most ``MAX_POINTS`` points (counted before the grid is
expanded); the local pool never starts more workers than points, nor more than the
CPUs this process may use (``plan_workers``: one line says so when it runs fewer than
asked); its workers die with the sweep, whatever ends it (``sim/lifeline.py``), and an
interrupted Ray sweep cancels its tasks.
"""
from __future__ import annotations

from sim.errors import InputError

import csv
import itertools
import json
import logging
import os
import shutil
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.rundir.atomic import atomic_folder
from sim.errors import ConfigError
from sim.config.fields import show

SWEEP_KEYS = {"name", "description", "base", "set", "grid", "points", "output", "search"}
#: the most points a sweep may have: each is a whole simulation (and is validated up
#: front), so more would not finish; a grid is counted before it is expanded
MAX_POINTS = 4096
TIMING = ("wall_s", "sim_requests_per_s")
SEARCH_COLUMNS = ("max_rate_scale", "max_arrival_rate", "search_result", "search_runs")
PROBE_COLUMNS = ("point", "label", "run", "rate_scale", "arrival_rate", "slo_attainment",
                 "request_goodput", "meets")


class SweepError(InputError):
    """One line naming the file and field."""


@dataclass(frozen=True)
class Point:
    id: str
    label: str
    overrides: dict          # dotted path -> value (sweep-wide set + the point's own)
    axes: dict               # dotted path -> value (the point's own coordinates)


@dataclass(frozen=True)
class Sweep:
    path: Path
    name: str
    base: Path
    points: list[Point]
    axes: list[str]
    output: str | None = None    # the sweep file's output: (folder, relative to the cwd)
    search: Any = None           # sim.commands.search.RateSearch: bisect each point's arrival rate


def _fmt_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _scenario_keys() -> set:
    from sim.config.scenario import TOP_KEYS

    return set(TOP_KEYS)


def load_sweep(path: str | Path, overrides: dict | None = None,
               search: str | None = None) -> Sweep:
    """Load and validate a sweep file; ``overrides`` (dotted field -> value, e.g. from
    ``sim sweep --requests``) apply to every point, after the file's own values.
    ``search`` (``sim sweep --search rate``) turns the rate search on with the file's
    ``search:`` settings, or the defaults."""
    from sim.config.fields import control_problem
    from sim.config.loader import load_file

    p = Path(path)
    cli = dict(overrides or {})
    data = load_file(p, SweepError, fmt="yaml")
    if not isinstance(data, dict):
        raise SweepError(f"{path}: expected a mapping with base and grid/points")
    if "base" not in data and set(data) - SWEEP_KEYS:
        # (a scenario or a case file where a sweep file belongs: say so, not "seed:
        # unknown key")
        what = ("a scenario" if set(data) <= _scenario_keys() else
                "a case file" if {"requests", "config"} <= set(data) else None)
        if what:
            run = "sim run" if what == "a scenario" else "sim case"
            raise SweepError(f"{path}: {what}, not a sweep file: sim sweep wants a sweep file "
                             f"(base: SCENARIO, then grid: or points:, as in scenarios/sweeps/);"
                             f" run {what} with {run}")
    for k in data:
        if k not in SWEEP_KEYS:
            raise SweepError(f"{path}: {k}: unknown key (known: {', '.join(sorted(SWEEP_KEYS))})")
    if "base" not in data:
        raise SweepError(f"{path}: base: missing (path of the base scenario)")
    if not isinstance(data["base"], str) or not data["base"].strip():
        raise SweepError(f"{path}: base: expected the path of the base scenario, "
                         f"got {show(data['base'])}")
    name = data.get("name")
    if name is not None and (isinstance(name, bool) or not isinstance(name, (str, int))
                             or not str(name).strip()):
        raise SweepError(f"{path}: name: must be a non-empty string, got {show(name)}")
    if name is not None and control_problem(str(name)):
        raise SweepError(f"{path}: name: {control_problem(str(name))}")
    base = (p.parent / str(data["base"])).resolve()
    if not base.is_file():
        raise SweepError(f"{path}: base: no such scenario file {base}")
    common = data.get("set") or {}
    if not isinstance(common, dict):
        raise SweepError(f"{path}: set: expected a mapping of dotted fields to values")
    grid = data.get("grid") or {}
    if not isinstance(grid, dict):
        raise SweepError(f"{path}: grid: expected a mapping of dotted fields to lists")
    _check_paths(path, "set", common)
    _check_paths(path, "grid", grid)
    for k, vals in grid.items():
        if not isinstance(vals, list) or not vals:
            raise SweepError(f"{path}: grid.{k}: expected a non-empty list of values")
    named = data.get("points") or []
    if not isinstance(named, list):
        raise SweepError(f"{path}: points: expected a list of {{name, set}}")
    import math

    n_grid = math.prod(len(v) for v in grid.values()) if grid else 0
    if n_grid + len(named) > MAX_POINTS:
        sizes = " x ".join(f"{len(v):,}" for v in grid.values())
        what = (f"grid: {sizes} = {n_grid:,} points" if grid else "points: ") + \
            (f" + {len(named):,} named" if grid and named else
             f"{len(named):,} named" if named else "")
        raise SweepError(f"{path}: {what}, more than the {MAX_POINTS:,} a sweep may have "
                         f"(each point is a whole simulation); split the sweep")
    axes = list(grid)
    for i, pt in enumerate(named):
        if not isinstance(pt, dict) or set(pt) - {"name", "set"} or not isinstance(pt.get("set", {}), dict):
            raise SweepError(f"{path}: points[{i}]: expected {{name: ..., set: {{field: value}}}}")
        if isinstance(pt.get("name"), str) and control_problem(pt["name"]):
            raise SweepError(f"{path}: points[{i}].name: {control_problem(pt['name'])}")
        _check_paths(path, f"points[{i}].set", pt.get("set", {}))
        for k in pt.get("set", {}):
            if k not in axes:
                axes.append(k)
    points: list[Point] = []
    combos = list(itertools.product(*(grid[k] for k in grid))) if grid else []
    for combo in combos:
        coords = dict(zip(grid, combo))
        label = ", ".join(f"{k.split('.')[-1]}={_fmt_value(v)}" for k, v in coords.items())
        points.append(Point(f"p{len(points):03d}", label, {**common, **coords, **cli}, coords))
    for pt in named:
        coords = dict(pt.get("set", {}))
        label = str(pt.get("name") or ", ".join(f"{k.split('.')[-1]}={_fmt_value(v)}"
                                                for k, v in coords.items()))
        points.append(Point(f"p{len(points):03d}", label, {**common, **coords, **cli}, coords))
    if not points:
        raise SweepError(f"{path}: grid/points: the sweep has no points")
    rate_search = _search_section(path, data, search)
    # Validate every point's scenario up front: a typo fails the sweep before any run.
    from sim.engine.replica import build_deployment
    from sim.config.scenario import ScenarioError, load_scenario

    for pt in points:
        try:
            sc = load_scenario(base, pt.overrides, set_label="")
            build_deployment(sc)
            if rate_search is not None:
                _check_searchable(sc)
        except (ScenarioError, ConfigError, ValueError) as e:
            raise SweepError(f"{path}: point {pt.id} ({pt.label}): {e}") from None
    output = data.get("output")
    if output is not None and (not isinstance(output, str) or not output.strip()):
        raise SweepError(f"{path}: output: must be a folder path, got {show(output)}")
    return Sweep(p, str(data.get("name") or p.stem), base, points, axes, output, rate_search)


def _search_section(path, data: dict, search: str | None):
    """The sweep's rate search (``sim.commands.search.RateSearch``), or None."""
    from sim.commands.search import parse_search

    if search is not None and search != "rate":
        raise SweepError(f"--search: must be rate (the arrival-rate scale), got {show(search)}")
    if "search" not in data and search is None:
        return None
    try:
        return parse_search(data.get("search"))
    except ConfigError as e:
        raise SweepError(f"{path}: {e}") from None


def _check_searchable(sc) -> None:
    """A rate search needs SLOs to meet and arrivals it can scale."""
    from sim.commands.search import rate_overrides

    if not sc.slo.active:
        raise ConfigError("search", "a rate search needs SLOs: give the scenario an slo: "
                          "section (ttft_ms, tpot_ms and/or e2e_ms), or set slo.ttft_ms in the "
                          "sweep's set:")
    rate_overrides(sc.workload, 1.0)


def _check_paths(path, where: str, mapping: dict) -> None:
    """Keys of ``set`` / ``grid`` / a point's ``set`` are dotted scenario field paths."""
    for k in mapping:
        if not isinstance(k, str) or not k.strip() or any(not p.strip() for p in k.split(".")):
            raise SweepError(f"{path}: {where}: {show(k)} is not a dotted field path "
                             f"(like cache.hash_block_size)")


def run_point(base: str, overrides: dict, command: list[str] | None = None,
              search: Any = None, tag: str = "", verbose: bool = False) -> dict:
    """Run one point; returns its status, summary and run-folder files (name ->
    bytes), so a remote Ray worker needs no shared filesystem.  Never raises.
    ``command`` (the sweep's command line) goes into the point's run.json.  With
    ``search`` (a ``RateSearch``) the point is a rate search: its runs are logged on
    stderr as ``tag: ...`` when ``verbose``, and the result has a ``search`` entry."""
    try:
        from sim.commands.run import simulate, write_run
        from sim.config.scenario import load_scenario

        sc = load_scenario(base, overrides)
        found = None
        if search is None:
            dep, rows, summary = simulate(sc)
        else:
            found = _search_point(base, overrides, sc, search, tag, verbose)
            sc, dep, rows, summary = found.best
        with tempfile.TemporaryDirectory() as d:
            folder = write_run(Path(d) / "run", sc, dep, rows, summary, report=True,
                               command=command)
            files = {f.name: f.read_bytes() for f in sorted(folder.iterdir()) if f.is_file()}
        out = {"status": "ok", "summary": summary, "files": files}
        if found is not None:
            from dataclasses import asdict
            from sim.commands.search import describe

            out["search"] = {"scale": found.scale, "outcome": found.outcome,
                             "probes": [asdict(p) for p in found.probes],
                             "line": describe(found, search)}
        return out
    except Exception as e:  # noqa: BLE001 - a failed point must not lose the others
        msg = f"{type(e).__name__}: {e}".replace("\n", " ")
        return {"status": "failed", "error": msg[:500],
                "trace": traceback.format_exc(limit=3)}


def _search_point(base: str, overrides: dict, sc, search, tag: str, verbose: bool):
    """Bisect one point's arrival rate; ``best`` holds (scenario, deployment, rows,
    summary) of the run at the rate found."""
    from sim.commands.run import simulate
    from sim.config.scenario import load_scenario
    from sim.commands.search import rate_overrides, search_rate

    def run(scale: float):
        s = load_scenario(base, {**overrides, **rate_overrides(sc.workload, scale)})
        dep, rows, summary = simulate(s)
        return summary, (s, dep, rows, summary)

    def log(line: str) -> None:
        if verbose:
            print(f"{tag}: {line}", file=sys.stderr, flush=True)

    return search_rate(run, search, log)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; a container's or a
    ``taskset``'s), not the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_workers(workers, label: str = "--workers") -> int | None:
    """``workers`` as given (``--workers N``, ``sim.sweep(workers=N)``): None (as many as
    useful) or an integer >= 1, else an ``InputError`` naming ``label``."""
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise InputError(f"{label}: must be an integer >= 1, got {show(workers)}")
    if workers < 1:
        raise InputError(f"{label}: must be >= 1, got {workers}")
    return workers


def plan_workers(asked: int | None, points: int, label: str = "--workers"
                 ) -> tuple[int, str | None]:
    """How many local workers to start for ``points`` points: ``asked`` (None: as many as
    useful), but never more than the points nor than the CPUs this process may use; and
    the line that says so when that is fewer than asked (None otherwise)."""
    cpus = usable_cpus()
    n = max(1, min(points, cpus) if asked is None else min(asked, points, cpus))
    if asked is None or n >= asked:
        return n, None
    why = []                    # (what binds)
    if points == n:
        why.append(f"{points:,} point{'s' * (points != 1)}")
    if cpus == n:
        why.append(f"{cpus:,} CPU{'s' * (cpus != 1)} usable")
    return n, (f"{label} {asked:,}: running {n:,} worker{'s' * (n != 1)} "
               f"({', '.join(why)})")


def _pool_worker_init(line) -> None:
    """A sweep worker's first act: die with the sweep (``sim/lifeline.py``), and leave
    Ctrl-C to it (it stops the workers itself, at once)."""
    import signal

    line.hold()
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _ray_points(jobs: list, workers: int, address: str | None, progress) -> list[dict]:
    import ray

    started = False
    if not ray.is_initialized():
        # a local instance's start-up lines (INFO, a token-authentication WARNING)
        # say nothing about the sweep; joining a cluster keeps Ray's warnings
        kw = ({"address": address} if address
              else {"num_cpus": workers, "logging_level": logging.ERROR})
        ray.init(include_dashboard=False, log_to_driver=False, ignore_reinit_error=True,
                 runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                     [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])}},
                 **kw)
        started = True
    refs: list = []
    try:
        remote = ray.remote(num_cpus=1)(run_point)
        for j in jobs:
            refs.append(remote.remote(*j))
        results = []
        for i, ref in enumerate(refs):
            results.append(ray.get(ref))
            progress(i + 1, len(jobs))
        return results
    except BaseException:
        # interrupted (or failed): the points under way and those queued are cancelled,
        # on a cluster too, rather than left running for no one
        for ref in refs:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - (finished already, or Ray is going away)
                pass
        raise
    finally:
        if started:
            ray.shutdown()


def _execute(sweep: Sweep, tmp: Path, executor: str, workers: int, address: str | None,
             progress, command: list[str] | None = None, verbose: bool = False) -> list[dict]:
    jobs = [(str(sweep.base), pt.overrides, command, sweep.search, f"{pt.id} ({pt.label})",
             verbose) for pt in sweep.points]
    if executor == "ray":
        return _ray_points(jobs, workers, address, progress)
    if workers <= 1:
        results = []
        for i, j in enumerate(jobs):
            results.append(run_point(*j))
            progress(i + 1, len(jobs))
        return results
    from sim.lifeline import Lifeline

    line = Lifeline()
    try:
        return _pool_points(jobs, workers, progress, line)
    finally:
        line.close()


def _pool_points(jobs: list, workers: int, progress, line) -> list[dict]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # (fork: the workers start from this process, the lifeline's read end with them)
    ctx = multiprocessing.get_context("fork") if "fork" in \
        multiprocessing.get_all_start_methods() else None
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                               initializer=_pool_worker_init if ctx else None,
                               initargs=(line,) if ctx else ())
    try:
        futures = [pool.submit(run_point, *j) for j in jobs]
        results = []
        for i, f in enumerate(futures):
            results.append(f.result())
            progress(i + 1, len(jobs))
    except BaseException:
        # interrupted (or failed): stop the workers now instead of letting the points
        # under way run to their end; the caller removes the half-made sweep folder
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.kill()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return results


def write_points_csv(path: Path, sweep: Sweep, results: list[dict]) -> None:
    metrics: list[str] = []
    seen: set[str] = set()
    for r in results:       # (every point's metrics, in order: a fleet's router adds some)
        if r["status"] == "ok":
            for k, v in r["summary"].items():
                if k not in TIMING and not isinstance(v, (list, dict)) and k not in seen:
                    seen.add(k)
                    metrics.append(k)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["point", "label", "status", "error", *sweep.axes, *metrics,
                    *(SEARCH_COLUMNS if sweep.search is not None else ())])
        for pt, r in zip(sweep.points, results):
            axis_vals = [_fmt_value(pt.axes.get(a, _base_value(sweep, pt, a))) for a in sweep.axes]
            s = r.get("summary") or {}
            vals = []
            for m in metrics:
                v = s.get(m, "")
                vals.append(f"{v:.6g}" if isinstance(v, float) else v)
            if sweep.search is not None:
                vals += _search_values(r.get("search"))
            w.writerow([pt.id, pt.label, r["status"], r.get("error", ""), *axis_vals, *vals])


def _search_values(found: dict | None) -> list:
    """The ``SEARCH_COLUMNS`` of one point (empty for a failed one)."""
    if not found:
        return [""] * len(SEARCH_COLUMNS)
    scale = found["scale"]
    rate = next((p["arrival_rate"] for p in found["probes"] if p["scale"] == scale), None)
    return [f"{scale:.6g}" if scale is not None else "",
            f"{rate:.6g}" if rate is not None else "", found["outcome"], len(found["probes"])]


def write_search_csv(path: Path, sweep: Sweep, results: list[dict]) -> None:
    """``search.csv``: every run of every point's rate search, in the order run."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(PROBE_COLUMNS)
        for pt, r in zip(sweep.points, results):
            for i, p in enumerate((r.get("search") or {}).get("probes", [])):
                w.writerow([pt.id, pt.label, i + 1, f"{p['scale']:.6g}",
                            f"{p['arrival_rate']:.6g}", f"{p['attainment']:.6g}",
                            f"{p['goodput']:.6g}", "true" if p["meets"] else "false"])


def _base_value(sweep: Sweep, pt: Point, dotted: str):
    """An axis a named point does not set: report the base scenario's value."""
    from sim.config.loader import load_file

    data = load_file(sweep.base, SweepError, fmt="yaml")
    cur: Any = data
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return "(base)"
        cur = cur[part]
    return cur


def run_sweep(sweep: Sweep, out: Path, executor: str = "local", workers: int | None = 1,
              address: str | None = None, progress=lambda done, total: None,
              report: bool = True, command: list[str] | None = None,
              verbose: bool = False, target: float | None = None,
              workers_label: str = "workers") -> list[dict]:
    """Run every point; write the sweep folder atomically; return the results.
    ``workers``: the local pool's size (or a local Ray's CPUs; None: as many as useful),
    capped by ``plan_workers`` (one line on stderr when capped, naming ``workers_label``);
    ``command``: the command line recorded in every point's run.json; ``verbose``: log
    each run of a rate search on stderr; ``target``: the token hit rate whose cheapest
    configuration a capacity sweep's report names (``sim sweep --target``)."""
    asked = check_workers(workers, workers_label)
    if executor != "ray" or not address:
        workers, note = plan_workers(asked, len(sweep.points), workers_label)
        if note:
            print(note, file=sys.stderr, flush=True)
    with atomic_folder(out, kind="sweep") as tmp:
        (tmp / "points").mkdir()
        shutil.copyfile(sweep.path, tmp / "sweep.yaml")
        results = _execute(sweep, tmp, executor, workers, address, progress, command, verbose)
        for pt, r in zip(sweep.points, results):
            files = r.pop("files", None)
            if files:
                d = tmp / "points" / pt.id
                d.mkdir()
                for name, data in files.items():
                    (d / name).write_bytes(data)
        write_points_csv(tmp / "points.csv", sweep, results)
        if sweep.search is not None:
            write_search_csv(tmp / "search.csv", sweep, results)
        with open(tmp / "errors.json", "w") as f:
            json.dump({pt.id: r.get("trace", "") for pt, r in zip(sweep.points, results)
                       if r["status"] != "ok"}, f, indent=1, sort_keys=True)
            f.write("\n")
        if report:
            try:
                from reports.sweep_report import write_sweep_report
            except ImportError:
                write_sweep_report = None
            if write_sweep_report is not None:
                write_sweep_report(tmp, target=target)
    return results
