"""The sweep report's numbers: its tables (as report blocks) and its ``report_*.csv``.

Every number the report shows is written to a CSV with fixed precision (so the same
folder gives the same bytes), and the Markdown and HTML tables are built from the same
values.  The figures' captions arrive from the figure writers so that each image's alt
text says the question it answers.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

from reports.render import Table
from reports.style import finite
from reports.sweep_data import (
    JUNCTION_FLAG,
    Sweep,
    axis_name,
    by_memory,
    dominators,
    flag_pairs,
    lost_reuse_stats,
    natural_key,
    pareto_frontier,
    pareto_items,
    provisioned,
    short_axis,
)


def _f(v: float, digits: int) -> str:
    """Fixed-precision number for the CSVs; empty when missing."""
    return f"{v:.{digits}f}" if finite(v) else ""


def _r(v: float, fmt: str, unit: str = "") -> str:
    """A number for the report; n/a when missing."""
    return (format(v, fmt) + unit) if finite(v) else "n/a"


def _signed(v: float, fmt: str, unit: str = "") -> str:
    if not finite(v):
        return "n/a"
    s = format(v, "+" + fmt)
    if s.lstrip("+-").strip("0.") == "":
        s = format(0.0, fmt)  # no "-0.00"
    return s + unit


def _rel(new: float, old: float) -> float:
    return (new - old) / old * 100.0 if finite(new) and finite(old) and old != 0 else math.nan


# token latency and goodput per point (points.csv, as `vllm bench serve` names them), each
# shown when some ok point has it: a sweep written before these fields, or (goodput) whose
# scenario sets no SLOs, leaves the column out
EXTRA_COLUMNS = (("p50_tpot_ms", "TPOT p50 (ms)"), ("p99_tpot_ms", "TPOT p99 (ms)"),
                 ("p50_itl_ms", "ITL p50 (ms)"), ("p99_itl_ms", "ITL p99 (ms)"),
                 ("request_goodput", "goodput (req/s)"),
                 ("max_arrival_rate", "max rate (req/s)"))


def extra_columns(sweep: Sweep) -> list[tuple[str, str]]:
    """The EXTRA_COLUMNS that some ok point of the sweep has a value for."""
    return [(k, h) for k, h in EXTRA_COLUMNS
            if any(p.ok and finite(p.metrics.get(k)) for p in sweep.points)]


def _points_table(sweep: Sweep, front: set[str]):
    extra = extra_columns(sweep)
    head = (["id", "label", "status"] + [short_axis(a) for a in sweep.axes]
            + ["token hit", "request hit", "lost tokens", "Mamba GiB", "states/req",
               "TTFT p50 (s)", "TTFT p90 (s)", "TTFT p99 (s)", "output tok/s"]
            + [h for _, h in extra] + ["frontier"])
    rows = []
    for p in sweep.points:
        num = p.ok
        rows.append([p.id, p.label, p.status + (f" ({p.note})" if p.note else "")]
                    + [p.axes[a] for a in sweep.axes]
                    + ([_r(p.hit_pct, ".2f", " %"), _r(p.m("request_hit_rate") * 100, ".2f", " %"),
                        _r(p.m("lost_token_rate") * 100, ".2f", " %"), _r(p.mamba_gib, ".2f"),
                        _r(p.states_per_request, ".2f"), _r(p.ttft("ttft_p50_s"), ".3f"),
                        _r(p.ttft("ttft_p90_s"), ".3f"), _r(p.ttft("ttft_p99_s"), ".3f"),
                        _r(p.m("throughput_tok_s"), ",.1f")]
                       + [_r(p.m(k), ",.2f") for k, _ in extra]
                       + ["yes" if p.id in front else ""]
                       if num else [""] * (10 + len(extra))))
    align = "lll" + "l" * len(sweep.axes) + "r" * (9 + len(extra)) + "c"
    return head, rows, align


def _latency_note(sweep: Sweep) -> str:
    """What the token-latency and goodput columns are, and why goodput is missing when
    the sweep's points carry the field but no SLOs were set."""
    keys = {k for k, _ in extra_columns(sweep)}
    note = ""
    if keys & {"p50_tpot_ms", "p99_tpot_ms", "p50_itl_ms", "p99_itl_ms"}:
        note += (" TPOT (time per output token after the first) and ITL (gap between two "
                 "deliveries of a request's tokens) are in ms, as `vllm bench serve` reports "
                 "them.")
    if "request_goodput" in keys:
        note += " Goodput: requests/s meeting every SLO of the scenario's `slo:` section."
    elif any(p.ok and "request_goodput" in p.metrics for p in sweep.points):
        note += " Goodput: no SLOs set (no `slo:` section), so no goodput column."
    if "max_arrival_rate" in keys:
        note += (" Max rate: the highest arrival rate at which the point still meets its SLOs "
                 "at the search's attainment (`sim sweep --search rate`; every run in "
                 "`search.csv`).")
    return note


