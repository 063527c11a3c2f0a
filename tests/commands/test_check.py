"""`sim check`: goldens of hit lengths fail loudly on drift and on a fixed `want:` marker."""
from __future__ import annotations

import shutil
from pathlib import Path

from typer.testing import CliRunner

from sim.entrypoints.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
CASE = ROOT / "cases" / "seed-d3-eagle.yaml"


def _golden(tmp_path: Path) -> Path:
    g = tmp_path / "golden"
    g.mkdir()
    src = ROOT / "checks" / "golden" / "cases__seed-d3-eagle.yaml.golden"
    shutil.copy(src, g / src.name)
    return g


def _run(tmp_path, golden, *extra):
    # relative paths as the goldens record them
    return runner.invoke(app, ["check", "cases/seed-d3-eagle.yaml", "--golden", str(golden), *extra])


def test_project_goldens_hold(monkeypatch):
    monkeypatch.chdir(ROOT)
    res = runner.invoke(app, ["check"])   # the defaults: cases/*.yaml and scenarios/athena.yaml
    assert res.exit_code == 0, res.output
    assert "every hit length holds" in res.output


def test_planted_drift_fails(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    g = _golden(tmp_path)
    f = next(g.iterdir())
    f.write_text(f.read_text().replace("per_group=12,16 junction=12", "per_group=16,16 junction=12"))
    res = _run(tmp_path, g)
    assert res.exit_code == 1, res.output
    assert "DRIFT" in res.output and "per_group" in res.output and "16,16 -> 12,16" in res.output


def test_fixed_want_marker_fails_with_move_the_marker(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    g = _golden(tmp_path)
    f = next(g.iterdir())
    # Pretend the golden recorded hit=5 and we want today's value (0): it "got fixed".
    f.write_text(f.read_text().replace("consumer: hit=0", "consumer: hit=5")
                 .replace("want: hit=12", "want: hit=0"))
    res = _run(tmp_path, g)
    assert res.exit_code == 1, res.output
    assert "fixed - move the marker" in res.output


def test_unfixed_want_marker_passes(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    g = _golden(tmp_path)
    assert "want: hit=12" in next(g.iterdir()).read_text()
    res = _run(tmp_path, g)
    assert res.exit_code == 0, res.output


def test_update_rewrites_and_reports(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    g = _golden(tmp_path)
    f = next(g.iterdir())
    f.write_text(f.read_text().replace("producer: hit=0", "producer: hit=7"))
    res = _run(tmp_path, g, "--update")
    assert res.exit_code == 0, res.output
    assert "hit: 7 -> 0" in res.output
    assert "producer: hit=0" in f.read_text() and "want: hit=12" in f.read_text()
    assert _run(tmp_path, g).exit_code == 0


def test_failure_is_a_summary_then_ten_differences_then_the_update_hint(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    g = _golden(tmp_path)
    f = next(g.iterdir())
    f.write_text(f.read_text().replace("producer: hit=0", "producer: hit=7")
                 .replace("per_group=12,16 junction=12", "per_group=16,16 junction=12"))
    res = _run(tmp_path, g)
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    assert lines[0] == "sim check FAILED: 2 of 2 requests changed (cases/seed-d3-eagle.yaml: 2)"
    assert "hit tokens: 0 gained (0 request(s)), 7 lost (1 request(s)); net -7" in res.output
    assert "2 difference(s): 2 DRIFT" in res.output
    assert lines[-1] == (f"If the change is intended, rewrite the goldens with `sim check "
                         f"cases/seed-d3-eagle.yaml --golden {g} --update` and review their diff.")


def test_failure_lists_ten_differences_unless_all():
    from sim.commands.check import CheckResult, Finding, failure_lines

    res = CheckResult(checked=40, findings=[
        Finding("s.yaml", f"r{i:02d}", "hit", "100", str(100 + (i % 3 - 1) * 16), "drift")
        for i in range(30)] + [Finding("s.yaml", "r99", "*", "present", "(gone)", "missing")])
    lines = failure_lines(res, "sim check s.yaml --update")
    assert lines[0] == "sim check FAILED: 31 of 40 requests changed (s.yaml: 31)"
    # i % 3 == 2: +16 (10 requests); i % 3 == 0: -16 (10 requests)
    assert lines[1] == "  hit tokens: 160 gained (10 request(s)), 160 lost (10 request(s)); net +0"
    assert lines[2] == "  31 difference(s): 30 DRIFT, 1 request gone"
    assert lines[3] == "first 10 of 31 difference(s):"
    table = [ln for ln in lines if ln.startswith("  s.yaml")]
    assert len(table) == 10 and table[0].split()[:2] == ["s.yaml", "r00"]
    assert "  ... 21 more (--all lists every one)" in lines
    assert lines[-1].startswith("If the change is intended")
    assert "sim check s.yaml --update" in lines[-1]
    every = failure_lines(res, "sim check --update", show_all=True)
    assert every[3] == "every 31 difference(s):"
    assert len([ln for ln in every if ln.startswith("  s.yaml")]) == 31
    assert not any("more (--all" in ln for ln in every)


def test_all_flag_lists_every_difference(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    g = _golden(tmp_path)
    f = next(g.iterdir())
    f.write_text(f.read_text().replace("producer: hit=0", "producer: hit=7"))
    res = _run(tmp_path, g, "--all")
    assert res.exit_code == 1, res.output
    assert "every 1 difference(s):" in res.output and "hit  7 -> 0" in res.output
