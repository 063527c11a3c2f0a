"""``compare.md``: one scenario with a boolean field off and on, as a planner reads it.

Built from the compare folder alone: ``off/`` and ``on/`` (each run's
``summary.json`` and ``run.json``), ``summary_deltas.csv`` (which metrics, in which
order: the Markdown table is the same table) and ``paired.csv`` (per request, read by
column name).  Every value carries its unit: rates in %, deltas of rates in percentage
points, times in s, memory in GiB per GPU (never ``5.195e+10`` bytes), counts with
thousands separators.
"""
from __future__ import annotations

import csv
from pathlib import Path

from reports.style import GIB, finite, gib


def _kind(metric: str) -> str:
    if metric.endswith("_rate"):
        return "rate"
    if metric.endswith("_bytes_peak"):
        return "bytes"
    if metric.endswith("_tok_s"):
        return "throughput"
    if metric.endswith("_s"):
        return "seconds"
    return "count"


def value_text(metric: str, v: float) -> str:
    """A summary value with its unit."""
    if not finite(v):
        return "n/a"
    kind = _kind(metric)
    if kind == "rate":
        return f"{v:.2%}"
    if kind == "bytes":
        return gib(v)
    if kind == "throughput":
        return f"{v:,.1f} tok/s"
    if kind == "seconds":
        return f"{v:.3f} s"
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.4g}"


def delta_text(metric: str, d: float) -> str:
    """on - off with its unit (percentage points for rates)."""
    if not finite(d):
        return "n/a"
    kind = _kind(metric)
    if kind == "rate":
        return f"{d * 100:+.2f} pp"
    if kind == "bytes":
        return f"{d / GIB:+.2f} GiB"
    if kind == "throughput":
        return f"{d:+,.1f} tok/s"
    if kind == "seconds":
        return f"{d:+.3f} s"
    return f"{d:+,.0f}" if float(d).is_integer() else f"{d:+,.4g}"


def _read_json(path: Path) -> dict:
    from sim.errors import InputError
    from sim.config.loader import load_file

    data = load_file(path, fmt="json")
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object (as sim run writes it)")
    return data


def _column(path: Path, name: str) -> list[str]:
    from sim.errors import InputError

    from sim.config.loader import open_input

    with open_input(path, text=True, newline="") as f:
        rd = csv.DictReader(f)
        if name not in (rd.fieldnames or []):
            raise InputError(f"{path}: missing column {name}")
        return [row[name] for row in rd]


def compare_markdown(folder: Path, flag: str) -> str:
    """The text of ``compare.md`` for the compare folder ``folder``."""
    folder = Path(folder)
    off, on = _read_json(folder / "off" / "summary.json"), _read_json(folder / "on" / "summary.json")
    name = _read_json(folder / "off" / "run.json").get("name", "")
    metrics = _column(folder / "summary_deltas.csv", "metric")
    deltas = [int(v) for v in _column(folder / "paired.csv", "hit_delta")]
    gain, lose = sum(d > 0 for d in deltas), sum(d < 0 for d in deltas)
    lines = [f"# {name}: `{flag}` off vs on", "",
             f"Same scenario and seed; {len(deltas):,} requests paired by id. "
             f"{gain:,} requests reuse more with the flag on, {lose:,} reuse less. "
             f"Memory is per GPU (GiB = 2^30 bytes); rate deltas are percentage points.", "",
             "| metric | off | on | delta | relative |", "|---|---:|---:|---:|---:|"]
    for k in metrics:
        a, b = off.get(k), on.get(k)
        if not (finite(a) and finite(b)):
            lines.append(f"| {k} | {value_text(k, a)} | {value_text(k, b)} | n/a | n/a |")
            continue
        rel = f"{(b - a) / a:+.2%}" if a else "n/a"
        lines.append(f"| {k} | {value_text(k, a)} | {value_text(k, b)} | "
                     f"{delta_text(k, b - a)} | {rel} |")
    lines += ["", "Per request: `paired.csv`; the same table as numbers: `summary_deltas.csv`; "
              "the two runs: `off/`, `on/`.", ""]
    return "\n".join(lines)


def is_compare_folder(folder: Path) -> bool:
    """Whether ``folder`` is what ``sim compare`` writes (its tables and the two runs)."""
    folder = Path(folder)
    return all((folder / f).is_file() for f in ("summary_deltas.csv", "paired.csv",
                                                "off/run.json", "on/run.json"))


def stored_flag(folder: Path) -> str:
    """The flag a compare folder compares: the one scenario field that is false in
    ``off/run.json`` and true in ``on/run.json`` (dotted, as ``compare.md`` names it)."""
    from sim.errors import InputError

    folder = Path(folder)
    off = _read_json(folder / "off" / "run.json").get("scenario")
    on = _read_json(folder / "on" / "run.json").get("scenario")
    found: list[str] = []

    def walk(a, b, path: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in a.keys() & b.keys():
                walk(a[k], b[k], f"{path}.{k}" if path else str(k))
        elif a is False and b is True:
            found.append(path)

    walk(off, on, "")
    if len(found) != 1:
        raise InputError(f"{folder}: not a compare folder of one flag (fields false in off/ and "
                         f"true in on/: {', '.join(sorted(found)) or 'none'})")
    return found[0]


def write_compare_report(folder: Path, flag: str) -> Path:
    """(Re)write ``compare.md`` in the compare folder; returns its path."""
    from sim.rundir.atomic_files import write_file

    path = Path(folder) / "compare.md"
    write_file(path, compare_markdown(folder, flag))
    return path