def _write_csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    import io

    from sim.rundir.atomic_files import write_file

    f = io.StringIO(newline="")
    w = csv.writer(f, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    write_file(path, f.getvalue())
    return path


def _csv_points(sweep: Sweep, folder: Path, front: set[str]) -> Path:
    header = (["point", "label", "status", "error", "note"] + sweep.axes
              + ["requests", "token_hit_rate_pct", "request_hit_rate_pct", "lost_token_rate_pct",
                 "mamba_state_bytes_peak", "mamba_state_gib", "states_per_request", "ttft_mean_s",
                 "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "throughput_tok_s"]
              + [k for k, _ in EXTRA_COLUMNS] + ["on_pareto_frontier"])
    rows = []
    for p in sweep.points:
        mb = p.m("mamba_state_bytes_peak")
        rows.append([p.id, p.label, p.status, p.error, p.note] + [p.axes[a] for a in sweep.axes]
                    + [str(int(p.m("requests"))) if finite(p.m("requests")) else "",
                       _f(p.hit_pct, 4), _f(p.m("request_hit_rate") * 100, 4),
                       _f(p.m("lost_token_rate") * 100, 4),
                       str(int(mb)) if finite(mb) else "", _f(p.mamba_gib, 4),
                       _f(p.states_per_request, 4), _f(p.ttft("ttft_mean_s"), 6),
                       _f(p.ttft("ttft_p50_s"), 6), _f(p.ttft("ttft_p90_s"), 6),
                       _f(p.ttft("ttft_p99_s"), 6), _f(p.m("throughput_tok_s"), 3)]
                    + [_f(p.m(k), 6) for k, _ in EXTRA_COLUMNS]
                    + [("true" if p.id in front else "false") if p.plotted else ""])
    return _write_csv(folder / "report_points.csv", header, rows)


def build_blocks(sweep: Sweep, folder: Path, captions: dict[str, str]):
    """The report as a list of blocks shared by the MD and HTML writers, and the CSVs
    written; ``captions``: each figure's caption by file stem (its alt text)."""
    pts = sweep.plotted
    items = pareto_items(pts)
    front_ids = pareto_frontier(items)
    front = set(front_ids)
    failed = [p for p in sweep.points if not p.ok]
    unplotted = [p for p in sweep.points if p.ok and not p.plotted]
    csvs: list[Path] = []
    B: list[tuple] = []

    scen = sorted({str(p.metrics.get("scenario")) for p in sweep.points if p.ok
                   and p.metrics.get("scenario")})
    B.append(("h1", f"Sweep report: {sweep.name}"))
    summ = [f"Base scenario: {', '.join(scen) if scen else 'unknown'}. "
            f"{len(sweep.points)} point{'s' if len(sweep.points) != 1 else ''}: "
            f"{sum(p.ok for p in sweep.points)} ok, {len(failed)} failed"
            + (f", {len(unplotted)} ok but not plotted" if unplotted else "") + "."]
    for key, name in (("model", "model"), ("policy", "cache policy"),
                      ("block_size", "attention/Mamba block (tokens)")):
        vals = sorted({str(p.metrics.get(key)) for p in sweep.points
                       if p.ok and p.metrics.get(key) is not None}, key=natural_key)
        if vals:
            summ.append(f"{name}: {', '.join(vals)}.")
    B.append(("p", " ".join(summ)))
    if sweep.axes:
        B.append(("ul", [f"axis `{a}`" + (f" (in figures: {axis_name(a)})"
                                           if axis_name(a) != short_axis(a) else "")
                         + ": " + ", ".join(sorted({p.axes[a] for p in sweep.points},
                                                   key=natural_key))
                         for a in sweep.axes]))
    B.append(("p", "Memory is the peak Mamba-state memory per GPU (GiB = 2^30 bytes); "
                   "states/req is the mean number of Mamba states written per request "
                   "(requests.csv); hit and lost rates are shares of prompt tokens."
                   + (" The points provision different pools, so the Reuse-Pareto's frontier "
                      "is taken on provisioned memory per GPU (pool_bytes), as its figure draws "
                      "it." if provisioned(pts) else "")
                   + _latency_note(sweep)))

    # points
    B.append(("h2", "Points"))
    head, rows, align = _points_table(sweep, front)
    B.append(("table", Table(head, rows, align)))
    csvs.append(_csv_points(sweep, folder, front))

    # pareto
    B.append(("h2", "Reuse-Pareto"))
    B.append(("img", "pareto.png", captions["pareto"]))
    by_mem = by_memory(pts)
    prow = []
    crow = []
    for p in by_mem:
        dom = dominators(items, p.id) if p.id not in front else []
        crow.append([p.id, p.label, _f(p.mamba_gib, 4), str(int(p.m("mamba_state_bytes_peak"))),
                     _f(p.hit_pct, 4), _f(p.states_per_request, 4), _f(p.ttft("ttft_p50_s"), 6),
                     _f(p.ttft("ttft_p99_s"), 6), "true" if p.id in front else "false",
                     ";".join(dom)])
        if p.id in front:
            prow.append([p.id, p.label, _r(p.mamba_gib, ".2f"), _r(p.hit_pct, ".2f", " %"),
                         _r(p.states_per_request, ".2f"), _r(p.ttft("ttft_p50_s"), ".3f"),
                         _r(p.ttft("ttft_p99_s"), ".3f")])
    csvs.append(_write_csv(folder / "report_pareto.csv",
                           ["point", "label", "mamba_state_gib", "mamba_state_bytes_peak",
                            "token_hit_rate_pct", "states_per_request", "ttft_p50_s", "ttft_p99_s",
                            "on_frontier", "dominated_by"], crow))
    if prow:
        B.append(("p", f"Pareto frontier (maximum token hit rate, minimum Mamba memory), "
                       f"{len(prow)} of {len(pts)} plotted points, by memory:"))
        B.append(("table", Table(["id", "label", "Mamba GiB", "token hit", "states/req",
                                  "TTFT p50 (s)", "TTFT p99 (s)"], prow, "llrrrrr")))
        dominated = [p for p in by_mem if p.id not in front]
        if dominated:
            B.append(("p", "Dominated: " + "; ".join(
                f"{p.id} by {', '.join(dominators(items, p.id))}" for p in
                sorted(dominated, key=lambda p: natural_key(p.id))) + "."))
    else:
        B.append(("p", "No successful points: no frontier."))

    # flag delta
    pairs = flag_pairs(sweep)
    if pairs is not None:
        flag, groups = pairs
        others = [a for a in sweep.axes if a != flag]
        B.append(("h2", f"Flag off vs on: {flag}"))
        B.append(("p", f"Each row pairs the point with `{short_axis(flag)}=false` and the one "
                       f"with `{short_axis(flag)}=true` at the same other-axis values; deltas "
                       f"are on minus off (relative to off). A positive hit delta means the flag "
                       f"reuses more; a positive TTFT or memory delta means it costs more."))
        drows, dcsv = [], []
        for g in groups:
            oth = [g.others[a] for a in others]
            ids = [g.off.id if g.off else "", g.on.id if g.on else ""]
            if not g.complete:
                why = ", ".join(f"{p.id} {p.status if not p.ok else 'not plotted'}"
                                for p in (g.off, g.on) if p is not None and not p.plotted)
                missing = [s for s, p in (("off", g.off), ("on", g.on)) if p is None]
                why = why or f"no {' / '.join(missing)} point"
                drows.append(oth + ids + [f"n/a ({why})"] + [""] * 3)
                dcsv.append(oth + ids + ["false"] + [""] * 16)
                continue
            a, b = g.off, g.on
            vals = {}
            for k, fa, fb in (("hit", a.hit_pct, b.hit_pct),
                              ("p50", a.ttft("ttft_p50_s"), b.ttft("ttft_p50_s")),
                              ("p99", a.ttft("ttft_p99_s"), b.ttft("ttft_p99_s")),
                              ("mem", a.mamba_gib, b.mamba_gib)):
                vals[k] = (fa, fb, fb - fa, _rel(fb, fa))
            h, t50, t99, mem = vals["hit"], vals["p50"], vals["p99"], vals["mem"]
            drows.append(oth + ids + [
                f"{h[0]:.2f} → {h[1]:.2f} %: {_signed(h[2], '.2f', ' pp')} "
                f"({_signed(h[3], '.1f', ' %')})",
                f"{_signed(t50[2], '.3f', ' s')} ({_signed(t50[3], '.1f', ' %')})",
                f"{_signed(t99[2], '.3f', ' s')} ({_signed(t99[3], '.1f', ' %')})",
                f"{_signed(mem[2], '.3f', ' GiB')} ({_signed(mem[3], '.1f', ' %')})"])
            dcsv.append(oth + ids + ["true"] + [
                _f(h[0], 4), _f(h[1], 4), _f(h[2], 4), _f(h[3], 4),
                _f(t50[0], 6), _f(t50[1], 6), _f(t50[2], 6), _f(t50[3], 4),
                _f(t99[0], 6), _f(t99[1], 6), _f(t99[2], 6), _f(t99[3], 4),
                _f(mem[0], 4), _f(mem[1], 4), _f(mem[2], 4), _f(mem[3], 4)])
        B.append(("table", Table([short_axis(a) for a in others] + ["off", "on",
                                  "token hit off → on (Δ pp, rel.)", "TTFT p50 Δ (rel.)",
                                  "TTFT p99 Δ (rel.)", "Mamba memory Δ (rel.)"],
                                 drows, "l" * len(others) + "ll" + "rrrr")))
        csvs.append(_write_csv(
            folder / "report_flag_delta.csv",
            others + ["off_point", "on_point", "complete",
                      "token_hit_rate_off_pct", "token_hit_rate_on_pct", "token_hit_delta_pp",
                      "token_hit_delta_rel_pct",
                      "ttft_p50_off_s", "ttft_p50_on_s", "ttft_p50_delta_s", "ttft_p50_delta_rel_pct",
                      "ttft_p99_off_s", "ttft_p99_on_s", "ttft_p99_delta_s", "ttft_p99_delta_rel_pct",
                      "mamba_state_off_gib", "mamba_state_on_gib", "mamba_state_delta_gib",
                      "mamba_state_delta_rel_pct"], dcsv))
    elif len(sweep.boolean_axes) > 1:
        B.append(("p", f"No flag off/on section: {len(sweep.boolean_axes)} boolean axes "
                       f"({', '.join(sweep.boolean_axes)}); it needs exactly one, or the "
                       f"junction flag ({JUNCTION_FLAG}) among them."))

    # TTFT
    B.append(("h2", "Time to first token"))
    qrows, qcsv = [], []
    for p in pts:
        qrows.append([p.id, f"{len(p.requests):,}", _r(p.ttft("ttft_mean_s"), ".3f"),
                      _r(p.ttft("ttft_p50_s"), ".3f"), _r(p.ttft("ttft_p90_s"), ".3f"),
                      _r(p.ttft("ttft_p99_s"), ".3f")])
        qcsv.append([p.id, p.label, str(len(p.requests)), _f(p.ttft("ttft_mean_s"), 6),
                     _f(p.ttft("ttft_p50_s"), 6), _f(p.ttft("ttft_p90_s"), 6),
                     _f(p.ttft("ttft_p99_s"), 6)])
    csvs.append(_write_csv(folder / "report_ttft_quantiles.csv",
                           ["point", "label", "requests", "ttft_mean_s", "ttft_p50_s",
                            "ttft_p90_s", "ttft_p99_s"], qcsv))
    if qrows:
        B.append(("table", Table(["id", "requests", "mean (s)", "p50 (s)", "p90 (s)", "p99 (s)"],
                                 qrows, "lrrrrr")))
    B.append(("img", "ttft_cdf.png", captions["ttft_cdf"]))
    B.append(("img", "ttft_vs_prompt.png", captions["ttft_vs_prompt"]))

    # lost reuse
    B.append(("h2", "Lost reuse"))
    B.append(("p", "Tokens full attention held for a request but reconciliation with the Mamba "
                   "state dropped (requests.csv `lost_tokens`); requests with a loss only."))
    lrows, lcsv = [], []
    for p in pts:
        st = lost_reuse_stats(p)
        share = st["with_loss"] / st["requests"] * 100 if st["requests"] else math.nan
        lrows.append([p.id, f"{st['requests']:,}", f"{st['with_loss']:,}", _r(share, ".1f", " %"),
                      f"{int(st['total']):,}", _r(st["mean"], ",.0f"),
                      _r(p.m("lost_token_rate") * 100, ".2f", " %")])
        lcsv.append([p.id, p.label, str(st["requests"]), str(st["with_loss"]), _f(share, 4),
                     str(int(st["total"])), _f(st["mean"], 2), _f(p.m("lost_token_rate") * 100, 4)])
    csvs.append(_write_csv(folder / "report_lost_reuse.csv",
                           ["point", "label", "requests", "requests_with_loss",
                            "requests_with_loss_pct", "lost_tokens_total",
                            "lost_tokens_mean_per_affected_request", "lost_token_rate_pct"], lcsv))
    if lrows:
        B.append(("table", Table(["id", "requests", "with loss", "share", "lost tokens",
                                  "mean per affected", "of prompt tokens"], lrows, "lrrrrrr")))
    B.append(("img", "lost_reuse.png", captions["lost_reuse"]))

    # failed
    B.append(("h2", "Failed points"))
    if failed or unplotted:
        frows = [[p.id, p.label, p.status, p.error or "(no error given)"] for p in failed]
        frows += [[p.id, p.label, p.status, p.note] for p in unplotted]
        B.append(("p", "Left out of every figure and of the Pareto, TTFT and lost-reuse tables."))
        B.append(("table", Table(["id", "label", "status", "error"], frows, "llll")))
    else:
        B.append(("p", "None."))
    B.append(("p", "Numbers: `report_points.csv`, `report_pareto.csv`, "
                   "`report_ttft_quantiles.csv`, `report_lost_reuse.csv`"
                   + (", `report_flag_delta.csv`" if pairs is not None else "")
                   + "; figures also as SVG."))
    return B, csvs
