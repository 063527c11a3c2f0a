"""Command line: ``sim case`` (and, as they land, run · steps · sweep · check ...)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
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
    from sim.cache.case import run_case_file

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
          compact: bool = typer.Option(False, "--compact", help="One-line JSON.")) -> None:
    """Run step cases through the sim-run engine with one time unit per step.

    Prints, per request, the step of first admission, the hit and junction, the first
    prefill's chunk ends and their steps, the first-token and finish steps and the
    number of preemptions, comparable with vLLM's real scheduler (sched_oracle.py).
    """
    from sim.steps import run_steps_file

    _print_results(files, run_steps_file, compact)


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
def sweep(sweep_file: Path = typer.Argument(..., help="Sweep YAML (base scenario + axes)."),
          out: Path = typer.Option(None, "--out", help="Sweep folder (default runs/sweeps/<name>/)."),
          executor: str = typer.Option("local", "--executor", help="local (process pool) | ray."),
          address: str = typer.Option(None, "--address", help="Ray cluster address (default: "
                                      "start a local Ray)."),
          workers: int = typer.Option(os.cpu_count() or 1, "--workers",
                                      help="Parallel points (local pool size / local Ray CPUs)."),
          quiet: bool = typer.Option(False, "--quiet", "-q"),
          no_report: bool = typer.Option(False, "--no-report")) -> None:
    """Run every point of a sweep; write points.csv, each point's run folder and the report."""
    from sim.sweep import SweepError, load_sweep, run_sweep

    if executor not in ("local", "ray"):
        fail(f"--executor: must be local or ray, got {executor!r}")
    if workers < 1:
        fail(f"--workers: must be >= 1, got {workers}")
    try:
        sw = load_sweep(sweep_file)
    except SweepError as e:
        fail(str(e))
    folder = out or Path("runs") / "sweeps" / sw.name

    def progress(done: int, total: int) -> None:
        if not quiet and sys.stderr.isatty():
            typer.echo(f"\r{done}/{total} points", err=True, nl=False)

    try:
        results = run_sweep(sw, folder, executor=executor, workers=workers, address=address,
                            progress=progress, report=not no_report)
    except ImportError as e:
        fail(f"--executor ray: {e} (pip install ray)")
    failed = [(p.id, r["error"]) for p, r in zip(sw.points, results) if r["status"] != "ok"]
    if not quiet:
        typer.echo(f"\n{len(results) - len(failed)}/{len(results)} points ok -> {folder}/")
        for pid, err in failed:
            typer.echo(f"  {pid} failed: {err}")
    if failed:
        raise typer.Exit(1)


@app.command()
def compare(scenario: Path = typer.Argument(..., help="Scenario YAML."),
            flag: str = typer.Option(..., "--flag", help="Boolean field to run off and on, e.g. "
                                     "enable_mamba_shared_prefix_checkpoint or cache.FIELD."),
            out: Path = typer.Option(None, "--out", help="Folder (default runs/<name>-<flag>/)."),
            sets: list[str] = typer.Option([], "--set", help="Override a field (repeatable)."),
            quiet: bool = typer.Option(False, "--quiet", "-q")) -> None:
    """Run a scenario with a boolean field off and on (same seed) and pair the requests."""
    from sim.cache.config import ConfigError
    from sim.compare import compare as run_compare
    from sim.scenario import ScenarioError, load_scenario

    over = _parse_sets(sets)
    try:
        sc = load_scenario(scenario, over or None)
        res = run_compare(scenario, flag, out or Path("runs") / f"{sc.name}-{flag.split('.')[-1]}",
                          over)
    except (ScenarioError, ConfigError) as e:
        fail(str(e))
    except ValueError as e:
        fail(f"{scenario}: {e}")
    if not quiet:
        a, b = res["off"], res["on"]
        typer.echo(f"{res['flag']}: token hit {a['token_hit_rate']:.2%} -> {b['token_hit_rate']:.2%} "
                   f"({(b['token_hit_rate'] - a['token_hit_rate']) * 100:+.2f} pp), TTFT p50 "
                   f"{a['ttft_p50_s']:.3f}s -> {b['ttft_p50_s']:.3f}s; {res['improved']:,} requests "
                   f"gain, {res['worse']:,} lose")


