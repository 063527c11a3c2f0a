"""Writes (issue #38, P1/P2): a full disk, a file-size limit or a read-only folder while
any writer writes is one line, exit 2, and nothing half-written (``sim run``, ``sim
sweep``, ``sim compare``, ``sim marconi``, ``sim report``, ``sim check --update``,
stdout); a symbolic link loop as ``--out`` is one line; what ``sim report`` writes is
sim's own (a run folder stays replaceable); stale hidden temporary folders whose writer
is gone are swept, and nothing else; an interrupt or a second report at the same time
leaves no mix.

The disk-full cases run ``sim`` in a child under ``RLIMIT_FSIZE`` (a write past the
limit fails with EFBIG: Python ignores SIGXFSZ); one runs on a small tmpfs where this
machine lets a test mount one.  Read-only folders are made with ``chmod`` (not root) or
a read-only bind mount in a private mount namespace (root); a case that can have
neither is skipped, and an in-process case forces EROFS everywhere.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (ROOT, Result, assert_input_error, finish, sim_popen, sim_subprocess,
                      snapshot)

TINY = str(ROOT / "scenarios" / "athena-tiny.yaml")
FLAG = "enable_mamba_shared_prefix_checkpoint"
CASE = "config:\n  block_size: 16\n  num_blocks: 64\nrequests:\n  - {id: a, prompt: 'S:40'}\n"

try:
    import resource
except ImportError:             # (not POSIX)
    resource = None

needs_fsize = pytest.mark.skipif(resource is None or not sys.platform.startswith("linux"),
                                 reason="needs RLIMIT_FSIZE")


def _hidden(folder: Path) -> list[str]:
    return [str(p.relative_to(folder)) for p in folder.rglob(".*")
            if p.name != ".hcs-output"]


def _limited(limit: int, *args: str, cwd: Path, timeout: float = 120) -> Result:
    """``python -m sim ARGS`` with every file it writes limited to ``limit`` bytes."""
    def pre():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "sim", *args], cwd=cwd, env=env,
                       preexec_fn=pre, capture_output=True, text=True, timeout=timeout)
    return Result(p.returncode, p.stdout, p.stderr)


def _unchanged(res: Result, tmp_path: Path, before: dict, *must: str) -> str:
    line = assert_input_error(res, *must)
    assert snapshot(tmp_path) == before, "files were written, changed or deleted"
    assert not _hidden(tmp_path), _hidden(tmp_path)
    return line


# ---- a full disk (a file-size limit) ------------------------------------------------

@needs_fsize
def test_disk_full_during_sim_run_keeps_the_earlier_run(sim_inproc, tmp_path):
    assert sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path).rc == 0
    before = snapshot(tmp_path)
    res = _limited(3000, "run", TINY, "--out", "r", "-q", "--set", "seed=5", cwd=tmp_path)
    _unchanged(res, tmp_path, before, "r:", "File too large", "nothing written")


@needs_fsize
def test_disk_full_during_sim_run_with_its_report_workers(tmp_path):
    # the report (drawn by the report workers) is what passes the limit: ~20 KB PNGs
    res = _limited(12_000, "run", TINY, "--out", "r", "-q", cwd=tmp_path)
    assert_input_error(res, "r:", "File too large", "nothing written")
    assert list(tmp_path.iterdir()) == []


@needs_fsize
def test_disk_full_during_sim_report_leaves_the_folder_as_it_was(sim_inproc, tmp_path):
    assert sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path).rc == 0
    before = snapshot(tmp_path)
    res = _limited(12_000, "report", "r", cwd=tmp_path)
    _unchanged(res, tmp_path, before, "r:", "cannot write", ".png", "File too large",
               "folder is as it was")


@needs_fsize
def test_disk_full_while_sim_report_rewrites_an_earlier_report(sim_inproc, tmp_path):
    assert sim_inproc("run", TINY, "--out", "r", "-q", cwd=tmp_path).rc == 0
    (tmp_path / "r" / "report.md").write_text("an earlier report\n")    # (to tell them apart)
    before = snapshot(tmp_path)
    res = _limited(12_000, "report", "r", cwd=tmp_path)
    _unchanged(res, tmp_path, before, "r:", "File too large")


@needs_fsize
def test_disk_full_during_a_sweep_and_its_report(sim_inproc, tmp_path):
    sw = tmp_path / "sw.yaml"
    sw.write_text(f"name: t\nbase: {TINY}\nset: {{workload.num_requests: 6}}\n"
                  "grid: {seed: [1]}\n")
    before = snapshot(tmp_path)
    res = _limited(20_000, "sweep", str(sw), "--out", "s", "--workers", "1", "-q",
                   cwd=tmp_path)
    _unchanged(res, tmp_path, before, "s:", "File too large", "nothing written")
    # a sweep folder whose report cannot be written: as it was
    assert sim_inproc("sweep", str(sw), "--out", "s", "--workers", "1", "-q", "--no-report",
                      cwd=tmp_path).rc == 0
    before = snapshot(tmp_path)
    res = _limited(20_000, "report", "s", cwd=tmp_path)
    _unchanged(res, tmp_path, before, "s:", "File too large")


@needs_fsize
@pytest.mark.parametrize("command", ["compare", "marconi"])
def test_disk_full_during_compare_and_marconi(tmp_path, command):
    args = ["--flag", FLAG] if command == "compare" else []
    res = _limited(1000, command, TINY, *args, "--out", "o", "-q", cwd=tmp_path)
    assert_input_error(res, "o/off:" if command == "compare" else "o:", "File too large",
                       "nothing written")
    assert list(tmp_path.iterdir()) == []


@needs_fsize
def test_disk_full_during_sim_check_update_keeps_the_golden(sim_inproc, tmp_path):
    (tmp_path / "c.yaml").write_text(CASE)
    (tmp_path / "gold").mkdir()
    (tmp_path / "gold" / "c.yaml.golden").write_text("# old\na: hit=7 per_group=0,0 junction=0\n")
    before = snapshot(tmp_path)
    res = _limited(60, "check", "c.yaml", "--golden", "gold", "--update", cwd=tmp_path)
    _unchanged(res, tmp_path, before, "c.yaml.golden", "cannot write the golden file",
               "File too large")


@needs_fsize
def test_disk_full_while_kv_events_stream_during_the_run(tmp_path):
    # the event stream is written (to a temporary folder) while the replay runs
    res = _limited(4000, "run", TINY, "--kv-events", "--out", "r", "-q", "--no-report",
                   cwd=tmp_path)
    assert_input_error(res, "cannot write", "File too large")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("args", [("case", "c.yaml"), ("model", "--list"),
                                  ("events", "check", "--json", "e.jsonl")],
                         ids=["case", "model", "events"])
def test_stdout_on_a_full_disk_is_one_line(tmp_path, args):
    (tmp_path / "c.yaml").write_text(CASE)
    (tmp_path / "e.jsonl").write_text('{"kv_events_header": {"groups": []}}\n')
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "sim", *args], cwd=tmp_path, env=env,
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert_input_error(Result(p.returncode, "", p.stderr), "cannot write the output",
                       "No space left on device")


def test_a_closed_pipe_ends_quietly(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-m", "sim", "model", "--list"], cwd=tmp_path,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()                        # (the reader has gone before the first line)
    err = p.stderr.read().decode()
    p.wait(timeout=60)
    p.stderr.close()
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert p.returncode in (0, 1, 128 + signal.SIGPIPE)     # (click's own: exit 1, quiet)


def _can_unshare() -> bool:
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    try:
        return subprocess.run(["unshare", "-m", "sh", "-c",
                               "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null || "
                               "mount -t tmpfs -o size=64k tmpfs /tmp"],
                              capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


CAN_UNSHARE = _can_unshare()


@pytest.mark.skipif(not CAN_UNSHARE, reason="cannot mount a tmpfs in a private namespace")
def test_a_real_full_tmpfs_during_sim_run(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (f'mount -t tmpfs -o size=48k tmpfs "{disk}" && cd "{disk}" && '
              f'"{sys.executable}" -m sim run "{TINY}" --out r -q; echo "rc=$?"; ls -A "{disk}"')
    p = subprocess.run(["unshare", "-m", "sh", "-c", script], env=dict(
        os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    out = p.stdout.split()
    assert out == ["rc=2"], (p.stdout, p.stderr)        # (and nothing left on the disk)
    assert_input_error(Result(2, "", p.stderr), "r:", "No space left on device",
                       "nothing written")


# ---- read-only folders --------------------------------------------------------------

def _run_read_only(folder: Path, *args: str, cwd: Path) -> Result:
    """``sim ARGS`` with ``folder`` read-only: chmod (not root), else a read-only bind
    mount in a private mount namespace; skipped where neither works."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")]}
        for p in modes:
            p.chmod(modes[p] & ~0o222)
        try:
            return sim_subprocess(*args, cwd=cwd)
        finally:
            for p, m in modes.items():
                p.chmod(m)
    if not CAN_UNSHARE:
        pytest.skip("root, and no private mount namespace to make a folder read-only")
    cmd = " ".join(f"'{a}'" for a in args)
    script = (f'mount --bind -o ro "{folder}" "{folder}" && cd "{cwd}" && '
              f'exec "{sys.executable}" -m sim {cmd}')
    p = subprocess.run(["unshare", "-m", "sh", "-c", script], env=dict(
        os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
    return Result(p.returncode, p.stdout, p.stderr)


def test_sim_report_on_a_read_only_folder(sim_inproc, tmp_path):
    assert sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path).rc == 0
    before = snapshot(tmp_path)
    res = _run_read_only(tmp_path / "r", "report", "r", cwd=tmp_path)
    _unchanged(res, tmp_path, before, "r:", "cannot write in it")


def test_sim_check_update_on_a_read_only_golden_folder(sim_inproc, tmp_path):
    (tmp_path / "c.yaml").write_text(CASE)
    (tmp_path / "gold").mkdir()
    (tmp_path / "gold" / "c.yaml.golden").write_text("a: hit=7 per_group=0,0 junction=0\n")
    before = snapshot(tmp_path)
    res = _run_read_only(tmp_path / "gold", "check", "c.yaml", "--golden", "gold", "--update",
                         cwd=tmp_path)
    _unchanged(res, tmp_path, before, "gold/c.yaml.golden", "cannot write the golden file")


def test_sim_run_under_a_read_only_parent(tmp_path):
    (tmp_path / "ro").mkdir()
    res = _run_read_only(tmp_path / "ro", "run", TINY, "--out", "ro/r", "-q", cwd=tmp_path)
    assert_input_error(res, "ro/r", "cannot write")
    assert list((tmp_path / "ro").iterdir()) == []


def test_sim_report_when_every_write_is_refused(sim_inproc, tmp_path, monkeypatch):
    """Whatever the machine: every file creation fails with EROFS (as on a read-only
    filesystem) -> one line, the folder as it was."""
    import tempfile

    assert sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path).rc == 0
    before = snapshot(tmp_path)

    def refuse(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    res = sim_inproc("report", "r", cwd=tmp_path)
    monkeypatch.undo()
    _unchanged(res, tmp_path, before, "r:", "Read-only file system")


def test_sim_report_when_moving_a_file_in_fails_puts_back_the_earlier_ones(
        sim_inproc, tmp_path, monkeypatch):
    """A failure half-way through moving the staged files in: those moved are undone
    (the earlier files put back), so the folder is as it was."""
    import sim.rundir.atomic

    assert sim_inproc("run", TINY, "--out", "r", "-q", cwd=tmp_path).rc == 0
    before = snapshot(tmp_path)
    real = os.replace
    moved = []

    def replace(src, dst):
        if Path(dst).parent.name == "r" and Path(dst).suffix == ".png":
            moved.append(dst)
            if len(moved) == 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        return real(src, dst)
    monkeypatch.setattr(sim.rundir.atomic.os, "replace", replace)
    res = sim_inproc("report", "r", cwd=tmp_path)
    monkeypatch.undo()
    _unchanged(res, tmp_path, before, "r:", "No space left on device")


# ---- symbolic link loops as the output -----------------------------------------------

@pytest.mark.parametrize("out", ["loop", "loop/sub", "a"], ids=["self", "below", "pair"])
def test_a_symlink_loop_as_out_is_one_line(sim_inproc, tmp_path, out):
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    before = snapshot(tmp_path)
    res = sim_inproc("run", TINY, "--out", out, "-q", cwd=tmp_path)
    assert_input_error(res, out)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["sweep", "compare"])
