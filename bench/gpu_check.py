"""The torch backend on one device, checked, timed and calibrated in one command.

    python bench/gpu_check.py --device cuda --out gpu_check     # an H200: 77 s (2026-12-04)
    python bench/gpu_check.py --device cpu --quick --out cpu_check   # scaled down, ~30 s

Everything goes under ``--out`` (bench/README.md says what each file and figure means):

1. ``env.json`` / ``env.txt`` (and ``nvidia-smi.txt`` where it exists): the device, driver,
   clocks, torch and CUDA versions; on a CPU its model and torch's thread count.
2. ``verify-*.log``: ``sim verify`` of the scenario (``scenarios/athena-tiny.yaml``) on the
   device in float32 and bfloat16 (must pass), and with the planted fault
   (``--plant state_off_by_one``) in both (must fail); ``verify-fp32/``, ``verify-bf16/``
   are the honest runs' folders with their ``verify.csv``.
3. ``kernels-<model>.csv``: the timing grid of the torch backend's kernels (Mamba2 chunked
   prefill, its SSD scan, Mamba2 decode, attention prefill without and with a cached
   prefix, MLP, the Mamba state save / restore / block copy and the KV block copy), each
   the median of several runs after warm-ups, CUDA events on a GPU (perf_counter on a CPU);
   ``grid-<model>.json`` / ``grid-<model>.csv``: the per-layer-kind prefill grid
   ``sim calibrate`` fits.
4. ``<tag>-<model>.yaml``: ``sim calibrate --from-grid`` of that grid, with its provenance
   (``calibrate-<model>.log``); on CUDA it is also written to ``profiles/`` (``h200-...``
   on an H200) unless ``--no-install``.
5. ``heldout-<model>.csv``: end-to-end prefills off the grid, measured against the
   profile's prediction (``--fit total`` and ``--fit per-kind`` side by side);
   ``ttft-<model>.csv``: the scenario run on the torch backend and on the analytical
   backend with the new profile, per request TTFT (``sim calibrate --compare``'s figure).
6. ``summary.json`` / ``summary.md``: every figure above and which checks passed; the same
   table is printed last, and both are rewritten after every phase.  Exit 0 when the
   checks passed (honest verifies pass, planted ones fail, the profile loads), else 1.

A phase a bug breaks is recorded (``errors.log``, the summary's ``errors``) and the next one
runs; ``--deadline-s`` starts no phase past that many seconds: a lent machine's run that
runs short of time still brings back what it measured.

On CUDA (without ``--quick``) a second, full-width model is calibrated too (``--wide``,
default Nemotron-H-8B's first 8 layers at full width in bfloat16), for per-layer H200 costs
at a real model's shapes.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SCENARIO = ROOT / "scenarios" / "athena-tiny.yaml"
PLANT = "state_off_by_one"
TARGET_TTFT_ERR = 0.10

#: sizes per mode: the grid sim calibrate fits, the kernel grid, repeats and warm-ups
MODES = {
    "full": {"grid": None,                         # sim calibrate's quick grid
             "kernels": {"tokens": (1, 16, 64, 256, 512), "cached": (0, 256, 1024),
                         "decode_tokens": (1, 2, 4)},
             "repeats": 5, "warmup": 2, "held_out": 16, "requests": None, "ttft_runs": 3},
    "quick": {"grid": {"new": [1, 16, 64, 160], "cached": [0, 128]},
              "kernels": {"tokens": (1, 64), "cached": (0, 128), "decode_tokens": (1, 2)},
              "repeats": 1, "warmup": 1, "held_out": 4, "requests": 6, "ttft_runs": 1},
}
WIDE_FULL = {"grid": {"new": [1, 4, 16, 64, 256, 1024, 2048],
                      "cached": [0, 256, 1024, 4096, 8192]},
             "kernels": {"tokens": (1, 16, 64, 256, 1024, 2048), "cached": (0, 1024, 8192),
                         "decode_tokens": (1, 2, 4)},
             "held_out": 12}
WIDE_QUICK = {"grid": {"new": [1, 32, 128], "cached": [0, 128]},
              "kernels": {"tokens": (1, 32), "cached": (0, 128), "decode_tokens": (1,)},
              "held_out": 3}


# ------------------------------------------------------------------------------ helpers --

def run_sim(args: list[str], log: Path) -> tuple[int, str]:
    """``sim ARGS`` in this process (torch is imported once), its output to ``log``."""
    from sim.entrypoints.cli import main

    import signal

    buf = io.StringIO()
    old_argv = sys.argv
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    sys.argv = ["sim", *args]          # what a profile's "made by" line records
    code = 0
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            try:
                main(list(args))
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:            # a bug: keep its traceback in the log
                traceback.print_exc(file=buf)
                code = 99
    finally:
        sys.argv = old_argv
        for sig, h in handlers.items():       # (sim's main installs its own)
            signal.signal(sig, h)
    text = buf.getvalue()
    log.write_text("$ sim " + " ".join(args) + "\n" + text + f"(exit {code})\n")
    return code, text


def shown(path: Path) -> str:
    """``path`` as the commands and the profiles record it: relative to the current folder
    when it lies inside it (a profile made on a lent machine names no folder of that
    machine), else as given."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        path.write_text("")
        return
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def worst_error(text: str) -> float | None:
    import re

    m = re.search(r"max abs error (\S+)", text)
    return float(m.group(1)) if m else None


