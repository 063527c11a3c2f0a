#!/usr/bin/env python3
"""Random differential tester: our exact cache model against vLLM 0.33.0's real KV-cache manager.

Usage::

    python tools/diff_vllm.py --seed 1 --cases 600 [--profile NAME] [--oracle-python PATH]
                              [--oracle-dir DIR] [--keep DIR] [--shrink] [--quiet]
                              [--ours-config KEY=YAML ...]

An adapter on the differential harness (``sim.oracle.harness``): this file holds the case
generator (``PROFILES``), the shrink candidates, the printing and the command line; the
translation and the comparison are ``sim.oracle.kv_case`` (which ``sim validate`` uses too).

Each random case (seeded, reproducible: case *i* of seed *s* depends only on ``(s, i)``) is a
cache configuration plus a producer and 1-4 consumers.  It runs

* on our side through ``sim.cache.case.run_case_data`` (request 0 = producer, 1 = consumer,
  2.. = the oracle's ``consumers``), prompts written in the ``NAME[@OFF]:LEN`` notation;
* on the oracle side through ``oracle.run_case`` of ``oracle.py`` in the oracle folder (``$VLLM_ORACLE_DIR``)
  (a persistent worker in the oracle venv that imports ``oracle.py`` and calls ``run_case`` on
  each case, exactly what ``oracle.py --file`` does), with every prompt given as literal token
  ids (``{"ids": [...]}``): token ``p`` of stream number ``k`` is id ``(k + 1) * 100000 + p``,
  so prompts share ids exactly where they share stream segments.

``--profile ckpt`` (opt-in, not part of the default mix) is the default mix with vLLM's
internal prefill checkpoints on in ~70 % of cases (``num_prefill_checkpoint_blocks: 1``,
``prefill_checkpoint_alignment`` 1, sometimes the hash unit or 16).

Compared, per consumer: ``hit``, ``per_group``, ``junction`` (oracle
``shared_prefix_boundary``), ``error`` (our lookup error vs the oracle's ``exception`` or
``per_group_exception`` class), ``chunk_ends`` (non-last consumers) and ``events`` (BlockStored
only, where the oracle reports events); per producer: ``chunk_ends`` and ``mamba_states`` (the
oracle's ``producer_cached_positions`` of the last Mamba group).  A prefill that runs out of
blocks (``RuntimeError`` on both sides) is compared as ``prefill_error``; our last consumer is
prefilled too but the oracle never prefills it, so its prefill error is ignored.  Cases the
oracle rejects at construction and our config validation rejects too (``CaseError``) are
counted separately; a rejection on one side only is a mismatch (``construction``).

Prints a summary and, per mismatch, the case in our YAML format (``sim case FILE`` reruns it;
its ``expect`` block holds the oracle's answer mapped to our keys) with both answers.
``--shrink`` greedily minimises each mismatching case (fewer requests, default config values,
shorter segments) while it keeps mismatching on the same field.  Exit status 1 on any mismatch,
0 otherwise; 0 with ``skipped`` when the oracle venv is absent.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from sim.oracle import kv_case
from sim.oracle.harness import (
    BOTH_REJECT,
    ORACLE_UNSUPPORTED,
    Outcome,
    Summary,
    Tester,
    add_oracle_args,
    parse_overrides,
    rerun,
    run_both,
    shrink,
)
from sim.oracle.keys import KV
from sim.oracle.kv_case import Ours, oracle_events, oracle_expect, to_oracle, to_ours
from sim.oracle.worker import OracleUnavailable, start_oracle

# (OPT_IN_PROFILES: for the pytest wrapper)
if __package__:   # imported (tools.diff_vllm)
    from tools.diff_vllm_gen import (OPT_IN_PROFILES, PROFILES, gen_case,  # noqa: F401
                                     shrink_candidates)
else:             # run as a script: its folder is the first entry of sys.path
    from diff_vllm_gen import (OPT_IN_PROFILES, PROFILES, gen_case,  # noqa: F401
                               shrink_candidates)


# --------------------------------------------------------------------- presentation --
def case_yaml(spec: dict, ans: dict | None, source: str, note: str | None = None,
              ours_override: dict | None = None) -> str:
    """The case as our case file; its ``expect`` block holds the oracle's answer."""
    data = to_ours(spec, source)
    if ours_override:  # a mutation run: the file reproduces OUR side as it was run
        data["config"].update(ours_override)
    if note:
        data["description"] = note
    if ans is not None:
        data["expect"] = oracle_expect(spec, ans)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


def _brief_ours(ours: Ours) -> Any:
    if ours.case_error:
        return {"CaseError": ours.case_error}
    if ours.crash:
        return {"crash": ours.crash}
    keep = ("id", "hit", "per_group", "per_group_error", "junction", "chunk_ends", "mamba_states",
            "error", "events")
    return [{k: r.get(k) for k in keep} for r in ours.results]


def _brief_oracle(ans: dict) -> Any:
    drop = {"case", "vllm", "seconds"}
    out = {k: v for k, v in ans.items() if k not in drop}
    for c in out.get("consumers", []) or []:
        c.pop("null_blocks_per_group", None)
        if "events" in c:
            c["events"] = oracle_events(c["events"])
    return out


def _mismatch_lines(out: Outcome) -> list[str]:
    return [f"{m.field}@{m.request}: ours={json.dumps(m.ours)} oracle={json.dumps(m.oracle)}"
            for m in out.verdict.mismatches]


