"""The process tree (issue #38, P0): ``sim sweep --workers N`` never starts more workers
than points nor than the CPUs it may use, and says so when it caps; its workers, and
``sim run``'s report workers, die with the command whatever ends it (SIGKILL, SIGTERM,
SIGINT); an interrupted Ray sweep cancels its tasks.

Every process a test starts is killed by its pid in a ``finally``; the kill tests
assert that no worker outlives its parent by more than 5 s.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, assert_input_error, finish, sim_popen, snapshot

TINY = str(ROOT / "scenarios" / "athena-tiny.yaml")
BIG = str(ROOT / "scenarios" / "athena.yaml")
FLAG = "enable_mamba_shared_prefix_checkpoint"
GRACE_S = 5.0


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


needs_two_cpus = pytest.mark.skipif(_cpus() < 2, reason="a pool of 2 workers needs 2 usable CPUs")
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a live process; None when it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (None if fields[0] in ("Z", "X") else (fields[0], int(fields[1])))


def _children(pid: int) -> list[int]:
    """Every live descendant of ``pid``."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                parents.setdefault(st[1], []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in parents.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _wait(cond, timeout: float = 60.0, what: str = "") -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out waiting {what}"
        time.sleep(0.05)


def _kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _assert_gone(pids: list[int]) -> None:
    t0 = time.monotonic()
    while any(_stat(p) is not None for p in pids) and time.monotonic() - t0 < GRACE_S:
        time.sleep(0.05)
    alive = [p for p in pids if _stat(p) is not None]
    assert not alive, f"workers {alive} outlived their parent by {GRACE_S:g} s"


def _long_sweep(tmp_path: Path) -> Path:
    sw = tmp_path / "sw.yaml"
    sw.write_text(f"name: t\nbase: {BIG}\nset: {{workload.num_requests: 300000}}\n"
                  f"grid:\n  cache.{FLAG}: [false, true]\n")
    return sw


# ---- workers die with their parent ------------------------------------------------

@linux_only
@needs_two_cpus
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT],
                         ids=["SIGKILL", "SIGTERM", "SIGINT"])
def test_sweep_workers_die_with_their_parent(tmp_path, sig):
    proc = sim_popen("sweep", str(_long_sweep(tmp_path)), "--out", "s", "--workers", "2", "-q",
                     cwd=tmp_path)
    workers: list[int] = []
    try:
        _wait(lambda: proc.poll() is not None or len(_children(proc.pid)) >= 2,
              what="for the pool's 2 workers")
        assert proc.poll() is None, finish(proc)
        time.sleep(0.3)                          # (the points under way)
        workers = _children(proc.pid)
        assert len(workers) == 2, workers
        proc.send_signal(sig)
        proc.wait(timeout=30)
        _assert_gone(workers)
    finally:
        proc.kill()
        _kill_all(workers)
        proc.communicate()
    if sig != signal.SIGKILL:
        assert proc.returncode == 128 + sig
    # a SIGKILLed sweep leaves its hidden temporary folder (swept by the next write)
    assert not (tmp_path / "s").exists()