class Phases:
    """Wall seconds of each phase (summary.json ``phases_s``), the phases a bug broke
    (``errors``: its traceback goes to ``errors.log``, the next phase still runs) and the
    phases left out because ``--deadline-s`` had passed (``skipped``): on a lent machine a
    check that runs out of time still brings back every figure it measured."""

    def __init__(self, out: Path, deadline_s: float | None):
        self.out = out
        self.t0 = time.perf_counter()
        self.deadline_s = deadline_s
        self.s: dict[str, float] = {}
        self.errors: dict[str, str] = {}
        self.skipped: list[str] = []

    def open(self, name: str) -> bool:
        """Whether phase ``name`` may start (the deadline has not passed)."""
        if self.deadline_s is not None and time.perf_counter() - self.t0 > self.deadline_s:
            self.skipped.append(name)
            print(f"[gpu_check] {name}: skipped (past --deadline-s {self.deadline_s:g})",
                  flush=True)
            return False
        return True

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        print(f"[gpu_check] {name} ...", flush=True)
        try:
            yield
        except Exception as e:          # a bug in one phase: keep it, go on with the next
            self.errors[name] = f"{type(e).__name__}: {e}"
            with open(self.out / "errors.log", "a") as f:
                f.write(f"--- {name}\n{traceback.format_exc()}\n")
            print(f"[gpu_check] {name}: ERROR {self.errors[name]} (errors.log)", flush=True)
        finally:
            self.s[name] = round(time.perf_counter() - t0, 2)
            print(f"[gpu_check] {name}: {self.s[name]:.1f} s", flush=True)


# ------------------------------------------------------------------------------- phases --

def environment_report(device: str, out: Path) -> dict:
    from backends.torch_backend.envinfo import describe, environment, nvidia_smi_text

    env = environment(device)
    (out / "env.json").write_text(json.dumps(env, indent=1) + "\n")
    lines = [describe(env), ""] + [f"{k}: {v}" for k, v in env.items() if k != "nvidia_smi"]
    (out / "env.txt").write_text("\n".join(lines) + "\n")
    smi = nvidia_smi_text()
    if smi is not None:
        (out / "nvidia-smi.txt").write_text(smi)
    return env


def verify_all(scenario: Path, device: str, out: Path, requests: int | None) -> dict:
    """``sim verify`` honest and planted, float32 and bfloat16."""
    base = [shown(scenario), "--quiet", "--set", f"backend.device={device}"]
    if requests:
        base += ["--set", f"workload.num_requests={requests}"]
    res = {}
    for dtype, short in (("float32", "fp32"), ("bfloat16", "bf16")):
        args = base + ["--set", f"backend.dtype={dtype}"]
        code, text = run_sim(["verify", *args, "--out", str(out / f"verify-{short}")],
                             out / f"verify-{short}.log")
        res[short] = {"exit": code, "passed": code == 0, "worst_abs_err": worst_error(text)}
        code, text = run_sim(["verify", *args, "--plant", PLANT],
                             out / f"verify-{short}-planted.log")
        res[f"{short}_planted"] = {"exit": code, "failed_as_it_must": code == 1,
                                   "worst_abs_err": worst_error(text)}
    return res


