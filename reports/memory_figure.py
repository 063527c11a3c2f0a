"""The run report's memory section: the pool over time (``memory.png``) and its numbers.

It answers "does this deployment's cache fit, and how full does it run?".  Two peaks in
``summary.json`` (``kv_bytes_peak``, ``mamba_state_bytes_peak``) are each the most one
kind of block held at any moment; they need not be simultaneous, so their sum can exceed
the pool (the cache fills the pool with evictable blocks of both kinds at different
times).  The figure and ``occupied_bytes_peak`` show what both held at once.

Reads ``memory.csv`` and ``summary.json`` of a run folder; a folder written before they
existed gets no memory section.
"""
from __future__ import annotations

import csv
from pathlib import Path

from reports import style

CAPTION = ("How full is each GPU's cache pool over time? Attention KV and Mamba blocks held "
           "(in use by requests, or cached for reuse and evictable), stacked, against the "
           "pool; the black line is what requests hold. All memory is per GPU.")


def read_memory(path: Path) -> dict[str, list[float]]:
    """``memory.csv`` as columns (``time_s`` float, every other column int)."""
    from sim.config.loader import open_input

    with open_input(path, text=True, newline="") as f:
        text = f.read()
    header, _, body = text.partition("\n")
    names = header.rstrip("\r").split(",")
    fields = body.replace("\n", ",").split(",") if body else []
    if fields and fields[-1] == "":
        fields.pop()            # (the last line's end)
    k = len(names)
    if '"' not in text and len(fields) % k == 0:
        # the file as ``sim run`` writes it (no quoting): a column at a time, every
        # k-th field, by one C-level conversion (a report worker reads this while the
        # other draws: ~7x quicker than csv.reader and a conversion call per value)
        try:
            return _typed(names, (fields[i::k] for i in range(k)))
        except ValueError:
            pass                # (not a number: the reader below says so as before)
    return _read_memory_csv(path)


def _read_memory_csv(path: Path) -> dict[str, list[float]]:
    """``read_memory`` by ``csv.reader``: any CSV (quoted fields and all)."""
    with open(path, newline="") as f:
        rd = csv.reader(f)
        header = next(rd)
        rows = list(rd)
    if not rows:
        return {h: [] for h in header}
    return _typed(header, zip(*rows))


def _typed(names, columns) -> dict[str, list[float]]:
    """memory.csv's text columns as numbers by name (``time_s`` float, every other
    column int), a column at a time by one C-level conversion."""
    return {h: list(map(float if h == "time_s" else int, col)) for h, col in zip(names, columns)}


#: the requests panel draws time bins (each one's time-weighted mean, and its min-max as a
#: band) once a run has more than twice this many engine steps: thousands of steps drawn
#: one by one are a solid block of spikes (Mooncake: 11,700 steps over 7,000 s)
REQUEST_BINS = 150


def binned(t, v, bins: int = REQUEST_BINS):
    """``v`` (each value held from its step's time to the next step's) over ``bins``
    equal bins of [t[0], t[-1]]: (edges, time-weighted mean, min, max) per bin."""
    import numpy as np

    t = np.asarray(t, dtype=float)
    v = np.asarray(v, dtype=float)
    edges = np.linspace(t[0], t[-1], bins + 1)
    if not t[-1] > t[0]:
        return edges, np.full(bins, v[-1]), np.full(bins, v.min()), np.full(bins, v.max())
    # the integral of the step function at each step's time, then at each edge
    area = np.concatenate(([0.0], np.cumsum(v[:-1] * np.diff(t))))
    k = np.clip(np.searchsorted(t, edges, side="right") - 1, 0, len(t) - 1)
    at = area[k] + v[k] * (edges - t[k])
    mean = np.diff(at) / np.diff(edges)
    # min and max: the value holding at each bin's start, and every step inside the bin
    lo, hi = v[k[:-1]].copy(), v[k[:-1]].copy()
    inside = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
    np.minimum.at(lo, inside, v)
    np.maximum.at(hi, inside, v)
    return edges, mean, lo, hi


def memory_frame():
    """The memory figure before its data (in ``style.rc``): (figure, (memory axes,
    requests axes))."""
    fig = style.figure(*style.SINGLE)
    with style.fixed_titles():
        return fig, tuple(fig.subplots(2, 1, sharex=True,
                                       gridspec_kw={"height_ratios": [3, 1.4]}))


