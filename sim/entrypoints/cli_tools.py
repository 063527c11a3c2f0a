"""The checking and modelling commands of ``sim``: verify and calibrate (the torch backend),
validate and check (against vLLM and golden hit lengths), model (vLLM's KV layout) and events
(KV event streams).  They register on ``sim.entrypoints.cli.app``; ``sim/entrypoints/cli.py`` imports this module."""
from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Optional
from pathlib import Path

import typer

from sim.entrypoints.common import (COMMAND_LINE, DType, Device, Grid, Plant, expected_requests, parse_sets,
                     progress, app, fail, option_message, require_torch, scenario_error)

#: ``sim model``'s options by the parameter names ``derive_layout``'s messages use
MODEL_OPTIONS = {
    "tp": ("--tensor-parallel-size", "--tp"),
    "num_speculative_tokens": ("--num-speculative-tokens",),
    "mamba_cache_dtype": ("--mamba-cache-dtype",),
    "mamba_ssm_cache_dtype": ("--mamba-ssm-cache-dtype",),
    "kv_cache_dtype": ("--kv-cache-dtype",),
    "kernel_block_size": ("--kernel-block-size",),
    "block_size": ("--block-size",),
    "gdn_prefill_backend": ("--gdn-prefill-backend",),
    "speculative_method": ("--speculative-method",),
    "draft_num_layers": ("--draft-num-layers",),
    "draft_num_kv_heads": ("--draft-num-kv-heads",),
    "draft_head_dim": ("--draft-head-dim",),
}
#: ``sim calibrate``'s, by the names the scaled model's messages use
CALIBRATE_OPTIONS = {"num_layers": ("--layers",), "width_div": ("--width-div",)}


@app.command()
def verify(scenario: Path = typer.Argument(..., help="Scenario YAML (run with the torch backend)."),
           plant: Plant = typer.Option(None, "--plant", help="Break resumes on purpose to see "
                                       "the check fail."),
           tol: float = typer.Option(None, "--tol", help="Max abs error against the float32 "
                                     "reference (default: fp32 1e-4, bf16 0.25)."),
           sets: list[str] = typer.Option([], "--set", help="Override a field (repeatable)."),
           out: Path = typer.Option(None, "--out", help="Also write the run folder and verify.csv."),
           quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar.")
           ) -> None:
    """Prove that every cached-resume prefill equals a from-scratch prefill (torch backend).

    The hidden states of every position a request's prefill computed (from its resume point,
    on cached KV blocks and a cached Mamba state where it hit) and of its last decode step
    (after speculative steps with rejected drafts) are compared with one float32 pass over
    the same tokens with no cache and the same weights. Exit 1 if the worst error exceeds
    the tolerance, or if no request resumed from the cache (nothing was proved).
    """
    from sim.errors import ConfigError
    from sim.commands.run import simulate, write_run
    from sim.config.scenario import ScenarioError, load_scenario

    import math

    if tol is not None and not (math.isfinite(tol) and tol > 0):
        fail(f"--tol: must be a finite number > 0, got {tol:g}")
    require_torch("verify")
    plant = Plant(plant).value if plant is not None else None
    over = parse_sets(sets)
    over.update({"backend.kind": "torch", "backend.verify": True})
    if out:
        from sim.rundir.atomic import check_output_folder

        check_output_folder(out)        # before any work
    try:
        sc = load_scenario(scenario, over)
    except (ScenarioError, ConfigError) as e:
        fail(scenario_error(scenario, e, over))
    update, stop = progress(not quiet, "prefills verified", lambda: expected_requests(sc))
    try:
        dep, rows, summary = simulate(sc, plant=plant, progress=update)
    except (ScenarioError, ConfigError) as e:
        stop()
        fail(scenario_error(scenario, e, over))
    stop()
    from backends.torch_backend.backend import TOLERANCE

    limit = tol if tol is not None else TOLERANCE[sc.backend.dtype]
    recs = dep.verify or []
    prefills = [v for v in recs if getattr(v, "kind", "prefill") == "prefill"]
    resumed = [v for v in prefills if v.resumed_at > 0]
    worst = max(recs, key=lambda v: v.max_abs_err, default=None)
    if out:
        def verify_csv(folder: Path) -> None:      # inside the run folder, before it lands
            with open(folder / "verify.csv", "w") as f:
                f.write("request_id,prompt_tokens,resumed_at,max_abs_err,kind\n")
                for v in recs:
                    f.write(f"{v.request_id},{v.prompt_tokens},{v.resumed_at},"
                            f"{v.max_abs_err:.3e},{v.kind}\n")

        write_run(out, sc, dep, rows, summary, report=False, extra=verify_csv, command=COMMAND_LINE or None)
    decodes = len(recs) - len(prefills)
    typer.echo(f"{len(prefills)} prefills verified ({len(resumed)} resumed from cached KV blocks "
               f"and Mamba states)" + (f" and {decodes} final decode steps" if decodes else "")
               + f", {sc.backend.dtype}, tolerance {limit:g}"
               + ("" if sc.backend.dtype == "float32" else " against a float32 reference"))
    if worst is not None:
        typer.echo(f"worst: {worst.request_id} {getattr(worst, 'kind', 'prefill')} (prompt "
                   f"{worst.prompt_tokens}, resumed at {worst.resumed_at}): max abs error "
                   f"{worst.max_abs_err:.3e}")
    if not resumed:
        typer.echo("FAIL: no request resumed from the cache, nothing was proved")
        raise typer.Exit(1)
    if worst.max_abs_err > limit:
        bad = sum(1 for v in recs if v.max_abs_err > limit)
        typer.echo(f"FAIL: {bad} prefill(s)/decode(s) differ from scratch beyond {limit:g}")
        raise typer.Exit(1)
    typer.echo("OK: every resumed prefill and speculative decode equals its from-scratch pass")


