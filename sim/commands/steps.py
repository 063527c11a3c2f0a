"""Step case files: the ``sim run`` engine and scheduler, unchanged, driven by a
backend whose every step lasts one time unit, so times *are* step indices
(one per ``schedule()`` call, from 0) and can be compared with vLLM's real
scheduler (``sched_oracle.py`` of the optional vLLM oracle, ``$VLLM_ORACLE_DIR``) step for step.
"""
from __future__ import annotations

from sim.config.fields import show  # (values in messages: a short prefix)

from dataclasses import dataclass

from backends.base import FixedStep
from sim.cache.case import CASE_KEYS, CaseError, parse_runs
from sim.cache.config import NO_LENGTH_LIMIT, CacheConfig
from sim.cache.prompt import StreamRegistry
from sim.errors import CapacityError, ConfigError
from sim.config.scheduler import build_scheduler, with_model_len
from sim.engine.engine import Engine
from sim.engine.observers import StepLog
from sim.engine.scheduler import Scheduler, SimRequest
from sim.engine.tiered_scheduler import TieredScheduler

# the scheduler's keys of a step case (built as a scenario's ``scheduler:`` section is, with
# the step case's defaults; its max_model_len is its cache's), and the drafter's
SCHEDULER_KEYS = ("max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold",
                  "num_speculative_tokens", "policy", "lpm_max_wait_steps", "lpm_max_queue")
STEP_KEYS = {*SCHEDULER_KEYS, "accepted_tokens", "eagle_lookahead_hashes"}
UNIT_S = 1e-9   # one step = one engine nanosecond
# vLLM's KV cache events (sim/cache/events.py): the switch (``KVEventsConfig``), the default
# ``kv_cache_report_mode`` of every request, and the corrected stream instead of vLLM's
EVENT_KEYS = ("enable_kv_cache_events", "report_mode", "kv_events_fix_emit")
# the CPU tier (vLLM's --kv-offloading-size, the offload oracle's keys): on when
# kv_offloading_size_bytes is set; a chunk is blocks_per_chunk GPU blocks of one group,
# kv_bytes_per_block each, rounded up to page_size_alignment; transfers complete a fixed
# number of steps after the step that issues them (the oracle's stand-in worker)
OFFLOAD_KEYS = ("kv_offloading_size_bytes", "kv_bytes_per_block", "page_size_alignment",
                "eviction_policy", "offload_block_size", "blocks_per_chunk", "transfer_steps",
                "load_steps", "store_steps", "offload_prompt_only")
REPORT_MODES = (None, "full", "incremental")


@dataclass
class StepArrival:
    """One request of a step case as the engine takes an arrival (the fields a workload's
    ``TraceRequest`` has that the engine reads): arrival in engine steps."""

    request_id: str
    arrival_s: float
    segments: list
    output_tokens: int
    session: str | None = None
    after: str | None = None
    think_s: float = 0.0


def _int(name, v, lo, prefix="config."):
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise CaseError(f"{prefix}{name}: must be an integer >= {lo}, got {show(v)}")
    if v > NO_LENGTH_LIMIT:
        raise CaseError(f"{prefix}{name}: must be below 2**62, got {v}")
    return v


