"""Draw a run's report in worker processes started before the run, beside it.

``sim run`` spent about half of its time on the report: importing matplotlib, reading
requests.csv back and rendering four figures one after the other, after the
simulation.  The figures depend on nothing but the run's files and not on each other.
So ``ReportWorkers.start`` forks one worker when the command starts; it imports
matplotlib and the report modules and renders one throwaway figure (fonts, PIL) while
the simulation runs on the other core, then forks the second worker from its warm self
(one import for both, none of it competing with the simulation).  Once the run is
over, one worker draws the figures that read summary.json, run.json and memory.csv
alone (part "side": miss waterfall, memory); the other writes report.md and draws the
figures that read requests.csv (part "main": TTFT CDF, hit histogram).  Both get what
they read handed over in memory, exactly as the files read back (the two JSON files'
text, memory.csv's fields, the report's columns of requests.csv: ``reports/rows.py``),
and draw while the main process writes the files.  The main process
imports no matplotlib at all.

The output is the same bytes: each part is the same code (``reports/run_report.py``)
on the same values; only the process differs.  Nothing can hang or go missing:

* a worker that fails (an exception), dies, or has not answered after ``TIMEOUT_S`` is
  stopped, with the other, and the report is drawn again in the main process, which
  then fails, if it does, exactly as an in-process report fails (same exception, same
  exit code); a worker that died or hung says so in one warning line;
* the workers ignore SIGINT (the main process's interrupt handling stops them), the
  first dies with the main process whatever ends it, SIGKILL included (Linux's
  parent-death signal: ``sim/lifeline.py``) and the others die with the first, both
  see EOF and exit if the main process is gone, and ``close`` stops them in every case
  before the temporary run folder is removed or moved into place.

Where ``fork`` is unavailable (not Linux), in a process running other threads, or with
``HCS_REPORT_WORKERS=0``, ``start`` returns None and the report is drawn in the main
process, as the notebook API, ``sim compare`` and sweep points always draw it (a sweep
runs its points in parallel already; a pool per point would cost more than it saves).
"""
from __future__ import annotations

import gc
import os
import signal
import sys
import time
from pathlib import Path

TIMEOUT_S = 600.0
EXIT_S = 2.0        # how long workers that have answered are given to exit on their own
REPORT_MD = "report.md"
PRELUDE = "memory prelude"   # the first item of a prelude message (``ReportWorkers.prelude``)
# what each worker draws (figure stems, and report.md), by the CPUs this process may
# use: two parts (one a core beside the main process's writing) balanced on a 2-CPU
# machine; one figure each with four or more
PLANS = {2: (("miss_waterfall", "memory", "replicas"), (REPORT_MD, "ttft_cdf", "hit_hist")),
         4: (("miss_waterfall", "replicas"), ("memory",), ("hit_hist",),
             (REPORT_MD, "ttft_cdf"))}