@app.command()
def report(folder: Path = typer.Argument(..., help="A run folder (requests.csv, summary.json) "
                                         "or a sweep folder (points.csv).")) -> None:
    """Regenerate a run's or a sweep's report from stored results, without rerunning."""
    if (folder / "points.csv").is_file():
        from reports.sweep_report import write_sweep_report

        files = write_sweep_report(folder)
        typer.echo(f"sweep report: {len(files)} files in {folder}/")
    elif (folder / "summary.json").is_file() and (folder / "run.json").is_file():
        from reports.run_report import write_report

        write_report(folder)
        typer.echo(f"run report: {folder}/report.md")
    else:
        fail(f"{folder}: neither a sweep folder (points.csv) nor a run folder "
             f"(summary.json + run.json)")


@app.command()
def verify(scenario: Path = typer.Argument(..., help="Scenario YAML (run with the torch backend)."),
           plant: str = typer.Option(None, "--plant", help="Break resumes on purpose to see the "
                                     "check fail: state_off_by_one."),
           tol: float = typer.Option(None, "--tol", help="Max abs error (default: fp32 1e-4, "
                                     "bf16 3e-2)."),
           sets: list[str] = typer.Option([], "--set", help="Override a field (repeatable)."),
           out: Path = typer.Option(None, "--out", help="Also write the run folder and verify.csv.")
           ) -> None:
    """Prove that every cached-resume prefill equals a from-scratch prefill (torch backend).

    Each request's last-token hidden state at the end of its prefill (resumed from cached KV
    blocks and a cached Mamba state where it hit) is compared with one pass over the same
    tokens with no cache. Exit 1 if the worst error exceeds the tolerance, or if no request
    resumed from the cache (nothing was proved).
    """
    from sim.cache.config import ConfigError
    from sim.run import simulate, write_run
    from sim.scenario import ScenarioError, load_scenario

    if plant not in (None, "state_off_by_one"):
        fail(f"--plant: unknown {plant!r} (state_off_by_one)")
    over = _parse_sets(sets)
    over.update({"backend.kind": "torch", "backend.verify": True})
    try:
        sc = load_scenario(scenario, over)
        dep, rows, summary = simulate(sc, plant=plant)
    except (ScenarioError, ConfigError) as e:
        fail(str(e))
    from backends.torch_backend.backend import TOLERANCE

    limit = tol if tol is not None else TOLERANCE[sc.backend.dtype]
    recs = dep.verify or []
    resumed = [v for v in recs if v.resumed_at > 0]
    worst = max(recs, key=lambda v: v.max_abs_err, default=None)
    if out:
        write_run(out, sc, dep, rows, summary, report=False)
        with open(out / "verify.csv", "w") as f:
            f.write("request_id,prompt_tokens,resumed_at,max_abs_err\n")
            for v in recs:
                f.write(f"{v.request_id},{v.prompt_tokens},{v.resumed_at},{v.max_abs_err:.3e}\n")
    typer.echo(f"{len(recs)} prefills verified ({len(resumed)} resumed from cached KV blocks and "
               f"Mamba states), {sc.backend.dtype}, tolerance {limit:g}")
    if worst is not None:
        typer.echo(f"worst: {worst.request_id} (prompt {worst.prompt_tokens}, resumed at "
                   f"{worst.resumed_at}): max abs error {worst.max_abs_err:.3e}")
    if not resumed:
        typer.echo("FAIL: no request resumed from the cache, nothing was proved")
        raise typer.Exit(1)
    if worst.max_abs_err > limit:
        bad = sum(1 for v in recs if v.max_abs_err > limit)
        typer.echo(f"FAIL: {bad} prefill(s) differ from scratch beyond {limit:g}")
        raise typer.Exit(1)
    typer.echo("OK: every resumed prefill equals its from-scratch prefill")