def calibrate_model(cfg, name: str, device: str, env: dict, out: Path, sizes: dict,
                    repeats: int, warmup: int, held_out_n: int, scenario: Path | None,
                    install: bool) -> dict:
    """Time the grid and the kernels, fit with ``sim calibrate --from-grid``, hold out."""
    from backends.torch_backend.envinfo import device_tag
    from sim.commands import calibrate as cal

    grid = sizes.get("grid") or cal.QUICK_GRID
    data = cal.measure_grid(cfg, device, grid, repeats=repeats, warmup=warmup,
                            kernel_sizes=sizes["kernels"],
                            command="python bench/gpu_check.py " + " ".join(sys.argv[1:]))
    gpath = out / f"grid-{name}.json"
    gpath.write_text(json.dumps(data, indent=1) + "\n")
    write_csv(out / f"grid-{name}.csv", data["points"])
    write_csv(out / f"kernels-{name}.csv", data["kernels"])
    ppath = out / f"{device_tag(env)}-{name}.yaml"
    args = ["calibrate", "--from-grid", str(gpath), "--device", device, "--out", str(ppath),
            "--force", "--quiet", "--repeats", str(repeats), "--warmup", str(warmup),
            "--held-out", str(held_out_n)]
    if scenario is not None:
        args += ["--scenario", shown(scenario)]
    code, text = run_sim(args, out / f"calibrate-{name}.log")
    res: dict = {"model": cfg.source, "dtype": cfg.dtype, "grid_points": len(data["points"]),
                 "kernel_rows": len(data["kernels"]), "calibrate_exit": code}
    if code != 0:
        res["error"] = text.strip().splitlines()[-1] if text.strip() else "no output"
        return res
    import yaml

    prof = yaml.safe_load(ppath.read_text())
    res.update({"profile": ppath.name, "coefficients": prof["coefficients"],
                "fit_median_rel_err": prof["fit"]["fit_median_rel_err"],
                "per_kind_fit_median_rel_err": prof["per_kind"]["composed"]["fit_median_rel_err"],
                "kind_share": {k: v["mean_share"] for k, v in prof["per_kind"].items()
                               if k in ("mamba", "attention", "mlp", "other", "rest")},
                "state_copies": prof.get("state_copies")})
    h = prof.get("held_out")
    if h:
        # the same measured prefills against the per-kind composition, for comparison
        comp = dict(prof["per_kind"]["composed"]["coefficients"])
        comp["per_item_s"] += prof["fit"]["state_save_in_per_item_s"]
        comp["chunk_tokens"] = prof["coefficients"]["chunk_tokens"]
        rows = []
        for r in h["rows"]:
            chunks = [(s, min(s + h["budget"], r["cached"] + r["new_tokens"]))
                      for s in range(r["cached"], r["cached"] + r["new_tokens"], h["budget"])]
            p2 = sum(cal.predict(comp, e - s, s) for s, e in chunks)
            rows.append({**r, "predicted_per_kind_s": p2,
                         "rel_err_per_kind": abs(p2 - r["measured_s"]) / r["measured_s"]})
        write_csv(out / f"heldout-{name}.csv", rows)
        res["held_out"] = {"n": h["n"], "budget": h["budget"],
                           "median_rel_err": h["median_rel_err"], "p90_rel_err": h["p90_rel_err"],
                           "median_rel_err_per_kind":
                               statistics.median(r["rel_err_per_kind"] for r in rows)}
    if install and device == "cuda":
        dest = ROOT / "profiles" / ppath.name
        shutil.copyfile(ppath, dest)
        res["installed"] = str(dest.relative_to(ROOT))
    return res


