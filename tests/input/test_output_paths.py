"""Output paths (issue #13, P0): sim removes or replaces only a folder it wrote itself,
checks the output path before any work, and an interrupt or a concurrent run never
leaves a temporary folder, partial output or a mix of two runs."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import ROOT, assert_input_error, finish, sim_popen, snapshot

TINY = str(ROOT / "scenarios" / "athena-tiny.yaml")
BIG = str(ROOT / "scenarios" / "athena.yaml")
FLAG = "enable_mamba_shared_prefix_checkpoint"


def _user_files(folder: Path) -> dict[str, bytes]:
    """Put a user's files in ``folder``; return the snapshot of its parent tree."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notes.txt").write_text("mine\n")
    (folder / "sub").mkdir(exist_ok=True)
    (folder / "sub" / "data.csv").write_text("a,b\n1,2\n")
    return snapshot(folder)


def _hidden(folder: Path) -> list[str]:
    """Leftover temporary folders/files (``.<name>.XXXX``) anywhere under ``folder``."""
    return [str(p.relative_to(folder)) for p in folder.rglob(".*") if p.name != ".hcs-output"]


def _refused(res, tree: Path, before: dict, *must_name: str) -> str:
    line = assert_input_error(res, *must_name)
    assert snapshot(tree) == before, "files were written or deleted"
    assert not _hidden(tree)
    return line


# ---- existing targets -------------------------------------------------------------

def test_out_dot_is_refused_and_cwd_untouched(sim_inproc, tmp_path):
    before = _user_files(tmp_path)
    res = sim_inproc("run", TINY, "--out", ".", "-q", cwd=tmp_path)
    _refused(res, tmp_path, before, ".", str(tmp_path))


def test_out_user_folder_is_refused(sim_inproc, tmp_path):
    _user_files(tmp_path / "keep")
    before = snapshot(tmp_path)
    res = sim_inproc("run", TINY, "--out", "keep", "-q", cwd=tmp_path)
    line = _refused(res, tmp_path, before, "keep")
    assert "notes.txt" in line and "sim did not write" in line


def test_set_name_dot_keeps_earlier_runs(sim_inproc, tmp_path):
    assert sim_inproc("run", TINY, "-q", "--no-report", cwd=tmp_path).rc == 0
    assert (tmp_path / "runs" / "athena-tiny" / "requests.csv").is_file()
    before = snapshot(tmp_path)
    res = sim_inproc("run", TINY, "-q", "--set", "name=.", cwd=tmp_path)
    _refused(res, tmp_path, before, "name", "plain folder name")
    # the folder holding the earlier runs, given as the output, is not sim's to replace
    res = sim_inproc("run", TINY, "-q", "--out", "runs", cwd=tmp_path)
    _refused(res, tmp_path, before, "runs", "athena-tiny")


def test_scenario_output_onto_user_folder_is_refused(sim_inproc, tmp_path):
    sc = tmp_path / "sc.yaml"
    sc.write_text(Path(TINY).read_text() + "output: mine\n")
    _user_files(tmp_path / "mine")
    before = snapshot(tmp_path)
    res = sim_inproc("run", str(sc), "-q", cwd=tmp_path)
    _refused(res, tmp_path, before, "mine")


def test_empty_folder_is_used(sim_inproc, tmp_path):
    (tmp_path / "empty").mkdir()
    res = sim_inproc("run", TINY, "--out", "empty", "-q", "--no-report", cwd=tmp_path)
    assert res.rc == 0 and res.err == ""
    assert (tmp_path / "empty" / "summary.json").is_file()


def test_rerun_replaces_own_folder_and_says_so(sim_inproc, tmp_path):
    assert sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path).rc == 0
    first = snapshot(tmp_path / "r")
    assert ".hcs-output" in first
    res = sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", "--set", "seed=5",
                     cwd=tmp_path)
    assert res.rc == 0, res.err
    assert res.err.strip().splitlines() == ["replacing earlier run folder r/"]
    second = snapshot(tmp_path / "r")
    assert second.keys() == first.keys()
    assert second["requests.csv"] != first["requests.csv"]     # the new run, whole
    assert not _hidden(tmp_path)
    # a file the user added since makes it theirs: refused, nothing lost
    (tmp_path / "r" / "mine.txt").write_text("x")
    before = snapshot(tmp_path)
    res = sim_inproc("run", TINY, "--out", "r", "-q", cwd=tmp_path)
    _refused(res, tmp_path, before, "r", "mine.txt")


# ---- bad paths, refused at once ------------------------------------------------------

def test_file_in_the_path(sim_inproc, tmp_path):
    (tmp_path / "user.txt").write_text("x")
    before = snapshot(tmp_path)
    res = sim_inproc("run", TINY, "--out", "user.txt/sub/r", "-q", cwd=tmp_path)
    _refused(res, tmp_path, before, "user.txt/sub/r", "is a file")


