"""Command line (``sim``): the console entry point and the commands that replay
(case · steps · run · sweep · compare · report); the checking and modelling commands
(verify · calibrate · validate · check · model · events) are in ``sim/entrypoints/cli_tools.py``,
registered on the same app."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer

from sim.entrypoints.common import (COMMAND_LINE, Executor, REQUESTS_HELP, app,
                                     expected_requests, fail, no_update, parse_sets, progress,
                                     requests_override, scenario_error, stop_bars)


@app.command()
def case(files: list[Path] = typer.Argument(..., help="Case files (YAML or JSON)."),
         compact: bool = typer.Option(False, "--compact", help="One-line JSON.")) -> None:
    """Run case files through the exact cache model and print JSON.

    One file prints an array (one object per request); several print an object
    keyed by the paths as given.
    """
    from sim.commands.case_files import run_case_file

    _print_results(files, run_case_file, compact)


def _print_results(files: list[Path], run_file, compact: bool) -> None:
    """JSON of one file's results, or an object keyed by the paths as given."""
    from sim.cache.case import CaseError

    out = {}
    for f in files:
        try:
            out[str(f)] = run_file(f)
        except CaseError as e:
            fail(str(e))
    result = out[str(files[0])] if len(files) == 1 else out
    json.dump(result, sys.stdout, indent=None if compact else 1)
    sys.stdout.write("\n")


@app.command()
def steps(files: list[Path] = typer.Argument(..., help="Step case files (YAML or JSON)."),
          compact: bool = typer.Option(False, "--compact", help="One-line JSON."),
          kv_events: bool = typer.Option(False, "--kv-events", help="Also print the KV cache "
                                         "events published step by step (canonical form): "
                                         '{"requests", "kv_events", "kv_events_error"} per file.'),
          per_step: bool = typer.Option(False, "--per-step", help="Also print each step's "
                                        "scheduled tokens and drafts per request: "
                                        '{"requests", "steps"} per file.'),
          ) -> None:
    """Run step cases through the sim-run engine with one time unit per step.

    Prints, per request, the step of first admission, the hit and junction, the first
    prefill's chunk ends and their steps, the first-token and finish steps and the
    number of preemptions, comparable with vLLM's real scheduler (sched_oracle.py).
    """
    from sim.commands.steps import run_steps_file

    _print_results(files, lambda f: run_steps_file(f, kv_events=kv_events, per_step=per_step),
                   compact)


