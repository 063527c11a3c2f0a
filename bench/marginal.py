"""Marginal CPU instructions a simulated request costs, and where they go (callgrind).

    python bench/marginal.py                                  # the Mooncake scenario, 2,000 -> 6,000
    python bench/marginal.py --top 40 --inclusive             # functions by inclusive cost
    python bench/marginal.py --scenario scenarios/athena.yaml --low 500 --high 2000
    python bench/marginal.py --set cluster.replicas=16 --set workload.time_scale=0.125
                                                              # a 16-replica fleet (#40)
    python bench/marginal.py --set cluster.replicas=16 --set workload.time_scale=0.125 \
        --set cluster.router.policy=hybrid_aware --against-plain
                                                              # ... and its ratio to one replica (#41)

Runs the whole ``sim run SCENARIO --requests N --no-report`` process twice under
valgrind's callgrind (``OPENBLAS_NUM_THREADS=1 PYTHONHASHSEED=0``: the same instructions
run to run), at ``--low`` and at ``--high`` requests, and prints

* the marginal cost: (instructions at high - instructions at low) / (high - low), the
  start-up and the files' fixed costs cancelled out (#19's measure; its goal: 200 k a
  Mooncake request);
* that cost by origin: the project's compiled modules (by module), CPython's runtime
  (allocation, reference counting, formatting), mypyc's runtime library, ``librt``'s vecs;
* with ``--against-plain``, the same measure of the scenario without the ``--set``
  overrides (two more runs), and the ratio of the two: a fleet's cost a request over its
  one replica's (#41's goal for ``hybrid_aware`` on 16 replicas: at most 1.5x);
* the functions with the largest marginal cost (own instructions, or with ``--inclusive``
  everything they call: our own functions only), named as mypyc compiles them
  (``scheduler.Scheduler.schedule``).

Instruction counts do not move with the machine's load, unlike wall time: compare
builds by them.  Needs valgrind (Debian package ``valgrind``); a few minutes.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL = 200_000       # #19: instructions a simulated Mooncake request
# one cost line of callgrind_annotate: "1,234 (12.34%)  file:function [object]"
_LINE = re.compile(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+([^\s<>*=].*?)\s*(?:\[[^\]]*\])?\s*$")


def _fail(message: str) -> None:
    """One line on stderr and exit code 2 (bad input, or a tool or a run that failed)."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse_annotate(text: str) -> dict[str, int]:
    """``callgrind_annotate`` output (its function lines; call-tree lines are skipped) as
    {function: instructions}; a function listed more than once (one name in several
    files) is summed, and PROGRAM TOTALS is kept under that name."""
    out: dict[str, int] = defaultdict(int)
    for line in text.splitlines():
        m = _LINE.match(line)      # (call-tree lines, "N (p%)  > callee", do not match)
        if m:
            out[m.group(2)] += int(m.group(1).replace(",", ""))
    return dict(out)


def name_of(entry: str) -> str:
    """A readable function name: ``path/__native_x.c:CPyDef_mod___Cls___meth`` ->
    ``mod.Cls.meth``; a runtime function keeps its file's base name."""
    file, _, func = entry.rpartition(":")
    func = func.split("'")[0]                       # (callgrind's recursion marks)
    if func.startswith(("CPyDef_", "CPyPy_")):
        return func.split("_", 1)[1].replace("___", ".")
    return f"{Path(file).name}:{func}" if file else func


def origin_of(entry: str) -> str:
    """Who ran these instructions: one of our compiled modules (``ours: <module>``),
    CPython's runtime, mypyc's runtime library, librt's vecs, or other (libc,
    extension modules such as orjson, unnamed code)."""
    file, _, func = entry.rpartition(":")
    if func.startswith(("CPyDef_", "CPyPy_")):
        return "ours: " + func.split("_", 1)[1].split("___")[0]
    if "/lib-rt/" in file:
        return "mypyc runtime"
    if "vec_template" in file or "/vecs/" in file:
        return "librt vecs"
    if "Python-3." in file or "libpython" in entry:
        return "CPython runtime"
    return "other"


def by_function(costs: dict[str, float], inclusive: bool) -> dict[str, float]:
    """Costs per function name (``name_of``).  Own costs add up over a function's
    entries (its lines inlined into other files, its recursion levels); inclusive ones
    do not (a wrapper encloses the function, a level the next): there, the largest of
    the entries of our compiled functions (CPython's call machinery encloses
    everything, so its inclusive costs say nothing)."""
    out: dict[str, float] = defaultdict(float)
    for f, c in costs.items():
        name = name_of(f)
        if not inclusive:
            out[name] += c
        elif "__native_" in f and "'" not in f.rpartition(":")[2]:
            out[name] = max(out.get(name, c), c)
    return dict(out)