class FitMethod(str, Enum):
    total = "total"
    per_kind = "per-kind"


@app.command()
def calibrate(model: str = typer.Option(None, "--model", help="Catalogue model (scaled by "
                                        "--layers/--width-div)."),
              scenario: Path = typer.Option(None, "--scenario", help="Take the model and torch "
                                            "settings from a scenario's backend section."),
              from_grid: Path = typer.Option(None, "--from-grid", help="Fit a grid measured "
                                             "earlier (--save-grid, bench/gpu_check.py) "
                                             "instead of timing one."),
              device: Device = typer.Option(Device.cpu, "--device", help="Where to time."),
              layers: int = typer.Option(4, "--layers", help="Layers of the scaled model."),
              width_div: int = typer.Option(8, "--width-div", help="Width divisor of the scaled model."),
              dtype: DType = typer.Option(DType.float32, "--dtype", help="With --model: the "
                                          "weights' dtype (the SSM state stays float32)."),
              grid: Grid = typer.Option(Grid.quick, "--grid", help="The (new tokens, cached "
                                        "tokens) grid to time: quick (36 points, up to 512 x "
                                        "1,024) or full (35, up to 2,048 x 8,192)."),
              repeats: int = typer.Option(3, "--repeats", help="Timed runs per grid point, "
                                          "after the warm-up runs; the median is kept."),
              warmup: int = typer.Option(1, "--warmup", help="Untimed runs before each grid "
                                         "point's timed ones."),
              fit_method: FitMethod = typer.Option(FitMethod.total, "--fit", help="total: fit "
                                                   "the whole forward; per-kind: sum the "
                                                   "per-layer-kind fits."),
              save_grid: Path = typer.Option(None, "--save-grid", help="Also write the measured "
                                             "grid (JSON) for a later --from-grid."),
              held_out_n: int = typer.Option(0, "--held-out", help="Then time N end-to-end "
                                             "prefills off the grid on --device and print the "
                                             "profile's median error on them."),
              out: Path = typer.Option(None, "--out", help="Profile YAML (default "
                                       "profiles/<device>-<model>.yaml; h200-... on an H200)."),
              compare_ttft: bool = typer.Option(False, "--compare", help="With --scenario: also run "
                                                "it on torch and on the fitted analytical backend "
                                                "and print the per-request TTFT error."),
              quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
              force: bool = typer.Option(False, "--force", help="Overwrite an existing profile "
                                         "file (the default path or --out).")) -> None:
    """Time the torch backend's prefill on a grid and write a profile for the analytical backend."""
    if from_grid is None and (model is None) == (scenario is None):
        fail("give exactly one of --model NAME or --scenario FILE (or --from-grid GRID)")
    if from_grid is not None and model is not None:
        fail("--from-grid takes its model from the grid: give no --model")
    for name, v in (("--repeats", repeats), ("--layers", layers), ("--width-div", width_div)):
        if v < 1:           # (before the model is scaled by them: named as typed)
            fail(f"{name}: must be >= 1, got {v}")
    for name, v in (("--warmup", warmup), ("--held-out", held_out_n)):
        if v < 0:
            fail(f"{name}: must be >= 0, got {v}")
    require_torch("calibrate")
    from sim.commands import calibrate as cal

    device, dtype, grid = Device(device).value, DType(dtype).value, Grid(grid).value
    method = FitMethod(fit_method).value
    sc, data, cfg, name = _calibrate_model(from_grid, scenario, model, layers, width_div,
                                           dtype)
    g = {"quick": cal.QUICK_GRID, "full": cal.FULL_GRID}[grid]
    from sim.rundir.atomic_files import check_output_file

    if device == "cuda" and data is None:
        import torch

        if not torch.cuda.is_available():
            fail("--device cuda: no GPU is visible to torch")
    tag = _device_tag(data["environment"] if data is not None else None,
                      data["device"] if data is not None else device)
    path = out or Path("profiles") / f"{tag}-{name}.yaml"
    # before the timing: a bad --out is one line, exit 2, at once
    check_output_file(path)
    cal.check_settings(path, force=force, repeats=repeats, layers=layers, width_div=width_div)
    if save_grid is not None:
        check_output_file(save_grid)

    command = " ".join(COMMAND_LINE or ["sim", *sys.argv[1:]])
    if data is None:
        update, stop = progress(not quiet, "grid points", len(g["new"]) * len(g["cached"]),
                                 delay_s=0.0)
        try:
            data = cal.measure_grid(cfg, device, g, repeats=repeats, warmup=warmup,
                                    progress=lambda done, total: update(done), command=command)
        finally:
            stop()
        if save_grid is not None:
            from sim.rundir.atomic_files import atomic_write_text

            atomic_write_text(save_grid, json.dumps(data, indent=1) + "\n")
    profile = cal.fit_profile(data, method=method)
    if held_out_n:
        if data["device"] != device:
            fail(f"--held-out: the grid was measured on {data['device']}, not on --device {device}")
        budget = sc.scheduler.max_num_batched_tokens if sc is not None else max(data["grid"]["new"])
        cases = cal.held_out_cases(data["grid"], held_out_n)
        profile["held_out"] = cal.held_out(cfg, device, profile["coefficients"], cases, budget,
                                           repeats=repeats, warmup=warmup)
    cal.write_profile(profile, path, command)
    _calibrate_report(profile, path, compare_ttft, sc, scenario, device)