@app.command()
def calibrate(model: str = typer.Option(None, "--model", help="Catalogue model (scaled by "
                                        "--layers/--width-div)."),
              scenario: Path = typer.Option(None, "--scenario", help="Take the model and torch "
                                            "settings from a scenario's backend section."),
              device: str = typer.Option("cpu", "--device", help="cpu | cuda"),
              layers: int = typer.Option(4, "--layers", help="Layers of the scaled model."),
              width_div: int = typer.Option(8, "--width-div", help="Width divisor of the scaled model."),
              dtype: str = typer.Option("float32", "--dtype"),
              grid: str = typer.Option("quick", "--grid", help="quick | full"),
              repeats: int = typer.Option(3, "--repeats"),
              out: Path = typer.Option(None, "--out", help="Profile YAML (default profiles/<device>-<model>.yaml)."),
              compare_ttft: bool = typer.Option(False, "--compare", help="With --scenario: also run "
                                                "it on torch and on the fitted analytical backend "
                                                "and print the per-request TTFT error.")) -> None:
    """Time the torch backend's prefill on a grid and write a profile for the analytical backend."""
    from backends.torch_backend.config import TorchModelConfig
    from sim import calibrate as cal
    from sim import models

    if (model is None) == (scenario is None):
        fail("give exactly one of --model NAME or --scenario FILE")
    if device not in ("cpu", "cuda"):
        fail(f"--device: must be cpu or cuda, got {device!r}")
    sc = None
    try:
        if scenario is not None:
            from sim.scenario import load_scenario

            sc = load_scenario(scenario)
            b = sc.backend
            spec = sc.model
            n_layers = b.layers or len(spec.pattern or "") or layers
            cfg = TorchModelConfig.scaled(spec, num_layers=n_layers, width_div=b.width_div,
                                          dtype=b.dtype, seed=sc.seed)
        else:
            spec = models.get_model(model)
            cfg = TorchModelConfig.scaled(spec, num_layers=layers, width_div=width_div, dtype=dtype)
    except (KeyError, ValueError) as e:
        fail(str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e))
    g = cal.QUICK_GRID if grid == "quick" else cal.FULL_GRID

    def progress(done, total):
        if sys.stderr.isatty():
            typer.echo(f"\r{done}/{total} grid points", err=True, nl=False)

    profile = cal.calibrate(cfg, device, g, repeats=repeats, progress=progress)
    name = (sc.model.name if sc else spec.name)
    path = out or Path("profiles") / f"{device}-{name}.yaml"
    cal.write_profile(profile, path, "sim " + " ".join(sys.argv[1:]))
    c, f = profile["coefficients"], profile["fit"]
    typer.echo(f"\nprofile {path}: per item {c['per_item_s'] * 1e3:.3f} ms, per token "
               f"{c['per_token_s'] * 1e6:.2f} us, per attention pair {c['per_pair_s'] * 1e9:.3f} ns; "
               f"fit median error {f['fit_median_rel_err']:.1%}")
    if compare_ttft:
        if sc is None:
            fail("--compare needs --scenario")
        from sim.run import simulate
        from sim.scenario import load_scenario

        t = load_scenario(scenario, {"backend.kind": "torch"})
        a = load_scenario(scenario, {"backend.kind": "analytical",
                                     "backend.profile": str(path.resolve())})
        _, rows_t, _ = simulate(t)
        _, rows_a, _ = simulate(a)
        med, n = cal.median_ttft_error(rows_t, rows_a)
        typer.echo(f"analytical (fitted) vs torch TTFT on {scenario}: median error {med:.1%} "
                   f"over {n} requests")


@app.command()
def validate(file: Path = typer.Argument(..., help="Case file (YAML or JSON)."),
             against_vllm: bool = typer.Option(False, "--against-vllm",
                                               help="Replay it through vLLM's real KV-cache manager.")
             ) -> None:
    """Compare a case file's per-request hits with vLLM 0.33.0's real KV-cache manager.

    Needs the oracle venv (../shared/vllm-oracle/setup.sh); without it, says so and exits 0.
    Exit 1 on any disagreement.
    """
    from sim.cache.case import CaseError, load_case_file
    from sim.validate import ValidateUnavailable, validate_case

    if not against_vllm:
        fail("say what to validate against: --against-vllm")
    try:
        res = validate_case(load_case_file(file))
    except CaseError as e:
        fail(f"{file}: {e}")
    except ValidateUnavailable as e:
        typer.echo(f"skipped: {e}")
        return
    if res["status"] != "compared":
        typer.echo(f"{file}: vLLM {res['vllm']}: {res['status'].replace('_', ' ')}")
        return
    if res["mismatches"]:
        typer.echo(f"{file}: {len(res['mismatches'])} disagreement(s) with vLLM {res['vllm']}:")
        for rid, field, ours, theirs in res["mismatches"]:
            typer.echo(f"  {rid} {field}: ours {ours!r}, vLLM {theirs!r}")
        raise typer.Exit(1)
    typer.echo(f"{file}: {res['lookups']} lookup(s) agree with vLLM {res['vllm']}")


