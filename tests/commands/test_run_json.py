"""run.json says what produced a run, and ``sim run FOLDER/run.json`` re-runs it exactly."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.entrypoints.sim_cli import run_sim

ROOT = Path(__file__).resolve().parents[2]
TIMING = ("wall_s", "sim_requests_per_s")


sim = run_sim   # ``sim ARGS`` in this process, from ``cwd``: its exit code


def _summary(folder: Path) -> dict:
    s = json.loads((folder / "summary.json").read_text())
    return {k: v for k, v in s.items() if k not in TIMING}


def _same_run(a: Path, b: Path) -> None:
    assert (a / "requests.csv").read_bytes() == (b / "requests.csv").read_bytes()
    # summary.json byte for byte, once the two wall-clock fields are blanked
    strip = [ln for ln in (a / "summary.json").read_text().splitlines()
             if not any(f'"{k}"' in ln for k in TIMING)]
    again = [ln for ln in (b / "summary.json").read_text().splitlines()
             if not any(f'"{k}"' in ln for k in TIMING)]
    assert strip == again


def test_rerun_from_run_json_is_byte_identical(tmp_path):
    # a trace scenario (a path relative to the scenario's folder), --set and --requests,
    # run from the project root; re-run from somewhere else entirely
    a, b = tmp_path / "a", tmp_path / "b"
    assert sim("run", "scenarios/mooncake-conversation.yaml", "--requests", "80",
               "--set", "cache.prefix_match_unit=1088", "--set", "scheduler.max_num_seqs=32",
               "--out", str(a), "-q", "--no-report", cwd=ROOT) == 0
    rec = json.loads((a / "run.json").read_text())
    sc = rec["scenario"]
    # (--set used the old name prefix_match_unit: run.json writes only the one name)
    assert sc["cache"]["hash_block_size"] == 1088 and sc["scheduler"]["max_num_seqs"] == 32
    assert "prefix_match_unit" not in sc["cache"]
    assert sc["workload"]["num_requests"] == 80 and "limit" not in sc["workload"]
    assert sc["workload"]["path"] == "data/traces/mooncake_fast25/conversation_trace.jsonl"
    assert rec["paths_relative_to"] == "project root"
    assert rec["seed"] == sc["seed"] == 1 and sc["name"] == "mooncake-conversation"
    assert rec["command"][:3] == ["sim", "run", "scenarios/mooncake-conversation.yaml"]
    assert "--requests" in rec["command"]
    assert rec["version"] and "commit" in rec and "commit_dirty" in rec
    assert rec["name"] == "mooncake-conversation"           # the report header is still there
    assert json.loads((a / "summary.json").read_text())["requests"] == 80

    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    assert sim("run", str(a / "run.json"), "--out", str(b), "-q", "--no-report",
               cwd=elsewhere) == 0
    _same_run(a, b)
    # and the re-run's own run.json re-runs the same scenario
    assert json.loads((b / "run.json").read_text())["scenario"] == sc


def test_rerun_of_a_synthetic_scenario_keeps_seed_and_overrides(tmp_path):
    src = yaml.safe_load((ROOT / "scenarios" / "athena-tiny.yaml").read_text())
    scen = tmp_path / "s" / "tiny.yaml"
    scen.parent.mkdir()
    scen.write_text(yaml.safe_dump(src))
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert sim("run", str(scen), "--set", "seed=5", "--set", "workload.rate_per_s=9.0",
               "--out", str(a), "-q", "--no-report", cwd=tmp_path) == 0
    scen.unlink()                                  # the run folder alone is enough
    assert sim("run", str(a / "run.json"), "--out", str(b), "-q", "--no-report",
               cwd=tmp_path) == 0
    _same_run(a, b)
    rec = json.loads((b / "run.json").read_text())
    assert rec["seed"] == 5 and rec["scenario"]["workload"]["rate_per_s"] == 9.0
    # --set on a re-run changes it (here: the seed), so it is not the same run any more
    assert sim("run", str(a / "run.json"), "--set", "seed=6", "--out", str(c), "-q",
               "--no-report", cwd=tmp_path) == 0
    assert (c / "requests.csv").read_bytes() != (a / "requests.csv").read_bytes()


def test_a_sweep_point_reruns_from_its_run_json(tmp_path):
    from sim.commands.sweep import load_sweep, run_sweep

    sw_file = tmp_path / "sw.yaml"
    sw_file.write_text(yaml.safe_dump({
        "name": "t", "base": str(ROOT / "scenarios" / "athena.yaml"),
        "set": {"workload.num_requests": 30},
        "grid": {"cache.enable_mamba_shared_prefix_checkpoint": [False, True]}}))
    sw = load_sweep(sw_file)
    run_sweep(sw, tmp_path / "sweep", workers=1, report=False, command=["sim", "sweep", "x"])
    point = tmp_path / "sweep" / "points" / "p001"
    rec = json.loads((point / "run.json").read_text())
    assert rec["scenario"]["cache"]["enable_mamba_shared_prefix_checkpoint"] is True
    assert rec["scenario"]["workload"]["num_requests"] == 30
    assert rec["command"] == ["sim", "sweep", "x"]
    assert sim("run", str(point / "run.json"), "--out", str(tmp_path / "again"), "-q",
               "--no-report", cwd=tmp_path) == 0
    _same_run(point, tmp_path / "again")


def test_a_json_that_is_not_a_run_record_is_one_line(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text('{"scenario": 3, "paths_relative_to": "project root"}')
    assert sim("run", str(bad), "--out", str(tmp_path / "o"), cwd=tmp_path) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error:") and "x.json" in err[0]
    assert not (tmp_path / "o").exists()


def test_run_json_tolerates_extra_and_missing_informational_keys(tmp_path):
    a = tmp_path / "a"
    assert sim("run", "scenarios/athena.yaml", "--requests", "20", "--out", str(a), "-q",
               "--no-report", cwd=ROOT) == 0
    rec = json.loads((a / "run.json").read_text())
    rec["owner"] = {"tool": "someone else's marker"}
    rec.pop("scenario_file")
    (a / "run.json").write_text(json.dumps(rec))
    assert sim("run", str(a / "run.json"), "--out", str(tmp_path / "b"), "-q", "--no-report",
               cwd=tmp_path) == 0
    _same_run(a, tmp_path / "b")


def test_git_probe_reads_commit_and_dirty_state(tmp_path):
    """run.json's commit, found by git processes started before the run: the commit and
    whether tracked files changed, (None, False) outside a checkout; one never read is
    reaped by ``close``, and git takes no lock in the repository."""
    import shutil
    import subprocess

    import pytest

    from sim.rundir.provenance import GitProbe

    if shutil.which("git") is None:
        pytest.skip("no git")
    assert GitProbe(tmp_path).result() == (None, False)          # not a checkout
    repo = tmp_path / "repo"
    repo.mkdir()

    def git(*args):
        return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t",
                               "-c", "user.email=t@t", *args],
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (repo / "f.txt").write_text("a\n")
    git("add", "f.txt")
    git("commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD")
    assert GitProbe(repo).result() == (head, False)
    (repo / "untracked.txt").write_text("x\n")                   # untracked: still clean
    assert GitProbe(repo).result() == (head, False)
    (repo / "f.txt").write_text("b\n")
    probe = GitProbe(repo)
    assert probe.result() == (head, True)
    assert probe.result() == (head, True)                         # (read once)
    unread = GitProbe(repo)
    procs = unread._procs
    unread.close()
    assert all(p.returncode is not None for p in procs)           # reaped
    assert unread.result() == (head, True)
    assert not (repo / ".git" / "index.lock").exists()            # (no lock left)