def report_mismatch(label: str, out: Outcome, stream=sys.stdout,
                    ours_override: dict | None = None) -> str:
    """Print one mismatching case (both answers, the case as our YAML); returns the YAML."""
    fields = ", ".join(sorted({f"{m.field}@{m.request}" for m in out.verdict.mismatches}))
    text = case_yaml(out.spec, out.answer, f"tools/diff_vllm.py {label}", f"mismatch: {fields}",
                     ours_override)
    lines = [f"=== MISMATCH {label}: {fields}"]
    lines += [f"  {m.field} @ {m.request}: ours={json.dumps(m.ours)} oracle={json.dumps(m.oracle)}"
              for m in out.verdict.mismatches]
    lines.append("--- case (our yaml; expect = oracle):")
    lines.append(text.rstrip())
    lines.append("--- ours: " + json.dumps(_brief_ours(out.ours)))
    lines.append("--- oracle: " + json.dumps(_brief_oracle(out.answer), default=str))
    stream.write("\n".join(lines) + "\n")
    return text


# ------------------------------------------------------------------------------ run --
def tester(ours_override: dict | None = None) -> Tester:
    """The harness's view of this tester (``ours_override``: config keys for our side only,
    a mutation check that the differential notices a semantic change)."""
    return kv_case.tester(ours_override, shrink_candidates)


def label(seed: int, index: int, profile: str) -> str:
    return f"seed {seed} case {index}" + ("" if profile == "default" else f" profile {profile}")


def run_diff(seed: int, n_cases: int, oracle, start: int = 0, profile: str = "default",
             ours_override: dict | None = None) -> Summary:
    """Generate cases ``start .. start + n_cases - 1`` of ``seed`` and compare both sides
    (``Outcome.index`` counts from ``start``)."""
    specs = [gen_case(seed, start + i, profile) for i in range(n_cases)]
    summ = run_both(tester(ours_override), specs, oracle)
    for out in summ.mismatches:
        out.index += start
    return summ


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=600)
    ap.add_argument("--start", type=int, default=0, help="index of the first case (default 0)")
    add_oracle_args(ap, KV)
    ap.add_argument("--keep", type=Path, default=None,
                    help="write cases, answers and one YAML file per mismatch here")
    ap.add_argument("--shrink", action="store_true",
                    help="minimise each mismatching case before printing it")
    ap.add_argument("--quiet", action="store_true",
                    help="summary only (mismatching cases still go to --keep)")
    ap.add_argument("--profile", choices=PROFILES, default="default",
                    help="case mix: default (the brief's), stress (small pools, more "
                         "requests, further layouts and sizes), tiny (stress with 2-6 token "
                         "blocks and short prompts), groups (stress with runs of several "
                         "identical groups, e.g. Nemotron-H's one attention + six Mamba) or "
                         "ckpt (default with internal prefill checkpoints in ~70%% of cases)")
    ap.add_argument("--ours-config", action="append", default=[], metavar="KEY=YAML",
                    help="override a config key on OUR side only (mutation check: the run "
                         "must then report mismatches), e.g. prompt_checkpoint=seed")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    try:
        oracle = start_oracle(KV, args.oracle_python, args.oracle_dir, batch=200)
    except OracleUnavailable as e:
        print(f"skipped: {e}")
        return 0
    override = parse_overrides(args.ours_config) or None
    keep = args.keep
    if keep:
        (keep / "mismatches").mkdir(parents=True, exist_ok=True)
    specs = [gen_case(args.seed, args.start + i, args.profile) for i in range(args.cases)]
    try:
        t = tester(override)
        summ = run_both(t, specs, oracle)
        for out in summ.mismatches:
            index = args.start + out.index
            name = label(args.seed, index, args.profile)
            if args.shrink:
                small = shrink(t, out.spec, out.verdict.mismatches[0].field, oracle,
                               max_rounds=200)
                if small is not out.spec:
                    out = rerun(t, small, oracle)
                name += " (shrunk)"
            if args.quiet:
                text = case_yaml(out.spec, out.answer, f"tools/diff_vllm.py {name}", None,
                                 override)
            else:
                text = report_mismatch(name, out, ours_override=override)
            if keep:
                fld = out.verdict.mismatches[0].field
                path = keep / "mismatches" / f"s{args.seed}_{args.profile}_c{index}_{fld}.yaml"
                path.write_text("# " + "; ".join(_mismatch_lines(out)) + "\n" + text)
        if keep:
            (keep / "cases.json").write_text(json.dumps([to_oracle(s) for s in specs]))
            (keep / "cases_ours.json").write_text(json.dumps([to_ours(s) for s in specs]))
            (keep / "answers.json").write_text(json.dumps(summ.answers, default=str))
    finally:
        version = oracle.version
        oracle.close()
    dt = time.perf_counter() - t0
    print(f"diff_vllm: seed {args.seed}, profile {args.profile}, cases {args.start}.."
          f"{args.start + args.cases - 1}, oracle vllm {version}, {dt:.1f} s"
          + (f", OUR side overridden: {override}" if override else ""))
    print(f"  cases: {summ.cases} ({summ.compared} compared, {summ.declined[BOTH_REJECT]} "
          f"rejected by both at construction, {summ.declined[ORACLE_UNSUPPORTED]} the oracle "
          f"cannot run)")
    print(f"  lookups compared: {summ.checked} (producers + consumer lookups)")
    print("  coverage (consumer lookups, or cases for partial_hash_hits/prefill_out_of_blocks): "
          + ", ".join(f"{k} {v}" for k, v in sorted(summ.coverage.items())))
    print(f"  mismatching cases: {len(summ.mismatches)}")
    for f, n in sorted(summ.cases_by_field.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"    {f}: {n}")
    return 1 if summ.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
