"""The token-latency, throughput and SLO numbers in the run and sweep reports, on
hand-built folders: every value shown must be summary.json's (or points.csv's) own, read
by key name, and folders written before those fields existed must still render."""
from __future__ import annotations

import csv
import re

from reports import run_report
from reports.sweep_report import write_sweep_report
from tests.reports.builders import P, Req, write_run, write_sweep

# a distinct value per cell (mean, p50, p90, p99 of each metric), exact in binary, none of
# them what requests.csv's own TTFTs (0.1 .. 1.0 s) would give
LATENCY = {"ttft": (100.25, 110.25, 120.25, 130.25), "tpot": (2.5, 2.25, 3.75, 9.5),
           "itl": (4.0, 3.5, 6.25, 40.75), "e2el": (1234.5, 1100.0, 2000.25, 3999.75),
           "queue_time": (0.5, 0.0, 1.25, 7.5)}
STATS = ("mean", "p50", "p90", "p99")
NEW_FIELDS = {f"{st}_{m}_ms": v for m, vals in LATENCY.items() for st, v in zip(STATS, vals)}
RATES = {"request_throughput": 2.5, "output_throughput": 30.25, "total_token_throughput": 1530.5,
         "arrival_rate": 2.75, "makespan_s": 12.5}
TTFTS = [0.1 * (i + 1) for i in range(10)]


