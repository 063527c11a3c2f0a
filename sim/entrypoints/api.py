"""The Python API for notebooks: ``sim.run``, ``sim.load`` and ``sim.sweep``.

::

    import sim
    r = sim.run("scenarios/athena.yaml", set={"workload.num_requests": 200})
    r.summary["p99_itl_ms"]            # summary.json, a dict
    r.requests                         # requests.csv as a pandas DataFrame, typed columns
    r.memory                           # memory.csv (the pool over time), a DataFrame
    r2 = sim.load("runs/athena")       # the same from a run folder
    pts = sim.sweep("scenarios/sweeps/flag-onoff.yaml", set={"workload.num_requests": 40})

There is no second implementation: ``sim.run`` loads the scenario, simulates and writes
the run folder with the functions ``sim run`` calls, into ``out`` or a temporary folder,
and reads it back as ``sim.load`` does; ``sim.sweep`` runs ``sim sweep``'s functions and
reads ``points.csv``.  So a notebook sees exactly what the CLI wrote.

Bad arguments are refused as the CLI refuses them, with the same one-line ``InputError``
(``sim.errors``): ``set`` is a mapping of dotted fields to values or, as ``--set``,
``"FIELD.PATH=VALUE"`` strings; ``requests`` and ``workers`` integers >= 1; a sweep's
``workers`` capped as ``sim sweep --workers`` caps them.

pandas is imported only when a table is first asked for (``import sim`` stays cheap);
without it the tables raise an ``ImportError`` saying how to install it, while
``summary``, ``info`` and the column dictionaries (``request_columns``) still work.
"""
from __future__ import annotations

import csv
import math
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PANDAS_HINT = ("the notebook API's tables need pandas, a dependency of the project: "
               "reinstall it (pip install -e .) or pip install pandas")


def _pandas():
    try:
        import pandas
    except ImportError:
        raise ImportError(PANDAS_HINT) from None
    return pandas


def _request_kinds() -> dict[str, str]:
    """requests.csv column -> "int" | "float" | "text", from ``sim.rundir.records``."""
    from sim.rundir.records import INT_COLUMNS, REQUEST_COLUMNS, TEXT_COLUMNS

    return {c: "int" if c in INT_COLUMNS else "text" if c in TEXT_COLUMNS else "float"
            for c in REQUEST_COLUMNS}


def _memory_kinds() -> dict[str, str]:
    from sim.rundir.records import MEMORY_COLUMNS

    return {c: "float" if c == "time_s" else "int" for c in MEMORY_COLUMNS}


def read_columns(path: Path, kinds: dict[str, str]) -> dict[str, list]:
    """A CSV written by ``sim run`` as typed columns: ints, floats (NaN where empty),
    text; an int column's empty cell (a request refused on arrival) is None.  Every
    column of ``kinds`` is present: one the file lacks (an older run folder) is all
    None/NaN."""
    from sim.config.loader import open_input

    with open_input(path, text=True, newline="") as f:
        rd = csv.reader(f)
        header = next(rd, [])
        rows = list(rd)
    out: dict[str, list] = {}
    for name, kind in kinds.items():
        if name in header:
            j = header.index(name)
            raw = [r[j] if j < len(r) else "" for r in rows]
        else:
            raw = [""] * len(rows)
        if kind == "text":
            out[name] = raw
        elif kind == "int":
            out[name] = [int(v) if v != "" else None for v in raw]
        else:
            out[name] = [float(v) if v != "" else math.nan for v in raw]
    return out


def _frame(columns: dict[str, list], kinds: dict[str, str]):
    """Typed columns as a DataFrame: nullable ``Int64`` (or ``int64`` when no cell is
    empty), ``float64``, ``string``."""
    pd = _pandas()
    data = {}
    for name, values in columns.items():
        kind = kinds[name]
        if kind == "text":
            data[name] = pd.array(values, dtype="string")
        elif kind == "int":
            data[name] = pd.array(values, dtype="Int64" if None in values else "int64")
        else:
            data[name] = pd.array(values, dtype="float64")
    return pd.DataFrame(data)