DEFAULT_CHECKS = ("cases/*.yaml", "scenarios/athena.yaml")


@app.command()
def check(paths: list[Path] = typer.Argument(None, help="Case files and scenarios (default: "
                                            "cases/*.yaml and scenarios/athena.yaml)."),
          golden: Path = typer.Option(Path("checks/golden"), "--golden",
                                      help="Folder of golden files."),
          update: bool = typer.Option(False, "--update", help="Rewrite the goldens; print what "
                                      "changed.")) -> None:
    """Compare per-request hit lengths (reconciled, per group alone, junction) with goldens.

    Exit 1 on any drift, on a request without a golden, or when a `want:` marker's value
    appears ("fixed - move the marker"); 0 when everything holds.
    """
    import glob

    from sim.cache.case import CaseError
    from sim.check import check as run_check
    from sim.scenario import ScenarioError

    if not paths:
        paths = [Path(p) for pat in DEFAULT_CHECKS for p in sorted(glob.glob(pat))]
    for p in paths:
        if not p.is_file():
            fail(f"{p}: no such file")
    try:
        res = run_check(paths, golden, Path.cwd(), update=update)
    except (CaseError, ScenarioError, ValueError) as e:
        fail(str(e))
    if update:
        for f in res.updated:
            typer.echo(f"updated {f}")
        new = {}
        for fd in res.findings:
            if fd.kind == "new":
                new[fd.path] = new.get(fd.path, 0) + 1
            else:
                typer.echo(f"  {fd.path} {fd.request} {fd.key}: {fd.golden} -> {fd.got}"
                           + ("  (want marker satisfied and removed)" if fd.kind == "fixed" else ""))
        for path, n in new.items():
            typer.echo(f"  {path}: {n} request(s) recorded for the first time")
        typer.echo(f"{res.checked} requests checked, {len(res.updated)} golden file(s) rewritten")
        return
    if res.findings:
        w = max(len(f.path) for f in res.findings)
        typer.echo(f"{'file':<{w}}  request  key  golden -> now  status")
        for fd in res.findings:
            status = {"fixed": "fixed - move the marker", "new": "no golden (run --update)",
                      "missing": "request gone", "drift": "DRIFT"}[fd.kind]
            typer.echo(f"{fd.path:<{w}}  {fd.request}  {fd.key}  {fd.golden} -> {fd.got}  {status}")
        typer.echo(f"{len(res.findings)} finding(s) in {res.checked} requests")
        raise typer.Exit(1)
    typer.echo(f"{res.checked} requests checked: every hit length holds")


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


class Interrupted(BaseException):
    """SIGINT or SIGTERM turned into an exception, so every ``finally`` and atomic
    write unwinds; a BaseException that is not KeyboardInterrupt, so neither an
    ``except Exception`` nor typer's own Ctrl-C handling swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, frame) -> None:
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: the one place where bad input becomes one line and exit 2,
    and an interrupt becomes one line and exit 130 (SIGINT) / 143 (SIGTERM).

    Anything else that escapes is a bug and keeps its traceback.
    """
    import signal

    from typer._click import ClickException

    from sim.config.errors import InputError

    try:
        signal.signal(signal.SIGINT, _on_signal)
        signal.signal(signal.SIGTERM, _on_signal)
    except ValueError:          # not the main thread (embedded use): leave signals alone
        pass
    try:
        # not standalone: click would print usage boxes and eat Ctrl-C itself
        rc = app(args=argv, standalone_mode=False, prog_name="sim")
    except InputError as e:
        typer.echo(f"error: {e}", err=True)
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
        typer.echo("interrupted; nothing written", err=True)
        sys.exit(128 + (e.signum if isinstance(e, Interrupted) else signal.SIGINT))
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
