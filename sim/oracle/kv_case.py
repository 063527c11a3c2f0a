"""The KV-cache manager oracle (``oracle.py``) and our ``sim case``: one case, both sides.

A case ("spec") is ``{"config": <our config keys>, "requests": [[(stream, offset, length),
...], ...]}``; request 0 is the producer, 1 the consumer, 2.. the oracle's ``consumers``.
Our side gets a case file (prompts in stream notation) through
``sim.cache.case.run_case_data``; the oracle gets the same configuration through the key
table (``sim.oracle.keys``) and every prompt as literal token ids (``sim.oracle.segments``).

Compared per consumer: ``hit``, ``per_group``, ``junction`` (the oracle's
``shared_prefix_boundary``), ``error`` (our lookup error vs the oracle's ``exception`` or
``per_group_exception`` class), ``chunk_ends`` (non-last consumers) and ``events``
(BlockStored only, where the oracle reports events); per producer: ``chunk_ends`` and
``mamba_states`` (the oracle's ``producer_cached_positions`` of the last Mamba group).  A
prefill that runs out of blocks (``RuntimeError`` on both sides) is compared as
``prefill_error``; our last consumer is prefilled too but the oracle never prefills it, so its
prefill error is ignored.  A configuration both sides reject is ``both_reject``; a rejection
on one side only is a mismatch (``construction``).

``sim validate --against-vllm`` and ``tools/diff_vllm.py`` both use this module.
"""
from __future__ import annotations

import copy
import traceback
from dataclasses import dataclass
from typing import Any

from sim.oracle.harness import (
    BOTH_REJECT,
    COMPARED,
    ORACLE_UNSUPPORTED,
    Mismatch,
    Tester,
    Verdict,
)
from sim.oracle.keys import KV, to_oracle_config
from sim.oracle.segments import parse_notation, prompt_notation, stream_numbers, token_ids

REQUEST_IDS_FIRST = ("producer", "consumer")


def request_id(i: int) -> str:
    return REQUEST_IDS_FIRST[i] if i < 2 else f"consumer{i}"


# ---------------------------------------------------------------------- translation --
def to_ours(spec: dict, source: str = "tools/diff_vllm.py") -> dict:
    """The case as our case file (``sim case FILE`` reruns it)."""
    return {
        "source": source,
        "config": copy.deepcopy(spec["config"]),
        "requests": [{"id": request_id(i), "prompt": prompt_notation(segs)}
                     for i, segs in enumerate(spec["requests"])],
    }


def to_oracle(spec: dict) -> dict:
    """The case as ``oracle.py`` takes it (raises ``OracleKeyError`` for a key it lacks)."""
    case: dict[str, Any] = to_oracle_config(spec["config"], KV)
    nums = stream_numbers(spec["requests"])
    toks = [{"ids": token_ids(segs, nums)} for segs in spec["requests"]]
    case["producer"] = toks[0]
    case["consumer"] = toks[1]
    if len(toks) > 2:
        case["consumers"] = toks[2:]
    return case


def case_to_spec(data: dict) -> tuple[dict, list[str]]:
    """A case file's mapping (validated) -> a spec and its request ids.  Raises
    ``CaseError`` (naming the field) for a bad case or one the oracle cannot take."""
    from sim.cache.case import CaseError, parse_case
    from sim.cache.config import case_field

    parse_case(data)  # validates; raises CaseError with the field
    cfg = {case_field(k): v for k, v in (data.get("config") or {}).items()}
    requests, ids = [], []
    for i, r in enumerate(data["requests"]):
        p = r["prompt"]
        if isinstance(p, list):
            segs = [("__lit", int(t), 1) for t in p]
        else:
            segs = parse_notation(p)
        requests.append(segs)
        ids.append(str(r.get("id", f"r{i}")))
    if len(requests) < 2:
        raise CaseError("requests: the oracle needs a producer and at least one consumer")
    return {"config": cfg, "requests": requests}, ids


# ------------------------------------------------------------------------- our side --
@dataclass
class Ours:
    results: list[dict] | None = None
    case_error: str | None = None
    crash: str | None = None