def scenario_ttft(scenario: Path, device: str, profile: Path, out: Path, name: str,
                  requests: int | None, runs: int) -> dict:
    """The scenario on the torch backend (measured steps) and on the analytical backend with
    the new profile: per-request TTFT and the median relative error, ``runs`` torch runs."""
    from sim.commands.calibrate import median_ttft_error
    from sim.config.scenario import load_scenario
    from sim.commands.run import simulate

    over = {"workload.num_requests": requests} if requests else {}
    a = load_scenario(scenario, {**over, "backend.kind": "analytical",
                                 "backend.profile": str(profile.resolve())})
    _, rows_a, _ = simulate(a)
    pred = {r.request_id: r.ttft_s for r in rows_a}
    medians, table = [], []
    for i in range(runs):
        t = load_scenario(scenario, {**over, "backend.kind": "torch", "backend.device": device})
        _, rows_t, _ = simulate(t)
        med, n = median_ttft_error(rows_t, rows_a)
        medians.append(med)
        table += [{"run": i + 1, "request_id": r.request_id, "torch_ttft_s": r.ttft_s,
                   "analytical_ttft_s": pred.get(r.request_id),
                   "rel_err": (abs(pred[r.request_id] - r.ttft_s) / r.ttft_s
                               if r.request_id in pred and r.ttft_s > 0 else None)}
                  for r in rows_t]
    write_csv(out / f"ttft-{name}.csv", table)
    return {"requests": n, "runs": runs, "median_rel_err_per_run": medians,
            "median_rel_err": statistics.median(medians)}


# ------------------------------------------------------------------------------ summary --

