"""The capacity view of a sweep (reports/sweep_capacity.py) on a hand-built folder: one
curve per policy against *provisioned* memory (pool_bytes), each policy's own frontier,
the ideal bounds apart, and the cheapest configuration for a target hit rate."""
from __future__ import annotations

import csv

from reports.sweep_capacity import answers, cheapest, curves, ideal_hit, is_capacity_sweep
from reports.sweep_data import load_sweep
from reports.sweep_report import write_sweep_report
from tests.reports.builders import P, write_sweep

GiB = 2**30
AXES = ("cache.policy", "kv_cache.kv_cache_memory_bytes", "cache.checkpoints")


def pt(i, policy, gib, hit, checkpoints="(base)", peak=GiB):
    # peak Mamba memory is the same everywhere: only provisioned memory tells them apart
    summary = {"policy": policy, "token_hit_rate": hit, "pool_bytes": int(gib * GiB),
               "mamba_state_bytes_peak": peak, "ttft_p50_s": 1.0 - hit, "ttft_p99_s": 2.0 - hit}
    axes = dict(zip(AXES, (policy, str(int(gib * GiB)) if policy != "ideal" else "(base)",
                           checkpoints)))
    return P(f"p{i}", axes, summary=summary)


def build(tmp_path):
    return write_sweep(tmp_path / "cap", [
        pt(0, "none", 8, 0.0), pt(1, "none", 16, 0.0),
        pt(2, "vllm", 8, 0.50), pt(3, "vllm", 16, 0.78), pt(4, "vllm", 32, 0.78),
        pt(5, "vllm", 24, 0.92),
        # the bounds are cheap on paper (a small configured pool): never an answer
        pt(6, "ideal", 4, 0.85, checkpoints="vllm"), pt(7, "ideal", 4, 0.95, "every_unit"),
    ], name="cap")


def test_curves_per_policy_on_provisioned_memory(tmp_path):
    sweep = load_sweep(build(tmp_path))
    assert is_capacity_sweep(sweep)
    budgeted, bounds = curves(sweep)
    assert [c.policy for c in budgeted] == ["none", "vllm"]
    assert [c.policy for c in bounds] == ["ideal", "ideal(checkpoints: vllm)"]
    vllm = budgeted[1]
    assert [p.id for p in vllm.points] == ["p2", "p3", "p5", "p4"]      # by pool bytes
    assert vllm.frontier == ["p2", "p3", "p5"]          # p4: more memory than p3, no more hit
    assert budgeted[0].frontier == ["p0"]
    assert ideal_hit(sweep) == 0.95


def test_cheapest_for_a_target_and_for_a_fraction_of_ideal(tmp_path):
    sweep = load_sweep(build(tmp_path))
    assert cheapest(sweep, 0.8).id == "p5"              # 24 GiB reaches 92 %; 16 GiB 78 %
    assert cheapest(sweep, 0.78).id == "p3"             # a tie with p4: the cheaper one
    assert cheapest(sweep, 0.93) is None                # only ideal goes higher
    a, rel = answers(sweep, 0.8)
    assert a.point.id == "p5"
    assert abs(rel.target - 0.76) < 1e-12 and rel.point.id == "p3"     # 0.8 x 0.95
    assert rel.line(sweep).startswith("cheapest config for 80 % of ideal (76.00 % token hit): "
                                      "p3 (")
    assert rel.line(sweep).endswith("vllm, 16.00 GiB per GPU, token hit 78.00 %")


def test_report_draws_and_tabulates_it(tmp_path):
    folder = build(tmp_path)
    files = {p.name for p in write_sweep_report(folder, target=0.8)}
    assert {"capacity.png", "capacity.svg", "report_capacity.csv"} <= files
    md = (folder / "report.md").read_text()
    assert "cheapest config for 80 % token hit: p5" in md
    assert md.index("## Capacity") < md.index("## Reuse-Pareto")
    rows = list(csv.DictReader(open(folder / "report_capacity.csv")))
    flags = {r["point"]: (r["policy"], r["pool_bytes"], r["on_policy_frontier"]) for r in rows}
    assert flags["p4"] == ("vllm", str(32 * GiB), "false")
    assert flags["p5"] == ("vllm", str(24 * GiB), "true")
    assert flags["p6"][0] == "ideal(checkpoints: vllm)" and flags["p7"][2] == "false"


def test_other_sweeps_get_no_capacity_view(tmp_path):
    # one policy, one pool: the flag sweeps' reports stay as they were
    folder = write_sweep(tmp_path / "flag", [
        P("p0", {"cache.enable_mamba_shared_prefix_checkpoint": "false"},
          summary={"pool_bytes": 8 * GiB}),
        P("p1", {"cache.enable_mamba_shared_prefix_checkpoint": "true"},
          summary={"pool_bytes": 8 * GiB})])
    assert not is_capacity_sweep(load_sweep(folder))
    (folder / "capacity.png").write_bytes(b"stale")
    names = {p.name for p in write_sweep_report(folder)}
    assert "capacity.png" not in names and not (folder / "capacity.png").exists()
    assert "Capacity" not in (folder / "report.md").read_text()


def tick_labels(svg: str, axes: int, axis: str = "y") -> list[str]:
    """The tick labels of one axis (``axes``: 1, 2, ... as matplotlib numbers them) in a
    figure's SVG (text kept as text, reports/style.py)."""
    import re

    start = svg.index(f'<g id="axes_{axes}">')
    end = svg.find(f'<g id="axes_{axes + 1}">', start)
    part = svg[start:end if end > 0 else len(svg)]
    return [t for block in re.split(rf'<g id="{axis}tick_\d+">', part)[1:]
            for t in re.findall(r"<text[^>]*>([^<]+)</text>", block.split("</g>\n    </g>")[0])]


def test_ttft_ticks_are_each_written_once_as_they_are(tmp_path):
    # TTFT 0.05 ... 1.95 s: 0.05 printed as "0.05", not as a second "0.1"; 1 as "1", not "1.0"
    folder = build(tmp_path)
    write_sweep_report(folder, target=0.8)
    labels = tick_labels((folder / "capacity.svg").read_text(), 2)
    assert labels and len(labels) == len(set(labels)), labels
    assert {"0.05", "0.1", "1"} <= set(labels) and "1.0" not in labels, labels


def test_pareto_draws_the_ideal_bounds_as_lines_and_bytes_in_gib(tmp_path):
    """The ideal policy's pool binds nothing (64.79 GiB on athena): on the Pareto it is a
    line at its hit rate, so the budgeted points keep the memory axis (0.5-8 GiB here,
    not 0-70); the key writes kv_cache_memory_bytes in GiB, not raw bytes."""
    folder = write_sweep(tmp_path / "cap", [
        pt(0, "none", 0.5, 0.0), pt(1, "vllm", 0.5, 0.12), pt(2, "vllm", 2, 0.67),
        pt(3, "vllm", 8, 0.78),
        pt(4, "ideal", 64.79, 0.78, checkpoints="vllm"), pt(5, "ideal", 64.79, 0.95, "every_unit"),
    ], name="cap")
    write_sweep_report(folder, target=0.8)
    svg = (folder / "pareto.svg").read_text()
    xs = [float(t.replace("\u2212", "-")) for t in tick_labels(svg, 1, "x")]
    assert xs and max(xs) < 10, xs
    assert "p5 ideal: 95.00 % (a bound: its 64.79 GiB pool binds nothing)" in svg
    assert "p4 ideal(checkpoints: vllm): 78.00 %" in svg
    assert "0.5 GiB" in svg and str(GiB // 2) not in svg