def _calibrate_model(from_grid, scenario, model, layers: int, width_div: int, dtype: str):
    """What ``sim calibrate`` times or fits: (scenario or None, a measured grid or None, the
    torch model configuration, the model's name), each bad input one line."""
    from backends.torch_backend.config import TorchModelConfig
    from sim.commands import calibrate as cal
    from sim import models
    from sim.errors import InputError

    sc = None
    data = None
    if from_grid is not None:
        try:
            data = cal.load_grid(from_grid)
            cfg = cal.grid_config(data)
        except InputError as e:
            fail(str(e))
        except (TypeError, ValueError) as e:
            fail(f"{from_grid}: model: not a torch model configuration ({e})")
    try:
        if scenario is not None:
            from sim.config.scenario import load_scenario

            sc = load_scenario(scenario)
            b = sc.backend
            spec = sc.model
            n_layers = b.layers or len(spec.pattern or "") or layers
            scfg = TorchModelConfig.scaled(spec, num_layers=n_layers, width_div=b.width_div,
                                           dtype=b.dtype, seed=sc.seed)
            if data is None:
                cfg = scfg
            elif scfg != cfg:
                fail(f"{from_grid}: measured on another model than {scenario}'s "
                     f"({cfg.source}, {cfg.dtype} vs {scfg.source}, {scfg.dtype})")
        elif data is None:
            spec = models.get_model(model)
            cfg = TorchModelConfig.scaled(spec, num_layers=layers, width_div=width_div, dtype=dtype)
    except (KeyError, ValueError) as e:
        fail(str(e.args[0]) if isinstance(e, KeyError) and e.args else
             option_message(str(e), {} if scenario is not None else CALIBRATE_OPTIONS))
    if sc is not None:
        name = sc.model.name
    elif data is not None:
        name = _grid_model_name(cfg)
    else:
        name = spec.name
    return sc, data, cfg, name