@app.command()
def run(scenario: Path = typer.Argument(..., help="Scenario YAML, or a run folder's run.json "
                                        "(re-runs that run exactly)."),
        out: Path = typer.Option(None, "--out", help="Run folder (default runs/<scenario name>/)."),
        sets: list[str] = typer.Option([], "--set", help="Override a field: cache.hash_block_size=16 "
                                       "(repeatable)."),
        requests: int = typer.Option(None, "--requests", min=1, metavar="N", help=REQUESTS_HELP),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress, no summary line."),
        no_report: bool = typer.Option(False, "--no-report", help="Skip report.md and figures."),
        kv_events: bool = typer.Option(False, "--kv-events", help="Also write the KV cache "
                                       "events vLLM publishes (kv_events.jsonl; sets "
                                       "kv_events.enable_kv_cache_events)."),
        ) -> None:
    """Replay a scenario's traffic through the scheduler and cache policy.

    Writes requests.csv, summary.json, run.json (the resolved scenario, seed, version and
    command: `sim run FOLDER/run.json` re-runs it) and report.md (+ PNG figures) atomically.
    """
    from sim.errors import ConfigError, InputError
    from sim.rundir.provenance import load_scenario_or_run
    from sim.commands.run import as_input_errors, memory_prelude, simulate, write_run
    from sim.config.scenario import ScenarioError

    over = requests_override(parse_sets(sets), requests)
    try:
        sc = load_scenario_or_run(scenario, over or None)
        if kv_events and not sc.kv_events.enable_kv_cache_events:   # (recorded in run.json)
            raw = sc.raw.get("kv_events") if isinstance(sc.raw, dict) else None
            key = "kv_events.enable_kv_cache_events" if isinstance(raw, dict) else "kv_events"
            sc = load_scenario_or_run(scenario, {**over, key: True})
    except (ScenarioError, ConfigError) as e:
        fail(str(e))
    from sim.rundir.atomic import check_output_folder

    folder = out or Path(sc.output or Path("runs") / sc.name)
    check_output_folder(folder)         # before any work: a bad path is one line, exit 2
    # the report is drawn by two processes that import matplotlib while the run runs
    # (reports/workers.py); --no-report imports none of it
    from reports.workers import ReportWorkers

    # (a fleet's report reads requests.csv's routing columns: drawn here, after the files)
    workers = None if no_report or getattr(sc, "cluster", None) is not None \
        else ReportWorkers.start()
    from sim.rundir.provenance import GitProbe

    git = GitProbe()        # (run.json's commit, found while the run runs)
    try:
        update, stop = progress(not quiet, "requests", lambda: expected_requests(sc))
        try:
            with as_input_errors(scenario, over):   # (the notebook API's lines too)
                dep, rows, summary = simulate(
                    sc, progress=None if update is no_update else update,
                    # (the memory figure's inputs, to its worker as soon as the replay ends)
                    replayed=None if workers is None else
                    lambda d: workers.prelude(memory_prelude(sc, d)))
        except InputError as e:
            stop()
            fail(str(e))
        stop()
        write_run(folder, sc, dep, rows, summary, report=not no_report, command=COMMAND_LINE or None,
                  workers=workers, git=git)
    finally:
        git.close()
        if workers is not None:
            workers.close()
    if not quiet:
        s = summary
        refused = (f" ({s['rejected_requests']:,} rejected: requests.csv `rejected`)"
                   if s.get("rejected_requests") else "")
        slo = (f"  SLOs met {s['slo_attainment']:.1%}, goodput {s['request_goodput']:.3g} req/s"
               if s.get("slo_attainment") is not None else "")    # the scenario's slo:
        typer.echo(f"{s['requests']:,} requests{refused}  token hit {s['token_hit_rate']:.2%}  "
                   f"lost {s['lost_token_rate']:.2%}  TTFT p50 {s['ttft_p50_s']:.3f}s "
                   f"p99 {s['ttft_p99_s']:.3f}s{slo}  ({s['sim_requests_per_s']:,.0f} req/s simulated)"
                   f"  -> {folder}/")
        if "per_replica" in s:     # a fleet (cluster:)
            per = s["per_replica"]
            hits = [p["token_hit_rate"] for p in per]
            typer.echo(f"{s['replicas']} replicas behind {s['router']}: requests imbalance "
                       f"{s['imbalance_requests']:.2f}x, token hit per replica "
                       f"{min(hits):.2%} to {max(hits):.2%}  -> {folder}/replicas.csv")
        if getattr(dep, "kv_events", None) is not None:
            typer.echo(f"{dep.kv_events.summary()}  -> {folder}/kv_events.jsonl")


TARGET_HELP = ("Capacity sweeps: name the cheapest configuration (least provisioned cache "
               "memory per GPU) reaching this token hit rate, and this fraction of ideal's "
               "(default 0.9).")


