"""How the sweep figures name, merge and lay out points, on hand-built sweeps.

SVG text stays text (``svg.fonttype: none``), so what a figure says is read from its
SVG; the Markdown's image alt text is the figure's caption."""
from __future__ import annotations

import re

import numpy as np
import pytest

from reports import sweep_figures
from reports.sweep_data import identical_groups, load_sweep, merge_note
from reports.sweep_report import write_sweep_report
from sim.rundir.stats import percentile
from tests.reports.builders import P, Req, write_sweep

FLAG, UNIT = "cache.enable_mamba_shared_prefix_checkpoint", "cache.hash_block_size"


def _reqs(scale: float, n: int = 12) -> list[Req]:
    return [Req(prompt=500 * (i + 1), lost=64 * (i % 3), ttft=scale * (0.05 + 0.01 * i))
            for i in range(n)]


def _alt(md: str, stem: str) -> str:
    return re.search(rf"!\[(.*?)\]\({stem}\.png\)", md).group(1)


def _svg_text(folder, stem: str) -> str:
    return (folder / f"{stem}.svg").read_text()


def test_identical_curves_are_drawn_once_and_said_so(tmp_path):
    # the flag changes nothing: p000 = p002 and p001 = p003
    pts = [P(f"p00{i}", {FLAG: f, UNIT: u}, _reqs(1.0 if u == "64" else 2.0),
             summary={"mamba_state_bytes_peak": (i + 1) * 2**30})
           for i, (f, u) in enumerate([("false", "64"), ("false", "1088"),
                                       ("true", "64"), ("true", "1088")])]
    folder = write_sweep(tmp_path / "s", pts)
    write_sweep_report(folder)
    md = (folder / "report.md").read_text()
    for stem in ("ttft_cdf", "ttft_vs_prompt"):
        svg = _svg_text(folder, stem)
        assert "(p000 = p002)" in svg and "(p001 = p003)" in svg, stem
        # named by the axis value that matters, not by the flag that does not
        assert "hash_block_size=64" in svg and "checkpoint=" not in svg, stem
        assert "Identical curves are drawn once (4 points, 2 distinct)." in _alt(md, stem)
    # the losses do not depend on either axis: one panel for all four
    lost = _svg_text(folder, "lost_reuse")
    assert "p000 = p001 = p002 = p003" in lost and "every setting" in lost


def test_point_and_group_labels_use_the_axes_that_differ(tmp_path):
    pts = [P("p0", {FLAG: "false", UNIT: "64", "cache.policy": "vllm"}),
           P("p1", {FLAG: "true", UNIT: "64", "cache.policy": "vllm"}),
           P("p2", {FLAG: "true", UNIT: "192", "cache.policy": "vllm"})]
    sweep = load_sweep(write_sweep(tmp_path / "s", pts))
    assert sweep.varying_axes == [FLAG, UNIT]         # policy is the same everywhere
    p0, p1, p2 = sweep.points
    assert sweep.point_label(p0) == "checkpoint=false, hash_block_size=64"
    assert sweep.group_label([p0, p1]) == "hash_block_size=64"
    assert sweep.group_label([p0, p2]) == "every setting"
    assert sweep.aliases() == [f"checkpoint = {FLAG}"]
    assert sweep.aliases("hash_block_size=64") == []
    assert merge_note([[p0, p1], [p2]]) == "Identical curves are drawn once (3 points, 2 distinct)."
    assert merge_note([[p0], [p1]]) == ""


def test_identical_groups_keep_point_order():
    class Pt:
        def __init__(self, id, key):
            self.id, self.key = id, key

    pts = [Pt("p10", 1), Pt("p2", 2), Pt("p1", 1), Pt("p3", 2)]
    groups = identical_groups(pts, lambda p: p.key)
    assert [[p.id for p in g] for g in groups] == [["p1", "p10"], ["p2", "p3"]]


def test_sweep_is_titled_with_its_name(tmp_path):
    folder = write_sweep(tmp_path / "s", [P("p0", {UNIT: "64"}), P("p1", {UNIT: "192"})],
                         name="unit-sweep")
    write_sweep_report(folder)
    md = (folder / "report.md").read_text()
    assert md.startswith("# Sweep report: unit-sweep\n")
    assert "Base scenario: synthetic." in md
    for stem in sweep_figures.CAPTIONS:
        assert "unit-sweep:" in _svg_text(folder, stem), stem
    assert "unit-sweep:" in _svg_text(folder, "pareto")
    # without a sweep.yaml: the folder's name
    other = write_sweep(tmp_path / "other-folder", [P("p0", {UNIT: "64"})])
    write_sweep_report(other)
    assert (other / "report.md").read_text().startswith("# Sweep report: other-folder\n")


def test_pareto_labels_by_values_when_few_else_ids_with_a_key(tmp_path):
    few = [P(f"p{i}", {UNIT: u}, summary={"mamba_state_bytes_peak": (i + 1) * 2**30,
                                           "token_hit_rate": 0.2 * (i + 1)})
           for i, u in enumerate(["64", "192", "1088"])]
    folder = write_sweep(tmp_path / "few", few)
    write_sweep_report(folder)
    svg = _svg_text(folder, "pareto")
    assert "hash_block_size=192" in svg and "key: the axis values" not in svg
    many = [P(f"p{i}", {UNIT: str(64 * (i + 1))},
              summary={"mamba_state_bytes_peak": (i + 1) * 2**30,
                       "token_hit_rate": 0.1 * (i + 1)}) for i in range(6)]
    folder = write_sweep(tmp_path / "many", many)
    write_sweep_report(folder)
    svg = _svg_text(folder, "pareto")
    assert "key: the axis values of each point" in svg
    assert "hash_block_size=" not in svg          # ids on the markers, values in the key


