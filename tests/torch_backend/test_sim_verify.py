"""`sim verify` on the scaled-down athena: the torch backend runs every chunk on the cache
model's blocks; resumed prefills equal scratch, and a planted off-by-one state is caught."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch not installed: pip install -e '.[torch]'")

from typer.testing import CliRunner  # noqa: E402

from sim.cli import app  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "scenarios" / "athena-tiny.yaml")
runner = CliRunner()


def test_athena_tiny_verifies(tmp_path):
    res = runner.invoke(app, ["verify", TINY, "--set", "workload.num_requests=14",
                              "--out", str(tmp_path / "v")])
    assert res.exit_code == 0, res.output
    assert "resumed from cached KV blocks and Mamba states" in res.output
    lines = (tmp_path / "v" / "verify.csv").read_text().splitlines()[1:]
    resumed = [ln for ln in lines if int(ln.split(",")[2]) > 0]
    assert len(lines) == 14 and len(resumed) >= 8
    assert max(float(ln.split(",")[3]) for ln in lines) < 1e-4


def test_planted_wrong_state_fails_the_check():
    res = runner.invoke(app, ["verify", TINY, "--set", "workload.num_requests=8",
                              "--plant", "state_off_by_one"])
    assert res.exit_code == 1, res.output
    assert "FAIL" in res.output and "differ from scratch" in res.output
