"""Locating the vLLM oracle, and long-lived workers in its venv.

The oracle folder (optional, not part of the project: ``$VLLM_ORACLE_DIR``, see
``default_oracle_dir``) holds ``oracle.py`` (vLLM 0.33.0's real KV-cache manager) and
``sched_oracle.py`` (its real scheduler); both need their own ~3 GB venv (``setup.sh``) and take
~8 s to import vLLM.  A worker imports one of them once and then answers batches of cases over
a pipe: one JSON list of cases per line in, one JSON list of ``run_case`` answers per line out.
Whatever the oracle prints while importing goes to a log, never into the protocol.

Used by the differential harness (``sim.oracle.harness``: ``tools/diff_vllm.py`` with module
``oracle``, ``tools/diff_steps.py`` with ``sched_oracle``), ``sim validate --against-vllm``, the
golden makers and their pytest wrappers (``oracle_unavailable`` says why a test skips).
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]   # the project root (sim/oracle/ is two down)


def default_oracle_dir() -> Path:
    """``$VLLM_ORACLE_DIR``, else the folder ``shared/vllm-oracle`` beside the checkout.

    The oracle (vLLM's own code, in its own ~3 GB venv) is optional and not part of the
    project; this is the one place that looks outside the project root for it, at the spot
    where the development machines and CI keep it.  Where it is absent, the tests that need
    it skip with one line saying so."""
    env = os.environ.get("VLLM_ORACLE_DIR")
    if env:
        return Path(env)
    return ROOT.parent / "shared" / "vllm-oracle"   # ../shared/vllm-oracle: optional oracle


WORKER = r"""
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
out = sys.stdout
sys.stdout = sys.stderr  # whatever imports print must not corrupt the protocol
mod = importlib.import_module(sys.argv[2])
out.write("READY " + json.dumps(mod.VLLM_VERSION) + "\n"); out.flush()
for line in sys.stdin:
    cases = json.loads(line)
    out.write(json.dumps([mod.run_case(c) for c in cases], default=str) + "\n"); out.flush()
"""


def default_oracle_python() -> Path:
    """``$VLLM_ORACLE_PYTHON``, else the venv ``setup.sh`` builds."""
    env = os.environ.get("VLLM_ORACLE_PYTHON")
    if env:
        return Path(env)
    return Path.home() / ".vllm-oracle" / "venv" / "bin" / "python"


class OracleUnavailable(RuntimeError):
    """The oracle venv or the oracle folder is not here (the message says which)."""


def oracle_unavailable(module: str = "oracle", python: Path | None = None,
                       oracle_dir: Path | None = None) -> str | None:
    """Why a worker for ``module`` cannot start here (None when it can)."""
    py = python or default_oracle_python()
    d = (oracle_dir or default_oracle_dir()).resolve()
    if not py.exists():
        return (f"vLLM oracle venv not found ({py}); build it with {d}/setup.sh "
                f"or set VLLM_ORACLE_PYTHON")
    if not (d / f"{module}.py").is_file():
        return f"vLLM oracle not found ({d}/{module}.py): set VLLM_ORACLE_DIR=<oracle folder>"
    return None


class OracleWorker:
    """``module.run_case`` in one oracle-venv process.  The process starts at
    construction; the first ``run`` (or ``wait_ready``) waits for its import."""

    def __init__(self, python: Path, oracle_dir: Path, module: str = "oracle", batch: int = 200):
        self.batch = batch
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [str(python), "-u", "-c", WORKER, str(oracle_dir), module], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.log, text=True, cwd=str(oracle_dir))
        self._version: str | None = None

    @property
    def version(self) -> str:
        self.wait_ready()
        return self._version  # type: ignore[return-value]

    def wait_ready(self) -> None:
        if self._version is not None:
            return
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            raise RuntimeError(f"oracle worker did not start: {line!r}\n{self._log_tail()}")
        self._version = json.loads(line[6:])

    def _log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read()[-3000:]

    def run(self, cases: list[dict]) -> list[dict]:
        self.wait_ready()
        out: list[dict] = []
        for i in range(0, len(cases), self.batch):
            self.proc.stdin.write(json.dumps(cases[i:i + self.batch]) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"oracle worker died\n{self._log_tail()}")
            out.extend(json.loads(line))
        return out

    def close(self) -> None:
        """End the worker (EOF on its input; killed if it has not exited 30 s later) and
        close both ends of its pipes and its log: a pipe left open was reported as an
        unclosed file (ResourceWarning) when the worker was collected."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                try:
                    pipe.close()
                except OSError:     # (EPIPE flushing input the worker never read)
                    pass
        self.log.close()


class OraclePool:
    """Up to ``n`` workers; a list of cases is dealt round-robin and run in parallel
    (answers come back in case order)."""

    def __init__(self, python: Path, oracle_dir: Path, module: str = "oracle", n: int = 2,
                 batch: int = 16):
        self.workers = [OracleWorker(python, oracle_dir, module, batch) for _ in range(max(1, n))]

    @property
    def version(self) -> str:
        return self.workers[0].version

    def run(self, cases: list[dict]) -> list[dict]:
        if len(cases) < 4 or len(self.workers) == 1:
            return self.workers[0].run(cases)
        n = len(self.workers)
        parts = [cases[i::n] for i in range(n)]
        res: list[Any] = [None] * n
        errs: list[BaseException] = []

        def go(j: int) -> None:
            try:
                res[j] = self.workers[j].run(parts[j])
            except BaseException as e:  # noqa: BLE001
                errs.append(e)

        threads = [threading.Thread(target=go, args=(j,)) for j in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errs:
            raise errs[0]
        out: list[dict] = [None] * len(cases)  # type: ignore[list-item]
        for j in range(n):
            out[j::n] = res[j]
        return out

    def close(self) -> None:
        for w in self.workers:
            w.close()


def start_oracle(module: str = "oracle", python: Path | None = None,
                 oracle_dir: Path | None = None, workers: int = 1,
                 batch: int = 16) -> OraclePool:
    """Up to ``workers`` processes answering ``module.run_case``; raises
    ``OracleUnavailable`` (saying why) where the venv or the folder is absent."""
    py = python or default_oracle_python()
    d = (oracle_dir or default_oracle_dir()).resolve()
    why = oracle_unavailable(module, py, d)
    if why:
        raise OracleUnavailable(why)
    return OraclePool(py, d, module, n=workers, batch=batch)
