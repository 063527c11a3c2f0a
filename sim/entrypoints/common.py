"""What every command group of the ``sim`` command line shares: the one ``app`` they
register on, one-line failures, the options' enums, the progress bar, ``--set`` and
``--requests`` parsing, and the command line as typed (``COMMAND_LINE``: what run.json
records).  Command groups import this module and never each other."""
from __future__ import annotations

import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="hybrid-cache-sim: vLLM prefix caching for hybrid Mamba/attention models.")


def fail(message: str) -> None:
    """One clear line on stderr, exit code 2 (bad input)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def option_as_typed(*names: str) -> str:
    """The spelling of an option the user typed on this command line (``--tp`` rather
    than ``--tensor-parallel-size``); its first name when it was not typed."""
    for arg in (COMMAND_LINE or sys.argv)[1:]:
        for n in names:
            if arg == n or arg.startswith(n + "="):
                return n
    return names[0]


def option_message(message: str, options: dict[str, tuple[str, ...]]) -> str:
    """A library's message about a parameter (``tp: must be ...``, ``num_layers must be
    ...``) naming the option as the user typed it (``--tp: must be ...``)."""
    head, sep, rest = message.partition(": ")
    if sep and head in options:
        return f"{option_as_typed(*options[head])}: {rest}"
    first, _, rest = message.partition(" ")
    if first in options:
        return f"{option_as_typed(*options[first])}: {rest}"
    return message


def scenario_error(scenario: Path, e: Exception, overrides: dict | None) -> str:
    """The one line of a scenario's input error (``sim.config.scenario.scenario_message``)."""
    from sim.config.scenario import scenario_message

    return scenario_message(scenario, e, overrides)


#: the command line of this invocation (``main`` sets it), recorded in run.json
# the command line as typed (``main`` fills it in place; empty: called as a library)
COMMAND_LINE: list[str] = []


# Options with fixed choices: typer lists them in --help and rejects anything else.
class Executor(str, Enum):
    local = "local"
    ray = "ray"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


class Grid(str, Enum):
    quick = "quick"
    full = "full"


class DType(str, Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"


class Plant(str, Enum):
    state_off_by_one = "state_off_by_one"


TORCH_INSTALL = ('pip install -e ".[torch]" (on a machine without a GPU first: pip install torch '
                 '--index-url https://download.pytorch.org/whl/cpu)')


def require_torch(command: str) -> None:
    """``sim verify`` and ``sim calibrate`` run the real-compute backend: without PyTorch,
    one line saying how to install it, exit 2."""
    try:
        import torch  # noqa: F401
    except ImportError:
        fail(f"sim {command} needs PyTorch, which is not installed: {TORCH_INSTALL}")


def no_update(done: int) -> None:
    """``progress``'s update when no bar is shown (``sim run`` then hands the engine
    no callback at all: an interpreted call a request otherwise)."""


#: the stop() of each progress bar on screen: an interrupt erases them before its message
BARS: list[Callable[[], None]] = []
#: a bar shows on a run expected to take longer than this (s) ...
SHOW_IF_EXPECTED_S = 1.0
#: ... expected from the rate of its first PROBE_S seconds (a bar without a total: shown
#: once the run has taken SHOW_IF_EXPECTED_S)
PROBE_S = 0.2


def stop_bars() -> bool:
    """Erase every progress bar on screen (the cursor then starts the line the bar held);
    whether there was one."""
    bars = list(BARS)
    for stop in bars:
        stop()
    return bool(bars)


def progress(enabled: bool, what: str = "requests",
             total: int | Callable[[], int | None] | None = None,
             delay_s: float | None = None):
    """A progress bar on stderr (done / total, elapsed, ETA; a counter where the total is
    unknown), shown only when stderr is a terminal and ``enabled`` (not ``--quiet``), on
    any run expected to take over ``SHOW_IF_EXPECTED_S`` (its rate over the first
    ``PROBE_S`` against its total), or after ``delay_s`` where that is given.  ``total``
    may be a function, asked only when there is a bar (a trace's total is a pass over
    its file).  Returns ``(update(done), stop())``; ``update`` is cheap enough to call
    per request (it redraws at most ~10 times a second)."""
    import time

    if not enabled or not sys.stderr.isatty():
        return no_update, (lambda: None)
    if callable(total):
        total = total()
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                               TextColumn, TimeElapsedColumn, TimeRemainingColumn)

    columns = [TextColumn(f"[bold]{what}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn()] \
        if total else [SpinnerColumn(), TextColumn("{task.completed:,} " + what + " done"),
                       TimeElapsedColumn()]
    prog = Progress(*columns, transient=True, console=Console(stderr=True))
    t0 = time.monotonic()
    first = delay_s if delay_s is not None else PROBE_S if total else SHOW_IF_EXPECTED_S
    state: dict = {"task": None, "next": t0 + first}

    def update(done: int) -> None:
        now = time.monotonic()
        if now < state["next"]:
            return
        state["next"] = now + 0.1
        if state["task"] is None:
            if delay_s is None and total and now - t0 < SHOW_IF_EXPECTED_S:
                # the whole run, at the rate so far: no bar for a run done within a second
                if done <= 0 or (now - t0) * total / done <= SHOW_IF_EXPECTED_S:
                    return
            prog.start()
            BARS.append(stop)
            state["task"] = prog.add_task(what, total=total or None)
            # the rate (and so the ETA) counts from the start, not from the first redraw
            prog.tasks[0].start_time = prog.get_time() - (now - t0)
        prog.update(state["task"], completed=done)

    def stop() -> None:
        if state["task"] is not None:
            state["task"] = None
            state["next"] = float("inf")      # (an update after stop draws nothing)
            prog.stop()
            if stop in BARS:
                BARS.remove(stop)

    return update, stop


def expected_requests(sc) -> int | None:
    """How many requests a scenario's workload will issue, where that is known before
    the run (for the progress bar's total); None otherwise."""
    from workloads import load_config

    try:
        cfg = load_config(sc.workload)
    except ValueError:
        return None
    n = getattr(cfg, "num_requests", None)
    if getattr(cfg, "duration_s", None) is not None or getattr(cfg, "num_sessions", None):
        return None
    path = getattr(cfg, "path", None)
    if path is None:
        return n
    from workloads.traces import resolve

    from sim.errors import InputError
    from sim.config.loader import open_input

    try:
        with open_input(resolve(path, sc.path.parent)) as f:
            lines = sum(1 for line in f if line.strip())
    except (OSError, InputError):
        return None
    lines -= cfg.KIND == "azure"            # the CSV header
    return lines if n is None else min(n, lines)


def parse_sets(sets: list[str]) -> dict:
    from sim.config.loader import parse_set

    out = {}
    for item in sets:
        k, v = parse_set(item)      # bad syntax: an InputError, one line
        out[k] = v
    return out


def requests_override(over: dict, requests: int | None) -> dict:
    """``--requests N``: ``workload.num_requests`` (the one name for how many requests;
    an old name of it in the file is cleared, see ``workloads.RENAMED``)."""
    if requests is not None:
        from workloads import RENAMED

        over["workload.num_requests"] = requests
        for old, new in RENAMED.items():
            if new == "num_requests":
                over[f"workload.{old}"] = None
    return over


REQUESTS_HELP = ("Issue only the first N requests of the workload (sets workload.num_requests; "
                 "multi_turn: N requests in all, the last session cut short).")