def test_a_symlink_loop_as_out_of_sweep_and_compare(sim_inproc, tmp_path, command):
    (tmp_path / "loop").symlink_to("loop")
    sw = tmp_path / "sw.yaml"
    sw.write_text(f"name: t\nbase: {TINY}\ngrid: {{seed: [1, 2]}}\n")
    args = (["sweep", str(sw), "--workers", "1"] if command == "sweep"
            else ["compare", TINY, "--flag", FLAG])
    res = sim_inproc(*args, "--out", "loop", "-q", cwd=tmp_path)
    assert_input_error(res, "loop", "symbolic link")


def test_a_symlink_loop_as_the_scenario(sim_inproc, tmp_path):
    (tmp_path / "s.yaml").symlink_to("s.yaml")
    res = sim_inproc("run", "s.yaml", "--out", "o", cwd=tmp_path)
    assert_input_error(res, "s.yaml", "cannot read")


# ---- what sim report writes is sim's -------------------------------------------------

def test_run_no_report_then_report_then_run_out_replaces_it(sim_inproc, tmp_path):
    assert sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path).rc == 0
    res = sim_inproc("report", "r", cwd=tmp_path)
    assert res.rc == 0, res.err
    assert (tmp_path / "r" / "report.md").is_file() and (tmp_path / "r" / "ttft_cdf.png").is_file()
    marker = json.loads((tmp_path / "r" / ".hcs-output").read_text())
    assert {"report.md", "ttft_cdf.png", "hit_hist.png", "memory.png"} <= set(marker["entries"])
    assert not _hidden(tmp_path)
    res = sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", "--set", "seed=3",
                     cwd=tmp_path)
    assert res.rc == 0, res.err
    assert res.err.strip() == "replacing earlier run folder r/"
    # a file the user adds after the report still makes the folder theirs
    assert sim_inproc("report", "r", cwd=tmp_path).rc == 0
    (tmp_path / "r" / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    res = sim_inproc("run", TINY, "--out", "r", "-q", cwd=tmp_path)
    assert_input_error(res, "r", "notes.txt")
    assert snapshot(tmp_path) == before


def test_a_sweep_report_is_sims_too(sim_inproc, tmp_path):
    sw = tmp_path / "sw.yaml"
    sw.write_text(f"name: t\nbase: {TINY}\nset: {{workload.num_requests: 6}}\n"
                  "grid: {seed: [1]}\n")
    args = ("sweep", str(sw), "--out", "s", "--workers", "1", "-q", "--no-report")
    assert sim_inproc(*args, cwd=tmp_path).rc == 0
    assert sim_inproc("report", "s", cwd=tmp_path).rc == 0
    assert (tmp_path / "s" / "report.html").is_file()
    res = sim_inproc(*args, cwd=tmp_path)
    assert res.rc == 0 and res.err.strip() == "replacing earlier sweep folder s/", res.err


def test_sim_report_twice_at_once(sim_inproc, tmp_path):
    assert sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path).rc == 0
    procs = [sim_popen("report", "r", cwd=tmp_path) for _ in range(2)]
    results = [finish(p) for p in procs]
    assert all(r.rc == 0 for r in results), [r.err for r in results]
    assert (tmp_path / "r" / "report.md").read_text().startswith("#")
    assert not _hidden(tmp_path)
    res = sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path)
    assert res.rc == 0, res.err