def memory_figure(cols: dict[str, list[float]], block_bytes: float, pool_bytes: float,
                  folder: Path, title: str, frame=None, into=None) -> style.Saved:
    """``memory.png``: held blocks by kind (stacked, GiB per GPU), the blocks in use, and
    the pool; below it the requests running and waiting; ``frame``: its
    ``memory_frame``, built ahead (else built here); ``into``: a binary file object the
    PNG goes to instead (``style.save``)."""
    gib = block_bytes / style.GIB
    if "replica" in cols:       # a fleet's memory.csv: replica 0's rows
        n = max(cols["replica"], default=0) + 1
        keep = [i for i, r in enumerate(cols["replica"]) if r == 0]
        cols = {k: [v[i] for i in keep] for k, v in cols.items()}
        title = f"{title} (replica 0 of {n})"
    t = cols["time_s"]
    with style.rc():
        fig, (ax, bx) = frame or memory_frame()
        kv = [v * gib for v in cols["kv_blocks"]]
        mamba = [v * gib for v in cols["mamba_blocks"]]
        in_use = [v * gib for v in cols["in_use_blocks"]]
        if t:
            ax.stackplot(t, kv, mamba, step="post", colors=("#1f77b4", "#2ca02c"), alpha=0.55,
                         labels=("attention KV held", "Mamba states held"))
            ax.step(t, in_use, where="post", color="black", lw=0.9, label="in use by requests")
            if len(t) > 2 * REQUEST_BINS:
                for name, colour in (("running", style.HIT), ("waiting", style.P99)):
                    edges, mean, lo, hi = binned(t, cols[name])
                    bx.stairs(hi, edges, baseline=lo, fill=True, color=colour, alpha=0.22,
                              lw=0)
                    bx.plot((edges[:-1] + edges[1:]) / 2, mean, color=colour, lw=1.2,
                            label=f"{name} (mean)")
                from matplotlib.patches import Patch

                bx.legend(handles=[*bx.get_legend_handles_labels()[0],
                                   Patch(color="grey", alpha=0.35, lw=0,
                                         label=f"min-max per {_seconds(edges[1] - edges[0])}")],
                          loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
            else:
                bx.step(t, cols["running"], where="post", color=style.HIT, lw=0.9,
                        label="running")
                bx.step(t, cols["waiting"], where="post", color=style.P99, lw=0.9,
                        label="waiting")
        else:
            style.empty(ax, "no engine step")
        ax.axhline(pool_bytes / style.GIB, color=style.LOSS, ls="--", lw=1.0,
                   label=f"pool ({style.gib(pool_bytes)})")
        ax.set_ylim(0, pool_bytes / style.GIB * 1.08)
        ax.set_ylabel("memory (GiB per GPU)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        bx.set_ylabel("requests")
        bx.set_xlabel("simulated time (s)")
        bx.grid(alpha=0.3)
        if bx.get_legend() is None:
            bx.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        bx.set_ylim(bottom=0)
        style.integer_axis(bx.yaxis)
        return style.save(fig, folder, "memory", CAPTION, svg=False, into=into)


def _seconds(w: float) -> str:
    """A bin's width for the key: 29 s, 2.5 s, 40 ms."""
    return f"{w:.3g} s" if w >= 1 else f"{w * 1000:.3g} ms"


def as_read(fields) -> dict[str, list[float]]:
    """``memory.csv``'s columns as ``read_memory`` reads them back, from the fields
    ``sim run`` writes it from (``sim.rundir.memory.memory_fields``: each column's %-format and
    values): a float column is its text read back, an int column its values.  ``sim
    run``'s report worker draws from these while the file is being written."""
    from sim.rundir.records import MEMORY_COLUMNS
    from sim.rundir.requests_csv import FLOAT_FIELD

    names = getattr(fields, "names", MEMORY_COLUMNS)    # (``sim.rundir.records.MemoryFields``)
    return {name: ([float(FLOAT_FIELD % v) for v in vals] if spec == FLOAT_FIELD
                   else list(vals))
            for name, (spec, vals) in zip(names, fields)}


def _inputs(folder: Path, s: dict, fields=None) -> tuple[Path, float, float] | None:
    """memory.csv, the pool and a block (bytes) of a run folder; None for a folder
    without a memory section (no memory.csv, unless its ``fields`` are at hand, or no
    pool in summary.json)."""
    path = Path(folder) / "memory.csv"
    if (fields is None and not path.is_file()) or not s.get("pool_bytes") \
            or not s.get("num_gpu_blocks"):
        return None
    per = s.get("per_replica")
    if per:     # a fleet: the figure shows replica 0 (every replica's rows: memory.csv)
        pool = float(per[0]["pool_bytes"])
        return path, pool, pool / per[0]["num_gpu_blocks"]
    pool = float(s["pool_bytes"])
    return path, pool, pool / s["num_gpu_blocks"]


def title_of(scenario: str) -> str:
    """The memory figure's title for a scenario name."""
    return f"{scenario}: pool memory over time"


def memory_png(fields, pool: float, block: float, title: str, frame=None) -> bytes:
    """``memory.png``'s bytes for memory.csv's ``fields`` (``sim.rundir.memory.memory_fields``),
    the pool and a block (bytes) and a title: what ``draw_memory`` writes for the same
    inputs.  A report worker draws it from ``sim.commands.run.memory_prelude`` as soon as the
    replay ends, before the summary and the run folder exist (``reports/workers.py``)."""
    import io

    buf = io.BytesIO()
    memory_figure(as_read(fields), block, pool, Path("."), title, frame, into=buf)
    return buf.getvalue()


def draw_memory(folder: Path, s: dict, fields=None, frame=None, drawn=None) -> None:
    """``memory.png`` of a run folder with a memory section (else nothing); ``fields``:
    memory.csv's, at hand (``as_read``), else the file is read; ``frame``: see
    ``memory_figure``; ``drawn``: ``(fields, pool, block, title, png bytes)`` of a
    figure drawn ahead (``memory_png``), written when those are exactly this folder's
    inputs (else the figure is drawn here)."""
    got = _inputs(folder, s, fields)
    if got is None:
        return
    path, pool, block = got
    title = title_of(s.get("scenario", ""))
    if drawn is not None and fields is not None and drawn[1:4] == (pool, block, title) \
            and drawn[0] == fields:
        from sim.rundir.atomic_files import write_file

        write_file(Path(folder) / "memory.png", drawn[4])
        return
    memory_figure(read_memory(path) if fields is None else as_read(fields), block, pool,
                  Path(folder), title, frame)


def memory_blocks(folder: Path, s: dict, draw: bool = True, fields=None) -> list:
    """The report blocks (``reports/render.py``) of the memory section: the figure and a
    table of the pool and the peaks; [] for a run folder without ``memory.csv``.
    ``draw``: also draw the figure (else it is drawn elsewhere: ``draw_memory``);
    ``fields``: see ``draw_memory``."""
    from reports.render import Table

    folder = Path(folder)
    got = _inputs(folder, s, fields)
    if got is None:
        return []
    _, pool, block = got
    if draw:
        draw_memory(folder, s, fields)
    rows = [
        ["pool", f"{style.gib(pool)} ({s['num_gpu_blocks']:,} blocks of "
                 f"{block / 2**20:,.2f} MiB)"],
        ["attention KV held, peak", style.gib(s["kv_bytes_peak"])],
        ["Mamba states held, peak", style.gib(s["mamba_state_bytes_peak"])],
        ["both held at once, peak", style.gib(s["occupied_bytes_peak"])],
        ["in use by requests at once, peak", style.gib(s["in_use_bytes_peak"])],
    ]
    return [
        ("h2", "Memory"),
        ("p", "All memory figures are per GPU (per tensor-parallel rank). Blocks are held "
              "while in use by a request or cached for reuse (evictable). The attention and "
              "Mamba peaks are each that kind's most at any moment and need not be "
              "simultaneous, so they may add up to more than the pool; `both held at once` "
              "is the most the two held together (at an engine step)."),
        ("table", Table(["memory per GPU", "value"], rows, "lr")),
        ("img", "memory.png", CAPTION),
    ]


def memory_markdown(folder: Path, s: dict, draw: bool = True, fields=None) -> list[str]:
    """The memory section as Markdown lines (for a report assembled as lines)."""
    from reports.render import render_md

    blocks = memory_blocks(folder, s, draw, fields)
    return render_md(blocks).splitlines() + [""] if blocks else []