def run_ours(spec: dict, override: dict | None = None) -> Ours:
    """Our side; ``override`` (config keys) is applied to our side only."""
    from sim.cache.case import CaseError, run_case_data

    data = to_ours(spec)
    if override:
        data["config"].update(override)
    try:
        return Ours(results=run_case_data(data, source="diff"))
    except CaseError as e:
        return Ours(case_error=str(e))
    except Exception:  # noqa: BLE001 - a crash of our model is itself a finding
        return Ours(crash=traceback.format_exc(limit=6))


# ------------------------------------------------------------------------ comparing --
def _cls(text: str | None) -> str | None:
    if not text:
        return None
    return text.split(":", 1)[0].strip()


def oracle_events(evs: list[dict]) -> list[dict]:
    return [{"group": e.get("group_idx"), "keys": e.get("num_block_hashes"),
             "tokens": e.get("num_token_ids")}
            for e in evs if e.get("type") == "BlockStored"]


def mamba_index(cfg: dict) -> int | None:
    idx = [i for i, g in enumerate(cfg["groups"]) if g == "mamba"]
    return idx[-1] if idx else None


def compare(spec: dict, ours: Ours, ans: dict) -> Verdict:
    cfg = spec["config"]
    n_req = len(spec["requests"])
    oracle_built = "scheduler_block_size" in ans
    if ours.crash:
        return Verdict(COMPARED, [Mismatch("crash", "-", ours.crash.strip().splitlines()[-1],
                                           ans.get("exception"))])
    if not oracle_built:
        if "UnitaryKVCacheCoordinator" in str(ans.get("exception_msg")):
            # oracle.py reads coordinator.hash_block_size, which the single-group coordinator
            # lacks: the harness cannot run one-group layouts at all.
            return Verdict(ORACLE_UNSUPPORTED)
        if ours.case_error is not None:
            return Verdict(BOTH_REJECT)
        our_errs = {r.get("error") for r in ours.results}
        if len(our_errs) == 1 and all(r.get("hit") is None for r in ours.results):
            err = our_errs.pop()
            if _cls(err) == ans.get("exception"):
                return Verdict(BOTH_REJECT)
            return Verdict(COMPARED, [Mismatch("construction", "-", err, ans.get("exception"))])
        return Verdict(COMPARED, [Mismatch(
            "construction", "-", "accepted",
            f"{ans.get('exception')}: {ans.get('exception_msg')}")])
    if ours.case_error is not None:
        return Verdict(COMPARED, [Mismatch("construction", "-", f"CaseError: {ours.case_error}",
                                           "accepted")])
    res = ours.results
    mm: list[Mismatch] = []
    lookups = 0

    def cmp(fld: str, i: int, a, b) -> None:
        if a != b:
            mm.append(Mismatch(fld, request_id(i), a, b))

    # Which request's prefill failed on the oracle side (top-level exception after building)?
    consumers = ans.get("consumers")
    failed_at = None
    if consumers is None:
        failed_at = 0
    elif len(consumers) < n_req - 1:
        failed_at = len(consumers) + 1

    # Our `error` field holds the request's own failure: the lookup's error (then nothing
    # is prefilled) or a prefill failure ("RuntimeError: allocate_slots failed ...").  The
    # per-group probe's failure is in `per_group_error`.  Take them apart again.
    def lookup_err(i: int) -> str | None:
        r = res[i]
        return _cls(r.get("error")) if r.get("hit") is None and r.get("error") else None

    def per_group_err(i: int) -> str | None:
        return _cls(res[i].get("per_group_error"))

    def prefill_err(i: int) -> str | None:
        e = res[i].get("error")
        return _cls(e) if e and e.startswith("RuntimeError") else None

    def stage_err(i: int) -> str | None:
        """What stops request i before or during its prefill (the oracle's top level)."""
        return lookup_err(i) or prefill_err(i)

    # producer (the oracle does not run the per-group lookup for it)
    lookups += 1
    if failed_at == 0:
        cmp("prefill_error", 0, stage_err(0), ans.get("exception"))
        return Verdict(COMPARED, mm, lookups)
    cmp("prefill_error", 0, stage_err(0), None)
    cmp("chunk_ends", 0, res[0].get("chunk_ends"), ans.get("producer_chunk_ends"))
    mi = mamba_index(cfg)
    if mi is not None:
        pos = (ans.get("producer_cached_positions") or {}).get(str(mi))
        cmp("mamba_states", 0, res[0].get("mamba_states"), pos)
    leftover = False
    for j, c in enumerate(consumers):
        i = j + 1
        lookups += 1
        r = res[i]
        cmp("error", i, lookup_err(i) or per_group_err(i),
            c.get("exception") or _cls(c.get("per_group_exception")))
        cmp("hit", i, r.get("hit"), c.get("hit"))
        cmp("per_group", i, r.get("per_group"), c.get("per_group"))
        cmp("junction", i, r.get("junction"), c.get("shared_prefix_boundary"))
        if "chunk_ends" in c:
            cmp("chunk_ends", i, r.get("chunk_ends"), c["chunk_ends"])
        if "events" in c:
            want = oracle_events(c["events"])
            mine = r.get("events")
            if leftover and isinstance(mine, list) and len(want) >= len(mine):
                # The oracle drains its event queue only after a lookup that did not raise:
                # what an earlier raising lookup published before its IndexError shows up
                # here first.  Compare only this lookup's own (trailing) events.
                want = want[len(want) - len(mine):]
            cmp("events", i, mine, want)
            if "exception" not in c:
                leftover = False
        if c.get("exception") and cfg.get("report_mode"):
            leftover = True
        last = i == n_req - 1
        if not last and "exception" not in c:
            cmp("prefill_error", i, prefill_err(i), None)
    if failed_at is not None:
        cmp("prefill_error", failed_at, stage_err(failed_at), ans.get("exception"))
    return Verdict(COMPARED, mm, lookups)