def test_sigterm_while_sim_report_moves_its_files_in(sim_inproc, tmp_path):
    assert sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path).rc == 0
    before = snapshot(tmp_path)
    proc = sim_popen("report", "r", cwd=tmp_path, env={"HCS_TEST_PAUSE_WRITE": "20"})
    try:
        t0 = time.monotonic()
        while not any((d / "files" / "report.md").is_file() for d in tmp_path.glob(".r.*")):
            assert proc.poll() is None and time.monotonic() - t0 < 60, finish(proc)
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        res = finish(proc, timeout=30)
    finally:
        proc.kill()
    assert res.rc == 143 and res.err.strip() == "interrupted; nothing written", res.err
    assert snapshot(tmp_path) == before and not _hidden(tmp_path)


# ---- stale temporary folders ------------------------------------------------------------

def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _writer(pid: int, **over) -> dict:
    import socket

    from sim.rundir.atomic import _boot_id, _proc_start

    rec = {"written_by": "hybrid-cache-sim", "pid": pid,
           "start": _proc_start(pid) if _proc_start(pid) is not None else 12345,
           "boot": _boot_id(), "host": socket.gethostname()}
    rec.update(over)
    return rec


def _temp(parent: Path, name: str, record: dict | None) -> Path:
    d = parent / name
    d.mkdir()
    (d / "requests.csv").write_text("half,written\n")
    if record is not None:
        (d / ".hcs-writer").write_text(json.dumps(record))
    return d


