#!/usr/bin/env python3
"""Random differential tester: our step engine against vLLM 0.33.0's real ``Scheduler``.

Usage::

    python tools/diff_steps.py --seed 1 --cases 200 [--profile default|edge|length|budget|ckpt]
                               [--oracle-python PATH] [--oracle-dir DIR] [--workers 2]
                               [--keep DIR] [--shrink] [--classify] [--show N] [--tables N]
                               [--assume NAME ...] [--ignore FIELD ...]
    python tools/diff_steps.py --replay DIR/NAME.oracle.json ... [--shrink]   # kept cases again
    python tools/diff_steps.py --mooncake data/traces/mooncake_fast25/conversation_trace.jsonl \
        --cases 300 --start 2000 [--num-blocks 300] [--junction-flag] [--step-ms 30]

``--mooncake TRACE`` compares one case instead: ``--cases`` real requests from ``--start`` on
the ``scenarios/mooncake-conversation.yaml`` cache layout (Nemotron-H-8B's 1 attention + 6 Mamba
groups, 1,088-token blocks, hash unit 64, EAGLE k=3 lookahead hashes, retention 0), arrivals
from the timestamps at ``--step-ms`` per step, a pool of ``--num-blocks`` shared by the groups
(small pools preempt), prompts of up to 126k tokens (``max_model_len`` is raised past them).

An adapter on the differential harness (``sim.oracle.harness``): the cases (profiles, the
Mooncake slice, shrink candidates) are ``tools/diff_steps_gen.py``, the translation and the
comparison ``sim.oracle.step_case``; this file holds the known-class options, the printing and
the command line.

Each random case (seeded, reproducible: case *i* of seed *s* depends only on ``(s, i)``) is a
hybrid cache layout (``[full, mamba]`` mostly, also ``[full, mamba, mamba]`` and
``[full, swa:W, mamba]``), block / Mamba-block / hash sizes, scheduler limits (token budget,
``max_num_seqs``, ``long_prefill_token_threshold``), a small or large pool, speculative
decoding (EAGLE with the legacy drop or with lookahead hashes, or ngram; ``K`` 0-3 and an
``accepted_tokens`` int ``<= K``), retention ``null`` / ``0`` and the shared-prefix checkpoint
flag, plus 2-8 requests (concurrent or staggered) built from shared system prompts and private
suffixes, exact replays and multi-turn extensions of earlier prompts.  ``--profile ckpt``
(opt-in, not part of the default mix) is the default mix with vLLM's internal prefill
checkpoints on in ~70 % of cases (``num_prefill_checkpoint_blocks: 1``,
``prefill_checkpoint_alignment`` 1, sometimes the hash unit or 16).

Both sides see identical literal token ids: token ``p`` of stream number ``k`` (streams
numbered in order of first use) is ``(k + 1) * 100000 + p``.

* ours: ``sim.commands.steps.run_steps_data`` with ``prompt: [ids...]``;
* the oracle: ``run_case`` of ``sched_oracle.py`` (oracle folder, ``$VLLM_ORACLE_DIR``) in persistent
  oracle-venv workers (exactly what ``sched_oracle.py --file`` does, one start-up per
  worker), ``tokens: {"ids": [...]}``.

Compared per request: ``first_scheduled_step, hit, junction, chunk_ends, chunk_end_steps,
first_token_step, finish_step, preemptions`` (the oracle's list length) and ``output_tokens``
(the oracle's ``num_output_tokens``).  Case-level outcomes: both sides reject the
configuration (counted, not a mismatch), one side rejects (``construction``), the oracle
fails while running (``oracle_error``, e.g. ``max_steps``), our side crashes (``crash``) or
runs past ``--timeout`` seconds (``hang``).

Per mismatching case it prints our step case as YAML (``sim steps FILE`` reruns it; its
``expect`` holds the oracle's answers) with the prompts in stream notation (``sys0:96 p_r1:12``,
checked to give our engine the same answers as the literal ids), both answers, and for the
first ``--tables`` cases both per-step tables.  ``--keep DIR`` writes every mismatching case as
``NAME.yaml`` (stream notation), ``NAME.literal.yaml`` (the literal ids that were compared) and
``NAME.oracle.json`` (the oracle case and its full answer).  ``--shrink`` greedily minimises each
mismatching case (fewer requests, default config values, shorter prompts and outputs) while a
mismatch on the same field remains.  Exit status 1 on any mismatch, 0 otherwise; 0 with one
``skipped`` line when the oracle venv is absent.

Known mismatch classes can be looked past, to find the next one: ``--assume NAME`` (see
``ASSUMPTIONS``: a config key added on our side or a field label ignored -- ``sim`` itself is
never changed) and ``--ignore FIELD``.
``--classify`` labels every mismatching case with the known classes that account for it
(reruns only our side, so it is cheap).  A plain run assumes nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sim.oracle import step_case
from sim.oracle.harness import (
    BOTH_REJECT,
    BOTH_STALL,
    BOTH_STOP,
    Outcome,
    Tester,
    add_oracle_args,
    parse_overrides,
    rerun,
    run_both,
    shrink,
)
from sim.oracle.keys import OFFLOAD, STEPS
from sim.oracle.segments import prompt_notation
from sim.oracle.step_case import FIELDS, oracle_value
from sim.oracle.worker import OracleUnavailable, start_oracle

# (OPT_IN_PROFILES: for the pytest wrapper)
if __package__:   # imported (tools.diff_steps)
    from tools.diff_steps_gen import (OFFLOAD_PROFILES, OPT_IN_PROFILES,  # noqa: F401
                                      PROFILES, gen_case, mooncake_case, shrink_candidates,
                                      size)
else:             # run as a script: its folder is the first entry of sys.path
    from diff_steps_gen import (OFFLOAD_PROFILES, OPT_IN_PROFILES, PROFILES,  # noqa: F401
                                gen_case, mooncake_case, shrink_candidates, size)

# ``--assume NAME``: look past a known mismatch class (exploration only; a plain run uses none).
ASSUMPTIONS = {
    "spec-blocks": "our config gets mamba_num_speculative_blocks = num_speculative_tokens "
                   "(vLLM's MambaSpec holds one state block per draft token)",
    "replay-chunks": "ignore chunk_ends@replay / chunk_end_steps@replay (our chunk list goes on "
                     "through the re-prefill after a preemption inside the first prefill)",
}


@dataclass
class Options:
    """What a run looks past: config keys added on our side only (``--ours-extra``; the YAML
    printed then carries them), fields or labels left out (``--ignore``) and the known classes
    assumed (``--assume``, each one a set of those two).  ``sim`` itself is never changed."""
    extra: dict[str, Any] = field(default_factory=dict)
    ignore: set[str] = field(default_factory=set)
    assume: set[str] = field(default_factory=set)

    def assuming(self, names) -> "Options":
        out = Options(dict(self.extra), set(self.ignore), set(self.assume))
        for n in names:
            if n not in ASSUMPTIONS:
                raise SystemExit(f"--assume: unknown {n!r} (known: {', '.join(ASSUMPTIONS)})")
            out.assume.add(n)
            if n == "spec-blocks":
                out.extra[step_case.SPEC_BLOCKS[0]] = step_case.SPEC_BLOCKS[1]
            elif n == "replay-chunks":
                out.ignore.update({"chunk_ends@replay", "chunk_end_steps@replay"})
        return out

    def tester(self, timeout: float | None = 20.0, oracle: str = STEPS) -> Tester:
        return step_case.tester(timeout, self.extra or None, frozenset(self.ignore),
                                shrink_candidates, size, oracle)

    def run_ours(self, spec: dict, timeout: float | None = 20.0, literal: bool = True,
                 scheduler: type | None = None) -> dict:
        return step_case.run_ours(spec, timeout, literal, self.extra or None, scheduler)


def _padded_admissions(ans: dict) -> list[str]:
    """Requests the oracle admitted with placeholder drafts: vLLM pads a newly scheduled
    request with one token left (a hit of all but one token) to ``1 + K`` tokens when no
    running request is prefilling this step (``pad_spec_decode`` in ``Scheduler.schedule``);
    named in the label of a case nothing else explains."""
    first = {r["id"]: r.get("first_scheduled_step") for r in ans.get("requests") or []}
    out = []
    for st in ans.get("steps") or []:
        for rid, n in (st.get("spec_tokens") or {}).items():
            if first.get(rid) == st.get("step") and n:
                out.append(rid)
    return out


def explain(spec: dict, ans: dict, opts: Options) -> str:
    """Which known classes (``--assume`` names) account for this case's mismatches: the
    single ones that each make it match, else a minimal set found greedily, else
    ``unexplained`` (with ``pad-spec-decode`` when the oracle padded an admission)."""

    def matches(names) -> bool:
        o = opts.assuming(names)
        return not step_case.compare(spec, o.run_ours(spec, timeout=5), ans, o.ignore).mismatches

    names = [n for n in ASSUMPTIONS if n not in opts.assume]
    alone = [n for n in names if matches({n})]
    if alone:
        return " | ".join(alone)
    cur = set(names)
    if not matches(cur):
        pad = _padded_admissions(ans)
        return "unexplained" + (f" (pad-spec-decode: {','.join(pad)})" if pad else "")
    for n in names:
        if matches(cur - {n}):
            cur.discard(n)
    pad = _padded_admissions(ans)
    return " + ".join(sorted(cur)) + (f" (oracle also padded {','.join(pad)})" if pad else "")


def tracing_scheduler(trace: list):
    """Our scheduler, recording its per-step decisions in ``trace`` (for the step tables;
    a subclass for one run, nothing in ``sim`` changes)."""
    import sim.commands.steps as steps_mod

    class Tracing(steps_mod.Scheduler):
        def schedule(self, now):
            before = {id(r): r.preemptions for r in self.running}
            items = super().schedule(now)
            victims = [r.rid for r in self.waiting if id(r) in before
                       and r.preemptions > before[id(r)]]
            trace.append({"step": int(now), "scheduled": {it.req.rid: it.num_tokens for it in items},
                          "spec_tokens": {it.req.rid: it.spec_tokens for it in items
                                          if it.spec_tokens},
                          "running": len(self.running), "waiting": len(self.waiting),
                          "preempted": victims})
            return items

        def jump_decode(self, items, k):
            trace.append({"step": int(self.sched_time), "jump": k})
            return super().jump_decode(items, k)

        def update_from_output(self, items, now):
            fin = super().update_from_output(items, now)
            if fin and trace:
                trace[-1]["finished"] = [r.rid for r in fin]
            return fin

    return Tracing


# ------------------------------------------------------------------------ display --
def ours_yaml(spec: dict, ans: dict | None, literal: bool = False, note: str = "",
              extra: dict | None = None) -> str:
    """Our step case as YAML (``sim steps FILE`` reruns it); ``expect`` = the oracle."""
    data = step_case.to_ours(spec, literal, extra)
    desc = "; ".join(f"{q['id']} ({q['kind']}): {prompt_notation(q['segments'])}"
                     for q in spec["requests"])
    doc: dict[str, Any] = {"source": f"tools/diff_steps.py case {spec['name']}" + note,
                           "description": desc}
    doc.update(data)
    if ans and ans.get("requests"):
        doc["expect"] = step_case.expect(ans)
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)


def step_table(steps: list[dict], limit: int = 80) -> str:
    lines = []
    for s in steps[:limit]:
        if s.get("idle"):
            lines.append(f"  {s['step']:>4}  (idle)")
            continue
        if "jump" in s:
            lines.append(f"  {s['step']:>4}  ... pure-decode jump over {s['jump']} steps")
            continue
        sch = " ".join(f"{k}:{v}" + (f"(+{s['spec_tokens'][k]}sp)" if s.get("spec_tokens", {})
                                       .get(k) else "")
                       for k, v in s["scheduled"].items())
        extra = ""
        if s.get("arrivals"):
            extra += f" arr={','.join(s['arrivals'])}"
        if s.get("preempted"):
            extra += f" PREEMPT={','.join(s['preempted'])}"
        if s.get("finished"):
            extra += f" fin={','.join(s['finished'])}"
        if "kv_usage" in s:
            extra += f" kv={s['kv_usage']}"
        lines.append(f"  {s['step']:>4}  R{s['running']} W{s['waiting']}  [{sch}]{extra}")
    if len(steps) > limit:
        lines.append(f"  ... {len(steps) - limit} more steps")
    return "\n".join(lines)



def describe(out: Outcome, tables: bool, opts: Options) -> str:
    spec, ours, ans, mm = out.spec, out.ours, out.answer, out.verdict.mismatches
    same = ""
    if "results" in ours:
        alt = opts.run_ours(spec, literal=False)
        if alt.get("results") != ours["results"]:
            same = " (NOTE: stream notation gives our engine different answers; use --keep's .literal.yaml)"
    lines = [f"=== {spec['name']}: " + ", ".join(out.verdict.fields), "--- our step case"
             " (sim steps FILE; prompts in stream notation)" + same,
             ours_yaml(spec, ans, extra=opts.extra).rstrip()]
    lines.append("--- mismatches (field request: ours | oracle)")
    for f, rid, a, b in mm:
        lines.append(f"  {f:<22} {rid:<4} {a!r} | {b!r}")
    if "results" in ours:
        lines.append("--- ours:   " + json.dumps([{k: v for k, v in r.items()
                                                 if k != "arrival_step"}
                                                for r in ours["results"]]))
    else:
        lines.append("--- ours:   " + step_case.short(ours))
    if ans.get("requests"):
        lines.append("--- oracle: " + json.dumps([{k: oracle_value(r, k) for k in ["id"] + FIELDS}
                                                for r in ans["requests"]]))
    if ans.get("error"):
        lines.append(f"--- oracle error: {ans['error']} {ans.get('traceback_tail', '')}")
    if tables and ans.get("steps"):
        lines.append("--- oracle steps (step  running/waiting after schedule()  [id:tokens])")
        lines.append(step_table(ans["steps"]))
        tr: list = []
        opts.run_ours(spec, scheduler=tracing_scheduler(tr))
        if not tr:
            # the compiled scheduler takes no interpreted subclass (the run above crashed):
            # what it records itself (its StepLog observer: tokens and drafts per step)
            tr = [dict(st, running="?", waiting="?") for st in ours.get("steps") or []]
        if tr:
            lines.append("--- our steps")
            lines.append(step_table(tr))
    return "\n".join(lines)


def keep_case(keep: Path, out: Outcome, opts: Options) -> None:
    """``NAME.yaml`` (stream notation), ``NAME.literal.yaml`` (the ids compared) and
    ``NAME.oracle.json`` (the oracle case and its full answer; ``--replay`` reads it)."""
    spec, ans = out.spec, out.answer
    keep.mkdir(parents=True, exist_ok=True)
    (keep / f"{spec['name']}.yaml").write_text(ours_yaml(spec, ans, extra=opts.extra))
    (keep / f"{spec['name']}.literal.yaml").write_text(
        ours_yaml(spec, ans, literal=True, extra=opts.extra))
    (keep / f"{spec['name']}.oracle.json").write_text(json.dumps(
        {"spec": spec, "oracle_case": step_case.to_oracle(spec), "oracle_answer": ans,
         "ours": out.ours, "mismatches": [list(m) for m in out.verdict.mismatches]},
        indent=1, default=str))


# --------------------------------------------------------------------------- main --
def _summary_lines(summ, what: str, version: str, opts: Options,
                   driver: str = STEPS) -> list[str]:
    bad = summ.mismatches
    lines = [f"vllm {version} {driver} vs sim.commands.steps: {what}"
             + (f"; assuming {', '.join(sorted(opts.assume))}" if opts.assume else "")
             + (f"; ignoring {', '.join(sorted(opts.ignore))}" if opts.ignore - {
                 "chunk_ends@replay", "chunk_end_steps@replay"} else ""),
             f"compared {summ.compared} cases, {summ.checked} requests "
             f"({summ.declined[BOTH_REJECT]} configurations rejected by both sides, "
             f"{summ.declined[BOTH_STALL]} cases where both never admit a request"
             + (f", {summ.declined[BOTH_STOP]} where vLLM fails an assertion and we stop at "
                f"that step too" if summ.declined[BOTH_STOP] else "") + "); "
             f"oracle {summ.oracle_s} s, ours {summ.ours_s} s",
             f"mismatching cases: {len(bad)}"]
    if summ.coverage:
        lines.insert(2, "coverage (cases): " + ", ".join(
            f"{k} {v}" for k, v in sorted(summ.coverage.items())))
    if bad:
        lines.append("mismatching cases by field: " + ", ".join(
            f"{f} {n}" for f, n in summ.cases_by_field.most_common()))
        lines.append("mismatching request fields: " + ", ".join(
            f"{f} {n}" for f, n in summ.by_field.most_common()))
    return lines


def _classify(bad: list[Outcome], opts: Options) -> list[str]:
    labels: Counter = Counter()
    per_case = []
    for out in bad:
        mm = out.verdict.mismatches
        if "config" not in out.answer or any(m.field in ("construction", "crash", "hang")
                                             for m in mm):
            lab = "case-level: " + mm[0].field
        else:
            lab = explain(out.spec, out.answer, opts)
        labels[lab] += 1
        per_case.append(f"  {out.spec['name']}: {lab}")
    return (["mismatching cases by known class (which --assume makes them match):"]
            + [f"  {n:4d}  {lab}" for lab, n in labels.most_common()] + per_case)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=100)
    ap.add_argument("--start", type=int, default=0, help="first case index")
    ap.add_argument("--profile", choices=PROFILES, default="default",
                    help="case distribution (edge: spec decode, small budgets/pools, "
                         "near-full replays; length: edge cases with max_model_len a few "
                         "tokens above the longest prompt; budget: concurrent speculative "
                         "decodes under a budget that cuts some of them short; ckpt: default "
                         "with internal prefill checkpoints in ~70%% of cases)")
    ap.add_argument("--write-golden", type=Path, default=None, metavar="DIR",
                    help="write every compared case as a step case whose expect block is "
                         "the oracle's answer (golden files for tests/golden/steps)")
    ap.add_argument("--mooncake", type=Path, default=None, metavar="TRACE",
                    help="instead of random cases: one case from a Mooncake trace (e.g. "
                         "data/traces/mooncake_fast25/conversation_trace.jsonl) on the "
                         "mooncake-conversation cache layout (7 groups); --cases = requests, "
                         "--start = first request")
    ap.add_argument("--step-ms", type=float, default=30.0,
                    help="with --mooncake: trace milliseconds per scheduler step")
    ap.add_argument("--num-blocks", type=int, default=400,
                    help="with --mooncake: pool size shared by the 7 groups")
    ap.add_argument("--junction-flag", action="store_true",
                    help="with --mooncake: enable the shared-prefix (junction) checkpoint")
    add_oracle_args(ap, STEPS)
    ap.add_argument("--workers", type=int, default=2, help="oracle processes in parallel")
    ap.add_argument("--keep", type=Path, default=None, help="write mismatching cases here")
    ap.add_argument("--shrink", action="store_true", help="minimise each mismatching case")
    ap.add_argument("--show", type=int, default=20, help="print at most N mismatching cases")
    ap.add_argument("--tables", type=int, default=3, help="step tables for the first N of them")
    ap.add_argument("--timeout", type=float, default=20.0, help="our side, seconds per case")
    ap.add_argument("--replay", type=Path, nargs="+", default=None,
                    help="rerun cases from kept NAME.oracle.json files (their 'spec')")
    ap.add_argument("--ours-extra", action="append", default=[], metavar="KEY=VALUE",
                    help="extra config key for OUR side only (YAML value; "
                         "mamba_num_speculative_blocks=K means num_speculative_tokens), to "
                         "look past a known mismatch class")
    ap.add_argument("--ignore", action="append", default=[], metavar="FIELD",
                    help="leave FIELD (or a label such as chunk_ends@replay) out of the "
                         "comparison, to look past a known mismatch class")
    ap.add_argument("--assume", action="append", default=[], metavar="NAME",
                    help="look past a known mismatch class: " + "; ".join(
                        f"{k}: {v}" for k, v in ASSUMPTIONS.items()))
    ap.add_argument("--classify", action="store_true",
                    help="label each mismatching case with the known classes (--assume "
                         "names) that account for it (reruns only our side)")
    args = ap.parse_args(argv)
    opts = Options(parse_overrides(args.ours_extra), set(args.ignore)).assuming(args.assume)

    if args.replay:
        specs = [json.loads(p.read_text())["spec"] for p in args.replay]
    elif args.mooncake:
        specs = [mooncake_case(args.mooncake, args.cases, args.start, args.step_ms,
                               args.num_blocks, junction_flag=args.junction_flag)]
    else:
        specs = [gen_case(args.seed, i, args.profile)
                 for i in range(args.start, args.start + args.cases)]
    which = OFFLOAD if any(step_case.driver(sp) == OFFLOAD for sp in specs) else STEPS
    if which == OFFLOAD and any(step_case.driver(sp) != OFFLOAD for sp in specs):
        raise SystemExit("cases with and without the CPU tier go to different oracle drivers: "
                         "replay them separately")
    try:
        oracle = start_oracle(which, args.oracle_python, args.oracle_dir,
                              workers=min(args.workers, max(1, len(specs) // 4)))
    except OracleUnavailable as e:
        print(f"skipped: {e}")
        return 0
    tester = opts.tester(args.timeout, which)
    try:
        summ = run_both(tester, specs, oracle, collect=bool(args.write_golden))
        if args.write_golden:
            args.write_golden.mkdir(parents=True, exist_ok=True)
            for out in summ.outcomes:
                (args.write_golden / f"oracle_{out.spec['name']}.yaml").write_text(
                    "# Written by tools/diff_steps.py --write-golden: expect = vLLM 0.33.0's "
                    "real Scheduler (sched_oracle.py).\n"
                    + ours_yaml(out.spec, out.answer, extra=opts.extra))
        bad = summ.mismatches
        what = (f"{len(specs)} replayed case(s)" if args.replay else
                f"seed {args.seed}, profile {args.profile}, "
                f"cases {args.start}..{args.start + len(specs) - 1}")
        print("\n".join(_summary_lines(summ, what, oracle.version, opts, which)))
        if bad and args.classify:
            print("\n".join(_classify(bad, opts)))
        for j, out in enumerate(bad):
            if args.keep:
                keep_case(args.keep, out, opts)
            if j < args.show:
                print()
                print(describe(out, j < args.tables, opts))
            if args.shrink:
                fld = out.verdict.mismatches[0].field
                small = shrink(tester, out.spec, fld, oracle)
                small = dict(small, name=out.spec["name"] + "_min")
                out2 = rerun(tester, small, oracle)
                print()
                print(f"--- shrunk {out.spec['name']} (on field {fld}):")
                print(describe(out2, True, opts))
                if args.keep:
                    keep_case(args.keep, out2, opts)
        if len(bad) > args.show:
            print(f"\n({len(bad) - args.show} more mismatching cases not shown"
                  + (f"; all kept in {args.keep}" if args.keep else "; use --keep DIR") + ")")
    finally:
        oracle.close()
    return 1 if summ.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
