"""The scheduler oracle (``sched_oracle.py``) and our ``sim steps``: one step case, both sides.

A case ("spec") is ``{"name", "config": <our config keys>, "requests": [{"id", "segments":
[[stream, offset, length], ...], "arrival", "max_tokens", "kind"}]}`` (optionally
``"max_steps"``).  Our side gets a step case (``sim.commands.steps.run_steps_data``) with the literal
token ids as prompts (or, for a file to read, the stream notation); the oracle gets the
configuration through the key table (``sim.oracle.keys``) and ``tokens: {"ids": [...]}``.

Compared per request: ``FIELDS`` (the oracle's ``preemptions`` list by its length, its
``num_output_tokens`` as ``output_tokens``); per step: ``STEP_FIELDS`` (tokens and drafts
scheduled per request, ``compare_steps``).  Case-level outcomes: both sides reject the
configuration (``both_reject``), one side rejects (``construction``), the oracle fails while
running (``oracle_error``, e.g. ``max_steps``), our side crashes (``crash``) or runs past its
time limit (``hang``; ``both_stall`` when the oracle ran out of steps too).
"""
from __future__ import annotations

import traceback
from typing import Any

from sim.oracle.harness import (
    BOTH_REJECT,
    BOTH_STALL,
    BOTH_STOP,
    COMPARED,
    Mismatch,
    OurTimeout,
    Tester,
    Verdict,
    call_with_timeout,
)
from sim.oracle.keys import OFFLOAD, STEPS, to_oracle_config
from sim.oracle.segments import prompt_notation, stream_numbers, token_ids

MAX_STEPS = 2000
# KV cache events (config keys of ours): the switch goes to the oracle as ``kv_events``; the
# corrected stream is ours only (the oracle is vLLM as it is); report modes map as they are
EVENT_SWITCH = "enable_kv_cache_events"
OURS_ONLY = ("kv_events_fix_emit",)
FIELDS = ["first_scheduled_step", "hit", "junction", "chunk_ends", "chunk_end_steps",
          "first_token_step", "finish_step", "preemptions", "output_tokens"]
# per step (``sim steps --per-step``, ``sched_oracle.py``'s step records): compared too
STEP_FIELDS = ["scheduled", "spec_tokens"]
# the CPU tier (``offload_oracle.py``): on when the case sets its size; our defaults for the
# bytes a chunk holds are written into the oracle case (its own are its stand-in pages')
OFFLOAD_SWITCH = "kv_offloading_size_bytes"
OFFLOAD_DEFAULTS = {"kv_bytes_per_block": 4096, "page_size_alignment": 4096}
# per request with the tier: the first admission's GPU and host hits, every admission that
# looked the prefix up, every lookup (null: deferred), the step that reported the load done,
# and at the end the host pool's written keys over the prompt, per group
OFFLOAD_FIELDS = ["gpu_hit", "external_hit", "admissions", "lookups", "load_done_step",
                  "cpu_cached_positions"]
# per step with the tier: loads and stores (job, request, per group: chunks, blocks, first
# block, chunk ends), flushed jobs, completions, CPU chunks evicted, failed allocations
OFFLOAD_STEP_FIELDS = ["loads", "stores", "flush", "done_loads", "done_stores", "evicted",
                       "alloc_fail"]
# the value of this override key that means "num_speculative_tokens" (one Mamba state block
# per draft token, as vLLM's MambaSpec holds them)
SPEC_BLOCKS = ("mamba_num_speculative_blocks", "K")


# ---------------------------------------------------------------------- translation --
def our_config(spec: dict, override: dict | None = None) -> dict:
    """The case's config for our side, with ``override`` (our side only) applied."""
    cfg = dict(spec["config"])
    for k, v in (override or {}).items():
        if (k, v) == SPEC_BLOCKS:
            k_spec = cfg.get("num_speculative_tokens", 1 if cfg.get("eagle") else 0)
            if k_spec:
                cfg[k] = k_spec
        else:
            cfg[k] = v
    return cfg


def to_ours(spec: dict, literal: bool = True, override: dict | None = None) -> dict:
    """Our step case: prompts as literal ids (what is compared) or in stream notation."""
    nums = stream_numbers(q["segments"] for q in spec["requests"])
    reqs = [{"id": q["id"],
             "prompt": token_ids(q["segments"], nums) if literal else
             prompt_notation(q["segments"]),
             "arrival_step": q["arrival"], "max_tokens": q["max_tokens"],
             **({"report_mode": q["report_mode"]} if "report_mode" in q else {})}
            for q in spec["requests"]]
    return {"config": our_config(spec, override), "requests": reqs}


