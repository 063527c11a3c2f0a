"""Draw a run's report in worker processes started before the run, beside it.

``sim run`` spends about half of its time on the report: importing matplotlib, reading
requests.csv back and rendering four figures, one after the other, after the
simulation.  The figures depend on nothing but the run folder's files and not on each
other, so ``ReportWorkers`` forks two processes when the command starts; they import
matplotlib and the report modules (and render one throwaway figure, which loads the
fonts) while the simulation runs on the other core, and once the run folder's files
are written each draws its part (``PARTS``) into the temporary run folder, the two at
once.  The main process imports no matplotlib at all.

The output is the same bytes: each part is the same code (``reports/run_report.py``)
on the same files; only where it runs differs.  Nothing can hang or go missing:

* a worker that fails (an exception), dies, or has not answered after ``TIMEOUT_S`` is
  stopped, and its part is drawn again in the main process, which then fails, if it
  does, exactly as an in-process report fails (same exception, same exit code);
* the workers ignore SIGINT (the main process's interrupt handling stops them), are
  daemons (they end with the main process), and ``close`` stops them in every case,
  before the temporary run folder is removed or moved into place.

Where ``fork`` is unavailable (not Linux) ``start`` returns None and the report is
drawn in the main process, as the notebook API and sweep points always draw it (a
sweep runs its points in parallel already).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

TIMEOUT_S = 600.0
EXIT_S = 2.0        # how long workers that have answered are given to exit on their own
# what each worker draws: (1) report.md and the figures that read requests.csv, (2) the
# figures that read summary.json and memory.csv alone, which can start first
PARTS = ("main", "side")


def draw_part(folder: Path, part: str, columns: list | None = None) -> None:
    """One part of the report of a run folder ``sim run`` has just written; ``columns``
    (part "main"): the requests' report columns (``reports/rows.py`` ``as_written``),
    else read from requests.csv."""
    from reports import run_report
    from reports.rows import rows_of

    if part == "main":
        run_report.write_report(folder, stems=run_report.ROW_FIGURES, fresh=True,
                                rows=None if columns is None else rows_of(columns))
    else:
        run_report.draw(folder, [s for s in run_report.FIGURES
                                 if s not in run_report.ROW_FIGURES])


def _warm() -> None:
    """Import what drawing needs and render one small figure with text (fonts, PIL),
    to nowhere; no state that a later figure's bytes depend on is changed."""
    import io

    from reports import memory_figure, miss_figure, run_report, style  # noqa: F401

    with style.rc():
        fig = style.figure(1.0, 1.0)
        ax = fig.add_subplot()
        ax.plot([0, 1], [0, 1])
        ax.set_title("warm", fontsize=9)
        fig.savefig(io.BytesIO(), format="png", dpi=style.DPI, metadata=style.PNG_META)
        style.plt.close(fig)


def _serve(conn, other, parents) -> None:
    """The first worker: close the main process's ends of the pipes (so that either
    worker reads EOF, and exits, once the main process is gone), warm up, fork the
    second worker (warm as well: one import of matplotlib for two workers, none of it
    competing with the simulation for the second core), and serve the first part."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # the main process handles Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for c in parents:
        c.close()
    try:
        _warm()
    except BaseException:       # (a real problem shows again when the part is drawn)
        pass
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:                # the second worker: it dies with the first (SIGKILL)
        code = 0
        try:
            conn.close()
            _die_with_parent(parent)
            _serve_one(other)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    other.close()
    try:
        _serve_one(conn)
    finally:
        os.waitpid(pid, 0)      # (its end would end the second worker: wait for it)


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when ``parent`` (the first worker) ends, so
    that stopping the first worker stops both (Linux ``PR_SET_PDEATHSIG``)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:      # PR_SET_PDEATHSIG
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:          # (it ended before the line above)
        os._exit(1)


def _serve_one(conn) -> None:
    """Draw the one part asked for and answer None (done) or the error's traceback (the
    main process then draws that part itself)."""
    try:
        folder, part, columns = conn.recv()
    except (EOFError, OSError):
        return                  # the main process needs no report after all
    try:
        draw_part(Path(folder), part, columns)
        answer = None
    except BaseException:
        import traceback

        answer = traceback.format_exc()
    try:
        conn.send(answer)
    except OSError:             # the main process stopped waiting (it is failing)
        pass


class ReportWorkers:
    """The report workers (``start``), given the run folder part by part (``submit``),
    waited for (``finish``) and stopped (``close``; also as a context manager)."""

    def __init__(self, ctx):
        main_end, main_theirs = ctx.Pipe()
        side_end, side_theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(main_theirs, side_theirs,
                                                      (main_end, side_end)),
                                 daemon=True, name="sim-report")
        self._proc.start()
        main_theirs.close()         # (so that a dead worker reads as EOF here)
        side_theirs.close()
        self._conns = {"main": main_end, "side": side_end}
        self._answered = 0
        self._pending: list[tuple[str, Path]] = []

    @classmethod
    def start(cls) -> "ReportWorkers | None":
        """Fork the workers now; None where this platform has no ``fork`` (or with
        ``HCS_REPORT_WORKERS=0``: the report drawn in the main process)."""
        if sys.platform != "linux" or os.environ.get("HCS_REPORT_WORKERS") == "0":
            return None
        import multiprocessing

        return cls(multiprocessing.get_context("fork"))

    def submit(self, folder: Path, part: str, columns: list | None = None) -> None:
        """Ask ``part``'s worker to draw it into ``folder`` (whose files it reads are
        written; ``columns``: see ``draw_part``); a worker that is gone already gets its
        part drawn in ``finish``."""
        try:
            self._conns[part].send((str(folder), part, columns))
        except (OSError, KeyError):
            pass
        self._pending.append((part, Path(folder)))

    def finish(self) -> None:
        """Wait for every submitted part; a part whose worker failed, died or timed out
        is drawn here (raising what drawing raises)."""
        deadline = time.monotonic() + TIMEOUT_S
        pending, self._pending = self._pending, []
        redo = []
        for part, folder in pending:
            if redo:                # (the workers are stopped: redone here as well)
                redo.append((part, folder))
                continue
            answer = self._answer(part, deadline)
            if answer is None:
                self._answered += 1
                continue
            self.close()
            if not answer.startswith("Traceback"):   # (an exception shows again below)
                sys.stderr.write(f"warning: report worker {answer}; drawing the report in "
                                 f"this process\n")
            redo.append((part, folder))
        for part, folder in redo:       # (in PARTS order: report.md's part first)
            draw_part(folder, part)

    def _answer(self, part: str, deadline: float) -> str | None:
        """None (drawn), an exception's traceback, or why no answer came."""
        from multiprocessing.connection import wait

        conn = self._conns[part]
        if not wait([conn], timeout=max(deadline - time.monotonic(), 0.0)):
            return f"gave no answer in {TIMEOUT_S:g} s"
        try:
            return conn.recv()
        except (EOFError, OSError):
            return "exited without answering"

    def close(self) -> None:
        """Stop the workers: after ``finish`` has had both answers they are exiting
        (given a moment, so that each ends on its own and is reaped); otherwise, idle
        or drawing, they are killed (the first worker's end kills the second:
        ``_die_with_parent``).  Safe to call twice."""
        done = self._answered == len(PARTS)
        for c in self._conns.values():
            c.close()
        if done:
            self._proc.join(EXIT_S)
        if self._proc.exitcode is None:
            self._proc.kill()
        self._proc.join()

    def __enter__(self) -> "ReportWorkers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