def parse_steps(data):
    if not isinstance(data, dict):
        raise CaseError("top level: expected a mapping with config and requests")
    for k in data:
        if k not in ("config", "requests", "source", "expect", "description",
                     "expect_kv_events", "expect_offload_steps"):
            raise CaseError(f"{k}: unknown key")
    cfg_in = data.get("config") or {}
    if not isinstance(cfg_in, dict):
        raise CaseError(f"config: expected a mapping, got {show(cfg_in)}")
    cfg_in = dict(cfg_in)
    sched_keys = {k: cfg_in.pop(k) for k in list(cfg_in) if k in STEP_KEYS}
    events = {k: cfg_in.pop(k) for k in EVENT_KEYS if k in cfg_in}   # (not cache keys here)
    offload = parse_offload({k: cfg_in.pop(k) for k in OFFLOAD_KEYS if k in cfg_in})
    for k in ("enable_kv_cache_events", "kv_events_fix_emit"):
        if not isinstance(events.get(k, False), bool):
            raise CaseError(f"config.{k}: must be true or false, got {show(events[k])}")
    if events.get("report_mode") not in REPORT_MODES:
        raise CaseError(f"config.report_mode: must be full, incremental or null, got "
                        f"{show(events['report_mode'])}")
    for k in list(cfg_in):
        if k in CASE_KEYS - {"max_num_batched_tokens", "long_prefill_token_threshold"}:
            cfg_in.pop(k)  # schedule: the scheduler decides chunking here
    eagle = bool(cfg_in.get("eagle", False))
    lookahead_hashes = sched_keys.get("eagle_lookahead_hashes", False)
    for name, v in (("eagle", cfg_in.get("eagle", False)),
                    ("eagle_lookahead_hashes", lookahead_hashes)):
        if not isinstance(v, bool):
            raise CaseError(f"config.{name}: must be true or false, got {show(v)}")
    if lookahead_hashes and eagle and offload is None:
        # (a KV connector keeps the legacy hashes: vLLM's num_hash_lookahead_tokens is 0)
        cfg_in.setdefault("num_hash_lookahead_tokens", 1)
    if eagle:
        cfg_in.setdefault("num_prefill_lookahead", 1)
    limits = {k: sched_keys[k] for k in SCHEDULER_KEYS if k in sched_keys}
    limits.setdefault("num_speculative_tokens", 1 if eagle else 0)
    try:
        sc = build_scheduler(limits, "config.", "step case")
    except ConfigError as e:
        raise CaseError(str(e)) from None
    K = sc.num_speculative_tokens
    budget = sc.max_num_batched_tokens
    # a served model's Mamba spec holds one state block per speculative token
    cfg_in.setdefault("mamba_num_speculative_blocks", K)
    # vLLM resolves async scheduling: two batches in flight size the SWA admission cap
    cfg_in.setdefault("max_in_flight_tokens", 2 * budget)
    try:
        cfg = CacheConfig.from_mapping(cfg_in, prefix="config.")
    except ConfigError as e:
        raise CaseError(str(e)) from None
    acc = sched_keys.get("accepted_tokens", 0)
    if isinstance(acc, list):
        if not acc or not all(isinstance(a, int) and not isinstance(a, bool) and 0 <= a <= K
                              for a in acc):
            raise CaseError(f"config.accepted_tokens: a list of integers in [0, {K}]")
    elif isinstance(acc, bool) or not isinstance(acc, (int, float)) or not 0 <= acc <= K:
        raise CaseError(f"config.accepted_tokens: must be in [0, num_speculative_tokens={K}]")
    try:
        sc = with_model_len(sc, cfg.max_model_len, "config.")
    except ConfigError as e:
        raise CaseError(str(e)) from None
    reqs_in = data.get("requests")
    if not isinstance(reqs_in, list) or not reqs_in:
        raise CaseError("requests: expected a non-empty list")
    streams = StreamRegistry()
    traces = []
    for i, r in enumerate(reqs_in):
        where = f"requests[{i}]"
        if not isinstance(r, dict):
            raise CaseError(f"{where}: expected a mapping")
        for k in r:
            if k not in ("id", "prompt", "arrival_step", "max_tokens", "priority", "report_mode"):
                raise CaseError(f"{where}.{k}: unknown key")
        if r.get("report_mode") not in REPORT_MODES:
            raise CaseError(f"{where}.report_mode: must be full, incremental or null, got "
                            f"{show(r['report_mode'])}")
        runs = parse_runs(r.get("prompt"), streams, f"{where}.prompt")
        arrival = _int(f"{where}.arrival_step", r.get("arrival_step", 0), 0, prefix="")
        mt = _int(f"{where}.max_tokens", r.get("max_tokens", 16), 1, prefix="")
        prio = r.get("priority", 0)
        if isinstance(prio, bool) or not isinstance(prio, int):
            raise CaseError(f"{where}.priority: must be an integer, got {show(prio)}")
        rid = str(r.get("id", f"r{i}"))
        if any(t[0] == rid for t in traces):
            raise CaseError(f"{where}.id: duplicate id {show(rid)}")
        traces.append((rid, runs, arrival, mt, prio))
        events.setdefault("modes", {})[rid] = r.get("report_mode")
    order = sorted(range(len(traces)), key=lambda i: (traces[i][2], i))
    if offload is not None:
        events["offload"] = offload
    return cfg, sc, acc, streams, [traces[i] for i in order], [t[0] for t in traces], events


