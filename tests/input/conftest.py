"""Helpers for the bad-input corpus: run ``sim`` the way a user does and check that
bad input ends in one line naming the file and field, exit 2, and nothing written or
deleted."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    rc: int
    out: str
    err: str


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones included) with its bytes."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def sim_inproc(capsys):
    """``sim_inproc(*args) -> Result``: the console entry point in this process (fast)."""
    from sim.entrypoints.cli import main

    def run(*args: str, cwd: Path | None = None) -> Result:
        old = os.getcwd()
        if cwd is not None:
            os.chdir(cwd)
        try:
            main(list(args))
            rc = 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            os.chdir(old)
        cap = capsys.readouterr()
        return Result(rc, cap.out, cap.err)

    return run


def sim_subprocess(*args: str, cwd: Path, env: dict | None = None,
                   timeout: float = 120) -> Result:
    """``python -m sim ARGS`` in a child process (signals, concurrency, real exit codes)."""
    e = dict(os.environ, **(env or {}))
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-m", "sim", *args], cwd=cwd, env=e,
                       capture_output=True, text=True, timeout=timeout)
    return Result(p.returncode, p.stdout, p.stderr)


def sim_popen(*args: str, cwd: Path, env: dict | None = None) -> subprocess.Popen:
    """``python -m sim ARGS`` started in the background (send it signals, run several)."""
    e = dict(os.environ, **(env or {}))
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-m", "sim", *args], cwd=cwd, env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 120) -> Result:
    """Wait for a ``sim_popen`` child; its exit code and output."""
    out, err = proc.communicate(timeout=timeout)
    return Result(proc.returncode, out, err)


def assert_input_error(res: Result, *must_name: str) -> str:
    """Exit 2, exactly one non-empty line on stderr starting ``error:``, naming each of
    ``must_name`` (file, field path, line ...); no traceback.  Returns the line."""
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    assert res.rc == 2, f"exit {res.rc}, stderr:\n{res.err}"
    assert len(lines) == 1, f"expected one line, got:\n{res.err}"
    line = lines[0]
    assert "Traceback" not in res.err
    for part in must_name:
        assert part in line, f"{part!r} not named in: {line}"
    return line
