"""The sweep report: figures, tables and CSVs for a sweep folder.

``write_sweep_report(sweep_dir)`` reads ``points.csv``, ``points/<point>/requests.csv``
and the name in the copied ``sweep.yaml`` (it never reruns anything) and (re)writes
into ``sweep_dir``:

* ``pareto.png/.svg``: token hit rate against provisioned memory per GPU when the points
  differ in ``pool_bytes``, else against peak Mamba-state memory per GPU, the
  Pareto frontier (max hit, min memory) as a step line, and TTFT p50/p99 per point;
* ``ttft_cdf.png/.svg``, ``ttft_vs_prompt.png/.svg``, ``lost_reuse.png/.svg``;
* for a capacity sweep (points differ in provisioned ``pool_bytes`` or in cache policy,
  ``reports/sweep_capacity.py``): ``capacity.png/.svg``, ``report_capacity.csv`` and the
  cheapest configuration for a target hit rate;
* ``miss_classes.png``: per point, its prompt tokens as hit and miss classes (stacked;
  points written with miss attribution: ``reports/miss_figure.py``);
* ``report.md`` and ``report.html`` (the same blocks; images inline as data URIs);
* ``report_points.csv``, ``report_pareto.csv``, ``report_ttft_quantiles.csv``,
  ``report_lost_reuse.csv`` and, when the report compares a flag off vs on
  (``Sweep.flag_axis``), ``report_flag_delta.csv``: every number the report shows.

The same folder gives byte-identical outputs: points are sorted by id, numbers are
formatted with fixed precision and matplotlib writes no dates, versions or random ids.
Failed points (and ok points without a readable ``requests.csv``) are left out of the
figures and listed in the report.

The work is split by job: ``sweep_data`` (loading, frontier, labels), ``sweep_pareto``
and ``sweep_figures`` (the figures), ``sweep_tables`` (tables and CSVs), ``render``
(Markdown and HTML) and ``style`` (the look shared with the run and compare reports).
"""
from __future__ import annotations

from pathlib import Path

from reports import style
from reports.render import render_html, render_md
from reports.sweep_data import (  # noqa: F401  (the public names callers import from here)
    FlagPair,
    Point,
    Sweep,
    dominators,
    flag_pairs,
    load_sweep,
    pareto_frontier,
)
from reports.sweep_capacity import (
    DEFAULT_TARGET,
    capacity_blocks,
    figure_capacity,
    is_capacity_sweep,
)
from reports.miss_figure import sweep_bars
from reports.sweep_figures import figure_lost_reuse, figure_ttft_cdf, figure_ttft_vs_prompt
from reports.sweep_pareto import figure_pareto
from reports.sweep_tables import build_blocks
from sim.rundir.atomic_files import file_exists, remove_file, write_file

FIGURES = ("pareto", "ttft_cdf", "ttft_vs_prompt", "lost_reuse")


def write_sweep_report(sweep_dir: Path, target: float | None = None) -> list[Path]:
    """(Re)write the sweep report into ``sweep_dir``; returns the files written, sorted.
    ``target``: the token hit rate (a fraction) whose cheapest configuration a capacity
    sweep's report names (default 0.9; see ``reports.sweep_capacity``)."""
    folder = Path(sweep_dir)
    sweep = load_sweep(folder)
    written: list[Path] = []
    stale = folder / "report_flag_delta.csv"
    captions = {}
    with style.rc():
        for stem, draw in zip(FIGURES, (figure_pareto, figure_ttft_cdf, figure_ttft_vs_prompt,
                                        figure_lost_reuse)):
            saved = draw(sweep, folder)
            written += saved.files
            captions[stem] = saved.caption
    blocks, csvs = build_blocks(sweep, folder, captions)
    written += csvs
    stale_capacity = [folder / n for n in ("capacity.png", "capacity.svg", "report_capacity.csv")]
    if is_capacity_sweep(sweep):
        goal = DEFAULT_TARGET if target is None else target
        with style.rc():
            saved = figure_capacity(sweep, folder, goal)
        extra, path = capacity_blocks(sweep, folder, saved.caption, goal)
        at = next((i for i, b in enumerate(blocks) if b == ("h2", "Reuse-Pareto")), len(blocks))
        blocks[at:at] = extra
        written += saved.files + [path]
    else:
        for stale_file in stale_capacity:       # from an earlier capacity sweep's report
            if file_exists(stale_file):
                remove_file(stale_file)
    if stale not in csvs and file_exists(stale):
        remove_file(stale)  # from an earlier report of a different sweep in the same folder
    # why each point missed (miss attribution; points written without it get no section)
    # (each bar named by its point id and the varying axes' values, a key's rows)
    ok = [p for p in sweep.points if p.ok]
    head, rows = sweep.value_table(ok) if sweep.varying_axes else (None, [p.id for p in ok])
    saved_miss = sweep_bars([(row, p.metrics) for row, p in zip(rows, ok)],
                            folder, f"{sweep.name}: why each point missed", head=head)
    if saved_miss is not None:
        at = next((i for i, b in enumerate(blocks) if b == ("h2", "Failed points")), len(blocks))
        blocks[at:at] = [("h2", "Why points missed"),
                         ("p", "Each point's prompt tokens: hit, then what it missed and why "
                               "(`miss_*` in `points.csv`; per request in each point's "
                               "`requests.csv`)."),
                         ("img", "miss_classes.png", saved_miss.caption)]
        written += saved_miss.files
    elif file_exists(folder / "miss_classes.png"):
        remove_file(folder / "miss_classes.png")   # from an earlier report of this folder
    md = folder / "report.md"
    write_file(md, render_md(blocks))
    hp = folder / "report.html"
    write_file(hp, render_html(blocks, folder))
    written += [md, hp]
    return sorted(written)


def main(argv: list[str] | None = None) -> None:
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m reports.sweep_report SWEEP_DIR", file=sys.stderr)
        raise SystemExit(2)
    for p in write_sweep_report(Path(args[0])):
        print(p)


if __name__ == "__main__":
    main()