def plan() -> tuple[tuple[str, ...], ...]:
    """The parts for the CPUs this process may run on."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return PLANS[4 if cpus >= 4 else 2]


def needs_rows(part: tuple[str, ...]) -> bool:
    """Whether ``part`` reads the requests (report.md, or a figure of requests.csv)."""
    from reports.rows import ROW_FIGURES

    return REPORT_MD in part or any(s in ROW_FIGURES for s in part)


def draw_part(folder: Path, part: tuple[str, ...], columns: list | None = None,
              files: tuple | None = None, built: dict | None = None,
              drawn: tuple | None = None) -> None:
    """One part of the report of a run folder ``sim run`` is writing: its figures, and
    report.md if it is one of them; ``columns``: the requests' report columns
    (``reports/rows.py`` ``as_written``), else read from requests.csv when needed;
    ``files``: what the report reads of summary.json, run.json and memory.csv, at hand
    (their texts and memory.csv's fields: ``sim/commands/run.py`` ``_write_files``), else the
    files are read; ``built``: the part's figures built ahead (``_frames``); ``drawn``:
    the memory figure drawn ahead (``_prelude``)."""
    from reports import run_report
    from reports.rows import rows_of

    rows = None if columns is None else rows_of(columns)
    texts, fields = (None, None) if files is None else (files[:2], files[2])
    stems = [s for s in part if s != REPORT_MD]
    if REPORT_MD in part:
        run_report.write_report(folder, stems=stems, rows=rows, texts=texts, memory=fields,
                                built=built)
    else:
        run_report.draw(folder, stems, rows=rows, texts=texts, memory=fields, built=built,
                        drawn=drawn)


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


def _serve(conns, parents, parts, main: int | None = None) -> None:
    """The first worker: close the main process's ends of the pipes (so that every
    worker reads EOF, and exits, once the main process is gone), warm up, fork the
    other workers (warm as well: one import of matplotlib for all, none of it competing
    with the simulation for the second core), serve the first part, and wait for the
    others (they die with it).  Each worker builds its part's figures before their data
    (``_frames``) while the simulation runs.

    No cyclic garbage collection in the workers: each lives for one import and a few
    figures, so the collector's passes over matplotlib's heap (about 1.6 % of a
    worker's instructions) would only free memory a moment before the process ends."""
    gc.disable()
    if main is not None:
        _die_with_parent(main)          # (a SIGKILLed main process ends it too)
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # the main process handles Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for c in parents:
        c.close()
    try:
        _warm()
    except BaseException:       # (a real problem shows again when the part is drawn)
        pass
    first = os.getpid()
    pids = []
    for i, conn in enumerate(conns[1:], start=1):
        pid = os.fork()
        if pid == 0:            # another worker: it dies with the first (SIGKILL)
            code = 0
            try:
                for j, c in enumerate(conns):
                    if j != i:
                        c.close()
                _die_with_parent(first)
                _serve_one(conn, _frames(parts[i]))
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        pids.append(pid)
        conn.close()
    try:
        _serve_one(conns[0], _frames(parts[0]))
    finally:
        for pid in pids:        # (this worker's end would end them: wait for them)
            os.waitpid(pid, 0)


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when ``parent`` ends (the main process, for
    the first worker; the first worker, for the others: stopping it stops all), Linux
    ``PR_SET_PDEATHSIG``, and end at once if it has ended already."""
    from sim.lifeline import die_with_parent

    die_with_parent(parent)


def _frames(part: tuple[str, ...]) -> dict:
    """The part's figures built before their data (``run_report.frames``: figure, axes,
    ticks: a sixth to a fifth of drawing one), while the simulation runs; none if that
    fails (the part is then drawn from scratch, and a real problem shows there)."""
    try:
        from reports import run_report

        return run_report.frames(part)
    except BaseException:
        return {}


def _prelude(msg: tuple, built: dict | None) -> tuple[list, tuple | None]:
    """A ``PRELUDE`` message (memory.csv's fields, the pool, a block, the scenario's
    name: ``sim.commands.run.memory_prelude``): its fields, and the memory figure drawn from it
    (with its frame if one was built) as ``draw_memory`` takes it, ``(fields, pool,
    block, title, png bytes)``; None if drawing failed (the part draws it again, and
    fails where it shows)."""
    _, fields, pool, block, scenario = msg
    try:
        from reports.memory_figure import memory_png, title_of

        title = title_of(scenario)
        frame = built.pop("memory", None) if built else None
        return fields, (fields, pool, block, title, memory_png(fields, pool, block, title,
                                                               frame))
    except Exception:
        return fields, None


def _serve_one(conn, built: dict | None = None) -> None:
    """Draw the one part asked for (``built``: its figures built ahead) and answer None
    (done) or the error's traceback (the main process then draws the report itself).
    A ``PRELUDE`` first (the part holding the memory figure): that figure is drawn at
    once, while the main process summarizes the run, and written with the part."""
    drawn = None
    try:
        msg = conn.recv()
        if msg[0] == PRELUDE:
            ahead, drawn = _prelude(msg, built)
            msg = conn.recv()
        folder, part, columns, files = msg
    except (EOFError, OSError):
        return                  # the main process needs no report after all
    if files is not None and files[2] == PRELUDE:
        files = (*files[:2], ahead)             # (memory.csv's fields, as sent ahead)
    try:
        draw_part(Path(folder), part, columns, files, built, drawn)
        answer = None
    except BaseException:
        import traceback

        answer = traceback.format_exc()
    try:
        conn.send(answer)
    except OSError:             # the main process stopped waiting (it is failing)
        pass


class ReportWorkers:
    """The report workers (``start``), given the run folder (``submit``), waited for
    (``finish``) and stopped (``close``; also as a context manager)."""

    def __init__(self, ctx, parts: tuple[tuple[str, ...], ...]):
        self.parts = parts
        pipes = [ctx.Pipe() for _ in parts]
        self._conns = [mine for mine, _ in pipes]
        self._proc = ctx.Process(target=_serve, args=([t for _, t in pipes], self._conns,
                                                      parts, os.getpid()),
                                 daemon=True, name="sim-report")
        self._proc.start()
        for _, theirs in pipes:
            theirs.close()          # (so that a dead worker reads as EOF here)
        self._answered = 0
        self._folder: Path | None = None
        self._preluded: dict[int, object] = {}   # part -> memory.csv's fields sent ahead

    @classmethod
    def start(cls) -> "ReportWorkers | None":
        """Fork the workers now; None (the report drawn in the main process) where this
        platform has no ``fork`` and ``PR_SET_PDEATHSIG`` (not Linux), in a process
        running other threads (a forked copy of one could find a lock held forever),
        or with ``HCS_REPORT_WORKERS=0``."""
        import threading

        if sys.platform != "linux" or os.environ.get("HCS_REPORT_WORKERS") == "0" \
                or threading.active_count() > 1:
            return None
        import multiprocessing

        return cls(multiprocessing.get_context("fork"), plan())

    def prelude(self, got: tuple | None) -> None:
        """Hand the worker whose part holds the memory figure what that figure needs, as
        soon as the replay is over (``got``: ``sim.commands.run.memory_prelude``'s answer; None:
        nothing to hand): it draws the figure on the core this process leaves idle
        while it puts the requests in order and summarizes them (~30 ms on the Mooncake
        run; the whole run 2-4 % shorter).  The figure is written only if the part's own
        inputs, when they come, are the same (``memory_figure.draw_memory``)."""
        if got is None or self._folder is not None:
            return
        for i, part in enumerate(self.parts):
            if "memory" in part:
                try:
                    self._conns[i].send((PRELUDE, *got))
                    self._preluded[i] = got[0]
                except OSError:     # (gone: ``finish`` finds out)
                    pass

    def submit(self, folder: Path, columns, files: tuple | None = None) -> None:
        """Have the workers draw the report into ``folder``, whose summary.json, run.json
        and memory.csv are written, or are being written when ``files`` holds what the
        report reads of them (see ``draw_part``); ``columns()``: the requests' report
        columns (``reports/rows.py`` ``as_written``), asked for once, after the parts
        that need none are on their way."""
        self._folder = Path(folder)
        order = sorted(range(len(self.parts)), key=lambda i: needs_rows(self.parts[i]))
        cols = None
        for i in order:
            if needs_rows(self.parts[i]) and cols is None:
                cols = columns()
            sent = files
            if files is not None and i in self._preluded and files[2] is self._preluded[i]:
                # memory.csv's fields are the very ones of the prelude: not sent twice (the
                # worker, drawing the memory figure, would leave a large message half read
                # in the pipe and this process blocked on it, ~0.1 s)
                sent = (*files[:2], PRELUDE)
            try:
                self._conns[i].send((str(folder), self.parts[i],
                                     cols if needs_rows(self.parts[i]) else None, sent))
            except OSError:     # (gone: ``finish`` finds out)
                pass

    def finish(self) -> None:
        """Wait for every part; if a worker failed, died or timed out, stop them all and
        draw the whole report here (raising what an in-process report raises)."""
        if self._folder is None:
            return
        deadline = time.monotonic() + TIMEOUT_S
        for conn in self._conns:
            answer = self._answer(conn, deadline)
            if answer is None:
                self._answered += 1
                continue
            self.close()
            if not answer.startswith("Traceback"):   # (an exception shows again below)
                sys.stderr.write(f"warning: report worker {answer}; drawing the report in "
                                 f"this process\n")
            from reports.run_report import write_report

            write_report(self._folder)
            return

    @staticmethod
    def _answer(conn, deadline: float) -> str | None:
        """None (drawn), an exception's traceback, or why no answer came."""
        from multiprocessing.connection import wait

        if not wait([conn], timeout=max(deadline - time.monotonic(), 0.0)):
            return f"gave no answer in {TIMEOUT_S:g} s"
        try:
            return conn.recv()
        except (EOFError, OSError):
            return "exited without answering"

    def close(self) -> None:
        """Stop the workers: after ``finish`` has had every answer they are exiting
        (given a moment, so that each ends on its own and is reaped); otherwise, idle
        or drawing, they are killed (the first worker's end kills the others:
        ``_die_with_parent``).  Safe to call twice."""
        done = self._answered == len(self.parts)
        for c in self._conns:
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