def _section(md: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", md, re.S | re.M)
    assert m, f"no section {title!r}"
    return m.group(1)


def _run_md(tmp_path, **summary) -> str:
    folder = write_run(tmp_path / "r", [Req(ttft=t) for t in TTFTS], **summary)
    run_report.write_report(folder)
    return (folder / "report.md").read_text()


def test_run_latency_table_is_summary_json(tmp_path):
    md = _run_md(tmp_path, **NEW_FIELDS, **RATES, slo_attainment=0.875, request_goodput=1.25)
    sec = _section(md, "Latency")
    assert "| latency (ms) | mean | p50 | p90 | p99 |\n|---|---:|---:|---:|---:|\n" in sec
    rows = [ln for ln in sec.splitlines() if ln.startswith("| ") and "latency (ms)" not in ln]
    assert rows == [
        "| TTFT (time to first token) | 100.25 | 110.25 | 120.25 | 130.25 |",
        "| TPOT (time per output token after the first) | 2.50 | 2.25 | 3.75 | 9.50 |",
        "| ITL (gap between two deliveries of a request's tokens) | 4.00 | 3.50 | 6.25 | 40.75 |",
        "| E2E (arrival to last token) | 1,234.50 | 1,100.00 | 2,000.25 | 3,999.75 |",
        "| queueing delay (arrival to first scheduled) | 0.50 | 0.00 | 1.25 | 7.50 |"]
    assert ("**Throughput** over the 12.50 s makespan (simulated time): 2.50 requests/s, "
            "30.2 output tokens/s, 1,530.5 total (prompt + output) tokens/s.") in sec
    assert "**SLOs:** met by 87.5% of requests" in sec and "goodput 1.25 requests/s" in sec
    # the TTFT table in seconds of older folders gives way to the ms table
    assert "| TTFT mean |" not in md


def test_the_slo_line_names_the_objectives_run_json_records(tmp_path):
    import json

    folder = write_run(tmp_path / "r", [Req(ttft=t) for t in TTFTS], **NEW_FIELDS, **RATES,
                       slo_attainment=0.875, request_goodput=1.25)
    h = json.loads((folder / "run.json").read_text())
    h["scenario"] = {"name": "toy", "slo": {"ttft_ms": 500, "tpot_ms": None, "e2e_ms": 12000.5}}
    (folder / "run.json").write_text(json.dumps(h))
    run_report.write_report(folder)
    sec = _section((folder / "report.md").read_text(), "Latency")
    assert "**SLOs (TTFT ≤ 500 ms, E2E ≤ 12,000.5 ms):** met by 87.5% of requests" in sec


def test_run_without_slos_says_so(tmp_path):
    sec = _section(_run_md(tmp_path, **NEW_FIELDS, **RATES, slo_attainment=None,
                           request_goodput=None), "Latency")
    assert "**SLOs:** no SLOs set" in sec and "met by" not in sec


def test_older_run_folder_renders_without_the_table(tmp_path):
    # builders.SUMMARY predates the ms fields, throughputs and SLOs
    md = _run_md(tmp_path)
    sec = _section(md, "Latency")
    assert "latency (ms)" not in sec and "**Throughput**" not in sec and "SLOs" not in sec
    assert "| 0.200 s | 0.200 s | 0.300 s | 0.400 s | 3 |" in sec    # summary.json's TTFT (s)


def test_run_latency_is_deterministic(tmp_path):
    fields = {**NEW_FIELDS, **RATES, "slo_attainment": 0.5, "request_goodput": 0.75}
    a = write_run(tmp_path / "a", [Req(ttft=t) for t in TTFTS], **fields)
    b = write_run(tmp_path / "b", [Req(ttft=t) for t in TTFTS], **fields)
    run_report.write_report(a)
    run_report.write_report(b)
    assert (a / "report.md").read_bytes() == (b / "report.md").read_bytes()


# ---------------------------------------------------------------- sweep


def _sweep(tmp_path, goodput=(1.5, 0.25), extra=True):
    """Two ok points (distinct token latencies and goodput) and a failed one."""
    def fields(i):
        if not extra:
            return {}
        return {"p50_tpot_ms": 2.25 + i, "p99_tpot_ms": 9.5 + i, "p50_itl_ms": 3.5 + i,
                "p99_itl_ms": 1040.75 + i, "request_goodput": goodput[i]}
    pts = [P("p0", {"cache.flag": "false"}, summary=fields(0)),
           P("p1", {"cache.flag": "true"}, summary=fields(1)),
           P("p2", {"cache.flag": "true"}, status="failed")]
    folder = write_sweep(tmp_path / "s", pts)
    write_sweep_report(folder)
    md = (folder / "report.md").read_text()
    with open(folder / "report_points.csv", newline="") as f:
        rows = {r["point"]: r for r in csv.DictReader(f)}
    return md, rows


def _points_table(md: str) -> tuple[list[str], dict[str, list[str]]]:
    lines = [ln for ln in _section(md, "Points").splitlines() if ln.startswith("| ")]
    split = [[c.strip() for c in ln.strip("|").split(" | ")] for ln in lines]
    return split[0], {r[0]: dict(zip(split[0], r)) for r in split[1:]}


def test_sweep_points_table_has_token_latency_and_goodput(tmp_path):
    md, rows = _sweep(tmp_path)
    head, table = _points_table(md)
    new = ["TPOT p50 (ms)", "TPOT p99 (ms)", "ITL p50 (ms)", "ITL p99 (ms)", "goodput (req/s)"]
    assert head[head.index("output tok/s") + 1:] == new + ["frontier"]
    assert [table["p0"][h] for h in new] == ["2.25", "9.50", "3.50", "1,040.75", "1.50"]
    assert [table["p1"][h] for h in new] == ["3.25", "10.50", "4.50", "1,041.75", "0.25"]
    assert [table["p2"][h] for h in new] == [""] * 5            # failed: no numbers
    assert rows["p0"]["p99_itl_ms"] == "1040.750000" and rows["p1"]["request_goodput"] == "0.250000"
    assert rows["p2"]["p50_tpot_ms"] == ""
    assert "Goodput: requests/s meeting every SLO" in md


def test_sweep_without_slos_has_no_goodput_column(tmp_path):
    md, rows = _sweep(tmp_path, goodput=(None, None))
    head, table = _points_table(md)
    assert "ITL p99 (ms)" in head and "goodput (req/s)" not in head
    assert "Goodput: no SLOs set" in md
    assert rows["p0"]["request_goodput"] == "" and rows["p0"]["p50_itl_ms"] == "3.500000"


def test_older_sweep_has_neither(tmp_path):
    md, rows = _sweep(tmp_path, extra=False)
    head, _ = _points_table(md)
    assert not [h for h in head if "TPOT" in h or "ITL" in h or "goodput" in h]
    assert "Goodput" not in md and "TPOT" not in md
    assert rows["p0"]["p50_tpot_ms"] == "" and rows["p0"]["request_goodput"] == ""