@linux_only
def test_report_workers_die_with_a_sigkilled_run(tmp_path):
    proc = sim_popen("run", BIG, "--out", "r", "-q", "--set", "workload.num_requests=300000",
                     cwd=tmp_path)
    workers: list[int] = []
    try:
        # the first report worker forks the second once it has imported matplotlib
        _wait(lambda: proc.poll() is not None or len(_children(proc.pid)) >= 2,
              what="for the report workers")
        assert proc.poll() is None, finish(proc)
        workers = _children(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        _assert_gone(workers)
    finally:
        proc.kill()
        _kill_all(workers)
        proc.communicate()


def test_lifeline_ends_a_child_whose_parent_ended(tmp_path):
    """The pipe watch alone (no parent-death signal: the child of a thread, or not
    Linux): a grandchild whose parent is SIGKILLed ends within the grace time."""
    import subprocess

    code = (
        "import os, sys, time\n"
        "from sim.lifeline import Lifeline\n"
        "line = Lifeline()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.close(line._w)\n"
        "    import threading\n"
        "    threading.Thread(target=line._watch, daemon=True).start()\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print(pid, flush=True)\n"
        "time.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env=env)
    child = 0
    try:
        child = int(p.stdout.readline())
        assert _stat(child) is not None
        p.kill()
        p.wait(timeout=10)
        _assert_gone([child])
    finally:
        p.kill()
        _kill_all([child])
        p.communicate()


# ---- never more workers than points or CPUs --------------------------------------

def _small_sweep(tmp_path: Path, n_values: int = 2) -> Path:
    sw = tmp_path / "sw.yaml"
    seeds = ", ".join(str(i + 1) for i in range(n_values))
    sw.write_text(f"name: t\nbase: {TINY}\nset: {{workload.num_requests: 4}}\n"
                  f"grid:\n  seed: [{seeds}]\n")
    return sw


FAILED = {"status": "failed", "error": "stand-in", "trace": ""}


def test_plan_workers_caps_by_points_and_cpus(monkeypatch):
    from sim.commands import sweep

    monkeypatch.setattr(sweep.os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert sweep.plan_workers(None, 2) == (2, None)
    assert sweep.plan_workers(None, 10) == (3, None)
    assert sweep.plan_workers(2, 10) == (2, None)
    n, line = sweep.plan_workers(100_000, 2)
    assert n == 2 and line == "--workers 100,000: running 2 workers (2 points)"
    n, line = sweep.plan_workers(100_000, 3)
    assert n == 3 and line == "--workers 100,000: running 3 workers (3 points, 3 CPUs usable)"
    n, line = sweep.plan_workers(8, 50, "workers")
    assert n == 3 and line == "workers 8: running 3 workers (3 CPUs usable)"
    n, line = sweep.plan_workers(5, 1)
    assert n == 1 and line == "--workers 5: running 1 worker (1 point)"


def test_sweep_workers_100000_starts_no_more_than_points(sim_inproc, tmp_path, monkeypatch):
    from sim.commands import sweep

    monkeypatch.setattr(sweep.os, "sched_getaffinity", lambda pid: set(range(64)),
                        raising=False)
    seen = []
    monkeypatch.setattr(sweep, "_pool_points", lambda jobs, workers, progress, line:
                        seen.append(workers) or [FAILED] * len(jobs))
    sw = _small_sweep(tmp_path)
    res = sim_inproc("sweep", str(sw), "--out", "s", "--workers", "100000", "-q", "--no-report",
                     cwd=tmp_path)
    assert res.rc == 1, res.err          # (the stand-in points all failed)
    assert seen == [2]
    assert res.err.strip().splitlines() == ["--workers 100,000: running 2 workers (2 points)"]


def test_sweep_workers_default_is_quiet(sim_inproc, tmp_path, monkeypatch):
    from sim.commands import sweep

    seen = []
    monkeypatch.setattr(sweep, "_pool_points", lambda jobs, workers, progress, line:
                        seen.append(workers) or [FAILED] * len(jobs))
    monkeypatch.setattr(sweep.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    res = sim_inproc("sweep", str(_small_sweep(tmp_path, 3)), "--out", "s", "-q",
                     "--no-report", cwd=tmp_path)
    assert res.rc == 1 and res.err == "", res.err
    assert seen == [2]


@pytest.mark.parametrize("value", ["0", "-3"])
def test_sweep_workers_below_one_is_refused(sim_inproc, tmp_path, value):
    sw = _small_sweep(tmp_path)
    before = snapshot(tmp_path)
    res = sim_inproc("sweep", str(sw), "--out", "s", "--workers", value, "-q", cwd=tmp_path)
    assert_input_error(res, "--workers", "must be >= 1", value)
    assert snapshot(tmp_path) == before


@linux_only
@needs_two_cpus
def test_a_real_pool_of_100000_asked_runs_two_workers(tmp_path):
    proc = sim_popen("sweep", str(_long_sweep(tmp_path)), "--out", "s", "--workers", "100000",
                     cwd=tmp_path)
    workers: list[int] = []
    try:
        _wait(lambda: proc.poll() is not None or len(_children(proc.pid)) >= 2,
              what="for the pool")
        time.sleep(0.5)
        workers = _children(proc.pid)
        assert len(workers) == 2, workers
        proc.send_signal(signal.SIGTERM)
        res = finish(proc, timeout=30)
    finally:
        proc.kill()
        _kill_all(workers)
    lines = res.err.strip().splitlines()
    assert lines[0].startswith("--workers 100,000: running 2 workers (2 points"), res.err
    assert lines[-1] == "interrupted; nothing written"


# ---- Ray: an interrupt cancels the tasks -------------------------------------------

class _FakeRay:
    """What ``sim/commands/sweep.py`` calls of Ray, recording the cancels."""

    def __init__(self, interrupt_at: int):
        self.cancelled: list = []
        self.gets = 0
        self.shut = False
        self.interrupt_at = interrupt_at

    def is_initialized(self):
        return False

    def init(self, **kw):
        self.kw = kw

    def remote(self, **kw):
        ray = self

        class Remote:
            def __init__(self, fn):
                self.n = 0

            def remote(self, *args):
                self.n += 1
                return f"ref{self.n}"
        del ray
        return Remote

    def get(self, ref):
        self.gets += 1
        if self.gets == self.interrupt_at:
            from sim.entrypoints.cli import Interrupted

            raise Interrupted(signal.SIGINT)
        return {"status": "failed", "error": "x", "trace": ""}

    def cancel(self, ref, force=False):
        self.cancelled.append((ref, force))

    def shutdown(self):
        self.shut = True


def test_an_interrupted_ray_sweep_cancels_its_tasks(tmp_path, monkeypatch):
    from sim.commands import sweep as sweep_mod
    from sim.entrypoints.cli import Interrupted

    fake = _FakeRay(interrupt_at=2)
    monkeypatch.setitem(sys.modules, "ray", fake)
    jobs = [("base", {}, None, None, f"p{i}", False) for i in range(3)]
    with pytest.raises(Interrupted):
        sweep_mod._ray_points(jobs, 2, None, lambda done, total: None)
    assert fake.cancelled == [("ref1", True), ("ref2", True), ("ref3", True)]
    assert fake.shut


def test_a_ray_sweep_that_finishes_cancels_nothing(monkeypatch):
    from sim.commands import sweep as sweep_mod

    fake = _FakeRay(interrupt_at=0)
    monkeypatch.setitem(sys.modules, "ray", fake)
    jobs = [("base", {}, None, None, f"p{i}", False) for i in range(2)]
    got = sweep_mod._ray_points(jobs, 2, None, lambda done, total: None)
    assert len(got) == 2 and fake.cancelled == [] and fake.shut
