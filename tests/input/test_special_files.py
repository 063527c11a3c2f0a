"""Special files (issue #38, P1): a FIFO, a device (``/dev/zero``, ``/dev/null``), a socket
or a folder given where sim reads a file -- a scenario, case, step case, sweep, trace,
profile, run.json, golden, event stream or a run folder's own files -- is refused at once
with one line naming it: no hang (a FIFO is opened non-blocking and never read), no
endless read, nothing written.

Each command runs in this process under an alarm: a regression that blocks fails the
test instead of stalling the suite.
"""
from __future__ import annotations

import os
import signal
import socket
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import ROOT, assert_input_error, snapshot

TINY = ROOT / "scenarios" / "athena-tiny.yaml"
CASE = "config:\n  block_size: 16\n  num_blocks: 64\nrequests:\n  - {id: a, prompt: 'S:40'}\n"

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")


class Hang(Exception):
    pass


@contextmanager
def no_hang(seconds: float = 20.0):
    def ring(signum, frame):
        raise Hang(f"blocked for {seconds:g} s")
    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _refused(sim_inproc, tmp_path: Path, *args: str, must: tuple = ()) -> str:
    before = snapshot(tmp_path)
    with no_hang():
        res = sim_inproc(*args, cwd=tmp_path)
    line = assert_input_error(res, *must)
    assert snapshot(tmp_path) == before, "files were written or deleted"
    return line


def _fifo(tmp_path: Path, name: str) -> Path:
    p = tmp_path / name
    os.mkfifo(p)
    return p


def _scenario_with(tmp_path: Path, **sections) -> Path:
    import yaml

    data = yaml.safe_load(TINY.read_text())
    for k, v in sections.items():
        data[k] = v
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


# ---- the scenario itself -------------------------------------------------------------

def test_dev_zero_as_the_scenario(sim_inproc, tmp_path):
    _refused(sim_inproc, tmp_path, "run", "/dev/zero", "--out", "o",
             must=("/dev/zero", "character device", "not a regular file"))


def test_dev_null_as_the_scenario(sim_inproc, tmp_path):
    _refused(sim_inproc, tmp_path, "run", "/dev/null", "--out", "o",
             must=("/dev/null", "character device"))


def test_fifo_as_the_scenario(sim_inproc, tmp_path):
    _fifo(tmp_path, "s.yaml")
    _refused(sim_inproc, tmp_path, "run", "s.yaml", "--out", "o",
             must=("s.yaml", "named pipe (FIFO)"))


def test_fifo_named_run_json(sim_inproc, tmp_path):
    _fifo(tmp_path, "run.json")
    _refused(sim_inproc, tmp_path, "run", "run.json", "--out", "o",
             must=("run.json", "named pipe (FIFO)"))


def test_fifo_named_like_a_run_record(sim_inproc, tmp_path):
    # any .json is probed for a run record first: the probe must not block either
    _fifo(tmp_path, "x.json")
    _refused(sim_inproc, tmp_path, "run", "x.json", "--out", "o", must=("x.json", "FIFO"))


def test_socket_as_the_scenario(sim_inproc, tmp_path):
    path = tmp_path / "s.sock"
    if len(str(path)) > 100:
        pytest.skip("path too long for a socket")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(str(path))
        _refused(sim_inproc, tmp_path, "run", "s.sock", "--out", "o", must=("s.sock", "a socket"))
    finally:
        srv.close()


def test_folder_as_the_scenario(sim_inproc, tmp_path):
    (tmp_path / "d.yaml").mkdir()
    _refused(sim_inproc, tmp_path, "run", "d.yaml", "--out", "o", must=("d.yaml", "folder"))


def test_symlink_to_a_fifo_as_the_scenario(sim_inproc, tmp_path):
    _fifo(tmp_path, "pipe")
    (tmp_path / "s.yaml").symlink_to("pipe")
    _refused(sim_inproc, tmp_path, "run", "s.yaml", "--out", "o", must=("s.yaml", "FIFO"))


def test_dangling_symlink_as_the_scenario(sim_inproc, tmp_path):
    (tmp_path / "s.yaml").symlink_to("nowhere.yaml")
    _refused(sim_inproc, tmp_path, "run", "s.yaml", "--out", "o", must=("s.yaml", "cannot read"))


# ---- other inputs ----------------------------------------------------------------------