def parse_offload(raw: dict) -> dict | None:
    """The tier's keys of a step case, checked; None when it is off."""
    size = raw.get("kv_offloading_size_bytes")
    if size is None:
        if raw:
            raise CaseError(f"config.{sorted(raw)[0]}: needs kv_offloading_size_bytes (the "
                            f"CPU tier is off without it)")
        return None
    out: dict = {"size": _int("kv_offloading_size_bytes", size, 1)}
    out["bpb"] = _int("kv_bytes_per_block", raw.get("kv_bytes_per_block", 4096), 1)
    out["align"] = _int("page_size_alignment", raw.get("page_size_alignment", 4096), 1)
    pol = raw.get("eviction_policy", "lru")
    if pol not in ("lru", "arc"):
        raise CaseError(f"config.eviction_policy: must be lru or arc, got {pol!r}")
    out["policy"] = pol
    if raw.get("offload_block_size") is not None and raw.get("blocks_per_chunk") is not None:
        raise CaseError("config.offload_block_size: set it or blocks_per_chunk, not both")
    out["block_size"] = (None if raw.get("offload_block_size") is None
                         else _int("offload_block_size", raw["offload_block_size"], 1))
    out["bpc"] = (None if raw.get("blocks_per_chunk") is None
                  else _int("blocks_per_chunk", raw["blocks_per_chunk"], 1))
    t = _int("transfer_steps", raw.get("transfer_steps", 1), 0)
    out["load_steps"] = _int("load_steps", raw.get("load_steps", t), 0)
    out["store_steps"] = _int("store_steps", raw.get("store_steps", t), 0)
    po = raw.get("offload_prompt_only", True)
    if not isinstance(po, bool):
        raise CaseError(f"config.offload_prompt_only: must be true or false, got {po!r}")
    out["prompt_only"] = po
    return out


