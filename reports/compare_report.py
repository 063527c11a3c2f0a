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


CAPTIONS = {
    "hit_delta": "How much more (or less) of each prompt does the cache serve with the flag "
                 "on?",
    "ttft": "Does a request wait less for its first token with the flag on?",
}
FIGURES = ("hit_delta", "ttft")
MAX_BARS = 12       # distinct deltas drawn as one bar each; more: a histogram
MAX_BINS = 40


def _floats(path: Path, name: str) -> "np.ndarray":
    import numpy as np

    from sim.errors import InputError

    try:
        return np.array([float(v) for v in _column(path, name)], dtype=float)
    except ValueError:
        raise InputError(f"{path}: {name}: expected numbers") from None


def hit_delta_figure(folder: Path, flag: str) -> "style.Saved":
    """``hit_delta.png``: the requests whose reconciled hit changed, by how many tokens
    (on - off): one bar per distinct change where there are few, else a histogram;
    gains in the reuse colour, losses in the loss colour; the unchanged counted in the
    title, not drawn."""
    import numpy as np

    from reports import style

    folder = Path(folder)
    d = _floats(folder / "paired.csv", "hit_delta")
    n = len(d)
    nz = d[d != 0]
    gain, lose = int((d > 0).sum()), int((d < 0).sum())
    fig = style.figure(8.0, 4.2)
    with style.fixed_titles():
        ax = fig.add_subplot()
    ax.set_ylabel("requests")
    ax.grid(alpha=0.3, axis="y")
    distinct, counts = np.unique(nz, return_counts=True)
    if not len(distinct):
        style.empty(ax, "no request's hit changes")
        ax.set_xlabel("hit with the flag on - off (tokens)")
    elif len(distinct) <= MAX_BARS:
        style.distinct_bars(ax, distinct, counts,
                            [style.HIT if v > 0 else style.LOSS for v in distinct],
                            [f"{int(v):+,}" for v in distinct],
                            "hit with the flag on - off (tokens; one bar per distinct change)")
    else:
        span = float(np.abs(nz).max())
        width = style.nice_step(2 * span / MAX_BINS, (1, 2, 5))
        lo = -width * np.ceil(-nz.min() / width) if nz.min() < 0 else 0.0
        hi = width * np.ceil(nz.max() / width) if nz.max() > 0 else 0.0
        edges = np.arange(lo, hi + width / 2, width)
        if len(edges) < 2:
            edges = np.array([lo, lo + width])
        hist, _ = np.histogram(nz, bins=edges)
        mid = (edges[:-1] + edges[1:]) / 2
        for sel, color in ((mid < 0, style.LOSS), (mid >= 0, style.HIT)):
            if sel.any():
                ax.bar(edges[:-1][sel], hist[sel], width=width, align="edge", color=color,
                       edgecolor="white", linewidth=0.4)
        ax.set_xlim(edges[0], edges[-1])
        style.token_axis(ax.xaxis)
        ax.set_xlabel(f"hit with the flag on - off (tokens; bins of {width:,.0f})")
    style.integer_axis(ax.yaxis)
    ax.set_title(f"{gain:,} of {n:,} requests reuse more (blue), {lose:,} less (red); "
                 f"{n - gain - lose:,} unchanged (not drawn)", fontsize=9.5, loc="left")
    fig.suptitle(f"{_name(folder)}: {flag} on vs off, per request", fontsize=11)
    return style.save(fig, folder, "hit_delta", CAPTIONS["hit_delta"], svg=False)


def ttft_figure(folder: Path, flag: str) -> "style.Saved":
    """``ttft.png``: the TTFT CDF of the paired requests with the flag off and on, their
    p50 and p90 in the key."""
    import numpy as np

    from reports import style
    from sim.rundir.stats import percentiles

    folder = Path(folder)
    fig = style.figure(6.4, 4.0)
    with style.fixed_titles():
        ax = fig.add_subplot()
    for side, color, ls in (("off", style.DOMINATED, "--"), ("on", style.HIT, "-")):
        vals = np.sort(_floats(folder / "paired.csv", f"ttft_{side}_s"))
        if not len(vals):
            continue
        p50, p90 = percentiles(vals, (50, 90))
        ax.plot(vals, np.arange(1, len(vals) + 1) / len(vals), drawstyle="steps-post",
                color=color, ls=ls, label=f"flag {side}: p50 {p50:.3f} s, p90 {p90:.3f} s")
    if ax.lines:
        ax.legend(loc="lower right", fontsize=8)
    else:
        style.empty(ax, "no paired requests")
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.set_title(f"{_name(folder)}: TTFT, {flag} off vs on", fontsize=10)
    return style.save(fig, folder, "ttft", CAPTIONS["ttft"], svg=False)


def _name(folder: Path) -> str:
    return str(_read_json(Path(folder) / "off" / "run.json").get("name", ""))


def compare_markdown(folder: Path, flag: str, figures=()) -> str:
    """The text of ``compare.md`` for the compare folder ``folder`` (``figures``: the
    ``style.Saved`` of each figure drawn, shown under the table)."""
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
    lines.append("")
    for fig in figures:
        lines += [f"![{fig.caption}]({fig.files[0].name})", ""]
    lines += ["Per request: `paired.csv`; the same table as numbers: `summary_deltas.csv`; "
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
    """(Re)write ``compare.md`` and its figures (``hit_delta.png``, ``ttft.png``) in the
    compare folder; returns the path of ``compare.md``."""
    from reports import style
    from sim.rundir.atomic_files import write_file

    with style.rc():
        figures = [hit_delta_figure(folder, flag), ttft_figure(folder, flag)]
    path = Path(folder) / "compare.md"
    write_file(path, compare_markdown(folder, flag, figures))
    return path