def driver(spec: dict) -> str:
    """The oracle driver a case goes to: the offload one when the CPU tier is on."""
    return OFFLOAD if spec["config"].get(OFFLOAD_SWITCH) is not None else STEPS


def to_oracle(spec: dict) -> dict:
    nums = stream_numbers(q["segments"] for q in spec["requests"])
    cfg = {k: v for k, v in spec["config"].items() if k != EVENT_SWITCH and k not in OURS_ONLY}
    which = driver(spec)
    if which == OFFLOAD:
        cfg = {**OFFLOAD_DEFAULTS, **cfg}
    case = to_oracle_config(cfg, which)
    if spec["config"].get(EVENT_SWITCH):
        case["kv_events"] = True
    case["id"] = spec["name"]
    case["max_steps"] = spec.get("max_steps", MAX_STEPS)
    case["requests"] = [{"id": q["id"], "tokens": {"ids": token_ids(q["segments"], nums)},
                         "arrival": q["arrival"], "max_tokens": q["max_tokens"],
                         **({"report_mode": q["report_mode"]} if "report_mode" in q else {})}
                        for q in spec["requests"]]
    return case


def from_oracle_case(case: dict) -> dict:
    """An oracle case (``sched_oracle.py`` / ``offload_oracle.py`` keys; prompts as ``n``
    shared tokens or ``[shared, private]``) as a case of this module.  The offload driver's
    default chunk bytes are its stand-in pages, well under one 4 KiB page: a case that
    leaves ``kv_bytes_per_block`` out gets 1 here (one page a chunk, as there)."""
    from sim.oracle.keys import from_oracle_config

    which = OFFLOAD if case.get(OFFLOAD_SWITCH) is not None else STEPS
    cfg = from_oracle_config(case, which)
    if which == OFFLOAD:
        cfg.setdefault("kv_bytes_per_block", 1)
    reqs = []
    for i, r in enumerate(case["requests"]):
        rid = str(r.get("id", f"r{i}"))
        t = r["tokens"]
        if isinstance(t, int):
            t = [t, 0]
        if not (isinstance(t, list) and len(t) == 2):
            raise ValueError(f"{case.get('id')}: {rid}: tokens {t!r} (use n or [shared, private])")
        segs = ([["S", 0, t[0]]] if t[0] else []) + ([[f"P_{rid}", 0, t[1]]] if t[1] else [])
        reqs.append({"id": rid, "segments": segs, "arrival": r.get("arrival", 0),
                     "max_tokens": r.get("max_tokens", 16), "kind": "oracle"})
    spec = {"name": str(case.get("id", "case")), "config": cfg, "requests": reqs}
    if "max_steps" in case:
        spec["max_steps"] = case["max_steps"]
    return spec


# ------------------------------------------------------------------------- our side --
def run_ours(spec: dict, timeout: float | None = 20.0, literal: bool = True,
             override: dict | None = None, scheduler: type | None = None,
             finish_orders: dict[int, list[str]] | None = None) -> dict:
    """``{"results": [...]}`` | ``{"case_error": msg}`` | ``{"crash": tb}`` |
    ``{"hang": seconds}``.  ``scheduler``: a subclass of ``sim.commands.steps.Scheduler`` to run
    instead, for this run only (e.g. one that records its decisions)."""
    from sim.cache.case import CaseError
    from sim.cache.offload_stop import ConnectorAssertion
    import sim.commands.steps as steps_mod

    data = to_ours(spec, literal, override)
    orig = steps_mod.Scheduler if scheduler is not None else None
    if scheduler is not None:
        steps_mod.Scheduler = scheduler
    events = bool(data["config"].get(EVENT_SWITCH))
    try:
        got = call_with_timeout(
            lambda: steps_mod.run_steps_data(data, spec["name"], kv_events=events,
                                             per_step=True, finish_orders=finish_orders),
            timeout)
        if events:   # (the KV events beside the requests: compared when the case has them)
            return {"results": got["requests"], "steps": got["steps"],
                    "kv_events": got["kv_events"], "kv_events_error": got["kv_events_error"]}
        if "stalled" in got:     # some request never fits: it waits, as in vLLM
            return {"stall": got["stalled"]}
        if "offload_steps" in got:
            return {"results": got["requests"], "steps": got["steps"],
                    "offload_steps": got["offload_steps"],
                    "offload_totals": got["offload_totals"],
                    "finish_ties": got["finish_ties"]}
        return {"results": got["requests"], "steps": got["steps"]}
    except OurTimeout:
        return {"hang": timeout}
    except ConnectorAssertion as e:   # where vLLM's engine dies on its own assertion
        return {"stopped": e.step, "message": str(e)}
    except CaseError as e:
        return {"case_error": str(e)}
    except Exception:  # noqa: BLE001 - a crash of our engine is itself a finding
        return {"crash": traceback.format_exc(limit=8)}
    finally:
        if orig is not None:
            steps_mod.Scheduler = orig


