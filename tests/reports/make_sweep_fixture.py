"""Build a sweep folder (points.csv + points/<id>/) by running ``sim run`` per grid point.

A stand-in for the sweep runner, used to (re)generate ``tests/fixtures/sweep_small``
and bigger sweeps to look at the report figures::

    python tests/reports/make_sweep_fixture.py tests/fixtures/sweep_small --requests 100 \\
        --axis cache.enable_mamba_shared_prefix_checkpoint=false,true \\
        --axis cache.prefix_match_unit=64,192,100

Points are the grid's product (first axis outermost), numbered p000, p001, ...; a point
whose run fails (``sim run`` exit code != 0) gets status ``failed`` and the error line.
``wall_s`` and ``sim_requests_per_s`` measure the machine; ``--fixed-wall`` sets them to
0 so the folder is byte-stable across regenerations.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]

SUMMARY_KEYS = ["scenario", "model", "policy", "block_size", "hash_block_size", "num_gpu_blocks",
                "requests", "prompt_tokens", "hit_tokens", "token_hit_rate", "request_hit_rate",
                "lost_tokens", "lost_token_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s",
                "ttft_p99_s", "output_tokens", "makespan_s", "throughput_tok_s",
                "mamba_state_bytes_peak", "kv_bytes_peak", "evictions", "preemptions", "steps",
                "wall_s", "sim_requests_per_s"]


def _fmt_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def build(out: Path, scenario: Path, axes: list[tuple[str, list]], requests: int,
          sets: list[str], fixed_wall: bool) -> None:
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    (out / "points").mkdir(parents=True)
    header = ["point", "label", "status", "error"] + [a for a, _ in axes] + SUMMARY_KEYS
    rows = []
    for i, combo in enumerate(itertools.product(*[vals for _, vals in axes])):
        pid = f"p{i:03d}"
        label = ", ".join(f"{a.split('.')[-1]}={_fmt_value(v)}" for (a, _), v in zip(axes, combo))
        cmd = [sys.executable, "-m", "sim", "run", str(scenario), "--out", str(out / "points" / pid),
               "-q", "--no-report", "--set", f"workload.num_requests={requests}"]
        for s in sets:
            cmd += ["--set", s]
        for (a, _), v in zip(axes, combo):
            cmd += ["--set", f"{a}={_fmt_value(v)}"]
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        row = {"point": pid, "label": label}
        row.update({a: _fmt_value(v) for (a, _), v in zip(axes, combo)})
        if res.returncode == 0:
            summary_path = out / "points" / pid / "summary.json"
            s = json.loads(summary_path.read_text())
            if fixed_wall:
                s["wall_s"] = 0.0
                s["sim_requests_per_s"] = 0.0
                summary_path.write_text(json.dumps(s, indent=1) + "\n")
            row.update(status="ok", error="", **{k: s[k] for k in SUMMARY_KEYS})
        else:
            err = (res.stderr.strip().splitlines() or ["unknown error"])[-1]
            row.update(status="failed", error=err.removeprefix("error: "))
        rows.append(row)
        print(pid, row["status"], label, file=sys.stderr)
    with open(out / "points.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header, lineterminator="\n", restval="")
        w.writeheader()
        w.writerows(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--scenario", type=Path, default=Path("scenarios/athena.yaml"),
                    help="relative to the repository root unless absolute")
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--axis", action="append", default=[], help="dotted.path=v1,v2,...")
    ap.add_argument("--set", action="append", default=[], dest="sets")
    ap.add_argument("--fixed-wall", action="store_true")
    a = ap.parse_args()
    axes = []
    for spec in a.axis:
        path, vals = spec.split("=", 1)
        axes.append((path, [yaml.safe_load(v) for v in vals.split(",")]))
    build(a.out.resolve(), a.scenario, axes, a.requests, a.sets, a.fixed_wall)


if __name__ == "__main__":
    main()
