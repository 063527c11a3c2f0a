#!/usr/bin/env python3
"""Random differential tester: our exact cache model against vLLM 0.33.0's real KV-cache manager.

Usage::

    python tools/diff_vllm.py --seed 1 --cases 600 [--oracle-python PATH] [--oracle-dir DIR]
                              [--keep DIR] [--shrink] [--quiet]

Each random case (seeded, reproducible: case *i* of seed *s* depends only on ``(s, i)``) is a
cache configuration plus a producer and 1-4 consumers.  It runs

* on our side through ``sim.cache.case.run_case_data`` (request 0 = producer, 1 = consumer,
  2.. = the oracle's ``consumers``), prompts written in the ``NAME[@OFF]:LEN`` notation;
* on the oracle side through ``oracle.run_case`` of ``oracle.py`` in the oracle folder (``$VLLM_ORACLE_DIR``)
  (a persistent worker in the oracle venv that imports ``oracle.py`` and calls ``run_case`` on
  each case, exactly what ``oracle.py --file`` does), with every prompt given as literal token
  ids (``{"ids": [...]}``): token ``p`` of stream number ``k`` is id ``(k + 1) * 100000 + p``,
  so prompts share ids exactly where they share stream segments.

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
import copy
import json
import math
import random
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.oracle_worker import (  # noqa: E402  (the worker, venv discovery: shared)
    DEFAULT_ORACLE_DIR,
    OracleWorker,
    default_oracle_python,
    oracle_unavailable,
)

BIG_BUDGET = 1 << 20
STREAM_STRIDE = 100_000  # token id = (stream index + 1) * STREAM_STRIDE + position


# ---------------------------------------------------------------------------- cases --
# A case "spec" is {"config": <our config mapping>, "requests": [[(name, off, len), ...], ...]};
# request 0 is the producer.  Both sides are derived from it.

Segment = tuple  # (stream name, offset, length)

REQUEST_IDS_FIRST = ("producer", "consumer")


def request_id(i: int) -> str:
    return REQUEST_IDS_FIRST[i] if i < 2 else f"consumer{i}"


def prompt_string(segs: list[Segment]) -> str:
    return " ".join(f"{n}@{o}:{ln}" if o else f"{n}:{ln}" for n, o, ln in segs)


def prompt_len(segs: list[Segment]) -> int:
    return sum(s[2] for s in segs)


def normalise(segs: list[Segment]) -> list[Segment]:
    """Merge runs that continue the same stream, drop empty ones."""
    out: list[list] = []
    for n, o, ln in segs:
        if ln <= 0:
            continue
        if out and out[-1][0] == n and out[-1][1] + out[-1][2] == o:
            out[-1][2] += ln
        else:
            out.append([n, o, ln])
    return [tuple(s) for s in out]


def truncate(segs: list[Segment], n: int) -> list[Segment]:
    out = []
    left = n
    for name, off, ln in segs:
        if left <= 0:
            break
        take = min(ln, left)
        out.append((name, off, take))
        left -= take
    return out


def stream_order(spec: dict) -> dict[str, int]:
    order: dict[str, int] = {}
    for segs in spec["requests"]:
        for name, _o, _l in segs:
            order.setdefault(name, len(order))
    return order


def token_ids(segs: list[Segment], order: dict[str, int]) -> list[int]:
    out: list[int] = []
    for name, off, ln in segs:
        base = (order[name] + 1) * STREAM_STRIDE
        out.extend(range(base + off, base + off + ln))
    return out


def to_ours(spec: dict, source: str = "tools/diff_vllm.py") -> dict:
    return {
        "source": source,
        "config": copy.deepcopy(spec["config"]),
        "requests": [{"id": request_id(i), "prompt": prompt_string(segs)}
                     for i, segs in enumerate(spec["requests"])],
    }


ORACLE_KEY = {  # our config key -> oracle case key
    "groups": "layout", "block_size": "block", "mamba_block_size": "mamba_block",
    "hash_block_size": "hash", "eagle": "eagle", "shared_prefix_checkpoint":
    "shared_prefix_checkpoint", "mamba_cache_mode": "mamba_mode", "num_blocks": "num_blocks",
    "schedule": "schedule", "long_prefill_token_threshold": "long_prefill_token_threshold",
    "max_num_batched_tokens": "max_num_scheduled_tokens", "report_mode": "report_mode",
    "prefix_cache_retention_interval": "retention", "num_hash_lookahead_tokens": "lookahead",
}


def to_oracle(spec: dict) -> dict:
    cfg = spec["config"]
    case: dict[str, Any] = {}
    for k, v in cfg.items():
        if k not in ORACLE_KEY:
            raise ValueError(f"config key {k!r} has no oracle counterpart")
        if v is None and k in ("mamba_block_size", "hash_block_size"):
            continue  # omitted: the oracle's default (block / gcd) equals ours
        case[ORACLE_KEY[k]] = copy.deepcopy(v)
    order = stream_order(spec)
    toks = [{"ids": token_ids(segs, order)} for segs in spec["requests"]]
    case["producer"] = toks[0]
    case["consumer"] = toks[1]
    if len(toks) > 2:
        case["consumers"] = toks[2:]
    return case


# ------------------------------------------------------------------------ generator --
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


PROFILES = ("default", "stress", "tiny", "groups")
# "groups": runs of several identical groups (one manager serves a run; see sim/cache/managers.py)
MULTI_MEMBER_LAYOUTS = (["full", "mamba", "mamba", "mamba"], ["full", "full", "mamba", "mamba"],
                        ["full", "swa:W", "swa:W", "mamba"], ["mamba", "mamba", "full"],
                        ["full", "mamba", "full", "mamba", "mamba"],
                        ["full"] + ["mamba"] * 6)


def gen_config(rng: random.Random, profile: str = "default") -> dict:
    """``default``: the layouts and value mixes of the brief.  ``stress``: small pools
    (eviction) most of the time, further multi-group layouts, block sizes that are not powers
    of two, Mamba blocks that are not a multiple of the attention block, lookahead without
    EAGLE and lookahead above the scheduler block.  ``tiny``: the stress mix with blocks of
    2-6 tokens, prompts of a few blocks and pools of a few dozen blocks, many requests.
    ``groups``: the stress mix on layouts with runs of several identical groups."""
    stress = profile in ("stress", "tiny", "groups")
    r = rng.random()
    if profile == "tiny":
        block = rng.choice([2, 2, 3, 4, 4, 6])
    else:
        block = rng.choice([2, 4, 8, 16, 32, 64] + ([6, 12, 24, 48] if stress else []))
    if profile == "groups":
        layout = list(rng.choice(MULTI_MEMBER_LAYOUTS))
    elif profile == "stress" and rng.random() < 0.4:
        layout = rng.choice([["full", "swa:W"], ["swa:W", "mamba"], ["mamba", "mamba"],
                             ["full", "full", "mamba"], ["mamba", "swa:W", "full"],
                             ["mamba", "full", "mamba"]])
    elif r < 0.66:
        layout = ["full", "mamba"]
    elif r < 0.77:
        layout = ["full", "mamba", "mamba"]
    elif r < 0.89:
        layout = ["full", "swa:W", "mamba"]
    else:
        layout = ["mamba", "full"]
    mult = rng.choice([1, 1, 1, 2, 4] + ([8, 1.5, 3, 2.5] if stress else []))
    mblock = int(block * mult)
    if mblock != block * mult:
        mult, mblock = 2, block * 2
    if "swa:W" in layout:
        w = rng.choice([block, 2 * block, 3 * block + rng.randint(1, block), rng.randint(1, 4 * block),
                        4 * mblock])
        layout = [f"swa:{max(1, w)}" if g == "swa:W" else g for g in layout]
    sizes = [block, mblock] if "mamba" in layout else [block]
    g = math.gcd(*sizes)
    sched = math.lcm(*sizes)
    r = rng.random()
    if r < 0.3:
        hash_bs = None
    elif r < 0.5:
        hash_bs = g
    else:
        hash_bs = rng.choice([d for d in _divisors(g) if d < g] or [g])
    eagle = rng.random() < 0.5
    lookahead = 0
    if eagle:
        r = rng.random()
        lookahead = 0 if r < 0.6 else (1 if r < 0.9 else 2)
    if stress:
        r = rng.random()
        if r < 0.05:
            lookahead = rng.choice([1, 2])  # with or without EAGLE
        elif r < 0.08:
            lookahead = rng.choice([3, 4, 5])
    r = rng.random()
    retention = None if r < 0.5 else (0 if r < 0.8 else sched * rng.randint(1, 4))
    r = rng.random()
    if r < 0.65:
        schedule: Any = "scheduler"
    elif r < 0.75:
        schedule = "blocks"
    elif r < 0.83:
        schedule = "whole"
    elif r < 0.9:
        schedule = "seed"
    else:
        schedule = "ENDS"  # filled in once the prompts are known
    lpt = 0 if rng.random() < 0.75 else rng.randint(1, 3 * sched)
    budget = BIG_BUDGET if rng.random() < 0.75 else rng.choice(
        [rng.randint(1, 3 * sched), sched * rng.randint(1, 3), rng.randint(1, max(1, block))])
    r = rng.random()
    report_mode = None if r < 0.78 else ("full" if r < 0.95 else "incremental")
    small_pool = 0.2 if profile == "default" else 0.7
    num_blocks = rng.randint(256, 1024) if rng.random() >= small_pool else rng.randint(16, 64)
    if profile == "tiny" and num_blocks < 256:
        num_blocks = rng.randint(6, 40)
    if stress and rng.random() < 0.05:
        num_blocks = rng.randint(2, 16)
    cfg: dict[str, Any] = {"groups": layout, "block_size": block}
    if "mamba" in layout and (mult > 1 or rng.random() < 0.3):
        cfg["mamba_block_size"] = mblock
    if hash_bs is not None:
        cfg["hash_block_size"] = hash_bs
    cfg.update({
        "eagle": eagle, "shared_prefix_checkpoint": rng.random() < 0.4,
        "mamba_cache_mode": "align", "num_blocks": num_blocks, "schedule": schedule,
        "long_prefill_token_threshold": lpt, "max_num_batched_tokens": budget,
        "report_mode": report_mode, "prefix_cache_retention_interval": retention,
        "num_hash_lookahead_tokens": lookahead,
    })
    # A few deliberately invalid configurations exercise validation agreement.
    r = rng.random()
    if r < 0.015:
        cfg["hash_block_size"] = g + 1 if g > 1 else 3
    elif r < 0.03:
        cfg["prefix_cache_retention_interval"] = sched + rng.randint(1, max(1, sched - 1))
    return cfg


def _sizes(cfg: dict) -> tuple[int, int, int]:
    block = cfg["block_size"]
    mblock = (cfg.get("mamba_block_size") or block) if "mamba" in cfg["groups"] else block
    sched = math.lcm(block, mblock)
    h = cfg.get("hash_block_size") or math.gcd(block, mblock)
    return sched, h, block


def pick_len(rng: random.Random, sched: int, h: int, max_units: float = 6.0, lo: int = 1) -> int:
    hi = max(lo, int(max_units * sched))
    r = rng.random()
    if r < 0.3:
        n = rng.randint(lo, hi)
    elif r < 0.65:
        n = rng.randint(1, max(1, int(max_units))) * sched + rng.choice([-h, -1, 0, 0, 1, h])
    else:
        n = rng.randint(1, max(1, hi // h)) * h + rng.choice([-1, 0, 0, 1])
    return max(lo, min(n, hi))


def gen_requests(rng: random.Random, cfg: dict, profile: str = "default") -> list[list[Segment]]:
    sched, h, _ = _sizes(cfg)
    # Keep prompts short enough to be cheap (and to fit a small pool most of the time).
    cap = 2500
    max_units = min(6.0 if profile != "tiny" else 4.0, cap / (2 * sched))
    names = iter(f"C{i}" if i else "C" for i in range(100))
    turns = iter(f"T{i}" for i in range(1, 100))
    sys_len = pick_len(rng, sched, h, max_units)
    priv = 0 if rng.random() < 0.15 else pick_len(rng, sched, h, max_units / 2)
    reqs: list[list[Segment]] = [normalise([("S", 0, sys_len), ("P", 0, priv)])]
    counts = {"default": [1, 1, 2, 2, 3, 4], "stress": [2, 3, 4, 5, 6], "groups": [2, 3, 4, 5, 6],
              "tiny": [2, 3, 4, 5, 6, 7, 8]}[profile]
    for _ in range(rng.choice(counts)):
        kind = rng.choices(["shared", "replay", "prefix", "extend", "multiturn", "fresh", "splice"],
                           [35, 12, 15, 12, 18, 8, 0 if profile == "default" else 10])[0]
        base = rng.choice(reqs)
        if kind == "shared":
            r = rng.random()
            n = sys_len if r < 0.6 else pick_len(rng, sched, h, max_units)
            segs = [("S", 0, n), (next(names), 0, pick_len(rng, sched, h, max_units / 2))]
        elif kind == "replay":
            segs = list(base)
        elif kind == "prefix":
            n = prompt_len(base)
            segs = truncate(base, max(1, min(n, pick_len(rng, sched, h, max(1.0, n / sched)))))
        elif kind == "extend":
            segs = list(base) + [(next(names), 0, pick_len(rng, sched, h, max_units / 2))]
        elif kind == "multiturn":
            segs = list(reqs[-1]) + [(next(turns), 0, pick_len(rng, sched, h, max_units / 3))]
        elif kind == "splice":
            # a prefix of one request, then a piece of another from the middle of its stream
            other = rng.choice(reqs)
            name, off, ln = rng.choice(other)
            cut = rng.randint(0, ln - 1)
            segs = truncate(base, rng.randint(1, prompt_len(base))) + [(name, off + cut, ln - cut)]
        else:
            segs = [(next(names), 0, pick_len(rng, sched, h, max_units))]
        if prompt_len(segs) > cap:
            segs = truncate(segs, cap)
        reqs.append(normalise(segs))
    return reqs


def gen_case(seed: int, index: int, profile: str = "default") -> dict:
    tag = "" if profile == "default" else f":{profile}"
    rng = random.Random(f"diff_vllm:{seed}:{index}{tag}")
    cfg = gen_config(rng, profile)
    reqs = gen_requests(rng, cfg, profile)
    if cfg["schedule"] == "ENDS":
        n = max(prompt_len(r) for r in reqs)
        k = rng.randint(1, 5)
        cfg["schedule"] = sorted(set(rng.randint(1, max(1, n)) for _ in range(k)))
    if cfg["num_blocks"] < 256:
        # A small pool: mostly big enough for the producer (eviction across requests), sometimes
        # not (both sides must fail the same way).
        sched, _h, block = _sizes(cfg)
        need = len(cfg["groups"]) * (prompt_len(reqs[0]) // block + 3)
        if rng.random() < 0.85 and cfg["num_blocks"] < need:
            cfg["num_blocks"] = min(1024, need + rng.randint(0, 16))
    return {"config": cfg, "requests": reqs}


# ------------------------------------------------------------------------ our side --
@dataclass
class Ours:
    results: list[dict] | None = None
    case_error: str | None = None
    crash: str | None = None


def run_ours(spec: dict, override: dict | None = None) -> Ours:
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
@dataclass
class Mismatch:
    field: str
    request: str
    ours: Any
    oracle: Any


@dataclass
class Verdict:
    status: str  # "compared" | "both_reject" | "oracle_unsupported"
    lookups: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)


def _cls(text: str | None) -> str | None:
    if not text:
        return None
    return text.split(":", 1)[0].strip()


def _oracle_events(evs: list[dict]) -> list[dict]:
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
        return Verdict("compared", 0, [Mismatch("crash", "-", ours.crash.strip().splitlines()[-1],
                                                ans.get("exception"))])
    if not oracle_built:
        if "UnitaryKVCacheCoordinator" in str(ans.get("exception_msg")):
            # oracle.py reads coordinator.hash_block_size, which the single-group coordinator
            # lacks: the harness cannot run one-group layouts at all.
            return Verdict("oracle_unsupported")
        if ours.case_error is not None:
            return Verdict("both_reject")
        our_errs = {r.get("error") for r in ours.results}
        if len(our_errs) == 1 and all(r.get("hit") is None for r in ours.results):
            err = our_errs.pop()
            if _cls(err) == ans.get("exception"):
                return Verdict("both_reject")
            return Verdict("compared", 0, [Mismatch("construction", "-", err, ans.get("exception"))])
        return Verdict("compared", 0, [Mismatch(
            "construction", "-", "accepted",
            f"{ans.get('exception')}: {ans.get('exception_msg')}")])
    if ours.case_error is not None:
        return Verdict("compared", 0, [Mismatch("construction", "-", f"CaseError: {ours.case_error}",
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
        return Verdict("compared", lookups, mm)
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
            want = _oracle_events(c["events"])
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
    return Verdict("compared", lookups, mm)


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
            e["events"] = _oracle_events(c["events"])
        exp[request_id(j + 1)] = e
    n = len(ans.get("consumers") or [])
    if "consumers" in ans and n < len(spec["requests"]) - 1:
        exp[request_id(n + 1)] = {"prefill_error": ans.get("exception")}
    return exp


def case_yaml(spec: dict, ans: dict | None, source: str, note: str | None = None,
              ours_override: dict | None = None) -> str:
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
            c["events"] = _oracle_events(c["events"])
    return out


def report_mismatch(label: str, spec: dict, ours: Ours, ans: dict, verdict: Verdict,
                    stream=sys.stdout, ours_override: dict | None = None) -> str:
    fields = ", ".join(sorted({f"{m.field}@{m.request}" for m in verdict.mismatches}))
    text = case_yaml(spec, ans, f"tools/diff_vllm.py {label}", f"mismatch: {fields}",
                     ours_override)
    lines = [f"=== MISMATCH {label}: {fields}"]
    for m in verdict.mismatches:
        lines.append(f"  {m.field} @ {m.request}: ours={json.dumps(m.ours)} oracle={json.dumps(m.oracle)}")
    lines.append("--- case (our yaml; expect = oracle):")
    lines.append(text.rstrip())
    lines.append("--- ours: " + json.dumps(_brief_ours(ours)))
    lines.append("--- oracle: " + json.dumps(_brief_oracle(ans), default=str))
    out = "\n".join(lines) + "\n"
    stream.write(out)
    return text


# ------------------------------------------------------------------------- shrinking --
def _spec_key(spec: dict) -> str:
    return json.dumps(spec, sort_keys=True, default=list)


def shrink_candidates(spec: dict) -> list[dict]:
    cands: list[dict] = []
    cfg = spec["config"]
    reqs = spec["requests"]

    def with_cfg(**kw) -> None:
        s = copy.deepcopy(spec)
        for k, v in kw.items():
            if v is None and k in ("mamba_block_size", "hash_block_size"):
                s["config"].pop(k, None)
            else:
                s["config"][k] = v
        cands.append(s)

    # 1. fewer requests (keep the producer and at least one consumer)
    for i in range(len(reqs) - 1, 0, -1):
        if len(reqs) > 2:
            s = copy.deepcopy(spec)
            del s["requests"][i]
            cands.append(s)
    # 2. default config values
    if cfg.get("report_mode") is not None:
        with_cfg(report_mode=None)
    if cfg.get("prefix_cache_retention_interval") is not None:
        with_cfg(prefix_cache_retention_interval=None)
    if cfg.get("long_prefill_token_threshold"):
        with_cfg(long_prefill_token_threshold=0)
    if cfg.get("max_num_batched_tokens") != BIG_BUDGET:
        with_cfg(max_num_batched_tokens=BIG_BUDGET)
    if cfg.get("schedule") != "scheduler":
        with_cfg(schedule="scheduler")
        if isinstance(cfg.get("schedule"), list) and len(cfg["schedule"]) > 1:
            for k in range(len(cfg["schedule"])):
                with_cfg(schedule=cfg["schedule"][:k] + cfg["schedule"][k + 1:])
    if cfg.get("shared_prefix_checkpoint"):
        with_cfg(shared_prefix_checkpoint=False)
    if cfg.get("num_hash_lookahead_tokens"):
        with_cfg(num_hash_lookahead_tokens=0)
        if cfg["num_hash_lookahead_tokens"] > 1:
            with_cfg(num_hash_lookahead_tokens=1)
    if cfg.get("eagle") and not cfg.get("num_hash_lookahead_tokens"):
        with_cfg(eagle=False)
    if cfg.get("num_blocks") != 256:
        with_cfg(num_blocks=256)
    if cfg.get("groups") != ["full", "mamba"]:
        with_cfg(groups=["full", "mamba"])
        if len(cfg["groups"]) == 3:
            for k in range(3):
                g = cfg["groups"][:k] + cfg["groups"][k + 1:]
                if "mamba" in g:
                    with_cfg(groups=g)
    if cfg.get("hash_block_size") is not None:
        with_cfg(hash_block_size=None)
    mb = cfg.get("mamba_block_size")
    if mb is not None:
        with_cfg(mamba_block_size=None)
        if mb // cfg["block_size"] == 4:
            with_cfg(mamba_block_size=mb // 2)
    # 3. smaller block sizes with every length scaled down
    b = cfg["block_size"]
    if b >= 4:
        s = copy.deepcopy(spec)
        sc = s["config"]
        ok = True
        for k in ("block_size", "mamba_block_size", "hash_block_size",
                  "prefix_cache_retention_interval"):
            v = sc.get(k)
            if v:
                if v % 2:
                    ok = False
                sc[k] = v // 2
        for g_i, g in enumerate(sc["groups"]):
            if g.startswith("swa:"):
                sc["groups"][g_i] = f"swa:{max(1, int(g[4:]) // 2)}"
        for k in ("long_prefill_token_threshold", "max_num_batched_tokens"):
            if sc.get(k) and sc[k] != BIG_BUDGET:
                sc[k] = max(1, sc[k] // 2)
        if isinstance(sc.get("schedule"), list):
            sc["schedule"] = sorted({max(1, e // 2) for e in sc["schedule"]})
        s["requests"] = [normalise([(n, o // 2, (o + ln) // 2 - o // 2) for n, o, ln in segs])
                         for segs in s["requests"]]
        if ok and all(s["requests"]):
            cands.append(s)
    # 4. shorter streams: shorten every segment of one stream ending at the same length
    ends: dict[tuple[str, int], None] = {}
    for segs in reqs:
        for n, o, ln in segs:
            ends[(n, o + ln)] = None
    unit = cfg.get("hash_block_size") or 1
    for (name, end) in ends:
        for new_end in sorted({0, end // 2, end - unit, end - 1}):
            if new_end < 0 or new_end >= end:
                continue
            s = copy.deepcopy(spec)
            new_reqs = []
            for segs in s["requests"]:
                out = []
                for n, o, ln in segs:
                    if n == name and o + ln == end:
                        ln = max(0, new_end - o)
                    out.append((n, o, ln))
                new_reqs.append(normalise(out))
            if all(new_reqs):
                s["requests"] = new_reqs
                cands.append(s)
    return cands


def shrink(spec: dict, field_name: str, worker: OracleWorker, max_rounds: int = 200,
           ours_override: dict | None = None) -> dict:
    """Greedy: take the first candidate that still mismatches on ``field_name``."""
    seen = {_spec_key(spec)}
    for _ in range(max_rounds):
        cands = []
        for c in shrink_candidates(spec):
            k = _spec_key(c)
            if k not in seen:
                seen.add(k)
                cands.append(c)
        if not cands:
            break
        answers = worker.run([to_oracle(c) for c in cands])
        for c, ans in zip(cands, answers):
            v = compare(c, run_ours(c, ours_override), ans)
            if any(m.field == field_name for m in v.mismatches):
                spec = c
                break
        else:
            break
    return spec


# ------------------------------------------------------------------------------ run --
@dataclass
class Summary:
    cases: int = 0
    compared_cases: int = 0
    both_reject: int = 0
    oracle_unsupported: int = 0
    lookups: int = 0
    mismatch_cases: int = 0
    by_field: dict[str, int] = field(default_factory=dict)
    coverage: dict[str, int] = field(default_factory=dict)
    answers: list[dict] = field(default_factory=list)
    reports: list[dict] = field(default_factory=list)


def run_diff(seed: int, n_cases: int, worker: OracleWorker, start: int = 0,
             on_mismatch=None, profile: str = "default",
             ours_override: dict | None = None) -> Summary:
    """Generate cases ``start .. start + n_cases - 1`` of ``seed`` and compare both sides.

    ``ours_override`` (config keys) is applied to our side only: a mutation check that the
    differential notices a semantic change (e.g. ``{"prompt_checkpoint": "seed"}``).
    """
    specs = [gen_case(seed, start + i, profile) for i in range(n_cases)]
    answers = worker.run([to_oracle(s) for s in specs])
    summ = Summary(answers=answers)
    for k, (spec, ans) in enumerate(zip(specs, answers)):
        idx = start + k
        ours = run_ours(spec, ours_override)
        v = compare(spec, ours, ans)
        summ.cases += 1
        if v.status == "both_reject":
            summ.both_reject += 1
            continue
        if v.status == "oracle_unsupported":
            summ.oracle_unsupported += 1
            continue
        summ.compared_cases += 1
        summ.lookups += v.lookups
        for t in coverage_tags(spec, ans):
            summ.coverage[t] = summ.coverage.get(t, 0) + 1
        if v.mismatches:
            summ.mismatch_cases += 1
            for f in sorted({m.field for m in v.mismatches}):
                summ.by_field[f] = summ.by_field.get(f, 0) + 1
            rep = {"label": f"seed {seed} case {idx}" + ("" if profile == "default" else f" profile {profile}"), "seed": seed, "index": idx, "spec": spec,
                   "ours": ours, "answer": ans, "verdict": v}
            summ.reports.append(rep)
            if on_mismatch:
                on_mismatch(rep)
    return summ


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=600)
    ap.add_argument("--start", type=int, default=0, help="index of the first case (default 0)")
    ap.add_argument("--oracle-python", type=Path, default=None,
                    help="python of the oracle venv (default $VLLM_ORACLE_PYTHON or "
                         "~/.vllm-oracle/venv/bin/python)")
    ap.add_argument("--oracle-dir", type=Path, default=DEFAULT_ORACLE_DIR,
                    help="directory holding oracle.py (default %(default)s)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="write cases, answers and one YAML file per mismatch here")
    ap.add_argument("--shrink", action="store_true",
                    help="minimise each mismatching case before printing it")
    ap.add_argument("--quiet", action="store_true",
                    help="summary only (mismatching cases still go to --keep)")
    ap.add_argument("--profile", choices=PROFILES, default="default",
                    help="case mix: default (the brief's), stress (small pools, more "
                         "requests, further layouts and sizes), tiny (stress with 2-6 token "
                         "blocks and short prompts) or groups (stress with runs of several "
                         "identical groups, e.g. Nemotron-H's one attention + six Mamba)")
    ap.add_argument("--ours-config", action="append", default=[], metavar="KEY=YAML",
                    help="override a config key on OUR side only (mutation check: the run "
                         "must then report mismatches), e.g. prompt_checkpoint=seed")
    args = ap.parse_args(argv)

    py = args.oracle_python or default_oracle_python()
    why = oracle_unavailable("oracle", py, args.oracle_dir)
    if why:
        print(f"skipped: {why}")
        return 0

    override: dict[str, Any] = {}
    for item in args.ours_config:
        k, _, val = item.partition("=")
        override[k] = yaml.safe_load(val)
    t0 = time.perf_counter()
    worker = OracleWorker(py, args.oracle_dir.resolve())
    keep = args.keep
    if keep:
        (keep / "mismatches").mkdir(parents=True, exist_ok=True)

    def on_mismatch(rep: dict) -> None:
        spec, ans, v = rep["spec"], rep["answer"], rep["verdict"]
        ours = rep["ours"]
        if args.shrink:
            small = shrink(spec, v.mismatches[0].field, worker, ours_override=override or None)
            if small is not spec:
                ans = worker.run([to_oracle(small)])[0]
                ours = run_ours(small, override or None)
                v = compare(small, ours, ans)
                spec = small
                rep.update(small=small, small_answer=ans, small_verdict=v)
        label = rep["label"] + (" (shrunk)" if args.shrink else "")
        if args.quiet:
            text = case_yaml(spec, ans, f"tools/diff_vllm.py {label}", None, override or None)
        else:
            text = report_mismatch(label, spec, ours, ans, v, ours_override=override or None)
        if keep:
            name = f"s{rep['seed']}_{args.profile}_c{rep['index']}_{v.mismatches[0].field}.yaml"
            (keep / "mismatches" / name).write_text(
                "# " + "; ".join(f"{m.field}@{m.request}: ours={json.dumps(m.ours)} "
                                 f"oracle={json.dumps(m.oracle)}" for m in v.mismatches)
                + "\n" + text)

    try:
        summ = run_diff(args.seed, args.cases, worker, args.start, on_mismatch, args.profile,
                        override or None)
        if keep:
            specs = [gen_case(args.seed, args.start + i, args.profile) for i in range(args.cases)]
            (keep / "cases.json").write_text(json.dumps([to_oracle(s) for s in specs]))
            (keep / "cases_ours.json").write_text(json.dumps([to_ours(s) for s in specs]))
            (keep / "answers.json").write_text(json.dumps(summ.answers, default=str))
    finally:
        version = worker.version
        worker.close()
    dt = time.perf_counter() - t0
    print(f"diff_vllm: seed {args.seed}, profile {args.profile}, cases {args.start}.."
          f"{args.start + args.cases - 1}, oracle vllm {version}, {dt:.1f} s"
          + (f", OUR side overridden: {override}" if override else ""))
    print(f"  cases: {summ.cases} ({summ.compared_cases} compared, {summ.both_reject} rejected by "
          f"both at construction, {summ.oracle_unsupported} the oracle cannot run)")
    print(f"  lookups compared: {summ.lookups} (producers + consumer lookups)")
    print("  coverage (consumer lookups, or cases for partial_hash_hits/prefill_out_of_blocks): "
          + ", ".join(f"{k} {v}" for k, v in sorted(summ.coverage.items())))
    print(f"  mismatching cases: {summ.mismatch_cases}")
    for f, n in sorted(summ.by_field.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"    {f}: {n}")
    return 1 if summ.mismatch_cases else 0


if __name__ == "__main__":
    sys.exit(main())