def build_offload(kv, cfg, off: dict):
    """The step case's connector (``sim/cache/offload.py``) on ``kv``."""
    from sim.cache.offload import OffloadConnector, StepTransfers

    sizes = set(kv.group_block_sizes)
    bpc = off["bpc"] or 1
    if off["block_size"] is not None:
        if len(sizes) != 1 or off["block_size"] % next(iter(sizes)):
            raise CaseError(f"config.offload_block_size: {off['block_size']} must be a multiple "
                            f"of the one block size of every group ({sorted(sizes)})")
        bpc = off["block_size"] // next(iter(sizes))
    align = off["align"]
    chunk = -(-off["bpb"] * bpc // align) * align
    return OffloadConnector(kv, off["size"] // chunk, off["policy"], bpc,
                            eagle_groups=connector_eagle_groups(cfg),
                            worker=StepTransfers(off["load_steps"], off["store_steps"]),
                            offload_prompt_only=off["prompt_only"], block_bytes=off["bpb"])


def connector_eagle_groups(cfg) -> tuple[int, ...]:
    """The groups vLLM's connector treats as EAGLE groups: those flagged
    ``is_eagle_group`` (none flagged: none, whatever the GPU side drops)."""
    if not cfg.eagle:
        return ()
    eg = cfg.eagle_groups
    if isinstance(eg, tuple):
        return eg
    if eg == "attention":
        return tuple(i for i, s in enumerate(cfg.group_specs()) if s.kind == "full")
    return ()


def run_steps_data(data, source: str = "<steps>", kv_events: bool = False,
                   per_step: bool = False, finish_orders: dict[int, list[str]] | None = None):
    """Per request, the step-level answers; with ``kv_events`` a mapping ``{"requests":
    [...], "kv_events": [{"step", "events"}, ...], "kv_events_error": None | {...}}`` of
    the KV events published step by step, in the oracle's canonical form (events are on
    when ``config.enable_kv_cache_events`` is true, or unset and ``kv_events`` asked).
    ``per_step``: a mapping with ``"steps"``: every step that scheduled anything, ``{"step",
    "scheduled": {id: tokens}, "num_scheduled_tokens", "spec_tokens": {id: drafts}}``
    (``sched_oracle.py``'s per-step fields; a request with no drafts is left out of
    ``spec_tokens``, as vLLM leaves it out of ``scheduled_spec_decode_tokens``)."""
    from sim.cache.kv_manager import KVCacheManager

    try:
        cfg, sc, acc, streams, traces, file_order, ev_cfg = parse_steps(data)
    except CaseError as e:
        raise CaseError(f"{source}: {e}") from None
    try:
        kv = KVCacheManager(cfg)
    except (AssertionError, ValueError) as e:
        res = [{"id": rid, "error": f"{type(e).__name__}: {e}"} for rid in file_order]
        if not (kv_events or per_step):
            return res
        return {"requests": res, **({"steps": []} if per_step else {}),
                **({"kv_events": [], "kv_events_error": None} if kv_events else {})}
    step_log = StepLog()
    sched_cls = Scheduler if ev_cfg.get("offload") is None else TieredScheduler
    sched = sched_cls(sc, kv, accepted_per_step=acc if not isinstance(acc, list) else 0.0,
                      eagle_family=cfg.eagle)
    if per_step:
        sched.observers.append(step_log)   # (the scheduler records each step's decisions)
    if isinstance(acc, list):
        sched.set_accept_pattern(acc)
    conn = None
    if ev_cfg.get("offload") is not None:
        try:
            conn = build_offload(kv, cfg, ev_cfg["offload"])
        except ValueError as e:
            raise CaseError(f"{source}: config: {e}") from None
        if per_step:
            conn.log = []
            conn.req_log = {}
        conn.finish_orders = finish_orders
        sched.attach_connector(conn)
    log = None
    if ev_cfg.get("enable_kv_cache_events", kv_events):
        log = _StepEvents(sched, ev_cfg)
        kv.enable_kv_events(log.log)
    reqs: dict[str, SimRequest] = {}
    by_id = {t[0]: t for t in traces}
    modes = ev_cfg.get("modes", {})

    def make(trace, index):
        _, runs, _, mt, prio = by_id[trace.request_id]
        r = SimRequest(kv.make_request(trace.request_id, runs, modes.get(trace.request_id)),
                       mt, index)
        r.priority = prio
        r.out_stream = streams.id(f"out/{trace.request_id}")
        reqs[trace.request_id] = r
        return r

    # (a decode jump caches a block completed by its last step at the next allocation,
    # not at that step's update as vLLM does: same hits, later events; step one by one)
    eng = Engine(sched, FixedStep(UNIT_S), make, lambda r: None,
                 jump=not isinstance(acc, list) and log is None and not per_step)
    stalled = None
    try:
        eng.run(StepArrival(rid, arrival * UNIT_S, [], mt) for rid, _, arrival, mt, _ in traces)
    except CapacityError as e:
        # the engine's progress guard: what is left can never be scheduled (a request the
        # pool can never hold).  vLLM's scheduler keeps such a request waiting for good
        # (its test_can_fit_full_sequence_full_attention_still_gates_oversized) while it
        # serves the others; so does a step case: it ends there, reporting the requests
        # still waiting ("waiting": true, their steps null)
        stalled = f"{source}: {e}"
    out = _request_answers(file_order, reqs, {id(r) for r in eng.rejected}, cfg, conn)
    if not (kv_events or per_step):
        return out
    res: dict = {"requests": out}
    if stalled is not None:
        res["stalled"] = stalled
    if per_step:
        res["steps"] = step_log.steps
        if conn is not None:
            res["offload_steps"] = conn.log
            res["finish_ties"] = conn.finish_ties
            res["offload_totals"] = {"loaded_chunks": conn.loaded_chunks,
                                     "stored_chunks": conn.stored_chunks,
                                     "evicted_chunks": conn.pool.evicted,
                                     "alloc_failures": conn.pool.failed}
    if kv_events:
        res.update(log.result() if log is not None else {"kv_events": [],
                                                         "kv_events_error": None})
    return res


def _request_answers(file_order: list[str], reqs: dict, rejected: set[int], cfg, conn) -> list:
    """Each request's step-level answers, in the file's order (``run_steps_data``)."""
    out = []
    for rid in file_order:
        r = reqs.get(rid)
        if r is None:
            out.append({"id": rid, "error": "never arrived"})
            continue
        if id(r) in rejected:
            out.append({"id": rid, "error": f"prompt of {r.cache.num_prompt_tokens} tokens >= "
                                            f"max_model_len {cfg.max_model_len} (vLLM rejects it)"})
            continue
        hit = r.hit_tokens
        if conn is not None and r.cpu_hit_tokens:
            hit = min(hit + r.cpu_hit_tokens, r.cache.num_prompt_tokens - 1)
        never = r.first_scheduled_ns < 0     # (only when stalled: every other request ends)
        out.append({
            "id": rid,
            "arrival_step": r.arrival_ns,
            "first_scheduled_step": None if never else r.first_scheduled_ns,
            "hit": None if never else hit,
            "junction": None if never else r.junction,
            "chunk_ends": list(r.chunk_ends),
            "chunk_end_steps": list(r.chunk_end_steps),
            "first_token_step": r.first_token_ns - 1 if r.first_token_ns >= 0 else None,
            "finish_step": r.finish_ns - 1 if r.finish_ns >= 0 else None,
            "preemptions": r.preemptions,
            "output_tokens": r.num_output,
        })
        if r.finish_ns < 0:
            out[-1]["waiting"] = True
        if conn is not None:
            out[-1]["gpu_hit"] = r.hit_tokens if r.hit_tokens >= 0 else None
            out[-1]["external_hit"] = r.cpu_hit_tokens if r.hit_tokens >= 0 else None
            if conn.req_log is not None:
                out[-1].update(conn.req_log.get(rid, {}))
                out[-1]["cpu_cached_positions"] = conn.cached_positions(r.cache)
    return out


class _StepEvents:
    """The KV events of a step case, step by step, in the oracle's canonical form."""

    def __init__(self, sched: Scheduler, ev_cfg: dict):
        from sim.cache.events import CanonicalForm, KVEventLog

        self.canon = CanonicalForm()
        self.steps: list[dict] = []
        self.log = KVEventLog(self._publish, clock=lambda: sched.sched_time,
                              report_mode=ev_cfg.get("report_mode"),
                              fix_emit=ev_cfg.get("kv_events_fix_emit", False))

    def _publish(self, step: int, events: list) -> None:
        self.steps.append({"step": step, "events": self.canon.events(events)})

    def result(self) -> dict:
        log = self.log
        log.flush()
        err = None
        if log.error is not None:
            err = {k: log.error[k] for k in ("step", "type", "request", "group")}
            err["unpublished"] = self.canon.events(log.unpublished)
        return {"kv_events": self.steps, "kv_events_error": err}


def run_steps_file(path, kv_events: bool = False, per_step: bool = False):
    from sim.commands.case_files import load_case_file

    return run_steps_data(load_case_file(path), source=str(path), kv_events=kv_events,
                          per_step=per_step)
