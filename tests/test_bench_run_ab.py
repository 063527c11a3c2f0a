"""``bench/run_ab.py``: whole runs of checkouts alternated, ratios to the first; bad
input is one line and exit code 2 (no timing is asserted: that is the script's output)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "run_ab.py"


def _run(*args: str, tmp: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, TMPDIR=str(tmp)) if tmp is not None else None
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env)


def test_two_runs_of_this_checkout_give_each_its_figures_and_a_ratio(tmp_path):
    res = _run(str(ROOT), str(ROOT), "--rounds", "1", "--scenario",
               "scenarios/athena-tiny.yaml", tmp=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("  round 1/1: ")
    assert lines[1].startswith(f"{ROOT}: wall median ") and "to the first" not in lines[1]
    assert lines[2].startswith(f"{ROOT}: wall median ") and "x per round (median)" in lines[2]
    assert list(tmp_path.iterdir()) == []       # (the runs' folders are removed)


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, words in ((["--rounds", "0", str(ROOT), str(ROOT)], "--rounds must be >= 1"),
                        ([str(ROOT)], "at least two checkouts"),
                        ([str(tmp_path), str(ROOT)], "not a hybrid-cache-sim checkout"),
                        ([str(ROOT), str(ROOT), "--scenario", "nope.yaml"], "no scenario nope.yaml")):
        res = _run(*args)
        assert res.returncode == 2, (args, res.stderr)
        assert res.stderr.count("\n") == 1 and words in res.stderr, res.stderr