@app.command()
def sweep(sweep_file: Path = typer.Argument(..., help="Sweep YAML (base scenario + axes)."),
          out: Path = typer.Option(None, "--out", help="Sweep folder (default runs/sweeps/<name>/)."),
          executor: Executor = typer.Option(Executor.local, "--executor",
                                            help="local (a process pool) or ray."),
          requests: int = typer.Option(None, "--requests", min=1, metavar="N",
                                       help=REQUESTS_HELP + " Every point."),
          address: str = typer.Option(None, "--address", help="Ray cluster address (default: "
                                      "start a local Ray)."),
          workers: int = typer.Option(None, "--workers", metavar="N",
                                      help="Parallel points (local pool size / local Ray CPUs); "
                                      "never more than the points nor the CPUs this process "
                                      "may use (default: that many)."),
          quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar, no summary "
                                     "lines (points ok, searches, failures, capacity answers)."),
          no_report: bool = typer.Option(False, "--no-report", help="Skip the sweep report "
                                         "(report.md/.html, figures, report_*.csv); points.csv "
                                         "and each point's run folder are written."),
          search: str = typer.Option(None, "--search", metavar="rate", help="Find each point's "
                                     "max sustainable arrival rate under the scenario's SLOs "
                                     "(the sweep file's search: settings, else the defaults)."),
          target: float = typer.Option(None, "--target", min=0.0, max=1.0, metavar="RATE",
                                       help=TARGET_HELP)
          ) -> None:
    """Run every point of a sweep; write points.csv, each point's run folder and the report."""
    from sim.commands.sweep import SweepError, check_workers, load_sweep, run_sweep

    executor = Executor(executor).value
    check_workers(workers, "--workers")
    try:
        sw = load_sweep(sweep_file, requests_override({}, requests) or None, search=search)
    except SweepError as e:
        fail(str(e))
    from sim.rundir.atomic import check_output_folder

    folder = out or Path(sw.output or Path("runs") / "sweeps" / sw.name)
    check_output_folder(folder)         # before any point runs

    update, stop = progress(not quiet, "points", len(sw.points), delay_s=0.0)
    update(0)
    try:
        results = run_sweep(sw, folder, executor=executor, workers=workers, address=address,
                            progress=lambda done, total: update(done), report=not no_report,
                            command=COMMAND_LINE or None, verbose=not quiet, target=target,
                            workers_label="--workers")
    except ImportError as e:
        stop()
        fail(f"--executor ray: {e} (pip install ray)")
    finally:
        stop()
    failed = [(p.id, r["error"]) for p, r in zip(sw.points, results) if r["status"] != "ok"]
    if not quiet:
        typer.echo(f"{len(results) - len(failed)}/{len(results)} points ok -> {folder}/")
        for p, r in zip(sw.points, results):
            if r.get("search"):
                typer.echo(f"  {p.id} ({p.label}): {r['search']['line']}")
        for pid, err in failed:
            typer.echo(f"  {pid} failed: {err}")
        if not no_report:
            _echo_capacity(folder, target)
    if failed:
        raise typer.Exit(1)


def _echo_capacity(folder: Path, target: float | None) -> None:
    """A capacity sweep's answers (reports/sweep_capacity.py), one line each."""
    from reports.sweep_capacity import DEFAULT_TARGET, answers, is_capacity_sweep
    from reports.sweep_data import load_sweep as load_results

    sw = load_results(folder)
    if is_capacity_sweep(sw):
        for a in answers(sw, DEFAULT_TARGET if target is None else target):
            typer.echo(a.line(sw))


@app.command()
def compare(scenario: Path = typer.Argument(..., help="Scenario YAML."),
            flag: str = typer.Option(..., "--flag", help="Boolean field to run off and on, e.g. "
                                     "enable_mamba_shared_prefix_checkpoint or cache.FIELD."),
            out: Path = typer.Option(None, "--out", help="Folder (default runs/<name>-<flag>/)."),
            sets: list[str] = typer.Option([], "--set", help="Override a field (repeatable)."),
            quiet: bool = typer.Option(False, "--quiet", "-q", help="No summary line.")) -> None:
    """Run a scenario with a boolean field off and on (same seed) and pair the requests."""
    from sim.errors import ConfigError
    from sim.commands.compare import compare as run_compare
    from sim.config.scenario import ScenarioError, load_scenario

    from sim.rundir.atomic import OutputPathError, check_output_folder

    over = parse_sets(sets)
    try:
        sc = load_scenario(scenario, over or None)
        folder = out or Path("runs") / f"{sc.name}-{flag.split('.')[-1]}"
        check_output_folder(folder)     # before either run
        res = run_compare(scenario, flag, folder, over, command=COMMAND_LINE or None)
    except OutputPathError:
        raise
    except (ScenarioError, ConfigError) as e:
        fail(scenario_error(scenario, e, over))
    except ValueError as e:
        fail(f"{scenario}: {e}")
    if not quiet:
        a, b = res["off"], res["on"]
        typer.echo(f"{res['flag']}: token hit {a['token_hit_rate']:.2%} -> {b['token_hit_rate']:.2%} "
                   f"({(b['token_hit_rate'] - a['token_hit_rate']) * 100:+.2f} pp), TTFT p50 "
                   f"{a['ttft_p50_s']:.3f}s -> {b['ttft_p50_s']:.3f}s; {res['improved']:,} requests "
                   f"gain, {res['worse']:,} lose  -> {folder}/")


