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
