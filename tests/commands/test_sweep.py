"""Sweeps: every point runs, a failed point keeps the others, executors agree byte for byte."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from sim.commands.sweep import SweepError, load_sweep, run_sweep

ROOT = Path(__file__).resolve().parents[2]


def _sweep(tmp_path: Path, grid: dict, points=None, n=60) -> Path:
    data = {"name": "t", "base": str(ROOT / "scenarios" / "athena.yaml"),
            "set": {"workload.num_requests": n}, "grid": grid}
    if points:
        data["points"] = points
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_grid_runs_every_point_and_flag_on_reuses_more(tmp_path):
    sw = load_sweep(_sweep(tmp_path, {"cache.enable_mamba_shared_prefix_checkpoint": [False, True]}))
    res = run_sweep(sw, tmp_path / "out", workers=2, report=False)
    assert [r["status"] for r in res] == ["ok", "ok"]
    rows = (tmp_path / "out" / "points.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("point,label,status,error,")
    assert res[1]["summary"]["token_hit_rate"] > res[0]["summary"]["token_hit_rate"]
    assert (tmp_path / "out" / "points" / "p001" / "requests.csv").is_file()


def test_failed_point_is_reported_and_others_kept(tmp_path):
    # 100 does not divide the 4,416-token block: load_sweep refuses it up front...
    with pytest.raises(SweepError, match="p001"):
        load_sweep(_sweep(tmp_path, {"cache.hash_block_size": [64, 100]}))
    # ...and so are weights that do not fit on one GPU.
    with pytest.raises(SweepError, match="gpu.count"):
        load_sweep(_sweep(tmp_path, {"gpu.count": [4, 1]}))
    # A point that fails while running (a broken trace line) is recorded, the others kept.
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    line = '{"id": "r%d", "arrival_s": %d, "prompt": "S:5000 U%d:300", "output_tokens": 3}\n'
    good.write_text("".join(line % (i, i, i) for i in range(20)))
    bad.write_text("".join(line % (i, i, i) for i in range(12)) + '{"id": "r12", "arrival_s":\n')
    sw = load_sweep(_sweep(tmp_path, {"workload": [{"kind": "jsonl", "path": str(good)},
                                                   {"kind": "jsonl", "path": str(bad)}]}))
    res = run_sweep(sw, tmp_path / "out", workers=1, report=False)
    assert res[0]["status"] == "ok" and res[1]["status"] == "failed"
    assert "bad.jsonl:13" in res[1]["error"]
    text = (tmp_path / "out" / "points.csv").read_text()
    assert ",failed," in text and ",ok," in text


@pytest.mark.skipif(os.environ.get("SIM_SKIP_RAY") == "1", reason="SIM_SKIP_RAY=1")
def test_ray_and_local_give_identical_points_csv(tmp_path):
    pytest.importorskip("ray")
    import subprocess
    import sys

    path = _sweep(tmp_path, {"cache.enable_mamba_shared_prefix_checkpoint": [False, True]}, n=40)
    run_sweep(load_sweep(path), tmp_path / "local", workers=2, report=False)
    # the ray side as a user runs it: `sim sweep --executor ray -q` in its own process, which
    # starts a local Ray instance; its start-up lines are not the sweep's output
    res = subprocess.run([sys.executable, "-m", "sim", "sweep", str(path), "--executor", "ray",
                          "--workers", "2", "--no-report", "-q", "--out", str(tmp_path / "ray")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert " INFO " not in res.stderr and " WARNING " not in res.stderr, res.stderr
    a = (tmp_path / "local" / "points.csv").read_bytes()
    b = (tmp_path / "ray" / "points.csv").read_bytes()
    assert a == b