# ------------------------------------------------------------------------ comparing --
def oracle_value(rec: dict, fld: str):
    if fld == "preemptions":
        return len(rec.get("preemptions") or [])
    if fld == "output_tokens":
        return rec.get("num_output_tokens")
    return rec.get(fld)


def compare(spec: dict, ours: dict, ans: dict, ignore: frozenset | set = frozenset()
            ) -> Verdict:
    """Every request's ``FIELDS``; a field (or label, see ``label``) in ``ignore`` is left
    out, to look past a known mismatch class."""
    n = len(spec["requests"])
    if "config" not in ans:   # the oracle did not build the scheduler
        if "case_error" in ours:
            return Verdict(BOTH_REJECT)
        return Verdict(COMPARED, [Mismatch("construction", "-", "accepted" if "results" in ours
                                           else short(ours), ans.get("error"))], n)
    if "case_error" in ours:
        return Verdict(COMPARED, [Mismatch("construction", "-",
                                           f"CaseError: {ours['case_error']}", "accepted")], n)
    if "crash" in ours:
        return Verdict(COMPARED, [Mismatch("crash", "-", ours["crash"].strip().splitlines()[-1],
                                           ans.get("error"))], n)
    if "stopped" in ours:
        if str(ans.get("error", "")).startswith(f"step {ours['stopped']}: AssertionError"):
            return Verdict(BOTH_STOP)
        return Verdict(COMPARED, [Mismatch("stopped", "-", ours["message"], ans.get("error"))],
                       n)
    if "stall" in ours:
        if "max_steps" in str(ans.get("error")):
            return Verdict(BOTH_STALL)   # vLLM never schedules some request either
        return Verdict(COMPARED, [Mismatch("stall", "-", ours["stall"], ans.get("error"))], n)
    if "hang" in ours and "max_steps" in str(ans.get("error")):
        # vLLM never admits some request either (the pool cannot hold it): both stall
        return Verdict(BOTH_STALL)
    if "hang" in ours:
        return Verdict(COMPARED, [Mismatch("hang", "-", f"no result after {ours['hang']} s",
                                           ans.get("error"))], n)
    res = ours["results"]
    ours_err = [r for r in res if "error" in r]
    if "kv_events" in ours:
        ev = compare_events(ours, ans)
        if ans.get("kv_event_error"):
            # vLLM's engine died there (the IndexError of an announced hit): requests stop
            # half-way, only the events and the error compare
            return Verdict(COMPARED, [m for m in ev if m.field not in ignore], n)
    else:
        ev = []
    if ans.get("error") or ours_err:
        o = ours_err[0]["error"] if ours_err else None
        if ans.get("error") and ours_err:
            return Verdict(COMPARED, [Mismatch("error", ours_err[0]["id"], o, ans["error"])], n)
        return Verdict(COMPARED, [Mismatch("oracle_error" if ans.get("error") else "error", "-",
                                           o, ans.get("error"))], n)
    orecs = {r["id"]: r for r in ans["requests"]}
    mm = []
    fields = FIELDS + (OFFLOAD_FIELDS if "offload_steps" in ours else [])
    for r in res:
        o = orecs[r["id"]]
        for f in fields:
            a, b = r.get(f), oracle_value(o, f)
            if a != b:
                mm.append(Mismatch(label(f, r, o, a, b), r["id"], a, b))
    if "steps" in ours:
        mm += compare_steps(ours["steps"], ans.get("steps") or [])
    if "offload_steps" in ours:
        mm += compare_offload_steps(ours["offload_steps"], ans.get("steps") or [])
    return Verdict(COMPARED, [m for m in mm + ev if m.field not in ignore], n)


def _jobs(jobs: list[dict]) -> list:
    """Transfer jobs in one canonical form: (job, request, per group (chunks, blocks, first
    block, chunk ends))."""
    out = []
    for j in jobs or []:
        groups = tuple(sorted((int(g), v["chunks"], v["blocks"], v["start_block"],
                               tuple(v["ends"])) for g, v in (j.get("groups") or {}).items()))
        out.append((j["job"], j["req"], groups))
    return sorted(out)


