"""The sweep report on the committed fixture sweep and on hand-built points.csv files.

tests/fixtures/sweep_small was made with
``python tests/reports/make_sweep_fixture.py tests/fixtures/sweep_small --requests 100
--fixed-wall --axis cache.enable_mamba_shared_prefix_checkpoint=false,true
--axis cache.prefix_match_unit=64,192,100``: four ok points (p000 p001 p003 p004) and two
failed ones (p002 p005, prefix_match_unit=100 does not divide the 4,416-token block).
"""
from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import pytest

from reports.sweep_report import (
    dominators,
    flag_pairs,
    load_sweep,
    pareto_frontier,
    write_sweep_report,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sweep_small"
FIGURES = ["pareto", "ttft_cdf", "ttft_vs_prompt", "lost_reuse"]
EXPECTED = sorted([f"{f}.{ext}" for f in FIGURES for ext in ("png", "svg")]
                  + ["report.md", "report.html", "report_points.csv", "report_pareto.csv",
                     "report_ttft_quantiles.csv", "report_lost_reuse.csv",
                     "report_flag_delta.csv"])
OK_POINTS = ["p000", "p001", "p003", "p004"]
FAILED_POINTS = ["p002", "p005"]


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _section(md: str, title: str) -> str:
    """The text of a '## title' section of report.md."""
    m = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", md, re.S | re.M)
    assert m, f"no section {title!r}"
    return m.group(1)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The fixture sweep copied to a temporary folder, with its report written once."""
    folder = tmp_path_factory.mktemp("a") / "sweep_small"
    shutil.copytree(FIXTURE, folder)
    written = write_sweep_report(folder)
    return folder, written


# ---------------------------------------------------------------- the fixture sweep


def test_fixture_is_small_and_has_no_report():
    size = sum(p.stat().st_size for p in FIXTURE.rglob("*") if p.is_file())
    assert size < 200_000
    assert not list(FIXTURE.glob("report*")) and not list(FIXTURE.glob("*.png"))


def test_writes_every_file(report):
    folder, written = report
    assert written == sorted(written)
    assert [p.name for p in written] == EXPECTED
    for p in written:
        assert p.parent == folder and p.stat().st_size > 0, p
    for f in FIGURES:
        assert (folder / f"{f}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (folder / f"{f}.svg").read_text().lstrip().startswith("<?xml")


def test_report_points_has_one_row_per_point(report):
    folder, _ = report
    points = _rows(folder / "points.csv")
    rows = _rows(folder / "report_points.csv")
    assert [r["point"] for r in rows] == [r["point"] for r in points]
    assert len(rows) == 6
    by_id = {r["point"]: r for r in rows}
    for pid in OK_POINTS:
        r = by_id[pid]
        assert r["status"] == "ok"
        assert 0 < float(r["token_hit_rate_pct"]) <= 100
        assert float(r["mamba_state_gib"]) > 0
        assert float(r["states_per_request"]) >= 1  # every request writes a state here
        src = next(p for p in points if p["point"] == pid)
        assert float(r["token_hit_rate_pct"]) == pytest.approx(
            float(src["token_hit_rate"]) * 100, abs=1e-4)
        assert float(r["mamba_state_gib"]) == pytest.approx(
            int(src["mamba_state_bytes_peak"]) / 2**30, abs=1e-4)
    for pid in FAILED_POINTS:
        assert by_id[pid]["status"] == "failed"
        assert "must divide" in by_id[pid]["error"]
        assert by_id[pid]["token_hit_rate_pct"] == ""


def test_states_per_request_is_the_mean_of_requests_csv(report):
    folder, _ = report
    reqs = _rows(folder / "points" / "p003" / "requests.csv")
    mean = sum(int(r["mamba_states_written"]) for r in reqs) / len(reqs)
    row = next(r for r in _rows(folder / "report_points.csv") if r["point"] == "p003")
    assert float(row["states_per_request"]) == pytest.approx(mean, abs=1e-4)


def test_quantile_and_lost_reuse_csvs(report):
    folder, _ = report
    q = _rows(folder / "report_ttft_quantiles.csv")
    assert [r["point"] for r in q] == OK_POINTS
    for r in q:
        assert 0 < float(r["ttft_p50_s"]) <= float(r["ttft_p90_s"]) <= float(r["ttft_p99_s"])
        assert float(r["ttft_mean_s"]) > 0
    lost = {r["point"]: r for r in _rows(folder / "report_lost_reuse.csv")}
    assert list(lost) == OK_POINTS
    for pid in OK_POINTS:
        reqs = _rows(folder / "points" / pid / "requests.csv")
        nz = [int(r["lost_tokens"]) for r in reqs if int(r["lost_tokens"]) > 0]
        assert int(lost[pid]["requests_with_loss"]) == len(nz)
        assert int(lost[pid]["lost_tokens_total"]) == sum(nz)


def test_pareto_of_the_fixture(report):
    folder, _ = report
    rows = _rows(folder / "report_pareto.csv")
    assert sorted(r["point"] for r in rows) == OK_POINTS
    mem = [float(r["mamba_state_gib"]) for r in rows]
    assert mem == sorted(mem)
    front = [r for r in rows if r["on_frontier"] == "true"]
    # along the frontier memory grows and so does the hit rate
    hits = [float(r["token_hit_rate_pct"]) for r in front]
    assert hits == sorted(hits) and len(front) >= 1
    for r in rows:
        if r["on_frontier"] == "false":
            assert r["dominated_by"]
            for d in r["dominated_by"].split(";"):
                dr = next(x for x in rows if x["point"] == d)
                assert float(dr["mamba_state_gib"]) <= float(r["mamba_state_gib"])
                assert float(dr["token_hit_rate_pct"]) >= float(r["token_hit_rate_pct"])
    md = (folder / "report.md").read_text()
    table = _section(md, "Reuse-Pareto")
    for r in front:
        assert f"| {r['point']} |" in table


def test_failed_points_in_report_not_in_figures(report):
    folder, _ = report
    md = (folder / "report.md").read_text()
    failed = _section(md, "Failed points")
    html = (folder / "report.html").read_text()
    for pid in FAILED_POINTS:
        assert f"| {pid} |" in failed
        assert pid in html
    assert "must divide every group block size" in failed
    # SVG text stays text (svg.fonttype none): the figures name every ok point, no failed one
    for f in FIGURES:
        svg = (folder / f"{f}.svg").read_text()
        for pid in OK_POINTS:
            assert pid in svg, (f, pid)
        for pid in FAILED_POINTS:
            assert pid not in svg, (f, pid)
    for name in ("report_pareto.csv", "report_ttft_quantiles.csv", "report_lost_reuse.csv"):
        assert not any(r["point"] in FAILED_POINTS for r in _rows(folder / name)), name
    for title in ("Time to first token", "Lost reuse"):
        for pid in FAILED_POINTS:
            assert f"| {pid} |" not in _section(md, title)


def test_flag_delta_section_has_the_right_sign(report):
    folder, _ = report
    md = (folder / "report.md").read_text()
    sec = _section(md, "Flag off vs on: cache.enable_mamba_shared_prefix_checkpoint")
    rows = {r["cache.prefix_match_unit"]: r for r in _rows(folder / "report_flag_delta.csv")}
    assert list(rows) == ["64", "100", "192"]
    for unit, off, on in (("64", "p000", "p003"), ("192", "p001", "p004")):
        r = rows[unit]
        assert (r["off_point"], r["on_point"], r["complete"]) == (off, on, "true")
        pts = {p["point"]: p for p in _rows(folder / "report_points.csv")}
        want = float(pts[on]["token_hit_rate_pct"]) - float(pts[off]["token_hit_rate_pct"])
        assert want > 0  # the shared-prefix checkpoint recovers the lost reuse
        assert float(r["token_hit_delta_pp"]) == pytest.approx(want, abs=1e-3)
        assert float(r["token_hit_delta_rel_pct"]) > 0
        assert float(r["ttft_p50_delta_s"]) < 0  # and the first token comes sooner
        line = next(ln for ln in sec.splitlines() if ln.startswith(f"| {unit} |"))
        assert f"+{want:.2f} pp" in line
    assert rows["100"]["complete"] == "false"
    assert "n/a (p002 failed, p005 failed)" in sec


def test_html_is_self_contained(report):
    folder, _ = report
    html = (folder / "report.html").read_text()
    srcs = re.findall(r'src="([^"]*)"', html)
    assert len(srcs) == 4 and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "<link" not in html and "http://" not in html and "https://" not in html
    md = (folder / "report.md").read_text()
    for f in FIGURES:
        assert f"]({f}.png)" in md
    # the same tables: every Markdown table row's first cell is an HTML cell too
    for ln in md.splitlines():
        if ln.startswith("| p0"):
            assert f"<td>{ln.split(' | ')[0][2:]}</td>" in html


def test_deterministic(report, tmp_path):
    folder, written = report
    other = tmp_path / "b" / "sweep_small"
    shutil.copytree(FIXTURE, other)
    again = write_sweep_report(other)
    assert [p.name for p in again] == [p.name for p in written]
    for a, b in zip(written, again):
        assert a.read_bytes() == b.read_bytes(), a.name


# ---------------------------------------------------------------- hand-built sweeps

SUMMARY = {"scenario": "synthetic", "model": "m", "policy": "vllm", "block_size": 1024,
           "hash_block_size": 64, "num_gpu_blocks": 100, "requests": 3, "prompt_tokens": 3000,
           "hit_tokens": 0, "token_hit_rate": 0.0, "request_hit_rate": 0.5, "lost_tokens": 0,
           "lost_token_rate": 0.01, "ttft_mean_s": 0.2, "ttft_p50_s": 0.2, "ttft_p90_s": 0.3,
           "ttft_p99_s": 0.4, "output_tokens": 30, "makespan_s": 10.0, "throughput_tok_s": 3.0,
           "mamba_state_bytes_peak": 0, "kv_bytes_peak": 0, "evictions": 0, "preemptions": 0,
           "steps": 10, "wall_s": 0.0, "sim_requests_per_s": 0.0}
# id, flag, unit, status, memory GiB, hit rate: p0, p1, p4 are the frontier; p2 (same memory
# as p1, lower hit) and p3 (more memory, lower hit) are dominated by p1 only.
SYNTH = [("p0", "false", 1, "ok", 10, 0.50), ("p1", "false", 2, "ok", 20, 0.70),
         ("p2", "true", 1, "ok", 20, 0.60), ("p3", "true", 2, "ok", 30, 0.65),
         ("p4", "false", 3, "ok", 40, 0.90), ("p5", "true", 3, "failed", None, None)]


def _synthetic(folder: Path, points=SYNTH, axes=("cache.flag", "cache.unit")) -> Path:
    folder.mkdir(parents=True)
    header = ["point", "label", "status", "error", *axes, *SUMMARY]
    with open(folder / "points.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        for pid, flag, unit, status, gib, hit in points:
            vals = dict(zip(axes, (flag, unit)))
            label = ", ".join(f"{a.split('.')[-1]}={v}" for a, v in vals.items())
            if status != "ok":
                w.writerow([pid, label, status, "boom: bad config", *vals.values()]
                           + [""] * len(SUMMARY))
                continue
            s = dict(SUMMARY, token_hit_rate=hit, mamba_state_bytes_peak=gib * 2**30)
            w.writerow([pid, label, status, "", *vals.values(), *s.values()])
            d = folder / "points" / pid
            d.mkdir(parents=True)
            with open(d / "requests.csv", "w", newline="") as rf:
                rw = csv.writer(rf, lineterminator="\n")
                rw.writerow(["request_id", "session", "arrival_s", "prompt_tokens", "hit_tokens",
                             "attention_hit_tokens", "lost_tokens", "junction",
                             "recomputed_tokens", "queue_s", "ttft_s", "e2e_s", "output_tokens",
                             "preemptions", "mamba_states_written"])
                for i, (prompt, lost, ttft, states) in enumerate(
                        ((500, 0, 0.1, 1), (1000, 64, 0.2, 2), (1500, 128, 0.4, 3))):
                    rw.writerow([f"r{i}", "", i, prompt, 0, 0, lost, 0, 0, 0, ttft, ttft + 1,
                                 10, 0, states])
    return folder


def test_pareto_frontier_function():
    items = [(pid, gib, hit) for pid, _, _, status, gib, hit in SYNTH if status == "ok"]
    assert pareto_frontier(items) == ["p0", "p1", "p4"]
    assert dominators(items, "p2") == ["p1"]
    assert dominators(items, "p3") == ["p1"]
    assert dominators(items, "p0") == []
    # ties both stay; order does not matter; NaN is ignored
    assert pareto_frontier([("b", 1, 0.5), ("a", 1, 0.5)]) == ["a", "b"]
    assert pareto_frontier(list(reversed(items))) == ["p0", "p1", "p4"]
    assert pareto_frontier([("x", float("nan"), 0.9), ("y", 2, 0.1)]) == ["y"]
    assert pareto_frontier([]) == []


def test_synthetic_sweep_report(tmp_path):
    folder = _synthetic(tmp_path / "sw")
    sweep = load_sweep(folder)
    assert sweep.axes == ["cache.flag", "cache.unit"]
    assert sweep.boolean_axes == ["cache.flag"]
    assert [p.id for p in sweep.plotted] == ["p0", "p1", "p2", "p3", "p4"]
    write_sweep_report(folder)
    rows = {r["point"]: r for r in _rows(folder / "report_pareto.csv")}
    assert [p for p, r in rows.items() if r["on_frontier"] == "true"] == ["p0", "p1", "p4"]
    assert rows["p2"]["dominated_by"] == "p1" and rows["p3"]["dominated_by"] == "p1"
    pts = {r["point"]: r for r in _rows(folder / "report_points.csv")}
    assert [p for p, r in pts.items() if r["on_pareto_frontier"] == "true"] == ["p0", "p1", "p4"]
    assert pts["p5"]["status"] == "failed" and pts["p5"]["on_pareto_frontier"] == ""
    assert float(pts["p0"]["states_per_request"]) == pytest.approx(2.0)
    # the flag raises the hit at unit 1 (+10 pp) and lowers it at unit 2 (-5 pp)
    delta = {r["cache.unit"]: r for r in _rows(folder / "report_flag_delta.csv")}
    assert float(delta["1"]["token_hit_delta_pp"]) == pytest.approx(10.0)
    assert float(delta["1"]["token_hit_delta_rel_pct"]) == pytest.approx(20.0)
    assert float(delta["2"]["token_hit_delta_pp"]) == pytest.approx(-5.0)
    assert float(delta["2"]["mamba_state_delta_gib"]) == pytest.approx(10.0)
    assert delta["3"]["complete"] == "false"
    md = (folder / "report.md").read_text()
    sec = _section(md, "Flag off vs on: cache.flag")
    assert "+10.00 pp (+20.0 %)" in sec and "-5.00 pp (-7.1 %)" in sec
    assert "+10.000 GiB (+50.0 %)" in sec
    assert "p3 by p1" in _section(md, "Reuse-Pareto")
    lost = {r["point"]: r for r in _rows(folder / "report_lost_reuse.csv")}
    assert (lost["p0"]["requests_with_loss"], lost["p0"]["lost_tokens_total"]) == ("2", "192")


def test_boolean_axis_detection_and_pairs(tmp_path):
    # two boolean axes: no pairing; one single-valued boolean axis: not a flag axis
    two = _synthetic(tmp_path / "two", points=[("p0", "false", "true", "ok", 1, 0.5),
                                                ("p1", "true", "false", "ok", 2, 0.6)],
                     axes=("cache.a", "cache.b"))
    s = load_sweep(two)
    assert s.boolean_axes == ["cache.a", "cache.b"] and flag_pairs(s) is None
    one = _synthetic(tmp_path / "one", points=[("p0", "true", 1, "ok", 1, 0.5),
                                                ("p1", "true", 2, "ok", 2, 0.6)])
    assert load_sweep(one).boolean_axes == []
    flag, pairs = flag_pairs(load_sweep(_synthetic(tmp_path / "syn")))
    assert flag == "cache.flag"
    assert [(g.others["cache.unit"], g.off.id, g.on.id, g.complete) for g in pairs] == [
        ("1", "p0", "p2", True), ("2", "p1", "p3", True), ("3", "p4", "p5", False)]


@pytest.mark.parametrize("name", ["cache.enable_mamba_shared_prefix_checkpoint",
                                  "cache.enable_mamba_fine_grained_prefix_cache"])
def test_several_boolean_axes_compare_the_junction_flag(tmp_path, name):
    # the junction flag (by either of its names) among several boolean axes is the one
    # compared off vs on; the other boolean axis groups the pairs like any other axis
    pts = [("p0", "false", "false", "ok", 1, 0.5), ("p1", "false", "true", "ok", 1, 0.4),
           ("p2", "true", "false", "ok", 1, 0.5), ("p3", "true", "true", "ok", 2, 0.6)]
    folder = _synthetic(tmp_path / "s", points=pts, axes=(name, "cache.other"))
    s = load_sweep(folder)
    assert s.boolean_axes == [name, "cache.other"] and s.flag_axis == name
    flag, pairs = flag_pairs(s)
    assert flag == name
    assert [(g.others["cache.other"], g.off.id, g.on.id) for g in pairs] == [
        ("false", "p0", "p2"), ("true", "p1", "p3")]
    # ... and the report has the section (not the "no flag off/on section" note)
    write_sweep_report(folder)
    md = (folder / "report.md").read_text()
    assert f"## Flag off vs on: {name}" in md and "No flag off/on section" not in md
    assert (folder / "report_flag_delta.csv").is_file()


def test_no_successful_points(tmp_path):
    folder = _synthetic(tmp_path / "none", points=[("p0", "false", 1, "failed", None, None)])
    written = write_sweep_report(folder)
    assert "report_flag_delta.csv" not in [p.name for p in written]
    md = (folder / "report.md").read_text()
    assert "No successful points" in md and "| p0 |" in _section(md, "Failed points")
    assert "boom: bad config" in md
    assert len(_rows(folder / "report_points.csv")) == 1
    assert _rows(folder / "report_ttft_quantiles.csv") == []


def test_missing_requests_csv_is_reported_not_plotted(tmp_path):
    folder = _synthetic(tmp_path / "sw")
    shutil.rmtree(folder / "points" / "p4")
    sweep = load_sweep(folder)
    p4 = next(p for p in sweep.points if p.id == "p4")
    assert p4.ok and not p4.plotted and p4.note == "requests.csv missing"
    assert pareto_frontier([(p.id, p.m("mamba_state_bytes_peak"), p.m("token_hit_rate"))
                            for p in sweep.plotted]) == ["p0", "p1"]
