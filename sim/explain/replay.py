"""Re-simulate up to one request's lookup, and stop there.

Nothing is recorded during ordinary runs: ``sim explain`` replays the run (the scenario
``run.json`` records, same overrides, same seed) or the case file, and stops at the
request's first admission.  A run is stopped through ``simulate``'s ``prepare`` hook: the
scheduler's waiting queue (the policy object it asks for the next request right before
each admission lookup, ``peek_request``, and pops once the request is admitted,
``pop_request``) is replaced by the same policy with a watch on one request, so the facts
are read on the pool exactly as that lookup saw it, and the replay ends at the pop.  A case
file runs as ``sim case`` runs it (``sim/cache/case.py``) up to the request.

``Lookup`` is what a replay returns: the facts (or only the hit, for a counterfactual).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sim.cache.case import CaseError, CaseSchedule, parse_case, prefill
from sim.cache.config import CacheConfig
from sim.cache.evictions import EvictionLog
from sim.cache.kv_manager import KVCacheManager
from sim.engine.scheduler import StopReplay
from sim.errors import ConfigError
from sim.explain.facts import Facts, gather


class ExplainError(CaseError):
    """Bad input to ``sim explain`` (an unknown request, a folder that is not a run
    folder): one line, exit 2."""


@dataclass
class Lookup:
    """One request's lookup in a replay: its hit, the facts when asked for, or why there
    was no lookup (``refused``: rejected on arrival; ``error``: vLLM raises there)."""

    hit: int | None
    facts: Facts | None = None
    refused: str | None = None
    error: str | None = None


class Requests:
    """The requests looked up so far and how much of their prefix each computed (its
    computed tokens, or what it had computed when it was last preempted, if more): how
    far *earlier* requests computed a given prefix (``facts.Reach``), and how far those
    still computing their prompt (admitted in a run, not through it yet) will."""

    def __init__(self) -> None:
        self.seen: list = []                      # (CacheRequest, SimRequest | None)
        self.before_preemption: dict[str, int] = {}

    def add(self, cache_req, sim_req=None) -> None:
        self.seen.append((cache_req, sim_req))

    def preempted(self, rid: str, computed: int) -> None:
        if computed > self.before_preemption.get(rid, 0):
            self.before_preemption[rid] = computed

    def reach(self, req) -> tuple[int, str | None, int, str | None]:
        t = req.block_hashes
        h = t.unit
        if t.count == 0:
            return 0, None, 0, None
        mine = t.keys()
        best, by, ahead, ahead_by = 0, None, 0, None
        for x, r in self.seen:
            if x is req:
                continue
            ever = max(x.num_computed_tokens, self.before_preemption.get(x.request_id, 0))
            running = (r is not None and r.hit_tokens >= 0 and r.finish_ns < 0
                       and x.num_computed_tokens < x.num_prompt_tokens)
            upto = max(ever, x.num_prompt_tokens if running else 0)
            xk = x.block_hashes
            hi = min(upto // h, xk.count, t.count)     # units it (will have) computed
            if (hi * h <= best and hi * h <= ahead) or hi == 0 or xk.key(0) != mine[0]:
                continue
            lo = 1              # units known shared (keys chain: shared up to a point)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if xk.key(mid - 1) == mine[mid - 1]:
                    lo = mid
                else:
                    hi = mid - 1
            done = min(lo, ever // h) * h
            if done > best:
                best, by = done, x.request_id
            if running and lo * h > ahead:
                ahead, ahead_by = lo * h, x.request_id
        return best, by, ahead, ahead_by


def _hit_only(kv, req) -> Lookup:
    try:
        return Lookup(kv.get_computed_blocks(req).hit)
    except IndexError as e:
        return Lookup(None, error=f"{type(e).__name__}: {e} (vLLM raises in this lookup)")


def _facts(kv, req, history: Requests, evicted, time_ns: int | None) -> Lookup:
    try:
        f = gather(kv, req, history, evicted)
    except IndexError as e:
        return Lookup(None, error=f"{type(e).__name__}: {e} (vLLM raises in this lookup)")
    f.time_ns = time_ns
    return Lookup(f.hit, f)


# ----------------------------------------------------------------------- case files --

def case_lookup(data, source: str, target: str | None, flip: dict | None = None,
                facts: bool = True) -> tuple[str, Lookup]:
    """Run the case mapping ``data`` as ``sim case`` does up to request ``target`` (None:
    the last) and look it up; ``flip``: ``CacheConfig`` fields changed first (a bad value
    raises ``ConfigError``).  Returns (the request's id, its lookup)."""
    try:
        cfg, sched, reqs = parse_case(data)
    except CaseError as e:
        raise CaseError(f"{source}: {e}") from None
    ids = [rid for rid, _, _ in reqs]
    if target is None:
        target = ids[-1]
    elif target not in ids:
        raise ExplainError(f"{source}: no request {target!r} (requests: {', '.join(ids)})")
    if flip:
        cfg = _replace(cfg, flip)
    try:
        mgr = KVCacheManager(cfg)
    except AssertionError as e:
        return target, Lookup(None, error=f"vLLM rejects this layout: {e}")
    except ValueError as e:
        raise ConfigError("config", str(e)) from None
    log = EvictionLog()
    mgr.enable_eviction_log(log)
    history = Requests()

    def evicted(key: int):
        got = log.get(key)
        return None if got is None else (None, got[1])   # (a case file has no clock)

    for rid, runs, report_mode in reqs:
        req = mgr.make_request(rid, runs, report_mode)
        if req.num_prompt_tokens >= cfg.max_model_len:
            if rid == target:
                return target, Lookup(None, refused=f"prompt of {req.num_prompt_tokens} tokens "
                                      f">= max_model_len {cfg.max_model_len}")
            continue
        if rid == target:
            return target, (_facts(mgr, req, history, evicted, None) if facts
                            else _hit_only(mgr, req))
        _serve(mgr, req, sched, history)
    raise AssertionError("unreachable: the target is one of the case's requests")


def _serve(mgr: KVCacheManager, req, sched: CaseSchedule, history: Requests) -> None:
    """One request of a case, as ``run_case_data`` serves it: lookup, prefill, free."""
    history.add(req)
    try:
        lookup = mgr.get_computed_blocks(req)
    except IndexError:
        return
    try:
        prefill(mgr, req, lookup, sched)
    except RuntimeError:
        pass
    mgr.free(req)
    mgr.new_step_starts()


def _replace(cfg: CacheConfig, flip: dict) -> CacheConfig:
    """``cfg`` with some fields changed (validated again: a bad value is a ConfigError)."""
    return dataclasses.replace(cfg, **flip)


# ------------------------------------------------------------------------------ runs --

class _Watch:
    """The waiting queue's watcher (``sim.engine.scheduler.QueueWatcher``) for one request:
    every request's history (arrivals, put-backs), the pool as the watched request's
    admission lookup sees it, and the replay's end at that admission."""

    def __init__(self, target: str, facts: bool):
        self.target = target
        self.facts = facts
        self.history = Requests()
        self.last_recomputed: dict[str, int] = {}
        self.found: Lookup | None = None
        self.admitted_once = False
        self.sched = None
        self.engine = None

    def prepare(self, dep, sched, engine) -> None:
        """``simulate``'s hook: watch the scheduler's waiting queue (and, for facts, turn
        on the pool's eviction log)."""
        self.sched, self.engine = sched, engine
        kv = dep.kv
        if self.facts and kv.eviction_log is None:
            kv.enable_eviction_log(EvictionLog())
        sched.watchers.append(self)

    def arrived(self, r) -> None:
        self.history.add(r.cache, r)

    def put_back(self, r) -> None:
        rid = r.cache.request_id
        before = self.last_recomputed.get(rid, 0)
        self.history.preempted(rid, r.recomputed_tokens - before)
        self.last_recomputed[rid] = r.recomputed_tokens

    def looking_at(self, r) -> None:
        if r.cache.request_id != self.target or r.hit_tokens >= 0 \
                or r.cache.num_computed_tokens != 0:
            return
        kv = self.sched.kv     # (the scheduler's admission lookup comes next, on this pool)
        if self.facts:
            self.found = _facts(kv, r.cache, self.history, kv.eviction_of, self.sched.sched_time)
        else:
            self.found = _hit_only(kv, r.cache)

    def admitted(self, r, first: bool) -> None:
        if first and r.cache.request_id == self.target:
            self.admitted_once = True
            raise StopReplay


def run_lookup(sc, target: str, facts: bool = True, traces=None) -> Lookup:
    """Replay scenario ``sc`` up to request ``target``'s first admission and return its
    lookup; ``refused`` when it was rejected on arrival, ``ExplainError`` when no such
    request arrives.  ``traces``: the records to replay instead of the scenario's workload
    (a fleet's replica: ``sim/explain/__init__.py``)."""
    from sim.commands.run import simulate

    w = _Watch(target, facts)
    try:
        simulate(sc, prepare=w.prepare, traces=traces)
    except StopReplay:
        pass
    if w.admitted_once and w.found is not None:
        return w.found
    eng = w.engine
    for r in (eng.rejected if eng is not None else []):
        if r.cache.request_id == target:
            from sim.engine.replica import why_rejected

            return Lookup(None, refused=why_rejected(w.sched, r))
    raise ExplainError(f"{sc.name}: request {target!r} never arrived in the replay")