def count(scenario: Path, n: int, work: Path, inclusive: bool,
          sets: list[str] = ()) -> tuple[int, dict[str, int]]:
    """Instructions of one whole ``sim run`` of ``n`` requests, and per function;
    ``sets``: ``--set`` overrides of the scenario."""
    out_file = work / f"callgrind.{n}.out"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONHASHSEED="0")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}",
           sys.executable, "-m", "sim", "run", str(scenario), "--requests", str(n),
           "--no-report", "--out", str(work / f"run{n}"), "-q",
           *(a for kv in sets for a in ("--set", kv))]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        _fail(f"sim run --requests {n} failed under callgrind: {tail}")
    ann = subprocess.run(["callgrind_annotate", "--auto=no", "--threshold=100",
                          f"--inclusive={'yes' if inclusive else 'no'}", str(out_file)],
                         capture_output=True, text=True)
    costs = parse_annotate(ann.stdout)
    if ann.returncode != 0 or "PROGRAM TOTALS" not in costs:
        _fail(f"callgrind_annotate could not read {out_file.name} (exit {ann.returncode})")
    return costs.pop("PROGRAM TOTALS"), costs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", type=Path, default=ROOT / "scenarios/mooncake-conversation.yaml",
                    help="the scenario to run (default: the Mooncake conversation trace)")
    ap.add_argument("--low", type=int, default=2000, help="requests of the first run (2000)")
    ap.add_argument("--high", type=int, default=6000, help="requests of the second run (6000)")
    ap.add_argument("--top", type=int, default=25, help="functions to list (25; 0: none)")
    ap.add_argument("--inclusive", action="store_true",
                    help="list functions by inclusive cost (with their callees), not own cost")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a scenario field for both runs (repeatable)")
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR",
                    help="keep the callgrind files (callgrind.N.out) in DIR for callgrind_annotate")
    ap.add_argument("--against-plain", action="store_true",
                    help="also measure the scenario without the --set overrides (two more runs) "
                         "and print the ratio: a fleet's cost a request over one replica's")
    args = ap.parse_args(argv)
    if not 0 < args.low < args.high:
        _fail(f"need 0 < --low < --high, got --low {args.low} --high {args.high}")
    if not args.scenario.is_file():
        _fail(f"no such scenario: {args.scenario}")
    if args.top < 0:
        _fail(f"--top must be >= 0, got {args.top}")
    if args.against_plain and not args.set:
        _fail("--against-plain compares with the scenario without the --set overrides: "
              "give at least one --set")
    kept = []
    if args.keep is not None:
        if args.keep.exists() and not args.keep.is_dir():
            _fail(f"--keep {args.keep}: not a folder")
        kept = [args.keep / f"callgrind.{n}.out" for n in (args.low, args.high)]
        for k in kept:
            if k.exists():
                _fail(f"--keep: {k} exists (this script overwrites nothing: remove it or "
                      f"choose another folder)")
    for tool in ("valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            _fail(f"needs {tool} (Debian package valgrind)")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hcs-marginal-") as tmp:
        work = Path(tmp)
        runs = {}
        for n in (args.low, args.high):
            print(f"  callgrind: sim run --requests {n:,} ...", file=sys.stderr, flush=True)
            runs[n] = count(args.scenario.resolve(), n, work, args.inclusive, args.set)
        plain = {}
        if args.against_plain:
            (work / "plain").mkdir()
            for n in (args.low, args.high):
                print(f"  callgrind: sim run --requests {n:,} (without the --set overrides) ...",
                      file=sys.stderr, flush=True)
                plain[n] = count(args.scenario.resolve(), n, work / "plain", False)[0]
        if kept:
            try:
                args.keep.mkdir(parents=True, exist_ok=True)
                for n, k in zip((args.low, args.high), kept):
                    shutil.copy2(work / f"callgrind.{n}.out", k)
            except OSError as e:
                _fail(f"--keep {args.keep}: cannot write: {e.strerror or e}")
    (lo_total, lo), (hi_total, hi) = runs[args.low], runs[args.high]
    span = args.high - args.low
    per = (hi_total - lo_total) / span
    print(f"{args.scenario.name}: marginal cost {per / 1e3:,.1f} k instructions a simulated "
          f"request ((hi {hi_total / 1e6:,.0f} M - lo {lo_total / 1e6:,.0f} M) / {span:,} requests; "
          f"{per / GOAL:.2f}x #19's {GOAL // 1000} k goal; callgrind, "
          f"{time.perf_counter() - t0:,.0f} s)")
    if plain:
        per0 = (plain[args.high] - plain[args.low]) / span
        print(f"against the scenario without the --set overrides: {per0 / 1e3:,.1f} k "
              f"instructions a simulated request; ratio {per / per0:.3f}x")
    marginal = {f: (hi.get(f, 0) - lo.get(f, 0)) / span for f in set(lo) | set(hi)}
    by_name = by_function(marginal, args.inclusive)
    if not args.inclusive:
        by_origin: dict[str, float] = defaultdict(float)
        for f, c in marginal.items():
            by_origin[origin_of(f)] += c
        print("by origin (own instructions a request):")
        for o, c in sorted(by_origin.items(), key=lambda kv: (-kv[1], kv[0])):
            if abs(c) >= 0.05 * 1e3:
                print(f"  {c / 1e3:8.1f} k  {o}")
    if args.top > 0:
        what = "inclusive" if args.inclusive else "own"
        print(f"top {args.top} functions by marginal {what} cost (k instructions a request):")
        top = sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))[:args.top]
        for f, c in top:
            print(f"  {c / 1e3:8.1f}  {f}")


if __name__ == "__main__":
    main()
