"""One differential harness: generate -> translate -> run both -> compare -> shrink -> keep.

Both differential testers (``tools/diff_vllm.py``: our cache model against vLLM's real
KV-cache manager; ``tools/diff_steps.py``: our step engine against its real scheduler) are
this loop with their own case shape.  A ``Tester`` says, for one shape, how a case reaches
the oracle (``to_oracle``), how our side runs it (``run_ours``), how the two answers compare
(``compare`` -> ``Verdict``) and which simpler cases to try when shrinking a mismatch
(``shrink_candidates``).  The harness does the rest the same way for both: one batch of
oracle cases per run, our side case by case, the counts, greedy shrinking, timeouts.

A case ("spec") is plain data the tester's functions read; case ``i`` of seed ``s`` is a pure
function of ``(s, i)`` in both testers, so a run is reproducible from its command line.
"""
from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import yaml

# Verdict statuses: a case compared (mismatches or not), or one both sides decline alike
COMPARED = "compared"
BOTH_REJECT = "both_reject"              # both reject the configuration at construction
BOTH_STALL = "both_stall"                # both never admit some request (the pool is too small)
BOTH_STOP = "both_stop"                  # vLLM fails an assertion, and we stop at that step too
ORACLE_UNSUPPORTED = "oracle_unsupported"  # the oracle's driver cannot run this shape at all


class Mismatch(NamedTuple):
    field: str        # the compared field (or a case-level label: construction, crash, hang)
    request: str      # request id, "-" for the case as a whole
    ours: Any
    oracle: Any


@dataclass
class Verdict:
    status: str
    mismatches: list[Mismatch] = field(default_factory=list)
    checked: int = 0      # what this case contributed to the count (lookups, requests)

    @property
    def fields(self) -> list[str]:
        return sorted({m.field for m in self.mismatches})


@dataclass
class Tester:
    """What the harness needs of one case shape; the functions close over the run's options
    (our-side overrides, fields ignored, a timeout)."""
    __test__ = False      # (not a pytest test class, whatever its name)
    oracle: str                                        # driver module: oracle | sched_oracle
    to_oracle: Callable[[dict], dict]
    run_ours: Callable[[dict], Any]
    compare: Callable[[dict, Any, dict], Verdict]
    shrink_candidates: Callable[[dict], list[dict]] = lambda spec: []
    # optional: only candidates strictly smaller than the current case are tried
    size: Callable[[dict], Any] | None = None
    # optional: what a compared case exercised (tags counted in Summary.coverage)
    coverage: Callable[[dict, dict], list[str]] | None = None


@dataclass
class Outcome:
    index: int            # position in the run's list of specs
    spec: dict
    ours: Any
    answer: dict
    verdict: Verdict


@dataclass
class Summary:
    cases: int = 0
    compared: int = 0
    declined: Counter = field(default_factory=Counter)     # status -> cases not compared
    checked: int = 0
    by_field: Counter = field(default_factory=Counter)        # mismatches per field
    cases_by_field: Counter = field(default_factory=Counter)  # mismatching cases per field
    coverage: Counter = field(default_factory=Counter)
    mismatches: list[Outcome] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)   # every compared case (collect=True)
    answers: list[dict] = field(default_factory=list)
    oracle_s: float = 0.0
    ours_s: float = 0.0


def run_both(tester: Tester, specs: list[dict], oracle, collect: bool = False) -> Summary:
    """Run ``specs`` through the oracle (one batch) and our side, and compare each."""
    t0 = time.time()
    answers = oracle.run([tester.to_oracle(s) for s in specs])
    t1 = time.time()
    summ = Summary(answers=answers, oracle_s=round(t1 - t0, 1))
    for i, (spec, ans) in enumerate(zip(specs, answers)):
        ours = tester.run_ours(spec)
        v = tester.compare(spec, ours, ans)
        summ.cases += 1
        if v.status != COMPARED:
            summ.declined[v.status] += 1
            continue
        summ.compared += 1
        summ.checked += v.checked
        out = Outcome(i, spec, ours, ans, v)
        if collect:
            summ.outcomes.append(out)
        if tester.coverage:
            summ.coverage.update(tester.coverage(spec, ans))
        if v.mismatches:
            summ.mismatches.append(out)
            summ.cases_by_field.update(v.fields)
            summ.by_field.update(m.field for m in v.mismatches)
    summ.ours_s = round(time.time() - t1, 1)
    return summ


def rerun(tester: Tester, spec: dict, oracle) -> Outcome:
    """One case again on both sides (after shrinking it)."""
    ans = oracle.run([tester.to_oracle(spec)])[0]
    ours = tester.run_ours(spec)
    return Outcome(0, spec, ours, ans, tester.compare(spec, ours, ans))


def _key(spec: dict) -> str:
    return json.dumps(spec, sort_keys=True, default=list)


def shrink(tester: Tester, spec: dict, field_name: str, oracle, max_rounds: int = 300) -> dict:
    """Greedy: move to the first simpler candidate that still mismatches on ``field_name``,
    until none does.  Each round's candidates go to the oracle as one batch."""
    seen = {_key(spec)}
    cur = spec
    for _ in range(max_rounds):
        cands = []
        for c in tester.shrink_candidates(cur):
            if tester.size is not None and not tester.size(c) < tester.size(cur):
                continue
            k = _key(c)
            if k not in seen:
                seen.add(k)
                cands.append(c)
        if not cands:
            break
        answers = oracle.run([tester.to_oracle(c) for c in cands])
        for c, ans in zip(cands, answers):
            v = tester.compare(c, tester.run_ours(c), ans)
            if any(m.field == field_name for m in v.mismatches):
                cur = c
                break
        else:
            break
    return cur


# ------------------------------------------------------------------ our side, bounded --
class OurTimeout(Exception):
    """Our side ran past its time limit (a hang is itself a finding)."""


def _alarm(signum, frame):  # noqa: ARG001
    raise OurTimeout()


def call_with_timeout(fn: Callable[[], Any], seconds: float | None) -> Any:
    """``fn()``, raising ``OurTimeout`` after ``seconds`` (SIGALRM; only in the main
    thread, elsewhere unbounded)."""
    use_alarm = bool(seconds) and threading.current_thread() is threading.main_thread()
    if not use_alarm:
        return fn()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------------- the command line --
def add_oracle_args(ap, module: str) -> None:
    """``--oracle-python`` / ``--oracle-dir``, as both testers take them."""
    from pathlib import Path

    ap.add_argument("--oracle-python", type=Path, default=None,
                    help="python of the oracle venv (default $VLLM_ORACLE_PYTHON or "
                         "~/.vllm-oracle/venv/bin/python)")
    ap.add_argument("--oracle-dir", type=Path, default=None,
                    help=f"directory holding {module}.py (default $VLLM_ORACLE_DIR, else "
                         f"the oracle folder beside the checkout)")


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``KEY=YAML`` items (config keys for OUR side only) -> a mapping."""
    out: dict[str, Any] = {}
    for item in items:
        k, _, val = item.partition("=")
        out[k] = yaml.safe_load(val)
    return out