def test_file_as_the_target(sim_inproc, tmp_path):
    (tmp_path / "user.txt").write_text("x")
    before = snapshot(tmp_path)
    res = sim_inproc("run", TINY, "--out", "user.txt", "-q", cwd=tmp_path)
    _refused(res, tmp_path, before, "user.txt", "not a folder")


def test_unwritable_parent_proc(sim_inproc, tmp_path):
    res = sim_inproc("run", TINY, "--out", "/proc/hcs-test-run", "-q", cwd=tmp_path)
    assert_input_error(res, "/proc/hcs-test-run", "cannot write")
    assert snapshot(tmp_path) == {}


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores permission bits")
def test_unwritable_parent_chmod(sim_inproc, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        res = sim_inproc("run", TINY, "--out", "ro/r", "-q", cwd=tmp_path)
        assert_input_error(res, "ro/r", "cannot write")
        assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o755)


def test_bad_path_is_refused_before_simulating(sim_inproc, tmp_path, monkeypatch):
    import sim.commands.run

    def boom(*a, **k):
        raise AssertionError("simulated before checking the output path")
    monkeypatch.setattr(sim.commands.run, "simulate", boom)
    (tmp_path / "f").write_text("x")
    assert_input_error(sim_inproc("run", TINY, "--out", "f", cwd=tmp_path), "f")
    assert_input_error(sim_inproc("verify", TINY, "--out", "f", cwd=tmp_path), "f")


def test_compare_onto_user_folder_is_refused(sim_inproc, tmp_path):
    _user_files(tmp_path / "cmp")
    before = snapshot(tmp_path)
    res = sim_inproc("compare", TINY, "--flag", FLAG, "--out", "cmp", "-q", cwd=tmp_path)
    _refused(res, tmp_path, before, "cmp")


def _sweep_file(tmp_path: Path, extra: str = "") -> Path:
    p = tmp_path / "sw.yaml"
    p.write_text(f"name: t\nbase: {TINY}\nset: {{workload.num_requests: 6}}\n"
                 f"grid:\n  cache.{FLAG}: [false, true]\n{extra}")
    return p


def test_sweep_onto_user_folder_is_refused(sim_inproc, tmp_path):
    sw = _sweep_file(tmp_path)
    _user_files(tmp_path / "s")
    before = snapshot(tmp_path)
    res = sim_inproc("sweep", str(sw), "--out", "s", "--workers", "1", "-q", cwd=tmp_path)
    _refused(res, tmp_path, before, "s")
    sw = _sweep_file(tmp_path, "output: s\n")          # the sweep file's own output:
    before = snapshot(tmp_path)
    res = sim_inproc("sweep", str(sw), "--workers", "1", "-q", cwd=tmp_path)
    _refused(res, tmp_path, before, "s")


def test_sweep_rerun_replaces_own_folder(sim_inproc, tmp_path):
    sw = _sweep_file(tmp_path)
    args = ("sweep", str(sw), "--out", "s", "--workers", "1", "-q", "--no-report")
    assert sim_inproc(*args, cwd=tmp_path).rc == 0
    assert (tmp_path / "s" / "points" / "p001" / "requests.csv").is_file()
    res = sim_inproc(*args, cwd=tmp_path)
    assert res.rc == 0 and res.err.strip() == "replacing earlier sweep folder s/"
    assert not _hidden(tmp_path)


# ---- interrupts ------------------------------------------------------------------

