"""Command line: ``sim case`` (and, as they land, run · steps · sweep · check ...)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="hybrid-cache-sim: vLLM prefix caching for hybrid Mamba/attention models.")


def fail(message: str) -> None:
    """One clear line on stderr, exit code 2 (bad input)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@app.command()
def case(files: list[Path] = typer.Argument(..., help="Case files (YAML or JSON)."),
         compact: bool = typer.Option(False, "--compact", help="One-line JSON.")) -> None:
    """Run case files through the exact cache model and print JSON.

    One file prints an array (one object per request); several print an object
    keyed by the paths as given.
    """
    from sim.cache.case import CaseError, run_case_file

    out = {}
    for f in files:
        try:
            out[str(f)] = run_case_file(f)
        except CaseError as e:
            fail(str(e))
    result = out[str(files[0])] if len(files) == 1 else out
    json.dump(result, sys.stdout, indent=None if compact else 1)
    sys.stdout.write("\n")


@app.command()
def steps(files: list[Path] = typer.Argument(..., help="Step case files (YAML or JSON)."),
          compact: bool = typer.Option(False, "--compact", help="One-line JSON.")) -> None:
    """Run step cases through the sim-run engine with one time unit per step.

    Prints, per request, the step of first admission, the hit and junction, the first
    prefill's chunk ends and their steps, the first-token and finish steps and the
    number of preemptions, comparable with vLLM's real scheduler (sched_oracle.py).
    """
    from sim.cache.case import CaseError
    from sim.steps import run_steps_file

    out = {}
    for f in files:
        try:
            out[str(f)] = run_steps_file(f)
        except CaseError as e:
            fail(str(e))
    result = out[str(files[0])] if len(files) == 1 else out
    json.dump(result, sys.stdout, indent=None if compact else 1)
    sys.stdout.write("\n")


def _progress(enabled: bool):
    """A live counter of finished requests, shown after ~2 s on a terminal."""
    import time

    if not enabled or not sys.stderr.isatty():
        return None, lambda: None
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    prog = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                    transient=True, console=None)
    state = {"task": None, "t0": time.monotonic()}

    def update(done: int) -> None:
        if done % 256:
            return
        if state["task"] is None:
            if time.monotonic() - state["t0"] < 2.0:
                return
            prog.start()
            state["task"] = prog.add_task("", total=None)
        prog.update(state["task"], description=f"{done:,} requests finished")

    def stop() -> None:
        if state["task"] is not None:
            prog.stop()

    return update, stop


def _parse_sets(sets: list[str]) -> dict:
    import yaml

    out = {}
    for item in sets:
        if "=" not in item:
            fail(f"--set {item!r}: expected FIELD.PATH=VALUE")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out


@app.command()
def run(scenario: Path = typer.Argument(..., help="Scenario YAML."),
        out: Path = typer.Option(None, "--out", help="Run folder (default runs/<scenario name>/)."),
        sets: list[str] = typer.Option([], "--set", help="Override a field: cache.prefix_match_unit=16 "
                                       "(repeatable)."),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress, no summary line."),
        no_report: bool = typer.Option(False, "--no-report", help="Skip report.md and figures."),
        ) -> None:
    """Replay a scenario's traffic through the scheduler and cache policy.

    Writes requests.csv, summary.json and report.md (+ PNG figures) atomically.
    """
    from sim.cache.config import ConfigError
    from sim.run import simulate, write_run
    from sim.scenario import ScenarioError, load_scenario
    from workloads import WorkloadError

    try:
        sc = load_scenario(scenario, _parse_sets(sets) or None)
    except (ScenarioError, ConfigError) as e:
        fail(str(e))
    update, stop = _progress(not quiet)
    try:
        dep, rows, summary = simulate(sc, progress=update)
    except WorkloadError as e:
        stop()
        fail(f"{scenario}: workload: {e}")
    except ValueError as e:
        stop()
        fail(f"{scenario}: {e}")
    stop()
    folder = out or Path(sc.output or Path("runs") / sc.name)
    write_run(folder, sc, dep, rows, summary, report=not no_report)
    if not quiet:
        s = summary
        typer.echo(f"{s['requests']:,} requests  token hit {s['token_hit_rate']:.2%}  "
                   f"lost {s['lost_token_rate']:.2%}  TTFT p50 {s['ttft_p50_s']:.3f}s "
                   f"p99 {s['ttft_p99_s']:.3f}s  ({s['sim_requests_per_s']:,.0f} req/s simulated)"
                   f"  -> {folder}/")


@app.command()
def model(name: str = typer.Argument(None, help="Catalogue name (see --list)."),
          list_: bool = typer.Option(False, "--list", help="List the catalogue."),
          tp: int = typer.Option(1, "--tensor-parallel-size", "--tp"),
          num_speculative_tokens: int = typer.Option(0, "--num-speculative-tokens"),
          mamba_cache_dtype: str = typer.Option("auto", "--mamba-cache-dtype"),
          mamba_ssm_cache_dtype: str = typer.Option("auto", "--mamba-ssm-cache-dtype"),
          kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype"),
          kernel_block_size: int = typer.Option(16, "--kernel-block-size"),
          block_size: int = typer.Option(None, "--block-size")) -> None:
    """Print how vLLM lays out the KV cache for a model: state bytes, block size, pool groups."""
    from sim import models

    if list_ or not name:
        for n in models.model_names():
            typer.echo(n)
        return
    try:
        m = models.get_model(name)
        lay = models.derive_layout(m, tp=tp, num_speculative_tokens=num_speculative_tokens,
                                   mamba_cache_dtype=mamba_cache_dtype,
                                   mamba_ssm_cache_dtype=mamba_ssm_cache_dtype,
                                   kv_cache_dtype=kv_cache_dtype,
                                   kernel_block_size=kernel_block_size, block_size=block_size)
    except KeyError as e:
        fail(str(e.args[0]) if e.args else str(e))
    except ValueError as e:
        fail(str(e))
    typer.echo(models.describe(lay, m))


@app.callback()
def _main() -> None:
    """hybrid-cache-sim."""


if __name__ == "__main__":
    app()