def _calibrate_report(profile: dict, path: Path, compare_ttft: bool, sc, scenario,
                      device: str) -> None:
    """``sim calibrate``'s lines: the profile's coefficients and fit, its held-out error,
    and with ``--compare`` the fitted analytical backend's TTFT error against torch."""
    from sim.commands import calibrate as cal

    c, f = profile["coefficients"], profile["fit"]
    typer.echo(f"profile {path}: per item {c['per_item_s'] * 1e3:.3f} ms, per token "
               f"{c['per_token_s'] * 1e6:.2f} us, per attention pair {c['per_pair_s'] * 1e9:.3f} ns; "
               f"fit median error {f['fit_median_rel_err']:.1%}")
    typer.echo("  per term (non-negative least squares): " + cal.describe_terms(f["per_term"]))
    if "held_out" in profile:
        h = profile["held_out"]
        typer.echo(f"held-out end-to-end prefills: {h['n']} off the grid, chunks of "
                   f"{h['budget']}: median error {h['median_rel_err']:.1%}, p90 "
                   f"{h['p90_rel_err']:.1%}")
    if compare_ttft:
        if sc is None:
            fail("--compare needs --scenario")
        from sim.commands.run import simulate
        from sim.config.scenario import load_scenario

        t = load_scenario(scenario, {"backend.kind": "torch", "backend.device": device})
        a = load_scenario(scenario, {"backend.kind": "analytical",
                                     "backend.profile": str(path.resolve())})
        _, rows_t, _ = simulate(t)
        _, rows_a, _ = simulate(a)
        med, n = cal.median_ttft_error(rows_t, rows_a)
        typer.echo(f"analytical (fitted) vs torch TTFT on {scenario}: median error {med:.1%} "
                   f"over {n} requests")


def _grid_model_name(cfg) -> str:
    """A file name for a grid's model: the catalogue name in its ``source``."""
    src = cfg.source or ""
    if src.startswith("scaled(") and "," in src:
        return src[len("scaled("):src.index(",")]
    return "model"


def _device_tag(env: dict | None, device: str) -> str:
    """``cpu``, or the GPU's short name (``h200``) for a CUDA profile's default path."""
    if device != "cuda":
        return "cpu"
    from backends.torch_backend.envinfo import device_tag

    if env is None:
        import torch

        env = {"device": "cuda", "device_name": torch.cuda.get_device_name(0)}
    return device_tag(env)


@app.command()
def validate(file: Path = typer.Argument(..., help="Case file (YAML or JSON)."),
             against_vllm: bool = typer.Option(False, "--against-vllm",
                                               help="Replay it through vLLM's real KV-cache manager.")
             ) -> None:
    """Compare a case file's per-request hits with vLLM 0.33.0's real KV-cache manager.

    Needs the optional vLLM oracle ($VLLM_ORACLE_DIR, and its venv built by its setup.sh);
    without it, says so and exits 0.
    Exit 1 on any disagreement.
    """
    from sim.cache.case import CaseError
    from sim.commands.case_files import load_case_file
    from sim.commands.validate import ValidateUnavailable, validate_case

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
                                      "changed."),
          all_: bool = typer.Option(False, "--all", help="On failure, list every difference "
                                    "(by default the summary and the first ten).")) -> None:
    """Compare per-request hit lengths (reconciled, per group alone, junction) with goldens.

    Exit 1 on any drift, on a request without a golden, or when a `want:` marker's value
    appears ("fixed - move the marker"): a summary (requests changed, hit tokens gained and
    lost), the first ten differences (--all: every one) and the --update command that
    records the change; 0 when everything holds.
    """
    import glob
    import shlex

    from sim.cache.case import CaseError
    from sim.commands.check import check as run_check
    from sim.commands.check import failure_lines
    from sim.config.scenario import ScenarioError

    named = list(paths or [])
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
        cmd = ["sim", "check", *map(str, named)]
        if golden != Path("checks/golden"):
            cmd += ["--golden", str(golden)]
        for line in failure_lines(res, shlex.join(cmd + ["--update"]), show_all=all_):
            typer.echo(line)
        raise typer.Exit(1)
    typer.echo(f"{res.checked} requests checked: every hit length holds")


