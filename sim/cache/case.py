"""Case files: a cache configuration and a sequence of requests served one
after another, as vLLM's KV-cache unit tests (and our oracle) drive the
manager.  Each request is looked up (and reported), prefilled per the
schedule, then freed.

The case runner calls exactly the code ``sim run`` uses (``KVCacheManager``
and the scheduler's split), so a hit length cannot differ between them.
"""
from __future__ import annotations

from sim.errors import InputError

from dataclasses import dataclass

from sim.cache.config import NO_LENGTH_LIMIT, CacheConfig, ConfigError
from sim.cache.kv_manager import KVCacheManager
from sim.cache.prompt import StreamRegistry, parse_prompt
from sim.config.dialects import DIALECT_DEFAULTS
from sim.config.scheduler import build_scheduler

# the scheduler limits a case file takes (built as a scenario's ``scheduler:`` section is,
# with the case file's defaults), and the schedule of its chunks
LIMIT_KEYS = ("long_prefill_token_threshold", "max_num_batched_tokens")
CASE_KEYS = {"schedule", *LIMIT_KEYS}
TOP_KEYS = {"config", "requests", "source", "expect", "description"}


class CaseError(InputError):
    """Bad case input; the message names the field."""


@dataclass(frozen=True)
class CaseSchedule:
    schedule: str | tuple[int, ...] = "scheduler"
    long_prefill_token_threshold: int = DIALECT_DEFAULTS["case file"]["long_prefill_token_threshold"]
    max_num_batched_tokens: int = DIALECT_DEFAULTS["case file"]["max_num_batched_tokens"]


def parse_case(data) -> tuple[CacheConfig, CaseSchedule, list[tuple[str, list, object]]]:
    if not isinstance(data, dict):
        raise CaseError("top level: expected a mapping with config and requests")
    for k in data:
        if k not in TOP_KEYS:
            raise CaseError(f"{k}: unknown key (expected {', '.join(sorted(TOP_KEYS))})")
    cfg_in = data.get("config") or {}
    if not isinstance(cfg_in, dict):
        raise CaseError("config: expected a mapping")
    cache_part = {k: v for k, v in cfg_in.items() if k not in CASE_KEYS}
    try:
        cfg = CacheConfig.from_mapping(cache_part, prefix="config.")
    except ConfigError as e:
        raise CaseError(str(e)) from None
    sched = cfg_in.get("schedule", "scheduler")
    if isinstance(sched, list):
        if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in sched):
            raise CaseError("config.schedule: a list of chunk ends must hold positive integers")
        sched = tuple(sched)
    elif sched not in ("scheduler", "blocks", "whole", "seed"):
        raise CaseError(f"config.schedule: must be scheduler | blocks | whole | seed | "
                        f"[chunk ends], got {sched!r}")
    try:
        limits = build_scheduler({k: cfg_in[k] for k in LIMIT_KEYS if k in cfg_in}, "config.",
                                 "case file")
    except ConfigError as e:
        raise CaseError(str(e)) from None
    reqs_in = data.get("requests")
    if not isinstance(reqs_in, list) or not reqs_in:
        raise CaseError("requests: expected a non-empty list")
    streams = StreamRegistry()
    reqs = []
    seen = set()
    for i, r in enumerate(reqs_in):
        where = f"requests[{i}]"
        if not isinstance(r, dict):
            raise CaseError(f"{where}: expected a mapping with id and prompt")
        for k in r:
            if k not in ("id", "prompt", "report_mode"):
                raise CaseError(f"{where}.{k}: unknown key")
        rid = str(r.get("id", f"r{i}"))
        if rid in seen:
            raise CaseError(f"{where}.id: duplicate id {rid!r}")
        seen.add(rid)
        if "prompt" not in r:
            raise CaseError(f"{where}.prompt: missing")
        runs = parse_runs(r["prompt"], streams, f"{where}.prompt")
        report_mode = r.get("report_mode")
        if report_mode not in (None, "full", "incremental"):
            raise CaseError(f"{where}.report_mode: must be full, incremental or null, "
                            f"got {report_mode!r}")
        reqs.append((rid, runs, report_mode))
    return cfg, CaseSchedule(sched, limits.long_prefill_token_threshold,
                             limits.max_num_batched_tokens), reqs


def parse_runs(prompt, streams: StreamRegistry, where: str) -> list:
    """A request's prompt → runs; a bad prompt, or token ids / positions beyond the
    machine-size integers of the compiled cache, is a ``CaseError`` naming ``where``."""
    try:
        runs = parse_prompt(prompt, streams)
    except ValueError as e:
        raise CaseError(f"{where}: {e}") from None
    total = 0
    for _, off, length in runs:
        total += length
        if off + length > NO_LENGTH_LIMIT or total > NO_LENGTH_LIMIT:
            raise CaseError(f"{where}: token ids and lengths must stay below 2**62, got a "
                            f"segment ending at {off + length:,}")
    return runs