@dataclass
class Run:
    """One run: what its folder holds.  ``path`` is None for a run made without ``out``
    (its folder was temporary)."""

    path: Path | None
    summary: dict                         # summary.json
    info: dict                            # run.json: header, resolved scenario, command
    request_columns: dict[str, list] = field(repr=False)
    memory_columns: dict[str, list] | None = field(default=None, repr=False)

    @property
    def requests(self):
        """requests.csv as a DataFrame (one row per request, arrival order)."""
        return _frame(self.request_columns, _request_kinds())

    @property
    def memory(self):
        """memory.csv as a DataFrame (the pool per GPU, in blocks, over time); None for a
        run folder written before memory.csv existed."""
        if self.memory_columns is None:
            return None
        return _frame(self.memory_columns, _memory_kinds())

    def __repr__(self) -> str:
        s = self.summary
        return (f"Run({s.get('scenario')!r}, {s.get('requests', 0):,} requests, token hit "
                f"{s.get('token_hit_rate', 0):.2%}, path={str(self.path) if self.path else None})")


def load(run_dir: str | Path) -> Run:
    """A run folder (``sim run``'s, a sweep point's) as a ``Run``.  A missing or corrupt
    file is an ``InputError`` naming it."""
    from sim.errors import InputError
    from sim.config.loader import load_file

    folder = _path_arg("run_dir", run_dir)
    if not folder.is_dir():
        raise InputError(f"{folder}: not a run folder (no such directory)")
    summary = load_file(folder / "summary.json", fmt="json")
    info = load_file(folder / "run.json", fmt="json")
    for name, data in (("summary.json", summary), ("run.json", info)):
        if not isinstance(data, dict):
            raise InputError(f"{folder / name}: expected a JSON object (as sim run writes it)")
    req = folder / "requests.csv"
    try:
        requests = read_columns(req, _request_kinds())
        mem_path = folder / "memory.csv"
        memory = read_columns(mem_path, _memory_kinds()) if mem_path.is_file() else None
    except OSError as e:
        raise InputError(f"{e.filename}: cannot read: {e.strerror or e}") from None
    except (ValueError, csv.Error) as e:
        raise InputError(f"{req}: not a run's table ({e})") from None
    return Run(folder, summary, info, requests, memory)


def _path_arg(name: str, value, optional: bool = False) -> Path | None:
    """A path argument (a str or an os.PathLike), else an ``InputError`` naming it."""
    import os

    from sim.errors import InputError
    from sim.config.fields import show

    if value is None and optional:
        return None
    if isinstance(value, (str, os.PathLike)) and str(value).strip():
        return Path(value)
    raise InputError(f"{name}: expected a path (a str or a Path), got {show(value)}")


def _bool_arg(name: str, value) -> bool | None:
    from sim.errors import InputError
    from sim.config.fields import show

    if value is None or isinstance(value, bool):
        return value
    raise InputError(f"{name}: must be true or false (or None), got {show(value)}")


def _set_arg(value) -> dict:
    """``set=``: a mapping of dotted fields to values, or (as ``--set``) a
    ``"FIELD.PATH=VALUE"`` string or a list of them, parsed as the CLI parses them."""
    from sim.errors import InputError
    from sim.config.fields import show
    from sim.config.loader import parse_set

    if value is None:
        return {}
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, str):
                raise InputError(f"set: {show(k)}: field paths are strings (like "
                                 "'cache.hash_block_size')")
        return dict(value)
    items = [value] if isinstance(value, str) else value
    if isinstance(items, (list, tuple)) and all(isinstance(i, str) for i in items):
        return dict(parse_set(i) for i in items)
    raise InputError(f"set: expected a mapping of dotted fields to values (or, as --set, "
                     f"'FIELD.PATH=VALUE' strings), got {show(value)}")