@app.command()
def report(folder: Path = typer.Argument(..., help="A run folder (requests.csv, summary.json) "
                                         "or a sweep folder (points.csv)."),
           target: float = typer.Option(None, "--target", min=0.0, max=1.0, metavar="RATE",
                                        help=TARGET_HELP)) -> None:
    """Regenerate a run's, a sweep's or a comparison's report from stored results, without
    rerunning.

    The report's files land together or not at all (a full disk, a read-only folder, an
    interrupt: one line, the folder as it was), and join the folder's marker: a run
    folder stays one that sim run --out may replace."""
    from reports.compare_report import is_compare_folder
    from sim.rundir.atomic_files import staged_files

    _check_report_inputs(folder)
    if (folder / "points.csv").is_file():
        from reports.sweep_report import write_sweep_report

        with staged_files(folder):
            files = write_sweep_report(folder, target=target)
        typer.echo(f"sweep report: {len(files)} files in {folder}/")
        _echo_capacity(folder, target)
    elif (folder / "summary.json").is_file() and (folder / "run.json").is_file():
        from reports.run_report import write_report

        with staged_files(folder):
            write_report(folder)
        typer.echo(f"run report: {folder}/report.md")
    elif is_compare_folder(folder):
        from reports.compare_report import stored_flag, write_compare_report
        from reports.run_report import write_report

        flag = stored_flag(folder)
        with staged_files(folder):
            for side in ("off", "on"):
                write_report(folder / side)
            write_compare_report(folder, flag)
        typer.echo(f"compare report: {folder}/compare.md ({flag}; and off/, on/ report.md)")
    else:
        fail(f"{folder}: neither a sweep folder (points.csv), a run folder (summary.json + "
             f"run.json) nor a compare folder (off/, on/, paired.csv, summary_deltas.csv)")


def _check_report_inputs(folder: Path) -> None:
    """``sim report``'s folder, before anything is read: a folder (not a file, a FIFO ...)
    whose entries, and those of its subfolders (points/<id>/, off/, on/), are files or
    folders: a FIFO or a device among what the report reads would hang it."""
    import stat

    from sim.config.loader import file_kind

    try:
        st = os.stat(folder)
    except OSError as e:
        fail(f"{folder}: cannot read: {e.strerror}")
    if not stat.S_ISDIR(st.st_mode):
        fail(f"{folder}: is {file_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a file'}"
             ", not a run, sweep or compare folder")
    todo, depth = [(folder, 0)], 0
    while todo:
        d, depth = todo.pop()
        try:
            entries = list(os.scandir(d))
        except OSError as e:
            fail(f"{d}: cannot read: {e.strerror}")
        for e in entries:
            try:
                mode = e.stat().st_mode
            except OSError:
                continue                # (a dangling link: read as missing)
            if stat.S_ISDIR(mode):
                if depth < 2 and not e.name.startswith("."):
                    todo.append((Path(e.path), depth + 1))
            elif not stat.S_ISREG(mode):
                fail(f"{e.path}: is {file_kind(mode)}, not a regular file: sim report reads "
                     "files only")


# verify · calibrate · validate · check · model · events: sim/entrypoints/cli_tools.py (registered on
# this app when imported, below)


def _show_version(value: bool) -> None:
    if value:
        from sim.native import describe
        from sim.rundir.provenance import version_line

        typer.echo(version_line())
        typer.echo(f"build: {describe()}")
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", is_eager=True, callback=_show_version,
                                       help="Print the version (and git commit, and which build "
                                       "of the hot path runs) and exit.")) -> None:
    """hybrid-cache-sim."""


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