def planned_chunk_ends(schedule, n: int, sched_bs: int, hash_bs: int) -> list[int]:
    if schedule == "whole":
        return [n]
    blocks = set(range(sched_bs, n + 1, sched_bs))
    if schedule == "blocks":
        return sorted(blocks | {n})
    if schedule == "seed":
        return sorted({b - hash_bs for b in blocks} | blocks | {n})
    return sorted(set(schedule) | {n})


def prefill(mgr: KVCacheManager, req, lookup, sched: CaseSchedule) -> list[int]:
    """Prefill ``req`` from its hit to the end of its prompt; returns chunk ends."""
    req.shared_prefix_boundary = lookup.junction
    n = req.num_tokens
    c = mgr.coordinator
    split = mgr.split_policy() if sched.schedule == "scheduler" else None
    planned = None if split else planned_chunk_ends(sched.schedule, n, c.scheduler_block_size,
                                                     c.hash_block_size)
    ends: list[int] = []
    first = True
    while req.num_computed_tokens < n:
        new_local = lookup.hit if first else 0
        start = req.num_computed_tokens + new_local
        if start >= n:
            break
        if split is not None:
            remaining = n - start
            lpt = sched.long_prefill_token_threshold
            if 0 < lpt < remaining:
                remaining = lpt
            remaining = min(remaining, sched.max_num_batched_tokens)
            if mgr.needs_aligned_split:
                num_new = split.split(req.num_prompt_tokens, req.num_tokens,
                                      req.num_computed_tokens, req.shared_prefix_boundary,
                                      remaining, new_local, sched.max_num_batched_tokens, lpt)
            else:
                num_new = remaining
        else:
            num_new = min((e for e in planned if e > start), default=n) - start
        if num_new <= 0:
            break
        ok = mgr.allocate_slots(req, num_new, new_local, lookup.blocks if first else None)
        if not ok:
            raise RuntimeError(f"allocate_slots failed at {start}+{num_new}: pool too small")
        req.num_computed_tokens = start + num_new
        ends.append(req.num_computed_tokens)
        mgr.release_cow_copies()
        mgr.new_step_starts()
        first = False
    return ends


def run_case_data(data, source: str = "<case>") -> list[dict]:
    """Run a parsed case mapping; returns one result dict per request."""
    try:
        cfg, sched, reqs = parse_case(data)
    except CaseError as e:
        raise CaseError(f"{source}: {e}") from None
    try:
        mgr = KVCacheManager(cfg)
    except AssertionError as e:  # vLLM rejects the layout when building the manager
        return [_error_result(rid, runs, type(e).__name__, str(e)) for rid, runs, _ in reqs]
    except ValueError as e:
        raise CaseError(f"{source}: config: {e}") from None
    mamba_gids = [i for i, s in enumerate(cfg.group_specs()) if s.kind == "mamba"]
    results = []
    for rid, runs, report_mode in reqs:
        req = mgr.make_request(rid, runs, report_mode)
        if req.num_prompt_tokens >= cfg.max_model_len:
            # vLLM's API rejects such a prompt before the cache ever sees it
            results.append(_error_result(
                rid, runs, "PromptTooLong", f"prompt of {req.num_prompt_tokens} tokens >= "
                f"max_model_len {cfg.max_model_len} (vLLM rejects it)"))
            continue
        res = {"id": rid, "prompt_tokens": req.num_prompt_tokens, "hit": None,
               "per_group": None, "per_group_error": None, "junction": None,
               "chunk_ends": [], "mamba_states": [], "error": None,
               "events": None if cfg.report_mode is None else []}
        before = {g: set(mgr.cached_positions(req, g)) for g in mamba_gids}
        # The per-group probe (each group alone, vLLM's
        # find_longest_cache_hit_per_group) is a diagnostic, not part of the
        # request's path: when it raises (it does with EAGLE lookahead >= 2 on
        # some shapes) while the real lookup succeeds, the request is fine.
        # Its failure goes in its own field; `error` is the request's own.
        try:
            res["per_group"] = mgr.per_group_hits(req)
        except IndexError as e:
            res["per_group_error"] = f"{type(e).__name__}: {e}"
        try:
            lookup = mgr.get_computed_blocks(req)
        except IndexError as e:
            res["error"] = type(e).__name__
            results.append(res)
            continue
        res["hit"] = lookup.hit
        res["junction"] = lookup.junction
        if lookup.events is not None:
            res["events"] = lookup.events
        try:
            res["chunk_ends"] = prefill(mgr, req, lookup, sched)
        except RuntimeError as e:
            res["error"] = f"{type(e).__name__}: {e}"
        if mamba_gids:
            g = mamba_gids[-1]
            res["mamba_states"] = [p for p in mgr.cached_positions(req, g) if p not in before[g]]
        mgr.free(req)
        mgr.new_step_starts()
        results.append(res)
    return results


def _error_result(rid, runs, err, msg) -> dict:
    return {"id": rid, "prompt_tokens": sum(r[2] for r in runs), "hit": None, "per_group": None,
            "per_group_error": None, "junction": None, "chunk_ends": None, "mamba_states": None, "error": err,
            "events": None, "error_message": msg}