def offload_step_value(rec: dict, f: str):
    """One step's ``OFFLOAD_STEP_FIELDS`` value, ours or the oracle's (its step record's
    ``offload`` part), in one form."""
    if f in ("loads", "stores"):
        return _jobs(rec.get(f))
    if f in ("evicted", "alloc_fail"):
        return rec.get(f, 0)
    return sorted(rec.get(f) or [])


def compare_offload_steps(ours: list[dict], steps: list[dict]) -> list[Mismatch]:
    """The tier's part of every step (the first step where each field differs)."""
    want = {s["step"]: s["offload"] for s in steps if s.get("offload")}
    got = {s["step"]: s for s in ours}
    out = []
    for f in OFFLOAD_STEP_FIELDS:
        for step in sorted(set(want) | set(got)):
            a = offload_step_value(got.get(step, {}), f)
            b = offload_step_value(want.get(step, {}), f)
            if a != b:
                out.append(Mismatch(f, f"step {step}", a, b))
                break
    return out


def compare_steps(ours: list[dict], steps: list[dict]) -> list[Mismatch]:
    """``STEP_FIELDS`` of every step that scheduled anything on either side (the first
    step where each field differs): tokens scheduled per request, drafts included, and the
    drafts scheduled per request, so spec-decode padding and cut drafts are checked."""
    want = {s["step"]: s for s in steps if s.get("scheduled")}
    got = {s["step"]: s for s in ours if s.get("scheduled")}
    out = []
    for f in STEP_FIELDS:
        for step in sorted(set(want) | set(got)):
            a, b = got.get(step, {}).get(f, {}), want.get(step, {}).get(f, {})
            if a != b:
                out.append(Mismatch(f, f"step {step}", a, b))
                break
    return out


def oracle_events(ans: dict) -> tuple[list[dict], dict | None]:
    """The oracle's KV events as ``sim steps --kv-events`` prints them: the steps that
    published any, and the error that stopped vLLM (its fields we report)."""
    steps = [{"step": s["step"], "events": s["kv_events"]} for s in ans.get("steps") or []
             if s.get("kv_events")]
    err = ans.get("kv_event_error")
    if err:
        err = {k: err.get(k) for k in ("step", "type", "request", "group", "unpublished")}
    return steps, err


def compare_events(ours: dict, ans: dict) -> list[Mismatch]:
    """``kv_events`` (the first step where the published events differ) and
    ``kv_events_error``."""
    want, werr = oracle_events(ans)
    out = []
    if ours["kv_events"] != want:
        a = {s["step"]: s["events"] for s in ours["kv_events"]}
        b = {s["step"]: s["events"] for s in want}
        step = min(s for s in set(a) | set(b) if a.get(s) != b.get(s))
        out.append(Mismatch("kv_events", f"step {step}", a.get(step), b.get(step)))
    if ours["kv_events_error"] != werr:
        out.append(Mismatch("kv_events_error", "-", ours["kv_events_error"], werr))
    return out


def label(f: str, r: dict, o: dict, a, b) -> str:
    """The field, with ``@replay`` where the only difference is that our chunk list goes on
    through the re-prefill after a preemption inside the first prefill (the oracle's
    ``chunk_ends`` stop at the first preemption)."""
    if (f in ("chunk_ends", "chunk_end_steps") and o.get("preemptions") and r.get("preemptions")
            and isinstance(a, list) and isinstance(b, list) and len(a) > len(b)
            and a[:len(b)] == b):
        return f + "@replay"
    return f


def short(ours: dict) -> str:
    """Our side's outcome in one line (when it has no results)."""
    for k in ("case_error", "crash", "hang", "stall", "message"):
        if k in ours:
            return f"{k}: {str(ours[k]).strip().splitlines()[-1]}"
    return "accepted"


def expect(ans: dict) -> dict[str, dict[str, Any]]:
    """The oracle's answers in our result keys (a step case's ``expect`` block; with the
    CPU tier its per-request fields too)."""
    fields = FIELDS + (OFFLOAD_FIELDS if ans.get("totals") is not None else [])
    return {r["id"]: {f: oracle_value(r, f) for f in fields} for r in ans["requests"]}


