"""Step case files: the ``sim run`` engine and scheduler, unchanged, driven by a
backend whose every step lasts one time unit, so times *are* step indices
(one per ``schedule()`` call, from 0) and can be compared with vLLM's real
scheduler (``sched_oracle.py`` of the optional vLLM oracle, ``$VLLM_ORACLE_DIR``) step for step.
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.cache.case import CASE_KEYS, CaseError, parse_runs
from sim.cache.config import NO_LENGTH_LIMIT, CacheConfig
from sim.cache.prompt import StreamRegistry
from sim.config.errors import CapacityError, ConfigError
from sim.config.scheduler import SchedulerConfig
from sim.engine.engine import Engine
from sim.engine.scheduler import Scheduler, SimRequest

STEP_KEYS = {"max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold",
             "num_speculative_tokens", "accepted_tokens", "eagle_lookahead_hashes"}
UNIT_S = 1e-9   # one step = one engine nanosecond


@dataclass
class _Trace:
    request_id: str
    arrival_s: float
    segments: list
    output_tokens: int
    session: str | None = None
    after: str | None = None
    think_s: float = 0.0


def _int(name, v, lo, prefix="config."):
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise CaseError(f"{prefix}{name}: must be an integer >= {lo}, got {v!r}")
    if v > NO_LENGTH_LIMIT:
        raise CaseError(f"{prefix}{name}: must be below 2**62, got {v}")
    return v


def parse_steps(data):
    if not isinstance(data, dict):
        raise CaseError("top level: expected a mapping with config and requests")
    for k in data:
        if k not in ("config", "requests", "source", "expect", "description"):
            raise CaseError(f"{k}: unknown key")
    cfg_in = data.get("config") or {}
    if not isinstance(cfg_in, dict):
        raise CaseError(f"config: expected a mapping, got {cfg_in!r}")
    cfg_in = dict(cfg_in)
    sched_keys = {k: cfg_in.pop(k) for k in list(cfg_in) if k in STEP_KEYS}
    for k in list(cfg_in):
        if k in CASE_KEYS - {"max_num_batched_tokens", "long_prefill_token_threshold"}:
            cfg_in.pop(k)  # schedule: the scheduler decides chunking here
    eagle = bool(cfg_in.get("eagle", False))
    lookahead_hashes = sched_keys.get("eagle_lookahead_hashes", False)
    for name, v in (("eagle", cfg_in.get("eagle", False)),
                    ("eagle_lookahead_hashes", lookahead_hashes)):
        if not isinstance(v, bool):
            raise CaseError(f"config.{name}: must be true or false, got {v!r}")
    if lookahead_hashes and eagle:
        cfg_in.setdefault("num_hash_lookahead_tokens", 1)
    if eagle:
        cfg_in.setdefault("num_prefill_lookahead", 1)
    k_default = 1 if eagle else 0
    K = _int("num_speculative_tokens", sched_keys.get("num_speculative_tokens", k_default), 0)
    budget = _int("max_num_batched_tokens", sched_keys.get("max_num_batched_tokens", 8192), 1)
    seqs = _int("max_num_seqs", sched_keys.get("max_num_seqs", 16), 1)
    if budget < seqs:
        raise CaseError(f"config.max_num_batched_tokens: {budget} is smaller than max_num_seqs "
                        f"{seqs} (vLLM rejects this)")
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
    lpt = _int("long_prefill_token_threshold", sched_keys.get("long_prefill_token_threshold", 0), 0)
    if lpt > cfg.max_model_len:
        raise CaseError(f"config.long_prefill_token_threshold: {lpt} cannot be greater than "
                        f"max_model_len {cfg.max_model_len} (vLLM rejects this)")
    sc = SchedulerConfig(
        max_num_batched_tokens=budget,
        max_num_seqs=seqs,
        long_prefill_token_threshold=lpt,
        num_speculative_tokens=K, max_model_len=cfg.max_model_len)
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
            if k not in ("id", "prompt", "arrival_step", "max_tokens"):
                raise CaseError(f"{where}.{k}: unknown key")
        runs = parse_runs(r.get("prompt"), streams, f"{where}.prompt")
        arrival = _int(f"{where}.arrival_step", r.get("arrival_step", 0), 0, prefix="")
        mt = _int(f"{where}.max_tokens", r.get("max_tokens", 16), 1, prefix="")
        rid = str(r.get("id", f"r{i}"))
        if any(t[0] == rid for t in traces):
            raise CaseError(f"{where}.id: duplicate id {rid!r}")
        traces.append((rid, runs, arrival, mt))
    order = sorted(range(len(traces)), key=lambda i: (traces[i][2], i))
    return cfg, sc, acc, streams, [traces[i] for i in order], [t[0] for t in traces]


def run_steps_data(data, source: str = "<steps>") -> list[dict]:
    from sim.cache.kv_manager import KVCacheManager

    try:
        cfg, sc, acc, streams, traces, file_order = parse_steps(data)
    except CaseError as e:
        raise CaseError(f"{source}: {e}") from None
    try:
        kv = KVCacheManager(cfg)
    except (AssertionError, ValueError) as e:
        return [{"id": rid, "error": f"{type(e).__name__}: {e}"} for rid in file_order]
    sched = Scheduler(sc, kv, accepted_per_step=acc if not isinstance(acc, list) else 0.0,
                      eagle_family=cfg.eagle)
    if isinstance(acc, list):
        sched.set_accept_pattern(acc)
    reqs: dict[str, SimRequest] = {}
    by_id = {t[0]: t for t in traces}

    def make(trace, index):
        _, runs, _, mt = by_id[trace.request_id]
        r = SimRequest(kv.make_request(trace.request_id, runs), mt, index)
        r.out_stream = streams.id(f"out/{trace.request_id}")
        reqs[trace.request_id] = r
        return r

    eng = Engine(sched, lambda items: UNIT_S, lambda *a: UNIT_S, make, lambda r: None,
                 jump=not isinstance(acc, list))
    try:
        eng.run(_Trace(rid, arrival * UNIT_S, [], mt) for rid, runs, arrival, mt in traces)
    except CapacityError as e:   # the engine's progress guard: a request that never fits
        raise CapacityError(f"{source}: {e}") from None
    rejected = {id(r) for r in eng.rejected}
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
        out.append({
            "id": rid,
            "arrival_step": r.arrival_ns,
            "first_scheduled_step": r.first_scheduled_ns,
            "hit": r.hit_tokens,
            "junction": r.junction,
            "chunk_ends": list(r.chunk_ends),
            "chunk_end_steps": list(r.chunk_end_steps),
            "first_token_step": r.first_token_ns - 1,
            "finish_step": r.finish_ns - 1,
            "preemptions": r.preemptions,
            "output_tokens": r.num_output,
        })
    return out


def run_steps_file(path) -> list[dict]:
    from sim.cache.case import load_case_file

    return run_steps_data(load_case_file(path), source=str(path))