@app.command()
def model(name: str = typer.Argument(None, help="Catalogue name (see --list)."),
          list_: bool = typer.Option(False, "--list", help="List the catalogue."),
          tp: int = typer.Option(1, "--tensor-parallel-size", "--tp", help="vLLM's "
                                 "--tensor-parallel-size: ranks the heads are split over (sizes "
                                 "are per GPU)."),
          num_speculative_tokens: int = typer.Option(0, "--num-speculative-tokens",
                                                     help="Draft tokens a step (0: no "
                                                     "speculative decoding; the drafter's "
                                                     "layers join the pool)."),
          mamba_cache_dtype: str = typer.Option("auto", "--mamba-cache-dtype", help="vLLM's "
                                                "--mamba-cache-dtype: the conv state's dtype, "
                                                "and the SSM state's when that is auto and the "
                                                "model sets none (auto: the model's dtype; "
                                                "float32, bfloat16, float16)."),
          mamba_ssm_cache_dtype: str = typer.Option("auto", "--mamba-ssm-cache-dtype",
                                                    help="vLLM's --mamba-ssm-cache-dtype: the "
                                                    "SSM state's dtype (auto: the model's rule, "
                                                    "e.g. NemotronH's float32, else the conv "
                                                    "state's)."),
          kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="vLLM's "
                                             "--kv-cache-dtype: auto (the model's dtype), "
                                             "bfloat16, float16, float32 or fp8."),
          kernel_block_size: int = typer.Option(16, "--kernel-block-size", help="The attention "
                                                "kernel's block grid (16; 64 for FlashInfer on "
                                                "some GPUs): the block size is a multiple."),
          block_size: int = typer.Option(None, "--block-size", help="vLLM's --block-size "
                                         "(default: derived so a Mamba state fits a block, as "
                                         "vLLM derives it)."),
          gdn_prefill_backend: str = typer.Option(
              "flashinfer", "--gdn-prefill-backend",
              help="GDN models: flashinfer (vLLM's pick on Hopper; 64-token checkpoint grid) "
                   "or triton (no internal prefill checkpoints)."),
          speculative_method: str = typer.Option(
              "auto", "--speculative-method",
              help="auto (mtp if the model has MTP layers, else its EAGLE head, else ngram) | mtp | "
                   "eagle | eagle3 | ngram | suffix."),
          draft_num_layers: int = typer.Option(None, "--draft-num-layers",
                                               help="EAGLE head: decoder layers (default 1)."),
          draft_num_kv_heads: int = typer.Option(None, "--draft-num-kv-heads",
                                                 help="EAGLE head: KV heads (default: the target's)."),
          draft_head_dim: int = typer.Option(None, "--draft-head-dim",
                                             help="EAGLE head: head size (default: the target's).")
          ) -> None:
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
                                   kernel_block_size=kernel_block_size, block_size=block_size,
                                   gdn_prefill_backend=gdn_prefill_backend,
                                   speculative_method=speculative_method,
                                   draft_num_layers=draft_num_layers,
                                   draft_num_kv_heads=draft_num_kv_heads, draft_head_dim=draft_head_dim)
    except KeyError as e:
        fail(str(e.args[0]) if e.args else str(e))
    except ValueError as e:
        fail(option_message(str(e), MODEL_OPTIONS))
    typer.echo(models.describe(lay, m))