linux_proc = pytest.mark.skipif(not os.path.exists("/proc/self/stat")
                                or not os.path.exists("/proc/sys/kernel/random/boot_id"),
                                reason="needs /proc to tell a writer's life")


@linux_proc
def test_a_stale_temp_folder_of_a_dead_writer_is_swept(sim_inproc, tmp_path):
    _temp(tmp_path, ".r.deadbeef", _writer(_dead_pid()))
    _temp(tmp_path, ".x.oldboot1", _writer(_dead_pid(), boot="another-boot"))
    assert sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path).rc == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]


@linux_proc
def test_what_sim_cannot_prove_stale_is_kept(sim_inproc, tmp_path):
    keep = {
        ".r.livewrtr": _writer(os.getpid()),                       # a live writer
        ".r.norecord": None,                                       # no record: not ours
        ".r.otherhst": _writer(_dead_pid(), host="another-host"),  # another machine's
        ".r.notours1": {"written_by": "someone-else", "pid": _dead_pid()},
        ".r.pidreuse": _writer(os.getpid(), start=1),              # (pid now another's)
    }
    for name, rec in keep.items():
        _temp(tmp_path, name, rec)
    (tmp_path / ".r.afile123").write_text("a file, not a folder")
    assert sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path).rc == 0
    left = sorted(p.name for p in tmp_path.iterdir())
    # (a pid whose start time differs is another process: its folder is stale)
    assert left == sorted(set(keep) - {".r.pidreuse"} | {".r.afile123", "r"})