def coverage_tags(spec: dict, ans: dict) -> list[str]:
    """What a compared case exercised (from the oracle's answer), for the summary."""
    tags: list[str] = []
    if "scheduler_block_size" not in ans:
        return tags
    sched = ans["scheduler_block_size"]
    if ans.get("partial_hash_hits"):
        tags.append("partial_hash_hits")
    if "consumers" not in ans or len(ans["consumers"]) < len(spec["requests"]) - 1:
        tags.append("prefill_out_of_blocks")
    for c in ans.get("consumers") or []:
        hit = c.get("hit")
        if c.get("exception"):
            tags.append("lookup_exception")
        if hit:
            tags.append("hit>0")
            if hit % sched:
                tags.append("hit_off_sched_grid")
        if c.get("shared_prefix_boundary"):
            tags.append("junction>0")
        pg = c.get("per_group") or []
        if len(set(pg)) > 1:
            tags.append("per_group_differ")
        if c.get("events"):
            tags.append("events_nonempty")
    return tags


# --------------------------------------------------------------------- presentation --
def oracle_expect(spec: dict, ans: dict) -> dict:
    """The oracle's answer in our result keys (as tools/make_goldens.py maps it)."""
    exp: dict[str, dict] = {}
    if "scheduler_block_size" not in ans:
        return {request_id(i): {"error": ans.get("exception")} for i in range(len(spec["requests"]))}
    prod: dict[str, Any] = {}
    if ans.get("producer_chunk_ends") is not None:
        prod["chunk_ends"] = ans["producer_chunk_ends"]
    mi = mamba_index(spec["config"])
    pos = ans.get("producer_cached_positions")
    if mi is not None and pos is not None:
        prod["mamba_states"] = pos.get(str(mi))
    if "consumers" not in ans:
        prod["error"] = ans.get("exception")
    exp["producer"] = prod
    for j, c in enumerate(ans.get("consumers") or []):
        e: dict[str, Any] = {"hit": c.get("hit"), "per_group": c.get("per_group"),
                             "per_group_error": c.get("per_group_exception"),
                             "junction": c.get("shared_prefix_boundary"),
                             "error": c.get("exception")}
        if "chunk_ends" in c:
            e["chunk_ends"] = c["chunk_ends"]
        if "events" in c:
            e["events"] = oracle_events(c["events"])
        exp[request_id(j + 1)] = e
    n = len(ans.get("consumers") or [])
    if "consumers" in ans and n < len(spec["requests"]) - 1:
        exp[request_id(n + 1)] = {"prefill_error": ans.get("exception")}
    return exp


def tester(override: dict | None = None, shrink_candidates=None) -> Tester:
    """This case shape for the harness (``override``: our side only)."""
    return Tester(KV, to_oracle, lambda spec: run_ours(spec, override), compare,
                  shrink_candidates or (lambda spec: []), coverage=coverage_tags)