def test_more_than_six_curves_become_small_multiples(tmp_path):
    pts = [P(f"p{i}", {UNIT: str(64 * (i + 1))}, _reqs(1.0 + i)) for i in range(8)]
    folder = write_sweep(tmp_path / "s", pts)
    write_sweep_report(folder)
    md = (folder / "report.md").read_text()
    for stem in ("ttft_cdf", "ttft_vs_prompt"):
        svg = _svg_text(folder, stem)
        assert len(set(re.findall(r'id="axes_(\d+)"', svg))) >= 8, stem   # a panel each
        assert "Grey: the other settings" in _alt(md, stem)


def test_beyond_sixteen_settings_an_evenly_spaced_selection(tmp_path):
    # TTFT grows with the point index: sorted by p50, ranks 4 and 13 of 18 are left out
    pts = [P(f"p{i:03d}", {UNIT: str(64 * (i + 1))}, _reqs(1.0 + i)) for i in range(18)]
    folder = write_sweep(tmp_path / "s", pts)
    write_sweep_report(folder)
    svg = _svg_text(folder, "ttft_cdf")
    shown = {i for i in range(18) if f"p{i:03d}" in svg}
    assert shown == set(range(18)) - {4, 13}
    assert "16 of 18 settings shown" in _alt((folder / "report.md").read_text(), "ttft_cdf")
    # the tables keep every point
    assert (folder / "report_ttft_quantiles.csv").read_text().count("\np0") == 18


def test_ttft_fallback_is_the_project_percentile(tmp_path):
    # points.csv without TTFT percentiles: the report computes them from requests.csv
    reqs = [Req(ttft=t) for t in (0.1, 0.2, 0.4, 0.8, 1.6)]
    pts = [P("p0", {UNIT: "64"}, reqs, summary={"ttft_p50_s": "", "ttft_p90_s": "",
                                                "ttft_p99_s": "", "ttft_mean_s": ""})]
    folder = write_sweep(tmp_path / "s", pts)
    write_sweep_report(folder)
    row = (folder / "report_ttft_quantiles.csv").read_text().splitlines()[1].split(",")
    t = np.array([r.ttft for r in reqs])
    assert float(row[-2]) == pytest.approx(percentile(t, 90), abs=1e-6)   # 1.28 (linear)
    assert float(row[-1]) == pytest.approx(percentile(t, 99), abs=1e-6)


def test_lost_reuse_bins_are_round(tmp_path):
    nz = [np.arange(1, 40) * 64.0]                     # 39 distinct losses up to 2,496
    labels, counts, edges = sweep_figures.lost_bins(nz)
    width = edges[1] - edges[0]
    assert width == 200 and edges[0] == 0 and edges[-1] > 2496
    assert int(counts[0].sum()) == 39 and len(labels) == len(edges) - 1



def test_miss_classes_is_written_as_png_and_svg_like_every_sweep_figure(tmp_path):
    # the report says "figures also as SVG": the per-point miss bars included
    from reports.miss_figure import sweep_bars

    s = {"prompt_tokens": 1000, "hit_tokens": 400, "miss_in_flight_tokens": 0,
         "miss_capacity_tokens": 100, "miss_checkpoint_tokens": 200,
         "miss_speculative_tokens": 0, "miss_compulsory_tokens": 300}
    saved = sweep_bars([("p000", s), ("p001", dict(s, hit_tokens=500,
                                                   miss_checkpoint_tokens=100))],
                       tmp_path, "t: why points missed")
    assert [f.name for f in saved.files] == ["miss_classes.png", "miss_classes.svg"]
    text = _svg_text(tmp_path, "miss_classes")
    assert "p000" in text and "p001" in text and "checkpoint" in text


def test_miss_classes_names_points_by_id_and_zooms_to_the_data(tmp_path):
    """Each bar is its point id and the varying axes' values under a header (not
    'checkpoint=false, hash_block_size=64, ...'); where every point hits >= 80 % the
    axis starts at 0.75, said in its label, so the miss classes fill the figure."""
    from reports.miss_figure import zoom_start

    from tests.reports.test_sweep_capacity import tick_labels

    assert zoom_start(0.815) == 0.75 and zoom_start(0.124) == 0.0 and zoom_start(0.3) == 0.25

    def summary(hit, ckpt):
        return {"prompt_tokens": 1000, "hit_tokens": hit, "token_hit_rate": hit / 1000,
                "miss_in_flight_tokens": 0, "miss_capacity_tokens": 0,
                "miss_checkpoint_tokens": ckpt, "miss_speculative_tokens": 0,
                "miss_compulsory_tokens": 1000 - hit - ckpt}

    pts = [P(f"p{i:03d}", {UNIT: u, "cache.enable_mamba_shared_prefix_checkpoint": f},
             summary=summary(hit, 930 - hit))
           for i, (u, f, hit) in enumerate([("64", "false", 815), ("64", "true", 927),
                                            ("192", "false", 887), ("192", "true", 935)])]
    folder = write_sweep(tmp_path / "s", pts)
    write_sweep_report(folder)
    svg = _svg_text(folder, "miss_classes")
    rows = tick_labels(svg, 1, "y")
    assert [r.split()[0] for r in rows] == ["p000", "p001", "p002", "p003"], rows
    assert "=" not in " ".join(rows)
    assert "point  hash_block_size  checkpoint" in svg
    assert tick_labels(svg, 1, "x")[0] == "0.75"
    assert "the axis starts at 0.75: every point hits at least 81.5%" in svg
    assert "93.5%" in svg                                  # each hit share on its bar
