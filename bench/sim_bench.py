"""Simulation speed and memory of ``sim run`` (analytical backend).

    python bench/sim_bench.py mooncake      # full Mooncake conversation trace (12,031 requests)
    python bench/sim_bench.py million       # 1,000,000 synthetic requests, peak RSS
    python bench/sim_bench.py athena
    python bench/sim_bench.py mooncake --repeat 3   # best of three (noisy machines)
    python bench/sim_bench.py mooncake --requests 3000 --profile 20   # where the time goes
    python bench/sim_bench.py mooncake --requests 2000 --instructions  # load-independent cost
    python bench/sim_bench.py mooncake --set attribution=false   # what a switch costs (A/B)

Prints simulated requests per wall second, the ratio to the 5,000/s target and to the
reference simulators measured on this machine class (Vidur ~670 req/s, Marconi's cache-only
replay 1-2 k req/s), the process's peak RSS and which build ran (the mypyc-compiled hot
path, or the source with ``HCS_NATIVE=0``: see sim/native.py).
"""
from __future__ import annotations

import argparse
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim import native  # noqa: E402
from sim.commands.run import simulate  # noqa: E402
from sim.config.scenario import load_scenario  # noqa: E402

# the speed goal on the Mooncake trace (2-core machine, best of 3): 20,000 simulated
# requests per second
TARGET = 20000.0
REFERENCES = {"Vidur": 670.0, "Marconi (cache-only replay)": 1500.0}

MILLION = {
    "workload.kind": "system_prompt",
    "workload.num_system_prompts": 32,
    "workload.system_prompt_tokens": {"dist": "uniform", "low": 1000, "high": 9000},
    "workload.popularity": "zipf",
    "workload.suffix_tokens": {"dist": "lognormal", "mean": 300, "sigma": 0.7, "min": 20, "max": 3000},
    "workload.output_tokens": {"dist": "lognormal", "mean": 60, "sigma": 0.5, "min": 4, "max": 400},
    "workload.arrival": "poisson",
    "workload.rate_per_s": 4.0,
    "workload.num_requests": 1_000_000,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("which", choices=["mooncake", "million", "athena"])
    ap.add_argument("--requests", type=int, default=None, help="cap the request count")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run N times in one process and report the best wall time (the "
                         "machines share cores: single runs vary by +-20%%)")
    ap.add_argument("--profile", type=int, metavar="N", default=0,
                    help="after the timed runs, run once more under cProfile and print the N "
                         "functions with the most own time and the Python call count per "
                         "request (a noise-free measure of interpreter work)")
    ap.add_argument("--instructions", action="store_true",
                    help="instead of timing: count the CPU instructions per simulated request "
                         "with valgrind (callgrind), as (run of N requests - run of 1) / N; "
                         "the same on a busy or an idle machine, so changes can be compared")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a scenario key (YAML value), as `sim run --set` does; "
                         "repeatable: A/B a switch, e.g. --set attribution=false")
    ap.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)  # one silent run
    args = ap.parse_args()
    sets = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or not key:
            ap.error(f"--set {item!r}: expected KEY=VALUE")
        sets[key] = yaml.safe_load(value)
    if args.instructions:
        instructions(args.which, args.requests or 2000, args.set)
        return
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    if args.profile < 0:
        ap.error("--profile must be >= 0")
    if args.which == "mooncake":
        over = {"workload.num_requests": args.requests} if args.requests else {}
        sc = load_scenario(ROOT / "scenarios" / "mooncake-conversation.yaml", {**over, **sets})
    elif args.which == "athena":
        over = {"workload.num_requests": args.requests} if args.requests else {}
        sc = load_scenario(ROOT / "scenarios" / "athena.yaml", {**over, **sets})
    else:
        over = dict(MILLION)
        if args.requests:
            over["workload.num_requests"] = args.requests
        sc = load_scenario(ROOT / "scenarios" / "athena.yaml", {**over, **sets})
    t0 = time.perf_counter()

    def progress(n: int) -> None:
        if n % 50_000 == 0:
            dt = time.perf_counter() - t0
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            print(f"  {n:,} requests, {dt:,.0f} s, {n / dt:,.0f} req/s, peak RSS {rss:.2f} GiB",
                  flush=True)

    if args.bare:
        simulate(sc)
        return
    walls = []
    for rep in range(args.repeat):
        t0 = time.perf_counter()
        dep, rows, s = simulate(sc, progress=progress)
        walls.append(time.perf_counter() - t0)
        if args.repeat > 1:
            print(f"  run {rep + 1}/{args.repeat}: {walls[-1]:,.2f} s "
                  f"({s['requests'] / walls[-1]:,.0f} req/s)", flush=True)
    wall = min(walls)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    rate = s["requests"] / wall
    print(f"scenario {sc.name} ({args.which}): {s['requests']:,} requests, {s['steps']:,} steps, "
          f"token hit {s['token_hit_rate']:.2%}")
    runs = "" if args.repeat == 1 else \
        f" (best of {args.repeat}; median {statistics.median(walls):,.1f} s)"
    print(f"  wall {wall:,.1f} s{runs} -> {rate:,.0f} simulated requests/s "
          f"({rate / TARGET:.2f}x the {TARGET:,.0f}/s target)")
    for name, ref in REFERENCES.items():
        print(f"  vs {name} ~{ref:,.0f} req/s: {rate / ref:.2f}x")
    print(f"  peak RSS {rss:.2f} GiB")
    print(f"  build: {native.describe()}")
    if args.profile:
        if native.mode() == "compiled":
            print("profile: cProfile cannot see inside the compiled modules; run with "
                  "HCS_NATIVE=0 to profile the source")
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.runcall(simulate, sc)
        st = pstats.Stats(prof)
        print(f"profile: {st.total_calls:,} function calls (builtins included), "
              f"{st.total_calls / s['requests']:,.0f} "
              f"per request (cProfile slows the run; compare calls, not seconds)")
        st.sort_stats("tottime").print_stats(args.profile)


def instructions(which: str, n: int, sets: list[str]) -> None:
    """Instructions per simulated request, counted by callgrind (startup cancels out)."""
    if shutil.which("valgrind") is None:
        sys.exit("--instructions needs valgrind (Debian package valgrind)")

    def count(requests: int) -> int:
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
               str(Path(__file__).resolve()), which, "--requests", str(requests), "--bare"]
        cmd += [f"--set={item}" for item in sets]
        res = subprocess.run(cmd, capture_output=True, text=True)
        m = re.search(r"Collected : (\d+)", res.stderr)
        if res.returncode != 0 or m is None:
            sys.exit(f"valgrind run failed:\n{res.stderr[-2000:]}")
        return int(m.group(1))

    t0 = time.perf_counter()
    full, base = count(n), count(1)
    per = (full - base) / n
    print(f"scenario {which}{''.join(f' --set {x}' for x in sets)}: {n:,} requests, {per / 1e3:,.0f} k instructions per simulated "
          f"request (callgrind; {time.perf_counter() - t0:,.0f} s)")
    print(f"  build: {native.describe()}")


if __name__ == "__main__":
    main()