@app.command()
def explain(target: Path = typer.Argument(..., help="A run folder (sim run's output) or a case "
                                          "file (sim case's input)."),
            request_id: str = typer.Argument(None, metavar="[REQUEST_ID]", help="The request "
                                             "(a run: required; a case file: default its last)."),
            request: str = typer.Option(None, "--request", help="The request (as REQUEST_ID)."),
            as_json: bool = typer.Option(False, "--json", help="The explanation as JSON (keys "
                                         "documented in sim/explain/render.py)."),
            no_what_if: bool = typer.Option(False, "--no-what-if", help="Skip the three "
                                            "re-simulations with one setting changed."),
            hash_unit: int = typer.Option(None, "--hash-unit", min=1, help="The hash unit the "
                                          "what-if tries (default: the block if finer, else "
                                          "half the block).")) -> None:
    """Why a request reused what it reused, and what a changed setting would reuse.

    Each KV-cache group's reach, the group that capped the hit, the nearest Mamba state and
    why none was closer (align grid, retention, never computed, evicted by which request,
    when), the junction, the EAGLE drop and lookahead, and the hit with the junction flag,
    the retention interval or the hash unit changed (re-simulated up to this request's
    lookup)."""
    from sim.explain import explain as run_explain, text

    if request_id is not None and request is not None and request_id != request:
        fail(f"give the request once (REQUEST_ID {request_id!r} or --request {request!r})")
    d = run_explain(target, request_id or request, counterfactuals=not no_what_if,
                    hash_unit=hash_unit)
    if as_json:
        json.dump(d, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        typer.echo(text(d))


events_app = typer.Typer(no_args_is_help=True, help="KV cache event streams (vLLM's "
                         "--kv-events-config): check one, or publish one over ZeroMQ.")
app.add_typer(events_app, name="events")


@events_app.command("check")
def events_check(file: Path = typer.Argument(..., help="A stream: kv_events.jsonl of sim run "
                                             "--kv-events, JSONL batches captured from vLLM, "
                                             "or kv_events.msgpack frames."),
                 as_json: bool = typer.Option(False, "--json", help="The report as JSON.")) -> None:
    """Replay a KV event stream as a router indexing it would, against the cache it describes.

    Reports keys removed that were never stored, keys published that were never stored
    (report_mode full announcements), keys a router forgets while a block still holds them,
    and the requests whose reuse a router trusting the stream misjudges, with token counts.
    Exit 1 when it finds any, 0 when the stream is sound.
    """
    from sim.commands.events_check import check_stream

    rep = check_stream(file)
    if as_json:
        json.dump(rep.as_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        typer.echo(rep.text())
    raise typer.Exit(1 if rep.problems else 0)


@events_app.command("serve")
def events_serve(run: Path = typer.Argument(..., help="A run folder of sim run --kv-events "
                                            "(its kv_events.jsonl), or such a stream file."),
                 endpoint: str = typer.Option("tcp://*:5557", "--endpoint",
                                              help="Where to publish (vLLM's default "
                                                   "tcp://*:5557; with * or :: bound, else "
                                                   "connected to, as vLLM does)."),
                 replay_speed: float = typer.Option(0.0, "--replay-speed", metavar="X",
                                                    help="Pace the batches by their simulated "
                                                         "step times, X times as fast (0: all "
                                                         "at once)."),
                 topic: Optional[str] = typer.Option(None, "--topic",
                                                     help="The topic frame (default: the "
                                                          "run's, else vLLM's \"\")."),
                 wait_s: float = typer.Option(0.5, "--wait-s", metavar="S",
                                              help="Seconds to wait before the first batch "
                                                   "(subscribers connecting late miss what "
                                                   "came before).")) -> None:
    """Publish a run's KV events over ZeroMQ as vLLM's ZmqEventPublisher frames them
    (topic, 8-byte sequence number, msgpack batch), so a real indexer (llm-d's, Dynamo's)
    can be pointed at the simulator.  Needs pyzmq and msgpack (the events extra)."""
    from sim.commands.events_serve import serve

    if wait_s < 0 or wait_s != wait_s or wait_s > 3600:
        fail(f"--wait-s: must be in [0, 3600], got {wait_s}")
    got = serve(run, endpoint, replay_speed, topic, wait_s)
    typer.echo(got.text())