def summary_md(s: dict) -> str:
    env = s["environment"]
    L = [f"# GPU check: {s['device_line']}", "",
         f"date {env.get('date')}, mode {s['mode']}, {s['wall_s']:.0f} s in all; "
         f"checks {'PASSED' if s['ok'] else 'FAILED'}", "",
         "| check | result |", "| --- | --- |"]
    v = s.get("verify", {})
    for k in ("fp32", "bf16"):
        if k in v:
            L.append(f"| sim verify {k} | {'pass' if v[k]['passed'] else 'FAIL'} "
                     f"(worst {v[k]['worst_abs_err']}) |")
        if f"{k}_planted" in v:
            p = v[f"{k}_planted"]
            L.append(f"| sim verify {k} --plant {PLANT} | "
                     f"{'fails as it must' if p['failed_as_it_must'] else 'DID NOT FAIL'} "
                     f"(worst {p['worst_abs_err']}) |")
    for name, m in s.get("models", {}).items():
        if "coefficients" not in m:
            L.append(f"| calibrate {name} | FAILED: {m.get('error')} |")
            continue
        c = m["coefficients"]
        L.append(f"| profile {m['profile']} | per item {c['per_item_s'] * 1e3:.3f} ms, per token "
                 f"{c['per_token_s'] * 1e6:.3f} us, per pair {c['per_pair_s'] * 1e9:.3f} ns, "
                 f"per chunk {c['per_chunk_s'] * 1e3:.3f} ms; fit median error "
                 f"{m['fit_median_rel_err']:.1%} (per-kind {m['per_kind_fit_median_rel_err']:.1%}) |")
        L.append(f"| time share {name} | " + ", ".join(
            f"{k} {v:.0%}" for k, v in m["kind_share"].items()) + " |")
        h = m.get("held_out")
        if h:
            met = "meets" if h["median_rel_err"] <= TARGET_TTFT_ERR else "misses"
            L.append(f"| held-out prefills {name} | median error {h['median_rel_err']:.1%} "
                     f"(p90 {h['p90_rel_err']:.1%}; per-kind fit {h['median_rel_err_per_kind']:.1%}) "
                     f"over {h['n']}, {met} the {TARGET_TTFT_ERR:.0%} target |")
        t = m.get("scenario_ttft")
        if t:
            L.append(f"| scenario TTFT {name} | median error {t['median_rel_err']:.1%} over "
                     f"{t['requests']} requests ({t['runs']} torch run(s)) |")
    for k, e in s.get("errors", {}).items():
        L.append(f"| {k} | ERROR {e} (errors.log) |")
    for k in s.get("skipped", []):
        L.append(f"| {k} | skipped: past --deadline-s |")
    L += ["", "phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in s["phases_s"].items())]
    return "\n".join(L) + "\n"


def parse_wide(text: str) -> tuple[str, int, int, str] | None:
    if text in ("", "none"):
        return None
    parts = text.split(":")
    if len(parts) != 4:
        raise SystemExit(f"--wide: MODEL:LAYERS:WIDTH_DIV:DTYPE or none, got {text!r}")
    return parts[0], int(parts[1]), int(parts[2]), parts[3]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--out", type=Path, default=Path("runs/gpu-check"))
    ap.add_argument("--quick", action="store_true",
                    help="scaled down (small grids, 6-request verifies): for tests and CPUs")
    ap.add_argument("--scenario", type=Path, default=SCENARIO)
    ap.add_argument("--wide", default=None,
                    help="a second model MODEL:LAYERS:WIDTH_DIV:DTYPE, or none (default on "
                         "CUDA without --quick: nemotron-h-8b:8:1:bfloat16; else none)")
    ap.add_argument("--no-install", action="store_true",
                    help="on CUDA, do not write the profiles into profiles/")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="start no phase after this many seconds (the summary names the "
                         "phases left out); default: none")
    args = ap.parse_args(argv)

    import torch

    from backends.torch_backend.config import TorchModelConfig
    from sim.config.scenario import load_scenario

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: torch sees no GPU", file=sys.stderr)
        return 2
    if device == "cpu":
        torch.set_num_threads(1)        # as the torch backend and sim calibrate run on a CPU
    mode = "quick" if args.quick else "full"
    sizes = MODES[mode]
    wide = parse_wide(args.wide if args.wide is not None else
                      ("nemotron-h-8b:8:1:bfloat16" if device == "cuda" and not args.quick
                       else "none"))
    out = args.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        print(f"error: {out}: exists and is not an empty folder; give another --out",
              file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    phase = Phases(out, args.deadline_s)
    s: dict = {"mode": mode, "device": device, "scenario": shown(args.scenario), "models": {},
               "verify": {}}

    def save() -> str:
        """summary.json / summary.md as they stand: written after every phase."""
        v = s["verify"]
        s["ok"] = bool(all(k in v for k in ("fp32", "bf16", "fp32_planted", "bf16_planted"))
                       and v["fp32"]["passed"] and v["bf16"]["passed"]
                       and v["fp32_planted"]["failed_as_it_must"]
                       and v["bf16_planted"]["failed_as_it_must"]
                       and s["models"] and all("coefficients" in m for m in s["models"].values())
                       and not phase.errors and not phase.skipped)
        s["phases_s"], s["errors"], s["skipped"] = phase.s, phase.errors, phase.skipped
        s["wall_s"] = round(time.perf_counter() - t_all, 2)
        (out / "summary.json").write_text(json.dumps(s, indent=1, default=str) + "\n")
        md = summary_md(s)
        (out / "summary.md").write_text(md)
        return md

    with phase("environment"):
        env = environment_report(device, out)
    from backends.torch_backend.envinfo import describe
    s["environment"] = env
    s["device_line"] = describe(env)
    print(f"[gpu_check] {s['device_line']}", flush=True)
    save()

    if phase.open("verify"):
        with phase("verify"):
            s["verify"] = verify_all(args.scenario, device, out, sizes["requests"])
        save()

    sc = load_scenario(args.scenario)
    b = sc.backend
    n_layers = b.layers or len(sc.model.pattern or "") or 4
    cfg = TorchModelConfig.scaled(sc.model, num_layers=n_layers, width_div=b.width_div,
                                  dtype=b.dtype, seed=sc.seed)
    name = sc.model.name
    if phase.open(f"calibrate {name}"):
        with phase(f"calibrate {name}"):
            s["models"][name] = calibrate_model(
                cfg, name, device, env, out, sizes, sizes["repeats"], sizes["warmup"],
                sizes["held_out"], args.scenario, not args.no_install)
        save()
    m = s["models"].get(name, {})
    if "profile" in m and phase.open(f"scenario TTFT {name}"):
        with phase(f"scenario TTFT {name}"):
            m["scenario_ttft"] = scenario_ttft(args.scenario, device, out / m["profile"], out,
                                               name, sizes["requests"], sizes["ttft_runs"])
        save()

    if wide is not None:
        wname, wl, wd, wdt = wide
        wsizes = WIDE_QUICK if args.quick else WIDE_FULL
        label = (f"{wname}-l{wl}" + (f"-w{wd}" if wd != 1 else "")
                 + "-" + {"float32": "fp32", "bfloat16": "bf16"}.get(wdt, wdt))
        if phase.open(f"calibrate {label}"):
            with phase(f"calibrate {label}"):
                wcfg = TorchModelConfig.scaled(wname, num_layers=wl, width_div=wd, dtype=wdt)
                s["models"][label] = calibrate_model(
                    wcfg, label, device, env, out, wsizes, sizes["repeats"], sizes["warmup"],
                    wsizes["held_out"], None, not args.no_install)

    print(save(), flush=True)
    return 0 if s["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