def _with_requests(overrides, requests: int | None) -> dict:
    """``set`` plus ``requests`` as ``--requests`` sets it (``workload.num_requests``; an
    old name of it in the file is cleared)."""
    from sim.errors import InputError
    from sim.config.fields import show

    out = _set_arg(overrides)
    if requests is not None and (isinstance(requests, bool) or not isinstance(requests, int)
                                 or requests < 1):
        raise InputError(f"requests: must be an integer >= 1, got {show(requests)}")
    if requests is not None:
        from workloads import RENAMED

        out["workload.num_requests"] = requests
        out.update({f"workload.{old}": None for old, new in RENAMED.items()
                    if new == "num_requests"})
    return out


def _call(name: str, path, overrides: dict) -> str:
    """The call as run.json's ``command`` records it."""
    return f"{name}({str(path)!r}" + (f", set={overrides!r}" if overrides else "") + ")"


def run(scenario: str | Path, set: dict[str, Any] | None = None,   # noqa: A002 (as --set)
        out: str | Path | None = None, requests: int | None = None,
        report: bool | None = None) -> Run:
    """Run a scenario (a YAML file, or a run folder's ``run.json``) as ``sim run`` does.

    ``set``: dotted field -> value overrides (``--set``, values as Python objects);
    ``requests``: only the first N (``--requests``); ``out``: the run folder to write (as
    ``--out``; default none: a temporary folder, removed once read); ``report``: write
    report.md and its figures (default: only when ``out`` is given)."""
    from sim.rundir.atomic import check_output_folder
    from sim.rundir.provenance import load_scenario_or_run
    from sim.commands.run import as_input_errors, simulate, write_run

    scenario = _path_arg("scenario", scenario)
    out = _path_arg("out", out, optional=True)
    report = _bool_arg("report", report)
    overrides = _with_requests(set, requests)
    sc = load_scenario_or_run(Path(scenario), overrides or None)
    command = [_call("sim.commands.run", scenario, overrides)]
    if out is not None:
        check_output_folder(Path(out))
    with as_input_errors(scenario, overrides):          # (sim run's lines)
        dep, rows, summary = simulate(sc)
    if out is not None:
        folder = write_run(Path(out), sc, dep, rows, summary,
                           report=True if report is None else report, command=command)
        return load(folder)
    tmp = Path(tempfile.mkdtemp(prefix="hcs-run-"))
    try:
        folder = write_run(tmp / "run", sc, dep, rows, summary, report=bool(report),
                           command=command)
        r = load(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    r.path = None
    return r


def sweep(sweep_file: str | Path, set: dict[str, Any] | None = None,   # noqa: A002
          out: str | Path | None = None, requests: int | None = None, workers: int = 1,
          search: str | None = None, report: bool | None = None):
    """Run a sweep as ``sim sweep`` does and return ``points.csv`` as a DataFrame (one row
    per point; ``df.attrs["path"]`` is the sweep folder, or None without ``out``).
    ``set`` applies to every point; ``search="rate"`` runs the rate search."""
    from sim.rundir.atomic import check_output_folder
    from sim.errors import InputError
    from sim.config.fields import show
    from sim.commands.sweep import check_workers, load_sweep, run_sweep

    pd = _pandas()
    sweep_file = _path_arg("sweep_file", sweep_file)
    out = _path_arg("out", out, optional=True)
    report = _bool_arg("report", report)
    check_workers(workers, "workers")
    if search is not None and search != "rate":
        raise InputError(f"search: must be 'rate' (the arrival-rate scale) or None, got "
                         f"{show(search)}")
    overrides = _with_requests(set, requests)
    sw = load_sweep(sweep_file, overrides or None, search=search)
    command = [_call("sim.commands.sweep", sweep_file, overrides)]
    if out is not None:
        check_output_folder(Path(out))
        run_sweep(sw, Path(out), workers=workers, report=True if report is None else report,
                  command=command)
        df = pd.read_csv(Path(out) / "points.csv")
        df.attrs["path"] = Path(out)
        return df
    tmp = Path(tempfile.mkdtemp(prefix="hcs-sweep-"))
    try:
        run_sweep(sw, tmp / "sweep", workers=workers, report=bool(report), command=command)
        df = pd.read_csv(tmp / "sweep" / "points.csv")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    df.attrs["path"] = None
    return df
