"""The per-run report: ``report.md`` with a TTFT CDF and a hit-length histogram.

It reads the run folder alone (``summary.json``, ``run.json``, ``requests.csv`` by
column name), so ``sim report DIR`` redraws it without rerunning; figures take their
look from ``reports/style.py`` (Agg backend, fixed metadata: the same run writes the
same bytes).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from reports import style
from reports.render import Table, render_md
from reports.rows import ROW_FIGURES
from sim.rundir.records import LATENCY_STATS
from sim.rundir.stats import percentiles

CAPTIONS = {
    "ttft_cdf": "How long does a request wait for its first token?",
    "hit_hist": "How much of each prompt does the prefix cache serve, and how much does "
                "reconciliation with the Mamba state give up?",
}
MAX_BARS = 12       # distinct values drawn as one bar each; more: a histogram
MAX_BINS = 40


def ttft_frame():
    """The TTFT figure before its data: (figure, axes)."""
    fig = style.figure(6.4, 4.0)
    with style.fixed_titles():
        return fig, fig.add_subplot()


def ttft_cdf(rows, folder: Path, title: str, frame=None) -> style.Saved:
    """``ttft_cdf.png``; ``frame``: its ``ttft_frame``, built ahead (else built here)."""
    vals = np.sort(np.array([r.ttft_s for r in rows], dtype=float))
    n = len(vals)
    fig, ax = frame or ttft_frame()
    if n:
        ax.plot(vals, np.arange(1, n + 1) / n, drawstyle="steps-post", color=style.HIT)
        for q, v, ls in zip((50, 90, 99), percentiles(vals, (50, 90, 99)), (":", "--", "-.")):
            ax.axvline(v, color=style.NOTE, ls=ls, lw=0.8, label=f"p{q} = {v:.3f} s")
        ax.legend(loc="lower right", fontsize=8)
    ax.set_xlabel("time to first token (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=10)
    return style.save(fig, folder, "ttft_cdf", CAPTIONS["ttft_cdf"], svg=False)


def _per_request(ax, values: np.ndarray, unit: int, color: str, what: str, xlabel: str) -> None:
    """Requests by tokens (> 0 only): one bar per value when there are few distinct
    values (typically whole blocks), else a histogram on bins of a round number of hash
    units (hits and losses are whole units, so no bin splits a unit)."""
    nz = values[values > 0]
    distinct, counts = np.unique(nz, return_counts=True)
    ax.set_ylabel("requests")
    ax.grid(alpha=0.3, axis="y")
    if len(distinct) == 0:
        style.empty(ax, f"no request {what}")
        ax.set_xlabel(f"{xlabel} (tokens)")
        return
    if len(distinct) <= MAX_BARS:
        style.distinct_bars(ax, distinct, counts, color, [f"{int(v):,}" for v in distinct],
                            f"{xlabel} (tokens; one bar per distinct value)")
    else:
        unit = max(int(unit), 1)
        # 1, 2, 5, 10, 20, ... hash units: whole units, round widths
        width = unit * max(1, round(style.nice_step(float(nz.max()) / (unit * MAX_BINS),
                                                    (1, 2, 5))))
        edges = np.arange(0, float(nz.max()) + width + 1, width)
        hist, _ = np.histogram(nz, bins=edges)
        # the bins as one filled outline and the thin white lines between bars as one
        # collection: the look of a bar per bin (white-edged), without an artist each
        # (80 rectangles were a quarter of this figure's time)
        ax.stairs(hist, edges, fill=True, color=color, linewidth=0)
        inner = np.minimum(hist[:-1], hist[1:])
        ax.vlines(edges[1:-1][inner > 0], 0, inner[inner > 0], colors="white", linewidth=0.4,
                  zorder=1)     # (with the bins: under the grid, as bar edges were)
        ax.set_xlim(0, edges[-1])
        style.token_axis(ax.xaxis)
        ax.set_xlabel(f"{xlabel} (tokens; bins of {width:,})")
    style.integer_axis(ax.yaxis)


def hist_frame():
    """The hit histogram before its data: (figure, (top axes, bottom axes))."""
    fig = style.figure(8.0, 6.6)
    with style.fixed_titles():
        return fig, tuple(fig.subplots(2, 1, gridspec_kw={"hspace": 0.5}))


def hit_histogram(rows, folder: Path, title: str, unit: int, frame=None) -> style.Saved:
    """Top: the reconciled hit of the requests that reuse a prefix (the misses are
    counted in the title, not drawn: on a trace where most requests miss they would be
    the only bar anyone sees). Bottom: the reuse full attention held but reconciliation
    gave up, of the requests that lost any. ``unit``: the hash unit (tokens);
    ``frame``: its ``hist_frame``, built ahead (else built here)."""
    hits = np.array([r.hit_tokens for r in rows], dtype=float)
    lost = np.array([r.lost_tokens for r in rows], dtype=float)
    n = len(rows)
    fig, (ax, bx) = frame or hist_frame()
    fig.suptitle(title, fontsize=11)
    nh, nl = int((hits > 0).sum()), int((lost > 0).sum())

    def share(k):
        return f"{k / n:.1%}" if n else "n/a"

    _per_request(ax, hits, unit, style.HIT, "reuses a prefix", "reused prefix per request")
    ax.set_title(f"reconciled prefix hit: {nh:,} of {n:,} requests ({share(nh)}) reuse a "
                 f"prefix; {n - nh:,} miss (not drawn)", fontsize=9.5, loc="left")
    _per_request(bx, lost, unit, style.LOSS, "lost reuse", "lost reuse per request")
    bx.set_title(f"lost to reconciliation: {nl:,} of {n:,} requests ({share(nl)}), "
                 f"{int(lost.sum()):,} tokens (requests with a loss only)", fontsize=9.5,
                 loc="left")
    return style.save(fig, folder, "hit_hist", CAPTIONS["hit_hist"], svg=False)


def read_rows(folder: Path) -> list:
    """The served requests of ``requests.csv`` (``sim.rundir.records.RequestRecord``, by column
    name); those refused on arrival have no measurements (see summary.json)."""
    from sim.rundir.records import read_request_records

    return [r for r in read_request_records(Path(folder) / "requests.csv") if not r.rejected]


def _rejected(s: dict) -> str:
    """Requests refused on arrival (a prompt of max_model_len tokens or more, or a
    request the pool can never hold), when there were any; run folders written before
    the field existed have none."""
    n = s.get("rejected_requests", 0)
    return f" served, {n:,} rejected (requests.csv `rejected`)" if n else ""


# what the report reads from summary.json (numbers) and run.json (present)
SUMMARY_NUMBERS = ("requests", "hash_block_size", "num_gpu_blocks", "token_hit_rate", "hit_tokens",
                   "prompt_tokens", "request_hit_rate", "lost_token_rate", "lost_tokens",
                   "mamba_state_bytes_peak", "kv_bytes_peak", "evictions", "preemptions",
                   "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "throughput_tok_s")
RUN_KEYS = ("name", "description", "model", "block_size", "policy", "retention",
            "shared_prefix_checkpoint", "lookahead_hashes", "speculative", "gpu", "workload")


# the latency table's rows: summary.json's ``<stat>_<metric>_ms`` (as `vllm bench serve`
# names them) by metric, with what each measures
LATENCY_ROWS = (("ttft", "TTFT (time to first token)"),
                ("tpot", "TPOT (time per output token after the first)"),
                ("itl", "ITL (gap between two deliveries of a request's tokens)"),
                ("e2el", "E2E (arrival to last token)"),
                ("queue_time", "queueing delay (arrival to first scheduled)"))
THROUGHPUT_KEYS = ("request_throughput", "output_throughput", "total_token_throughput",
                   "makespan_s")


def _ms(v: float) -> str:
    return f"{v:,.2f}"


SLO_NAMES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E"))


def _objectives(scenario) -> str:
    """`` (TTFT <= 500 ms, E2E <= 10,000 ms)`` from the ``slo`` section of run.json's
    ``scenario``; "" when it records none (a folder written before run.json held its
    scenario)."""
    slo = scenario.get("slo") if isinstance(scenario, dict) else None
    if not isinstance(slo, dict):
        return ""
    got = [f"{name} ≤ {slo[k]:,g} ms" for k, name in SLO_NAMES if style.finite(slo.get(k))]
    return f" ({', '.join(got)})" if got else ""


def latency_markdown(s: dict, scenario: dict | None = None) -> list[str]:
    """The Latency section's lines from summary.json: the TTFT/TPOT/ITL/E2E/queueing
    table (mean and percentiles, ms), throughputs, and SLO attainment and goodput, with
    the objectives the ``scenario`` run.json records sets.  A run folder written before
    these fields existed gets its TTFT line (seconds) instead, and no throughput or SLO
    line for fields it lacks."""
    keys = [f"{st}_{m}_ms" for m, _ in LATENCY_ROWS for st in LATENCY_STATS]
    out: list[str] = []
    if all(style.finite(s.get(k)) for k in keys):
        table = Table(["latency (ms)", *LATENCY_STATS],
                      [[what, *(_ms(s[f"{st}_{m}_ms"]) for st in LATENCY_STATS)]
                       for m, what in LATENCY_ROWS], "l" + "r" * len(LATENCY_STATS))
        out += render_md([("table", table)]).splitlines() + [
            "",
            "Milliseconds, as `vllm bench serve` reports them (`summary.json`: `mean_ttft_ms`, "
            "`p99_itl_ms`, ...); percentiles are numpy's `linear`. TPOT counts requests of more "
            "than one output token; ITL every gap over all requests.",
            ""]
    else:   # an older run folder: its TTFT fields in seconds
        out += ["| TTFT mean | p50 | p90 | p99 | output tok/s |",
                "|---|---|---|---|---|",
                f"| {s['ttft_mean_s']:.3f} s | {s['ttft_p50_s']:.3f} s | {s['ttft_p90_s']:.3f} s "
                f"| {s['ttft_p99_s']:.3f} s | {s['throughput_tok_s']:,.0f} |", ""]
    if all(style.finite(s.get(k)) for k in THROUGHPUT_KEYS):
        out += [f"**Throughput** over the {s['makespan_s']:,.2f} s makespan (simulated time): "
                f"{s['request_throughput']:,.2f} requests/s, {s['output_throughput']:,.1f} output "
                f"tokens/s, {s['total_token_throughput']:,.1f} total (prompt + output) tokens/s.",
                ""]
    if "slo_attainment" in s and "request_goodput" in s:
        att, good = s["slo_attainment"], s["request_goodput"]
        if att is None or good is None:
            out += ["**SLOs:** no SLOs set (the scenario has no `slo:` section), so no "
                    "attainment or goodput.", ""]
        elif style.finite(att) and style.finite(good):
            out += [f"**SLOs{_objectives(scenario)}:** met by {att:.1%} of requests (refused ones "
                    f"count as misses); goodput {good:,.2f} requests/s.", ""]
    return out


def load_run_folder(folder: Path, rows: list | None = None,
                    texts: tuple[str, str] | None = None) -> tuple[dict, dict, list]:
    """summary.json, run.json and requests.csv of a run folder, checked before anything is
    drawn: a corrupt or foreign file is one ``InputError`` naming it.  ``rows``: the
    report's columns of requests.csv already at hand (``sim run``: ``reports/rows.py``),
    checked as if read; ``texts``: see ``load_run_json``."""
    s, h = load_run_json(folder, texts)
    return s, h, load_rows(folder, rows)


def load_run_json(folder: Path, texts: tuple[str, str] | None = None) -> tuple[dict, dict]:
    """summary.json and run.json of a run folder, checked (``load_run_folder``);
    ``texts``: the two files' text at hand (``sim run``'s report workers draw while the
    files are written), parsed and checked as the files would be."""
    import math

    from sim.errors import InputError
    from sim.config.loader import load_file, loads_json

    folder = Path(folder)
    if texts is None:
        s = load_file(folder / "summary.json", fmt="json")
        h = load_file(folder / "run.json", fmt="json")
    else:
        s = loads_json(texts[0], str(folder / "summary.json"), InputError)
        h = loads_json(texts[1], str(folder / "run.json"), InputError)
    for path, data in ((folder / "summary.json", s), (folder / "run.json", h)):
        if not isinstance(data, dict):
            raise InputError(f"{path}: expected a JSON object (as sim run writes it)")
    for k in SUMMARY_NUMBERS:
        v = s.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise InputError(f"{folder / 'summary.json'}: {k}: "
                             f"{'missing' if k not in s else f'expected a finite number, got {v!r}'}")
    for k in RUN_KEYS:
        if k not in h:
            raise InputError(f"{folder / 'run.json'}: {k}: missing")
    if isinstance(h["block_size"], bool) or not isinstance(h["block_size"], int) \
            or h["block_size"] < 1:
        raise InputError(f"{folder / 'run.json'}: block_size: expected an integer >= 1, "
                         f"got {h['block_size']!r}")
    return s, h


def load_rows(folder: Path, rows: list | None = None) -> list:
    """The served requests of a run folder's requests.csv, checked (``load_run_folder``)."""
    import csv
    import math

    from sim.errors import InputError

    req = Path(folder) / "requests.csv"
    try:
        if rows is None:
            rows = read_rows(folder)
    except OSError as e:
        raise InputError(f"{req}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InputError(f"{req}: not UTF-8 text") from None
    except (ValueError, IndexError, StopIteration, TypeError, csv.Error) as e:
        raise InputError(f"{req}: not a run's requests table "
                         f"({type(e).__name__}: {str(e) or 'empty file'})") from None
    for r in rows:
        # the figures read hit_tokens, lost_tokens and ttft_s
        if not all(isinstance(v, (int, float)) and math.isfinite(v)
                   for v in (r.hit_tokens, r.lost_tokens, r.ttft_s)):
            raise InputError(f"{req}: request {r.request_id}: not a row of sim run's "
                             f"requests table")
    return rows


# the report's figures, by stem: ``draw`` renders any of them, in any process
FIGURES = ("ttft_cdf", "hit_hist", "miss_waterfall", "memory", "replicas")


def frames(stems) -> dict:
    """The figures ``stems`` built before their data (figure and axes, ticks made:
    ``style.ready``), by stem, for ``draw``: a report worker builds its figures while
    the simulation runs (``reports/workers.py``)."""
    from reports.fleet_figure import replicas_frame
    from reports.memory_figure import memory_frame
    from reports.miss_figure import waterfall_frame

    build = {"ttft_cdf": ttft_frame, "hit_hist": hist_frame,
             "miss_waterfall": waterfall_frame, "memory": memory_frame,
             "replicas": replicas_frame}
    out = {}
    with style.rc():
        for stem in stems:
            if stem in build:
                fig, axes = build[stem]()
                style.ready(axes if isinstance(axes, tuple) else (axes,))
                out[stem] = (fig, axes)
    return out


def draw(folder: Path, stems=FIGURES, s: dict | None = None, h: dict | None = None,
         rows: list | None = None, texts: tuple[str, str] | None = None,
         memory=None, built: dict | None = None, drawn=None) -> None:
    """Render the report's figures ``stems`` into ``folder`` (a figure whose section the
    report leaves out is not drawn), reading the run folder for what is not given.  The
    figures are independent of each other and of report.md, so ``sim run`` draws them in
    worker processes, two groups at once (``reports/workers.py``); ``texts``: see
    ``load_run_json``; ``memory``: memory.csv's fields at hand (``memory_figure.as_read``);
    ``built``: figures built ahead (``frames``), used once each; ``drawn``: the memory
    figure drawn ahead (``memory_figure.draw_memory``)."""
    from reports.memory_figure import draw_memory
    from reports.miss_figure import has_attribution, waterfall

    folder = Path(folder)
    if s is None or h is None:
        s, h = load_run_json(folder, texts)
    if rows is None and any(st in ROW_FIGURES for st in stems):
        rows = load_rows(folder)
    name = h["name"]
    built = {} if built is None else built
    with style.rc():
        if "ttft_cdf" in stems:
            ttft_cdf(rows, folder, f"{name}: time to first token, CDF of {s['requests']:,} "
                                   f"requests", built.pop("ttft_cdf", None))
        if "hit_hist" in stems:
            hit_histogram(rows, folder, f"{name}: prefix reuse per request",
                          s["hash_block_size"], built.pop("hit_hist", None))
        if "miss_waterfall" in stems and has_attribution(s):
            waterfall(s, folder, f"{name}: why requests missed",
                      built.pop("miss_waterfall", None))
    if "memory" in stems:
        draw_memory(folder, s, memory, built.pop("memory", None), drawn)
    if "replicas" in stems:
        from reports.fleet_figure import has_fleet, replicas_figure

        if has_fleet(s):
            with style.rc():
                replicas_figure(s, folder, f"{name}: {s['replicas']} replicas behind "
                                           f"{s['router']}", built.pop("replicas", None))


def write_report(folder: Path, stems=FIGURES, rows: list | None = None,
                 texts: tuple[str, str] | None = None, memory=None,
                 built: dict | None = None) -> None:
    """Rebuild report.md and its figures from a run folder (requests.csv,
    summary.json, run.json).  ``stems``: the figures drawn here (the others are drawn
    elsewhere: ``reports/workers.py``); ``rows``, ``texts`` and ``memory``: the run's
    files at hand (see ``load_run_folder`` and ``draw``); ``built``: see ``draw``."""
    folder = Path(folder)
    s, h, rows = load_run_folder(folder, rows, texts)
    name = h["name"]
    draw(folder, [st for st in FIGURES if st in stems and st in ROW_FIGURES], s, h, rows,
         memory=memory, built=built)
    lines = [
        f"# Run report: {name}",
        "",
        h["description"] or "",
        "",
        "| | |",
        "|---|---|",
        f"| model | {h['model']} (block {h['block_size']} tokens, hash unit {s['hash_block_size']}) |",
        f"| cache policy | {h['policy']}: retention {h['retention']}, junction flag "
        f"{'on' if h['shared_prefix_checkpoint'] else 'off'}, lookahead hashes "
        f"{'on' if h['lookahead_hashes'] else 'off'} |",
        f"| speculative | {h['speculative']} |",
        f"| GPU | {h['gpu']}, {s['num_gpu_blocks']:,} pool blocks |",
        f"| workload | {h['workload']} |",
        "",
        "## Reuse",
        "",
        "| metric | value |",
        "|---|---|",
        f"| requests | {s['requests']:,}{_rejected(s)} |",
        f"| token hit rate | {s['token_hit_rate']:.2%} ({s['hit_tokens']:,} of {s['prompt_tokens']:,}) |",
        f"| request hit rate | {s['request_hit_rate']:.2%} |",
        f"| lost to reconciliation | {s['lost_token_rate']:.2%} of prompt tokens ({s['lost_tokens']:,}) |",
        f"| Mamba state memory, peak | {style.gib(s['mamba_state_bytes_peak'])} |",
        f"| attention KV memory, peak | {style.gib(s['kv_bytes_peak'])} |",
        f"| evicted cache keys | {s['evictions']:,} |",
        f"| preemptions | {s['preemptions']:,} |",
        "",
        "## Latency",
        "",
        *latency_markdown(s, h.get("scenario")),
        f"![{CAPTIONS['ttft_cdf']}](ttft_cdf.png)",
        "",
        f"![{CAPTIONS['hit_hist']}](hit_hist.png)",
        "",
        "Per-request values: `requests.csv`; every figure above: `summary.json`.",
        "",
    ]
    from reports.miss_figure import miss_markdown  # why requests missed (attribution)
    lines += miss_markdown(folder, s, rows, name, draw="miss_waterfall" in stems)
    from reports.fleet_figure import fleet_markdown  # a fleet's replicas side by side
    lines += fleet_markdown(folder, s, h, draw="replicas" in stems)
    from reports.memory_figure import memory_markdown  # the pool over time (memory.csv)
    lines += memory_markdown(folder, s, draw="memory" in stems, fields=memory)
    from sim.rundir.atomic_files import write_file

    write_file(folder / "report.md", "\n".join(lines))
