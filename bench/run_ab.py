"""Whole ``sim run`` wall time of two or more checkouts, alternated round by round.

The machines this project runs on change speed by up to 2x from one minute to the next, so
a whole-run figure means something only beside another build measured in the same
minutes.  Each round runs ``sim run SCENARIO --out TMP -q`` (report included, as a user
runs it) once in every checkout, in the order given, each from its own folder and with
its own code first on ``PYTHONPATH`` (build each checkout first: ``pip install -e`` or
``python setup.py build_ext --inplace``); it prints each checkout's median and least wall
time, its median CPU time (the process and its report workers), and every checkout's
ratio to the first: the median of the per-round ratios and the ratio of the medians.
Python writes each checkout's bytecode as a user's first run does (an environment's
PYTHONDONTWRITEBYTECODE is dropped for the runs), in an untimed first round: a
checkout whose sources changed since its last run is not timed compiling them.

    python bench/run_ab.py /path/to/old-checkout . --rounds 9

(#19's whole-run goal: this checkout under half of edbe8b7's wall.)
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def run_once(tree: Path, scenario: str, out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one ``sim run`` in ``tree`` (CPU: it and its children)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("PYTHONDONTWRITEBYTECODE", None)    # (bytecode cached, as a user's run has it)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "sim", "run", scenario, "--out", str(out), "-q"],
                         cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode:
        _fail(f"{tree}: sim run {scenario} exited {res.returncode}: "
              f"{(res.stderr.strip().splitlines() or ['(no output)'])[-1]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="+", type=Path,
                    help="checkouts to compare (built); ratios are to the first")
    ap.add_argument("--rounds", type=int, default=7, help="alternated rounds (default 7)")
    ap.add_argument("--scenario", default="scenarios/mooncake-conversation.yaml",
                    help="scenario, relative to each checkout (default: the Mooncake trace)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        _fail(f"--rounds must be >= 1, got {args.rounds}")
    if len(args.trees) < 2:
        _fail("give at least two checkouts to compare")
    trees = [t.resolve() for t in args.trees]
    for t in trees:
        if not (t / "sim" / "__init__.py").is_file():
            _fail(f"{t}: not a hybrid-cache-sim checkout (no sim/__init__.py)")
        if not (t / args.scenario).is_file():
            _fail(f"{t}: no scenario {args.scenario}")
    walls: list[list[float]] = [[] for _ in trees]
    cpus: list[list[float]] = [[] for _ in trees]
    work = Path(tempfile.mkdtemp(prefix="run_ab_"))
    try:
        for i, t in enumerate(trees):       # (untimed: writes each checkout's bytecode)
            run_once(t, args.scenario, work / f"warm_{i}")
            shutil.rmtree(work / f"warm_{i}", ignore_errors=True)
        for r in range(args.rounds):
            for i, t in enumerate(trees):
                out = work / f"{r}_{i}"
                w, c = run_once(t, args.scenario, out)
                shutil.rmtree(out, ignore_errors=True)
                walls[i].append(w)
                cpus[i].append(c)
            print(f"  round {r + 1}/{args.rounds}: "
                  + "  ".join(f"{ws[-1]:.2f} s" for ws in walls), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(walls[0])
    for i, t in enumerate(trees):
        med = statistics.median(walls[i])
        line = (f"{t}: wall median {med:.3f} s (least {min(walls[i]):.3f}), "
                f"CPU median {statistics.median(cpus[i]):.3f} s")
        if i:
            per_round = statistics.median(w / w0 for w, w0 in zip(walls[i], walls[0]))
            line += f"; to the first: {per_round:.3f}x per round (median), {med / base:.3f}x of medians"
        print(line)


if __name__ == "__main__":
    main()