def _plain(v: Any) -> Any:
    """Tuples as lists (what YAML writes and reads back)."""
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def offload_steps_canonical(records: list[dict]) -> list[dict]:
    """Per-step offload records (ours, or the oracle's ``offload`` parts with their step)
    in the canonical form ``OFFLOAD_STEP_FIELDS`` are compared in; empty steps left out."""
    out = []
    for rec in records:
        row: dict[str, Any] = {"step": rec["step"]}
        for f in OFFLOAD_STEP_FIELDS:
            v = offload_step_value(rec, f)
            if v:
                row[f] = _plain(v)
        if len(row) > 1:
            out.append(row)
    return out


def expect_offload_steps(ans: dict) -> list[dict]:
    """The oracle's per-step transfers, canonical (a golden step case's
    ``expect_offload_steps``)."""
    return offload_steps_canonical([dict(s["offload"], step=s["step"])
                                    for s in ans.get("steps") or [] if s.get("offload")])


MAX_TIE_ORDERS = 120


def compare_ties(spec: dict, ours: dict, ans: dict, ignore: frozenset | set = frozenset(),
                 timeout: float | None = 20.0, override: dict | None = None) -> Verdict:
    """``compare``, where vLLM's order is not determined: its connector takes the requests
    that finished in one step in Python set order (string hashes, random per process), and
    that order decides their host-pool recency.  When the first answer mismatches and steps
    had several finished requests, the other orders of those steps are tried (at most
    ``MAX_TIE_ORDERS``); the case matches if one of them does (the verdict's ``checked``
    is unchanged)."""
    import itertools

    v = compare(spec, ours, ans, ignore)
    ties = ours.get("finish_ties") or []
    if not v.mismatches or not ties:
        return v
    choices = [[(step, list(p)) for p in itertools.permutations(ids)] for step, ids in ties]
    for n, combo in enumerate(itertools.product(*choices)):
        if n == 0:
            continue        # (the order already run)
        if n > MAX_TIE_ORDERS:
            break
        alt = run_ours(spec, timeout, override=override, finish_orders=dict(combo))
        w = compare(spec, alt, ans, ignore)
        if not w.mismatches:
            return w
    return v


def offload_coverage(spec: dict, ans: dict) -> list[str]:
    """What a compared case with the CPU tier exercised (one tag per case each): its layout
    (Nemotron-H-shaped: attention first; Qwen3-Next-shaped: Mamba first), EAGLE, chunks of
    several blocks, ARC; host hits (async loads), partial-tail loads and stores, lookups
    deferred, host evictions and failed allocations, flushes, a reload after preemption."""
    cfg = spec["config"]
    groups = cfg.get("groups", ["full", "mamba"])
    block = cfg.get("block_size", 16)
    tags = ["mamba_first" if groups[0] == "mamba" else "attention_first"]
    if cfg.get("eagle"):
        tags.append("eagle")
    if cfg.get("blocks_per_chunk", 1) > 1 or (cfg.get("offload_block_size") or block) > block:
        tags.append("bpc>1")
    if cfg.get("eviction_policy") == "arc":
        tags.append("arc")
    reqs = ans.get("requests") or []
    adms = [a for r in reqs for a in r.get("admissions") or []]
    if any(a["external"] for a in adms):
        tags.append("external_hit")
    if any(a["external"] and a.get("resume") for a in adms):
        tags.append("preempt_reload")
    if any(lk[2] is None for r in reqs for lk in r.get("lookups") or []):
        tags.append("deferred_lookup")
    unit = cfg.get("hash_block_size") or block
    ends = [e for st in ans.get("steps") or [] for kind in ("loads", "stores")
            for j in (st.get("offload") or {}).get(kind) or []
            for g in j["groups"].values() for e in g["ends"]]
    if any(e % block and e % unit == 0 for e in ends):
        tags.append("partial_tail")
    offs = [st.get("offload") or {} for st in ans.get("steps") or []]
    for key, tag in (("evicted", "cpu_evict"), ("alloc_fail", "cpu_alloc_fail"),
                     ("flush", "flush")):
        if any(o.get(key) for o in offs):
            tags.append(tag)
    return tags


def tester(timeout: float | None = 20.0, override: dict | None = None,
           ignore: frozenset | set = frozenset(), shrink_candidates=None, size=None,
           oracle: str = STEPS) -> Tester:
    """This case shape for the harness, with the run's options (``oracle``: the driver,
    ``OFFLOAD`` for cases with the CPU tier)."""
    return Tester(oracle, to_oracle,
                  lambda spec: run_ours(spec, timeout, override=override),
                  lambda spec, ours, ans: compare_ties(spec, ours, ans, ignore, timeout,
                                                       override),
                  shrink_candidates or (lambda spec: []), size,
                  offload_coverage if oracle == OFFLOAD else None)