@linux_proc
def test_a_folder_moved_aside_by_a_dead_writer_is_put_back(sim_inproc, tmp_path):
    from sim.rundir.atomic import _boot_id

    assert sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path).rc == 0
    first = snapshot(tmp_path / "r")
    tag = f"{_dead_pid()}-12345-{_boot_id().replace('-', '')[:8]}"
    (tmp_path / "r").rename(tmp_path / f".r.old.{tag}.abcd1234")
    # the next write in this folder finds the earlier run aside and nothing in its place
    assert sim_inproc("run", TINY, "--out", "other", "-q", "--no-report", cwd=tmp_path).rc == 0
    assert snapshot(tmp_path / "r") == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "r"]


@linux_proc
def test_a_sigkilled_write_leaves_a_temp_folder_the_next_write_sweeps(sim_inproc, tmp_path):
    proc = sim_popen("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path,
                     env={"HCS_TEST_PAUSE_WRITE": "20"})
    try:
        t0 = time.monotonic()
        while not any((d / "summary.json").is_file() for d in tmp_path.glob(".r.*")):
            assert proc.poll() is None and time.monotonic() - t0 < 60, finish(proc)
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.communicate()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".r.")]
    assert sim_inproc("run", TINY, "--out", "r", "-q", "--no-report", cwd=tmp_path).rc == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]