@pytest.mark.parametrize("command", ["case", "steps"])
def test_fifo_as_a_case_file(sim_inproc, tmp_path, command):
    _fifo(tmp_path, "c.yaml")
    _refused(sim_inproc, tmp_path, command, "c.yaml", must=("c.yaml", "FIFO"))


def test_dev_zero_as_a_case_file(sim_inproc, tmp_path):
    _refused(sim_inproc, tmp_path, "case", "/dev/zero", must=("/dev/zero", "character device"))


def test_fifo_as_the_sweep_file(sim_inproc, tmp_path):
    _fifo(tmp_path, "sw.yaml")
    _refused(sim_inproc, tmp_path, "sweep", "sw.yaml", "--out", "o", "-q",
             must=("sw.yaml", "FIFO"))


def test_fifo_as_a_sweeps_base(sim_inproc, tmp_path):
    _fifo(tmp_path, "base.yaml")
    (tmp_path / "sw.yaml").write_text("name: t\nbase: base.yaml\ngrid: {seed: [1, 2]}\n")
    _refused(sim_inproc, tmp_path, "sweep", "sw.yaml", "--out", "o", "-q",
             must=("sw.yaml", "base"))


@pytest.mark.parametrize("kind", ["mooncake", "azure", "jsonl"])
def test_fifo_as_the_trace(sim_inproc, tmp_path, kind):
    _fifo(tmp_path, "t.trace")
    s = _scenario_with(tmp_path, workload={"kind": kind, "path": "t.trace"})
    _refused(sim_inproc, tmp_path, "run", str(s), "--out", "o", "-q",
             must=("workload.path", "t.trace", "FIFO", "not a regular file"))


def test_dev_zero_as_the_trace(sim_inproc, tmp_path):
    s = _scenario_with(tmp_path, workload={"kind": "mooncake", "path": "/dev/zero"})
    _refused(sim_inproc, tmp_path, "run", str(s), "--out", "o", "-q",
             must=("workload.path", "/dev/zero", "character device"))


def test_fifo_as_the_backend_profile(sim_inproc, tmp_path):
    _fifo(tmp_path, "p.yaml")
    s = _scenario_with(tmp_path, backend={"kind": "analytical", "profile": "p.yaml"})
    _refused(sim_inproc, tmp_path, "run", str(s), "--out", "o", "-q",
             must=("backend.profile", "p.yaml", "FIFO"))


def test_fifo_as_a_golden_file(sim_inproc, tmp_path):
    (tmp_path / "c.yaml").write_text(CASE)
    (tmp_path / "gold").mkdir()
    _fifo(tmp_path / "gold", "c.yaml.golden")
    _refused(sim_inproc, tmp_path, "check", "c.yaml", "--golden", "gold",
             must=("c.yaml.golden", "FIFO"))


@pytest.mark.parametrize("name", ["s.jsonl", "s.msgpack"])
def test_fifo_as_an_event_stream(sim_inproc, tmp_path, name):
    _fifo(tmp_path, name)
    _refused(sim_inproc, tmp_path, "events", "check", name, must=(name, "FIFO"))


def test_fifo_as_a_case_to_explain(sim_inproc, tmp_path):
    _fifo(tmp_path, "c.yaml")
    _refused(sim_inproc, tmp_path, "explain", "c.yaml", must=("c.yaml", "FIFO"))


@pytest.mark.parametrize("victim", ["requests.csv", "summary.json", "memory.csv"])
def test_sim_report_refuses_a_fifo_in_the_run_folder(sim_inproc, tmp_path, victim):
    assert sim_inproc("run", str(TINY), "--out", "r", "-q", "--no-report", cwd=tmp_path).rc == 0
    (tmp_path / "r" / victim).unlink()
    _fifo(tmp_path / "r", victim)
    _refused(sim_inproc, tmp_path, "report", "r", must=(victim, "FIFO"))


def test_sim_report_on_a_fifo(sim_inproc, tmp_path):
    _fifo(tmp_path, "r")
    _refused(sim_inproc, tmp_path, "report", "r", must=("r", "FIFO"))


def test_notebook_load_refuses_a_fifo_requests_csv(tmp_path):
    import sim
    from sim.errors import InputError

    sim.run(str(TINY), set={"workload.num_requests": 4}, out=tmp_path / "r", report=False)
    (tmp_path / "r" / "requests.csv").unlink()
    _fifo(tmp_path / "r", "requests.csv")
    with no_hang(), pytest.raises(InputError, match="requests.csv: is a named pipe"):
        sim.load(tmp_path / "r")