def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait(cond, timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out waiting"
        time.sleep(0.05)


@pytest.mark.parametrize("sig,rc", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_during_simulation(tmp_path, sig, rc):
    proc = sim_popen("run", BIG, "--out", "r", "-q", "--set", "workload.num_requests=300000",
                     cwd=tmp_path)
    try:
        # past start-up (imports ~0.6 s of CPU) and well into the replay
        _wait(lambda: proc.poll() is not None or _cpu_s(proc.pid) > 1.5)
        assert proc.poll() is None, finish(proc)
        proc.send_signal(sig)
        res = finish(proc, timeout=30)
    finally:
        proc.kill()
    assert res.rc == rc, res.err
    assert res.err.strip().splitlines() == ["interrupted; nothing written"]
    assert "Traceback" not in res.err
    assert snapshot(tmp_path) == {} and not list(tmp_path.iterdir())


def test_sigterm_while_writing_files(tmp_path):
    proc = sim_popen("run", TINY, "--out", "r", "-q", cwd=tmp_path,
                     env={"HCS_TEST_PAUSE_WRITE": "20"})
    try:
        # the files are in the hidden temporary folder, not yet moved into place
        _wait(lambda: proc.poll() is not None
              or any((d / "summary.json").is_file() for d in tmp_path.glob(".r.*")))
        assert proc.poll() is None, finish(proc)
        proc.send_signal(signal.SIGTERM)
        res = finish(proc, timeout=30)
    finally:
        proc.kill()
    assert res.rc == 143, res.err
    assert res.err.strip().splitlines() == ["interrupted; nothing written"]
    assert not list(tmp_path.iterdir())


def test_sigterm_during_sweep_stops_the_points_at_once(tmp_path):
    sw = tmp_path / "sw.yaml"
    sw.write_text(f"name: t\nbase: {BIG}\nset: {{workload.num_requests: 300000}}\n"
                  f"grid:\n  cache.{FLAG}: [false, true]\n")
    proc = sim_popen("sweep", str(sw), "--out", "s", "--workers", "2", "-q", cwd=tmp_path)
    try:
        _wait(lambda: proc.poll() is not None or any(tmp_path.glob(".s.*/points")))
        time.sleep(1.0)                                 # the points are under way
        assert proc.poll() is None, finish(proc)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        res = finish(proc, timeout=30)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert res.rc == 143, res.err
    assert res.err.strip().splitlines() == ["interrupted; nothing written"]
    assert took < 5, f"waited {took:.1f}s for the points under way"
    assert [p.name for p in tmp_path.iterdir()] == ["sw.yaml"]


def test_interrupt_during_the_final_rename_keeps_the_earlier_run(sim_inproc, tmp_path,
                                                                 monkeypatch):
    import sim.rundir.atomic

    assert sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path).rc == 0
    before = snapshot(tmp_path)
    real_rename = os.rename

    def rename(src, dst):
        if Path(dst).name == "r" and Path(src).name.startswith(".r."):
            os.kill(os.getpid(), signal.SIGTERM)        # lands mid-commit (held back)
        real_rename(src, dst)
    monkeypatch.setattr(sim.rundir.atomic.os, "rename", rename)
    res = sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", "--set", "seed=5",
                     cwd=tmp_path)
    monkeypatch.undo()
    assert res.rc == 143, res.err
    assert res.err.strip().splitlines() == ["interrupted; nothing written"]
    assert snapshot(tmp_path) == before         # the earlier run, whole; no temp folder


# ---- concurrent runs -----------------------------------------------------------

def _comparable(folder: Path) -> tuple[bytes, dict]:
    s = json.loads((folder / "summary.json").read_text())
    for k in ("wall_s", "sim_requests_per_s"):
        s.pop(k)
    return (folder / "requests.csv").read_bytes(), s


def test_concurrent_runs_same_out(sim_inproc, tmp_path):
    refs = {}
    for seed in (1, 2):
        assert sim_inproc("run", TINY, "--out", f"ref{seed}", "-q", "--no-report",
                          "--set", f"seed={seed}", cwd=tmp_path).rc == 0
        refs[seed] = _comparable(tmp_path / f"ref{seed}")
    assert refs[1] != refs[2]
    procs = [sim_popen("run", TINY, "--out", "r", "-q", "--no-report", "--set", f"seed={seed}",
                       cwd=tmp_path, env={"HCS_TEST_PAUSE_WRITE": "1"}) for seed in (1, 2)]
    results = [finish(p) for p in procs]
    for res in results:
        assert "Traceback" not in res.err
        lines = res.err.strip().splitlines()
        if res.rc == 0:
            assert lines in ([], ["replacing earlier run folder r/"])
        else:
            assert_input_error(res, "r", "another run")
    assert any(res.rc == 0 for res in results)
    assert _comparable(tmp_path / "r") in refs.values()     # one run, whole, not a mix
    assert not _hidden(tmp_path)


def test_other_program_takes_the_folder_meanwhile(tmp_path):
    proc = sim_popen("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path,
                     env={"HCS_TEST_PAUSE_WRITE": "2"})
    try:
        _wait(lambda: proc.poll() is not None
              or any((d / "summary.json").is_file() for d in tmp_path.glob(".r.*")))
        before = _user_files(tmp_path / "r")       # while the run's files wait to land
        res = finish(proc, timeout=60)
    finally:
        proc.kill()
    assert_input_error(res, "r", "another run or program took the folder")
    assert snapshot(tmp_path / "r") == before
    assert not _hidden(tmp_path)


# ---- calibrate's profile ------------------------------------------------------

def test_atomic_write_text_leaves_no_temp_file(tmp_path, monkeypatch):
    from sim.rundir.atomic import OutputPathError
    from sim.rundir.atomic_files import atomic_write_text

    p = tmp_path / "profiles" / "x.yaml"
    atomic_write_text(p, "a: 1\n")
    atomic_write_text(p, "a: 2\n")
    assert p.read_text() == "a: 2\n" and os.listdir(p.parent) == ["x.yaml"]

    def fail(*a):
        raise OSError("disk full")
    monkeypatch.setattr("sim.rundir.atomic.os.replace", fail)
    with pytest.raises(OSError):
        atomic_write_text(p, "a: 3\n")
    monkeypatch.undo()
    assert p.read_text() == "a: 2\n" and os.listdir(p.parent) == ["x.yaml"]
    with pytest.raises(OutputPathError, match="is a folder"):
        atomic_write_text(tmp_path / "profiles", "x")