class Interrupted(BaseException):
    """SIGINT or SIGTERM turned into an exception, so every ``finally`` and atomic
    write unwinds; a BaseException that is not KeyboardInterrupt, so neither an
    ``except Exception`` nor typer's own Ctrl-C handling swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, frame) -> None:
    raise Interrupted(signum)


# Console commands whose process ends with ``os._exit`` once they succeed: a finished
# ``sim run`` holds every request's record, the cache's blocks and key maps; letting the
# interpreter free them one by one costs ~0.1 s of a two-second run, and nothing else is
# left to do (no atexit work: these commands start no thread, and the report workers are
# reaped before the command returns).  Embedded calls (``main(argv)``) never take it.
FAST_EXIT = frozenset({"run", "report"})


def _from_stdout(e: OSError) -> bool:
    """Whether a failed write was one to stdout (a redirection to a full disk): the
    flush at the end, or a frame on the way holding stdout (click's echo, json.dump)."""
    if getattr(e, "from_stdout", False):
        return True
    outs = (sys.stdout, sys.__stdout__)
    tb = e.__traceback__
    while tb is not None:
        if any(v is o for v in tb.tb_frame.f_locals.values() for o in outs):
            return True
        tb = tb.tb_next
    return False


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so that what it still buffers (and the interpreter's
    flush at exit) cannot fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> None:
    """Console entry point: the one place where bad input becomes one line and exit 2,
    and an interrupt becomes one line and exit 130 (SIGINT) / 143 (SIGTERM).

    Anything else that escapes is a bug and keeps its traceback.
    """
    import signal

    from typer._click import ClickException

    from sim.errors import InputError

    try:
        signal.signal(signal.SIGINT, _on_signal)
        signal.signal(signal.SIGTERM, _on_signal)
    except ValueError:          # not the main thread (embedded use): leave signals alone
        pass
    COMMAND_LINE[:] = ["sim", *(sys.argv[1:] if argv is None else argv)]
    try:
        # not standalone: click would print usage boxes and eat Ctrl-C itself
        rc = app(args=argv, standalone_mode=False, prog_name="sim")
        try:
            sys.stdout.flush()      # (a full disk under a redirected stdout shows here)
        except OSError as e:
            e.from_stdout = True    # type: ignore[attr-defined]
            raise
    except InputError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
    except BrokenPipeError:         # `sim case x | head -1`: the reader has had enough
        _drop_stdout()
        sys.exit(128 + signal.SIGPIPE)
    except OSError as e:
        from sim.rundir.atomic import write_failure

        if not write_failure(e):
            raise
        where = f"{e.filename}: " if e.filename else "cannot write: "
        if e.filename is None and _from_stdout(e):
            _drop_stdout()
            where = "cannot write the output (standard output): "
        typer.echo(f"error: {where}{e.strerror or e}", err=True)
        sys.exit(2)
    except ClickException as e:         # usage errors: one line, click's exit code (2)
        if not e.format_message():      # bare `sim`: the help was shown already
            sys.exit(e.exit_code)
        hint = ""
        ctx = getattr(e, "ctx", None)
        if ctx is not None:
            hint = f" (see {ctx.command_path} --help)"
        typer.echo(f"error: {e.format_message()}{hint}", err=True)
        sys.exit(e.exit_code)
    except (Interrupted, KeyboardInterrupt) as e:
        # the message on its own line: the bar erased, or past the terminal's echo of ^C
        sigint = not isinstance(e, Interrupted) or e.signum == signal.SIGINT
        if not stop_bars() and sigint and _isatty(sys.stderr):
            typer.echo("", err=True)
        typer.echo("interrupted; nothing written", err=True)
        sys.exit(128 + (e.signum if isinstance(e, Interrupted) else signal.SIGINT))
    code = rc if isinstance(rc, int) else 0
    if argv is None and code == 0 and len(sys.argv) > 1 and sys.argv[1] in FAST_EXIT:
        # the console command is done: every file is written and closed, the report
        # workers are reaped; end without freeing the run's objects one by one
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    sys.exit(code)


if __name__ == "__main__":
    main()


from sim.entrypoints import cli_tools  # noqa: E402,F401  (registers its commands on ``app``)
from sim.entrypoints import cli_marconi  # noqa: E402,F401  (registers ``sim marconi``)


def _paragraph_help(typer_app: typer.Typer) -> None:
    """Each command's help is its docstring with every paragraph on one line: typer's
    help keeps a docstring's line breaks inside a paragraph, so ``sim run --help``
    broke sentences wherever the source lines ended, then again at the terminal's
    width.  (No docstring of a command holds a list or other layout to keep.)"""
    import inspect

    for info in typer_app.registered_commands:
        if info.help is None and info.callback is not None:
            doc = inspect.getdoc(info.callback) or ""
            info.help = "\n\n".join(" ".join(p.split()) for p in doc.split("\n\n"))
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _paragraph_help(group.typer_instance)


_paragraph_help(app)
