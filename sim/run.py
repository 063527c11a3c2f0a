"""``sim run``: build the deployment a scenario describes, replay its traffic,
and write the run folder (requests.csv, summary.json, run.json, memory.csv, report.md +
figures).  Called as ``sim.run(...)``, this module is the notebook API's ``run``
(``sim/api.py``; see the end of the file).

Everything written goes to a temporary folder first and is renamed into place
at the end, so a failed run leaves no partial output.
"""
from __future__ import annotations

import contextlib
import csv
import gc
import json
import math
import operator
import sys
import time
import types
from array import array
from dataclasses import dataclass, field, replace
from itertools import compress
from pathlib import Path
from typing import Callable, Sequence

from backends.analytical import CostModel
from backends.base import build_backend
from sim.atomic import atomic_folder
from sim.cache.kv_manager import KVCacheManager
from sim.cache.prompt import StreamRegistry
from sim.capacity import check_max_model_len, check_pool_memory
from sim.config.errors import CapacityError, ConfigError
from sim.config.gpus import get_gpu, kv_budget
from sim.config.scenario import Scenario
from sim.engine.engine import Engine
from sim.engine.record import ROW_FIELDS, Recorder, RequestMaker, StepSampler
from sim.engine.scheduler import TOO_LONG_FOR_POOL, Scheduler, SimRequest
from sim.models.layout import derive_layout
from sim.cache.policies import PoolShape, get_policy
from sim.records import (LATENCY_STATS, MEMORY_COLUMNS, MISS_CLASSES, OFFLOAD_COLUMNS,
                         MemoryFields, OFFLOAD_MEMORY_COLUMNS, OFFLOAD_SUMMARY_FIELDS, REQUEST_COLUMNS,
                         SUMMARY_FIELDS, RequestRecord)
from sim import requests_csv
from sim.request_table import RequestColumns, RequestTable
from sim.stats import mean, percentiles, weighted_percentiles


@dataclass
class Deployment:
    """What a scenario resolves to before any request runs."""

    layout: object
    groups: tuple[str, ...]
    num_blocks: int
    block_bytes: int
    budget: object | None
    cost: CostModel
    kv: KVCacheManager
    verify: list | None = None       # torch backend: per-request resume-vs-scratch records
    sampler: StepSampler | None = None   # memory over time and inter-token latencies
    # every request in arrival order, served and refused on arrival (requests.csv): a
    # ``RequestTable`` after ``simulate`` (column by column; records built when read)
    records: RequestTable | list[RequestRecord] = field(default_factory=list)
    kv_events: object | None = None   # sim/kv_events.RunEvents: the KV event stream, if on
    memory: list | None = None       # memory.csv's fields, once built (``memory_prelude``)
    offload: object | None = None    # the CPU tier's connector (sim/cache/offload.py), if on


def build_deployment(sc: Scenario) -> Deployment:
    kvs = sc.kv_cache
    spec = sc.speculative
    method = spec.method if spec.method else "auto"
    try:
        layout = _derive(sc, kvs, spec, method)
    except ValueError as e:
        msg = str(e)
        field = "speculative.method" if msg.startswith("speculative_method") else "kv_cache"
        raise ConfigError(field, msg.split(": ", 1)[-1]) from None
    gpu = get_gpu(sc.gpu.type)
    tp = kvs.tensor_parallel_size
    budget = None
    if kvs.num_gpu_blocks_override is not None:
        num_blocks = kvs.num_gpu_blocks_override
        block_bytes = layout.pool_block_bytes
    else:
        try:
            budget = kv_budget(gpu, sc.model, layout,
                               gpu_memory_utilization=sc.gpu.gpu_memory_utilization,
                               tp=tp, num_gpus=sc.gpu.count,
                               kv_cache_memory_bytes=kvs.kv_cache_memory_bytes)
        except ValueError as e:
            msg = str(e)
            if kvs.kv_cache_memory_bytes is not None:
                raise ConfigError("kv_cache.kv_cache_memory_bytes",
                                  msg.removeprefix("kv_cache_memory_bytes: ")) from None
            raise ConfigError("gpu", msg) from None
        num_blocks = budget.num_blocks
        block_bytes = budget.block_bytes
    overridden = kvs.num_gpu_blocks_override is not None
    check_pool_memory(num_blocks, "kv_cache.num_gpu_blocks_override" if overridden else "gpu",
                      "" if overridden else " (the memory budget's pool: set "
                      "kv_cache.num_gpu_blocks_override to simulate a smaller one)")
    groups = layout.groups          # vLLM's group order (Mamba first for a Mamba-first model)
    sd = spec.spec_decode()
    shape = PoolShape(groups=groups, block_size=layout.block_size, num_blocks=num_blocks,
                      max_model_len=sc.scheduler.max_model_len, uses_eagle=sd.uses_eagle,
                      num_speculative_tokens=sd.num_speculative_tokens,
                      num_prefill_lookahead=sd.num_prefill_lookahead,
                      prefill_checkpoints=kvs.prefill_checkpoints(layout,
                                                                  sc.cache.hash_block_size),
                      eagle_groups=layout.eagle_groups if sd.uses_eagle else (),
                      block_bytes=block_bytes,
                      costs=(layout.attn_bytes_per_token, layout.mamba_bytes_per_seq,
                             sc.model.flops_per_token(0),
                             sc.model.flops_per_token(1) - sc.model.flops_per_token(0)))
    off = getattr(sc, "kv_offloading", None)
    switches = sc.cache
    if off is not None:
        if sc.cache.policy != "vllm":
            raise ConfigError("kv_offloading.size_gb", f"the CPU tier is vLLM's offloading "
                              f"connector: it needs cache.policy vllm, not {sc.cache.policy}")
        # a KV connector keeps the legacy hashes (vLLM: num_hash_lookahead_tokens 0)
        switches = replace(sc.cache, kv_connector=sc.cache.kv_connector or "OffloadingConnector")
    kv = get_policy(sc.cache.policy).build(switches, sc.cache.options, shape)
    if sc.scheduler.max_model_len is not None:
        check_max_model_len(kv, sc.scheduler.max_model_len, block_bytes,
                            "kv_cache.num_gpu_blocks_override" if overridden else
                            "kv_cache.kv_cache_memory_bytes"
                            if kvs.kv_cache_memory_bytes is not None else
                            f"the memory budget of {sc.gpu.count} x {sc.gpu.type} at "
                            f"gpu_memory_utilization {sc.gpu.gpu_memory_utilization}")
    cost = cost_model(sc, layout, gpu)
    dep = Deployment(layout, groups, num_blocks, block_bytes, budget, cost, kv)
    if off is not None:
        dep.offload = build_offload(sc, off, kv, layout, block_bytes, sd.uses_eagle)
    return dep


def build_offload(sc: Scenario, off, kv: KVCacheManager, layout, block_bytes: int,
                  uses_eagle: bool):
    """The CPU tier's connector for this replica (``kv_offloading``): its chunks as vLLM
    sizes them, its transfers timed on each GPU's host link."""
    from sim.cache.offload import OffloadConnector, TimedTransfers

    bpc = off.chunk_blocks(kv.group_block_sizes)
    n, chunk = off.num_chunks(block_bytes, sc.gpu.count, bpc)
    if n < 1:
        raise ConfigError("kv_offloading.size_gb", f"{off.size_gb:g} GiB holds no chunk of "
                          f"{chunk:,} bytes ({bpc} pool block(s) of {block_bytes:,} bytes on each "
                          f"of {sc.gpu.count} GPU(s))")
    try:
        return OffloadConnector(
            kv, n, off.eviction_policy, bpc,
            eagle_groups=layout.eagle_groups if uses_eagle else (),
            worker=TimedTransfers(off.load_bandwidth_gb_s * 1e9, off.store_bandwidth_gb_s * 1e9),
            offload_prompt_only=off.offload_prompt_only, block_bytes=block_bytes,
            num_gpus=sc.gpu.count)
    except ValueError as e:
        raise ConfigError("kv_offloading", str(e).removeprefix("kv_offloading: ")) from None


def _derive(sc, kvs, spec, method):
    return derive_layout(
        sc.model, tp=kvs.tensor_parallel_size,
        mamba_cache_dtype=kvs.mamba_cache_dtype, mamba_ssm_cache_dtype=kvs.mamba_ssm_cache_dtype,
        kv_cache_dtype=kvs.kv_cache_dtype, kernel_block_size=kvs.kernel_block_size,
        block_size=kvs.block_size, **spec.layout_args(),   # method, k, the EAGLE head
        gdn_prefill_backend=kvs.gdn_backend(sc.gpu.type, sc.model),
        # the policy's Mamba cache mode (cache.policy none: vLLM's mode none)
        mamba_cache_mode=getattr(get_policy(sc.cache.policy), "mamba_cache_mode", "align"))


def cost_model(sc: Scenario, layout, gpu) -> CostModel:
    m = sc.model
    tp = sc.kv_cache.tensor_parallel_size
    b = sc.backend
    mfu, mbu, overhead = b.mfu, b.mbu, b.overhead_s
    fitted = {}
    if b.profile:
        fitted, (mfu, mbu, overhead) = load_profile(sc.path.parent / b.profile, (mfu, mbu, overhead))
    if m.mamba_kind == "mamba2":
        state_elems = m.mamba_heads * m.mamba_head_dim * m.d_state
    elif m.mamba_kind == "gdn":
        state_elems = m.gdn_v_heads * m.gdn_k_dim * m.gdn_v_dim
    else:
        state_elems = m.d_inner * m.d_state
    return CostModel(
        dense_flops_per_token=m.flops_per_token(0) / tp,
        attn_layers=layout.num_attention_layers,
        attn_width=m.q_heads * m.head_dim // tp,
        kv_bytes_per_token=layout.attn_bytes_per_token,
        mamba_layers=layout.num_mamba_layers,
        ssd_flops_per_token=6.0 * state_elems / tp,
        state_bytes_per_seq=layout.mamba_bytes_per_seq,
        weight_bytes=m.active_params * m.dtype_bytes / tp,
        peak_flops=gpu.bf16_flops, hbm_bytes_per_s=gpu.hbm_bytes_per_s,
        mfu=mfu, mbu=mbu, overhead_s=overhead, **fitted)


#: what a profile may hold: one ``sim calibrate`` wrote (kind: fitted), or overrides
PROFILE_KEYS = ("kind", "description", "device", "torch", "model", "coefficients", "fit",
                "measured", "provenance", "implementation", "per_kind", "state_copies",
                "held_out", "kernels")
COEFFICIENT_KEYS = ("per_item_s", "per_token_s", "per_pair_s", "per_chunk_s", "chunk_tokens")
OVERRIDE_KEYS = ("description", "mfu", "mbu", "overhead_s")


def _known_keys(ppath: Path, data: dict, known: tuple[str, ...], where: str) -> None:
    """An unknown key in a profile (a typo such as ``mfuu``) is an error naming the
    profile file, not a setting silently ignored."""
    import difflib

    from sim.config.fields import show

    for k in data:
        if k not in known:
            close = difflib.get_close_matches(str(k), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError("backend.profile", f"{ppath}: {where}{show(k)}: unknown key "
                              f"(known: {', '.join(known)}){hint}")


def load_profile(ppath: Path, defaults: tuple[float, float, float]) -> tuple[dict, tuple]:
    """A calibration profile (``backend.profile``): fitted coefficients, or mfu/mbu/
    overhead_s overrides.  Every problem is a ``ConfigError`` naming the file and key."""
    from sim.config.errors import InputError
    from sim.config.loader import load_file

    try:
        prof = load_file(ppath)
    except InputError as e:
        raise ConfigError("backend.profile", str(e)) from None
    if prof is None:
        prof = {}
    if not isinstance(prof, dict):
        raise ConfigError("backend.profile", f"{ppath}: expected a mapping (a profile written "
                          f"by sim calibrate)")
    fitted_kind = prof.get("kind") == "fitted"
    if "kind" in prof and not fitted_kind:
        from sim.config.fields import show

        raise ConfigError("backend.profile", f"{ppath}: kind: must be fitted (a profile written "
                          f"by sim calibrate), or absent (mfu, mbu, overhead_s), got "
                          f"{show(prof['kind'])}")
    _known_keys(ppath, prof, PROFILE_KEYS if fitted_kind else OVERRIDE_KEYS, "")
    if fitted_kind and isinstance(prof.get("coefficients"), dict):
        _known_keys(ppath, prof["coefficients"], COEFFICIENT_KEYS, "coefficients.")

    def num(d: dict, key: str, where: str, default=None, lo: float = 0.0, hi: float | None = None):
        v = d.get(key, default)
        if v is None:
            raise ConfigError("backend.profile", f"{ppath}: {where}{key}: missing")
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                or v < lo or (hi is not None and v > hi)):
            rng = f">= {lo:g}" if hi is None else f"in [{lo:g}, {hi:g}]"
            raise ConfigError("backend.profile", f"{ppath}: {where}{key}: must be a finite "
                              f"number {rng}, got {v!r}")
        return v

    if fitted_kind:
        c = prof.get("coefficients")
        if not isinstance(c, dict):
            raise ConfigError("backend.profile", f"{ppath}: coefficients: missing or not a "
                              "mapping (needs per_item_s, per_token_s and per_pair_s)")
        fitted = {k: float(num(c, k, "coefficients.")) for k in
                  ("per_item_s", "per_token_s", "per_pair_s")}
        fitted["per_chunk_s"] = float(num(c, "per_chunk_s", "coefficients.", 0.0))
        chunk = c.get("chunk_tokens", 0)
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
            raise ConfigError("backend.profile", f"{ppath}: coefficients.chunk_tokens: must be "
                              f"an integer >= 0, got {chunk!r}")
        fitted["chunk_tokens"] = chunk
        return fitted, defaults
    mfu, mbu, overhead = defaults
    return {}, (float(num(prof, "mfu", "", mfu, 1e-6, 1.0)),
                float(num(prof, "mbu", "", mbu, 1e-6, 1.0)),
                float(num(prof, "overhead_s", "", overhead)))


@contextlib.contextmanager
def as_input_errors(scenario, overrides: dict | None):
    """``with as_input_errors(scenario, overrides): simulate(...)``: what goes wrong once
    the deployment is built and the workload read, as the one-line ``InputError`` sim run
    prints (``sim run`` and ``sim.run`` alike): a workload's or trace's error, a field
    only the built layout can check (named at its line or ``--set``), a capacity
    error, each after the scenario's path."""
    from sim.config.errors import InputError
    from sim.config.scenario import scenario_message
    from workloads import WorkloadError

    try:
        yield
    except WorkloadError as e:
        raise InputError(f"{scenario}: {e}" if str(e).startswith("workload") else
                         f"{scenario}: workload: {e}") from None
    except ConfigError as e:
        raise InputError(scenario_message(scenario, e, overrides)) from None
    except ValueError as e:
        raise InputError(f"{scenario}: {e}") from None


@contextlib.contextmanager
def _quiet_gc():
    """Collect cyclic garbage less often during a replay.

    A replay allocates millions of short-lived containers (run tuples, block
    lists, SimPy events) and very few cycles; CPython's default thresholds
    re-scan the young ones every 700 allocations and the whole heap (block
    pool included) every few hundred thousand.  Objects built before the
    replay are frozen (never scanned) and the young generation is scanned every
    50,000 allocations: the same garbage is collected, ~3% fewer instructions
    per simulated request.  Settings are restored afterwards.

    What the replay leaves (the pool's cached blocks, the run's records) joins the old
    objects without a scan: frozen too before the thresholds are restored, else the
    first allocation after would scan all of it as one young generation (~17 ms after
    2,000 Mooncake requests, ~125 ms after 6,000), to find nothing: a replay makes no
    cyclic garbage of its own (a finished request lets go of its step item, the one
    cycle it had).  Any other is collected with the old objects, later."""
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    try:
        yield
    finally:
        gc.freeze()
        gc.set_threshold(*old)
        gc.unfreeze()


def simulate(sc: Scenario, progress: Callable[[int], None] | None = None, jump: bool = True,
             fast_decode: bool = True, plant: str | None = None,
             prepare: Callable[[Deployment, Scheduler, Engine], None] | None = None,
             replayed: Callable[[Deployment], None] | None = None, traces=None):
    """Run the scenario; returns (deployment, records, summary dict).  ``records`` are the
    served requests in arrival order, ``deployment.records`` every request, those refused
    on arrival included (what ``write_run`` writes): both ``sim.request_table.RequestTable``,
    a read-only sequence of ``RequestRecord`` (len, indexing, iteration, ``==`` with a
    list of records) kept column by column, a record built each time one is read
    (``column(name)`` reads one field of every request without building any).
    ``prepare(dep, sched, engine)`` runs once the parts are built, before the replay
    (``sim explain`` watches one request's admission there and stops the replay);
    ``replayed(dep)`` once the replay is over and some request finished, before the
    requests are put in arrival order and summarized (``sim run`` hands its report
    workers the memory figure's inputs there: ``memory_prelude``).  ``traces``: the
    workload records to replay instead of the scenario's workload (an iterable of
    ``workloads.TraceRequest`` in arrival order)."""
    from workloads import build_workload

    if getattr(sc, "cluster", None) is not None:   # a fleet (sim/cluster)
        if prepare is not None:
            raise ConfigError("cluster", "this command replays one replica; a fleet is "
                              "replayed by sim run")
        from sim.cluster.fleet import run_fleet

        return run_fleet(sc, progress, jump, fast_decode, plant, replayed, traces)
    t_wall = time.perf_counter()
    dep = build_deployment(sc)
    kv = dep.kv
    sched = Scheduler(sc.scheduler, kv, accepted_per_step=sc.speculative.mean_accepted_tokens
                      if sc.speculative.method else 0.0, fast_decode=fast_decode,
                      reject_unservable=True)
    tier = None
    if dep.offload is not None:
        sched.attach_connector(dep.offload)
        tier = TierRecorder()
    maker = RequestMaker(kv, StreamRegistry())
    sampler = StepSampler(sched)
    if dep.offload is not None:
        sampler.host = dep.offload.pool
    dep.sampler = sampler
    kept = RequestColumns()          # the finished requests' rows, column by column
    rec = Recorder(maker, sampler, kept.add, kept.add_batch)
    on_finish: Callable[[SimRequest], None] = rec.finish

    base_dir = sc.path.parent
    if traces is None:
        traces = build_workload(sc.workload, sc.seed, base_dir)
    backend = build_backend(sc, dep, plant)   # by backend.kind (torch imported only for torch)
    from sim.kv_events import attach as attach_kv_events   # (vLLM's KV events: opt-in)
    dep.kv_events = attach_kv_events(sc, kv, sched)   # (no decode jumps: exact event steps)
    eng = Engine(sched, backend, maker.make, on_finish,
                 jump=jump and dep.kv_events is None, progress=progress)
    # (called natively: see Engine.maker)
    eng.maker, eng.recorder, eng.sampler = maker, rec, sampler
    if tier is not None:
        eng.observers.append(tier)
    if getattr(sc, "attribution", True):   # why each request missed (sim/cache/attribution.py)
        from sim.cache.attribution import MissAttribution

        sched.attribution = MissAttribution(kv)
    if prepare is not None:
        prepare(dep, sched, eng)
    with _quiet_gc():
        eng.run(traces)     # (the engine's progress guard raises a CapacityError)
    if dep.kv_events is not None:
        dep.kv_events.finish()
    if not rec.pending and not kept.n and eng.rejected:   # (no request finished)
        raise CapacityError(f"every request was rejected ({len(eng.rejected):,}); the first: "
                            f"{why_rejected(sched, eng.rejected[0])}")
    if replayed is not None:
        replayed(dep)
    for r in eng.rejected:
        rec.reject(r)
    rec.flush()
    dep.records = kept.table(sc.slo)
    if tier is not None:
        dep.records = tier.columns(dep.records)
    rows = dep.records.served()
    wall = time.perf_counter() - t_wall
    summary = summarize(sc, dep, rows, eng, sched, wall)
    if dep.offload is not None:
        summary = offload_summary(sc, dep, rows, summary)
    if sc.backend.kind == "torch":   # the torch backend's resume-vs-scratch checks
        stats = backend.stats  # type: ignore[attr-defined]
        recs = stats.records
        resumed = [v for v in recs if v.resumed_at > 0]
        summary["verify_requests"] = len(recs)
        summary["verify_resumed"] = len(resumed)
        summary["verify_max_abs_err"] = max((v.max_abs_err for v in recs), default=0.0)
        summary["torch_forward_s"] = stats.forward_s
        dep.verify = recs
    return dep, rows, summary


class TierRecorder:
    """The CPU tier's per-request figures (``OFFLOAD_COLUMNS``), taken as requests finish
    (an engine observer: only when the tier is on)."""

    def __init__(self) -> None:
        self.got: dict[int, tuple[int, int]] = {}

    def on_step(self, items, start: int, end: int, k: int) -> None:
        return None

    def on_finish(self, req: SimRequest, now: int) -> None:
        self.got[req.index] = (req.cpu_hit_tokens, req.cpu_no_state_tokens)

    def columns(self, table: RequestTable) -> RequestTable:
        """``table`` with the tier's columns ("" for a request refused on arrival)."""
        got = self.got
        for j, name in enumerate(OFFLOAD_COLUMNS):
            table = table.with_column(name, [got[i][j] if i in got else ""
                                             for i in range(len(table))])
        return table


def offload_summary(sc: Scenario, dep, rows, summary: dict) -> dict:
    """summary.json with the CPU tier's fields (``OFFLOAD_SUMMARY_FIELDS``) before the two
    that measure the machine; a fleet's (``dep.replicas``) are every replica's, summed, as
    its ``pool_bytes`` is."""
    conns = [r.dep.offload for r in dep.replicas] if hasattr(dep, "replicas") else [dep.offload]
    pools = [c.pool for c in conns]
    prompt = summary["prompt_tokens"]
    cpu = [v for v in _col(rows, "cpu_hit_tokens") if v != ""]
    miss = [v for v in _col(rows, "cpu_no_state_tokens") if v != ""]
    hit = sum(cpu)
    n = len(rows)
    chunk = sc.kv_offloading.num_chunks(dep.block_bytes, sc.gpu.count, conns[0].bpc)[1]
    chunks = sum(p.num_chunks for p in pools)
    tier = {
        "kv_offloading_size_bytes": sc.kv_offloading.size_bytes * len(conns),
        "host_chunks": chunks,
        "host_chunk_bytes": chunk,
        "host_pool_bytes": chunks * chunk // sc.gpu.count,   # per GPU, as pool_bytes
        "cpu_hit_tokens": hit,
        "cpu_token_hit_rate": hit / prompt if prompt else 0.0,
        "cpu_request_hit_rate": sum(1 for v in cpu if v > 0) / n if n else 0.0,
        "offload_loaded_bytes": sum(c.loaded_bytes for c in conns),
        "offload_stored_bytes": sum(c.stored_bytes for c in conns),
        "host_evictions": sum(p.evicted for p in pools),
        "host_store_failures": sum(p.failed for p in pools),
        "host_chunks_peak": sum(p.peak for p in pools),
        "miss_cpu_no_state_tokens": sum(miss),
        "miss_cpu_no_state_rate": sum(miss) / prompt if prompt else 0.0,
    }
    assert tuple(tier) == OFFLOAD_SUMMARY_FIELDS
    out = {k: v for k, v in summary.items() if k not in ("wall_s", "sim_requests_per_s")}
    out.update(tier)
    out["wall_s"] = summary["wall_s"]
    out["sim_requests_per_s"] = summary["sim_requests_per_s"]
    return out


def why_rejected(sched: Scheduler, r: SimRequest) -> str:
    """One request's refusal on arrival, with its numbers."""
    c = r.cache
    if r.rejected == TOO_LONG_FOR_POOL:
        return (f"request {c.request_id!r} (prompt {c.num_prompt_tokens:,} tokens, up to "
                f"{r.max_tokens:,} output tokens) needs up to {sched.blocks_needed(r):,} pool "
                f"blocks, more than the pool's {sched.usable_blocks:,} usable ({r.rejected})")
    return (f"request {c.request_id!r}: prompt of {c.num_prompt_tokens:,} tokens >= "
            f"scheduler.max_model_len {sched.max_model_len:,} ({r.rejected})")


def _col(rows, name: str):
    """One field of every row, in order, read-only: a ``RequestTable``'s column as it
    keeps it (no record built), or the field of each record of a list."""
    if isinstance(rows, RequestTable):
        return rows.column(name)
    return [getattr(r, name) for r in rows]


def _int_array(values):
    """A column of ints held in an integer array, as a numpy view of it (no int object
    a value); None for any other column (a list: read it value by value)."""
    if isinstance(values, array) and values.typecode in "bhilq":
        import numpy as np

        return np.frombuffer(values, dtype=values.typecode)
    return None


def _isum(values) -> int:
    """``sum`` of a column of ints (an integer array's exact in int64: token counts)."""
    a = _int_array(values)
    return int(a.sum(dtype="q")) if a is not None else sum(values)


def _positive(values) -> int:
    """How many values of a column of ints are > 0."""
    a = _int_array(values)
    return int((a > 0).sum()) if a is not None else sum(1 for h in values if h > 0)


def _ttfts_makespan(rows) -> tuple[Sequence[float], float]:
    """The TTFTs in increasing order (summed left to right by the caller: a list) and
    the makespan (last finish - first arrival): of arrays of doubles by numpy (a sort
    and an elementwise sum: the same doubles; stable, as sorted is, for -0.0 beside 0.0),
    else value by value (and with a NaN, whose place in a sort Python and numpy do not
    agree on)."""
    ttft, arrivals, e2e = (_col(rows, c) for c in ("ttft_s", "arrival_s", "e2e_s"))
    if all(isinstance(c, array) and c.typecode == "d" and len(c) for c in (ttft, arrivals, e2e)):
        import numpy as np

        t, a, e = (np.frombuffer(c, dtype="d") for c in (ttft, arrivals, e2e))
        if not (np.isnan(t).any() or np.isnan(a).any() or np.isnan(e).any()):
            return np.sort(t, kind="stable").tolist(), float((a + e).max()) - float(a.min())
    makespan = (max(map(operator.add, arrivals, e2e), default=0.0) - min(arrivals, default=0.0))
    return sorted(ttft), makespan


def pool_fields(dep, eng, sched) -> dict:
    """summary.json's fields of the deployment's pool and engine (one replica's; a fleet
    sums its replicas': ``sim/cluster/outputs.py``)."""
    kv = dep.kv
    page = dep.block_bytes
    sampler = dep.sampler
    return {
        "block_size": dep.layout.block_size,
        "hash_block_size": kv.hash_block_size,
        "num_gpu_blocks": dep.num_blocks,
        "rejected_requests": len(eng.rejected),   # refused on arrival (requests.csv rejected)
        "mamba_state_bytes_peak": kv.peak_blocks("mamba") * page,
        "kv_bytes_peak": kv.peak_blocks("full") * page,
        "evictions": kv.evicted_keys,
        "preemptions": sched.preemptions,
        "steps": eng.steps,
        "pool_bytes": dep.num_blocks * page,
        "occupied_bytes_peak": sampler.occupied_peak * page if sampler else 0,
        "in_use_bytes_peak": sampler.in_use_peak * page if sampler else 0,
    }


def summarize(sc, dep, rows, eng, sched, wall, pool: dict | None = None) -> dict:
    """summary.json's fields (``SUMMARY_FIELDS``) from the served requests ``rows`` (a
    ``RequestTable`` or a list of ``RequestRecord``), read a column at a time; ``pool``:
    the deployment's own fields (``pool_fields``) when given, else those of ``dep``,
    ``eng`` and ``sched``."""
    n = len(rows)
    prompt = _isum(_col(rows, "prompt_tokens"))
    hit = _isum(_col(rows, "hit_tokens"))
    lost = _isum(_col(rows, "lost_tokens"))
    out_tokens = _isum(_col(rows, "output_tokens"))
    ttfts, makespan = _ttfts_makespan(rows)
    p = pool if pool is not None else pool_fields(dep, eng, sched)
    summary = {
        "scenario": sc.name,
        "model": sc.model.name,
        "policy": sc.cache.policy,
        "block_size": p["block_size"],
        "hash_block_size": p["hash_block_size"],
        "num_gpu_blocks": p["num_gpu_blocks"],
        "requests": n,
        "rejected_requests": p["rejected_requests"],
        "prompt_tokens": prompt,
        "hit_tokens": hit,
        "token_hit_rate": hit / prompt if prompt else 0.0,
        "request_hit_rate": _positive(_col(rows, "hit_tokens")) / n if n else 0.0,
        "lost_tokens": lost,
        "lost_token_rate": lost / prompt if prompt else 0.0,
        "ttft_mean_s": sum(ttfts) / n if n else float("nan"),
        **dict(zip(("ttft_p50_s", "ttft_p90_s", "ttft_p99_s"), percentiles(ttfts, (50, 90, 99)))),
        "output_tokens": out_tokens,
        "makespan_s": makespan,
        "throughput_tok_s": out_tokens / makespan if makespan > 0 else 0.0,
        "mamba_state_bytes_peak": p["mamba_state_bytes_peak"],
        "kv_bytes_peak": p["kv_bytes_peak"],
        "evictions": p["evictions"],
        "preemptions": p["preemptions"],
        "steps": p["steps"],
        **latency_fields(rows, dep.sampler),
        **rate_fields(sc, dep, rows, makespan),
        "pool_bytes": p["pool_bytes"],
        "occupied_bytes_peak": p["occupied_bytes_peak"],
        "in_use_bytes_peak": p["in_use_bytes_peak"],
        **miss_fields(rows, prompt),
        "wall_s": wall,
        "sim_requests_per_s": n / wall if wall > 0 else 0.0,
    }
    assert tuple(summary) == SUMMARY_FIELDS   # (sim/records.py names them, in file order)
    return summary


def miss_fields(rows: list[RequestRecord], prompt: int) -> dict:
    """Miss attribution totals (tokens) and their shares of the prompt tokens; ``reusable``
    is what an unlimited attention-only cache would reuse (hit + every class but
    compulsory).  None with attribution off."""
    compulsory = _col(rows, "compulsory_tokens")
    out: dict = {}
    if isinstance(compulsory, array) and len(compulsory):
        # (no blank: every row attributed, each class's column an array too)
        totals = {name: _isum(_col(rows, f"{name}_tokens")) for name in MISS_CLASSES}
        totals["reusable"] = _isum(_col(rows, "prompt_tokens")) - _isum(compulsory)
    else:
        on = [v != "" for v in compulsory]      # rows attributed (all or none, in a run)
        totals = {name: sum(compress(_col(rows, f"{name}_tokens"), on)) if any(on) else None
                  for name in MISS_CLASSES}
        if any(on):
            totals["reusable"] = sum(compress(map(operator.sub, _col(rows, "prompt_tokens"),
                                                  [v if v != "" else 0 for v in compulsory]),
                                              on))
        else:
            totals["reusable"] = None
    for name, v in totals.items():
        out[f"miss_{name}_tokens" if name != "reusable" else "reusable_tokens"] = v
    for name, v in totals.items():
        out[f"miss_{name}_rate" if name != "reusable" else "reusable_token_rate"] = \
            (v / prompt if prompt else 0.0) if v is not None else None
    return out


PERCENTILES = tuple(float(s[1:]) for s in LATENCY_STATS if s.startswith("p"))


def _stats(metric: str, values_s: list[float]) -> dict:
    """``mean_<metric>_ms`` and ``p50/p90/p99_<metric>_ms`` of values in seconds, computed
    as ``vllm bench serve`` does (numpy, in seconds, then x 1000; 0 when there are none)."""
    if len(values_s) == 0:
        return {f"{s}_{metric}_ms": 0.0 for s in LATENCY_STATS}
    return {f"mean_{metric}_ms": mean(values_s) * 1000,
            **{f"p{q:g}_{metric}_ms": v * 1000
               for q, v in zip(PERCENTILES, percentiles(values_s, PERCENTILES))}}


def latency_fields(rows: list[RequestRecord], sampler: StepSampler | None) -> dict:
    """TTFT, TPOT, ITL, end-to-end latency and queueing delay: mean and percentiles (ms).
    TPOT covers requests of more than one output token (as vLLM's); ITL every gap
    between two deliveries of a request's tokens, over all requests (the sampler's
    histogram of whole microseconds; its mean is exact)."""
    out = {}
    out.update(_stats("ttft", _col(rows, "ttft_s")))
    # (a table's column without its blanks by numpy: the same doubles, the same order)
    tpot = rows.floats("tpot_ms") if isinstance(rows, RequestTable) else None
    out.update(_stats("tpot", tpot * 1e-3 if tpot is not None else
                      [v * 1e-3 for v in _col(rows, "tpot_ms") if v != ""]))
    if sampler is not None and sampler.itl_count:
        # (the histogram's nonzero counts by numpy, the rare gaps past the dense range
        # after them: weighted_percentiles orders the distinct gaps itself)
        import numpy as np

        dense = np.frombuffer(sampler.itl_dense_bytes(), dtype="<i8")
        keys = np.flatnonzero(dense)
        counts = dense[keys]
        sparse = sampler.itl_sparse
        if sparse:
            keys = np.concatenate([keys, np.fromiter(sparse.keys(), np.int64, len(sparse))])
            counts = np.concatenate([counts,
                                     np.fromiter(sparse.values(), np.int64, len(sparse))])
        out["mean_itl_ms"] = sampler.itl_sum_ns / sampler.itl_count * 1e-6
        out.update({f"p{q:g}_itl_ms": v * 1e-3 for q, v in
                    zip(PERCENTILES, weighted_percentiles(keys, counts, PERCENTILES))})
    else:
        out.update({f"{s}_itl_ms": 0.0 for s in LATENCY_STATS})
    out.update(_stats("e2el", _col(rows, "e2e_s")))
    out.update(_stats("queue_time", _col(rows, "queue_s")))
    return out


def rate_fields(sc: Scenario, dep, rows: list[RequestRecord], makespan: float) -> dict:
    """Throughputs over the makespan (requests, output tokens, prompt + output tokens per
    second of simulated time), the arrival rate (requests, refused ones included, over
    the arrival span), and with SLOs the share of requests meeting them (refused ones
    count as missing them) and the rate of those that do."""
    n = len(rows)
    prompt = _isum(_col(rows, "prompt_tokens"))
    out_tokens = _isum(_col(rows, "output_tokens"))
    arrivals = _col(dep.records or rows, "arrival_s")
    span = max(arrivals) - min(arrivals) if len(arrivals) else 0.0
    per_s = (lambda x: x / makespan) if makespan > 0 else (lambda x: 0.0)
    active = sc.slo.active
    # (read only with SLOs: without, the column is blank)
    good = sum(1 for v in _col(rows, "slo_ok") if v == 1) if active else 0
    return {
        "request_throughput": per_s(n),
        "output_throughput": per_s(out_tokens),
        "total_token_throughput": per_s(prompt + out_tokens),
        "arrival_rate": (len(arrivals) - 1) / span if span > 0 else 0.0,
        "slo_attainment": good / len(arrivals) if active and arrivals else None,
        "request_goodput": per_s(good) if active else None,
    }


def run_header(sc: Scenario, dep) -> dict:
    """What the report says about the deployment: the first keys of ``run.json``, so that
    ``sim report`` rebuilds the report from the run folder alone."""
    from workloads import describe

    return {
        "name": sc.name, "description": sc.description.strip(), "model": sc.model.name,
        "block_size": dep.layout.block_size, "policy": sc.cache.policy,
        "retention": sc.cache.prefix_cache_retention_interval,
        "shared_prefix_checkpoint": sc.cache.enable_mamba_shared_prefix_checkpoint,
        "lookahead_hashes": not sc.cache.disable_lookahead_block_hashes,
        "speculative": f"{sc.speculative.method or 'none'} k={sc.speculative.num_speculative_tokens}, "
                       f"mean accepted {sc.speculative.mean_accepted_tokens}",
        "gpu": f"{sc.gpu.count} x {sc.gpu.type}",
        "workload": describe(sc.workload),
        **({"replicas": sc.cluster.replicas, "router": sc.cluster.router.policy}
           if getattr(sc, "cluster", None) is not None else {}),
    }


_fmt = requests_csv.fmt     # (a float with six decimals, anything else str)


def memory_fields(sampler: StepSampler) -> list[tuple[str, Sequence]]:
    """``memory.csv``'s columns (``MEMORY_COLUMNS``) as written: each one's %-format
    (``requests_csv.FLOAT_FIELD`` or ``INT_FIELD``) and values -- the pool over time,
    per GPU, in blocks: the attention and Mamba blocks held (in use or cached), those in
    use (both kinds), those cached (held, free, evictable), and the requests running and
    waiting, at the start of each engine step (evenly thinned past ``MEMORY_ROWS``
    rows); the time in seconds with six decimals."""
    raw = sampler.row_bytes()
    names = MEMORY_COLUMNS + (OFFLOAD_MEMORY_COLUMNS if sampler.host is not None else ())
    if not raw:
        return MemoryFields(names, [(requests_csv.INT_FIELD, ()) for _ in names])
    import numpy as np

    # (the rows' columns by numpy, in arrays: the same numbers as the rows' tuples --
    # a time below 2**53 ns is exact as a double, times 1e-9 the same product)
    d = np.frombuffer(raw, dtype="<i8").reshape(-1, ROW_FIELDS)
    t, a, m, in_use, running, waiting = (d[:, k] for k in range(ROW_FIELDS))
    secs = array("d", (t.astype(np.float64) * 1e-9).tobytes())
    counts = [array("q", c.astype("<i8").tobytes())
              for c in (a, m, in_use, a + m - in_use, running, waiting)]
    if sampler.host is not None:     # the CPU tier's host chunks (OFFLOAD_MEMORY_COLUMNS)
        counts.append(array("q", sampler.host_data))
    return MemoryFields(names, [(requests_csv.FLOAT_FIELD, secs)]
                        + [(requests_csv.INT_FIELD, c) for c in counts])


def memory_prelude(sc: Scenario, dep) -> tuple | None:
    """What the memory figure is drawn from, known once the replay is over: memory.csv's
    fields (kept on ``dep`` for the file), the pool and a block in bytes as the report
    reads them from summary.json (``pool_bytes``, ``pool_bytes / num_gpu_blocks``), and
    the scenario's name (summary.json's ``scenario``: the figure's title); None without a
    sampler or a pool (no memory figure)."""
    fields = _memory_of(dep)
    one = dep.replicas[0].dep if hasattr(dep, "replicas") else dep   # (a fleet: replica 0's)
    if fields is None or not one.num_blocks or not one.num_blocks * one.block_bytes:
        return None
    pool = float(one.num_blocks * one.block_bytes)
    return fields, pool, pool / one.num_blocks, sc.name


def _memory_of(dep) -> list | None:
    """memory.csv's fields of a run (``memory_fields`` of its sampler; None without
    one), built once and kept on ``dep``: the prelude and the file are the same object
    (``ReportWorkers.submit`` then does not send them twice)."""
    sampler = getattr(dep, "sampler", None)
    if getattr(dep, "memory", None) is None and sampler is not None:
        if hasattr(dep, "replicas"):    # a fleet: every replica's rows, and which
            from sim.cluster.outputs import memory_fields as fleet_memory

            dep.memory = fleet_memory(dep)
        else:
            dep.memory = memory_fields(sampler)
    return getattr(dep, "memory", None)


def write_memory_csv(path: Path, fields: MemoryFields) -> None:
    """``memory.csv`` from its ``memory_fields`` (as ``csv.writer`` writes each row: at
    most MEMORY_ROWS rows, one %-formatting)."""
    with open(path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerow(fields.names)
        requests_csv.write_fields(f, fields)


def write_run(out_dir: Path, sc: Scenario, dep, rows, summary, report: bool = True,
              extra: Callable[[Path], None] | None = None,
              command: list[str] | None = None, workers=None, git=None) -> Path:
    """Write the run folder atomically (temp folder, then rename); ``extra(folder)``
    may add files of its own before the folder moves into place.  ``run.json`` holds the
    report header plus what re-runs the run (``sim/provenance.py``); ``command`` is the
    command line recorded there.  ``workers``: report workers started before the run
    (``reports/workers.py``; ``sim run``) that draw the report while this process
    writes the rest; without them the report is drawn here.  ``git``: the commit's
    ``sim.provenance.GitProbe``, started before the run (else git runs here)."""
    with atomic_folder(out_dir, kind="run") as tmp:
        try:
            _write_files(tmp, sc, dep, rows, summary, command,
                         workers if report else None, git)
            if report and workers is None:
                from reports.rows import as_written, rows_of
                from reports.run_report import write_report   # (matplotlib: only here)

                # (the report's columns as requests.csv reads back: not read back)
                write_report(tmp,
                             rows=rows_of(as_written(getattr(dep, "records", None) or rows)))
            if getattr(dep, "kv_events", None) is not None:
                dep.kv_events.write(tmp)          # kv_events.jsonl (+ .msgpack)
            if report and workers is not None:
                workers.finish()                  # (the report whole before ``extra``)
            if extra is not None:
                extra(tmp)
        finally:
            if workers is not None:
                workers.close()     # (before the temporary folder is moved or removed)
    return Path(out_dir)


def _write_files(tmp: Path, sc: Scenario, dep, rows, summary, command, workers,
                 git=None) -> None:
    """summary.json, memory.csv, run.json, requests.csv.  With report workers, their
    parts are handed over first, with what they read of these files (the text of the
    two JSON files, memory.csv's fields, requests.csv's report columns: ``reports/rows.py``),
    so that they draw while the files are written."""
    from sim.provenance import run_record

    # wall_s and sim_requests_per_s measure this machine; every other field (and
    # every other file but run.json's command and commit) is byte-identical for the
    # same inputs and seed.
    # allow_nan=False: NaN is not JSON; a NaN here is a bug and must show
    summary_text = json.dumps(summary, indent=1, sort_keys=False, allow_nan=False) + "\n"
    run_text = json.dumps({**run_header(sc, dep), **run_record(sc, command, git)},
                          indent=1) + "\n"
    fields = _memory_of(dep)
    recs = getattr(dep, "records", None) or rows
    if workers is not None:
        from reports.rows import as_written

        # drawn meanwhile, from the report's columns of requests.csv as read back
        workers.submit(tmp, lambda: as_written(recs), (summary_text, run_text, fields))
    (tmp / "summary.json").write_text(summary_text)
    if fields is not None:
        write_memory_csv(tmp / "memory.csv", fields)
    (tmp / "run.json").write_text(run_text)
    if "per_replica" in summary:     # a fleet: one row per replica
        from sim.cluster.outputs import write_replicas_csv

        write_replicas_csv(tmp / "replicas.csv", summary["per_replica"])
    with open(tmp / "requests.csv", "w", newline="") as f:
        # column by column, a chunk of rows at a time: csv.writer's bytes (a list of
        # records has no storage kinds: every column formatted value by value)
        if isinstance(recs, RequestTable):
            requests_csv.write_table(f, recs.names(), recs)
        else:
            requests_csv.write_rows(f, list(REQUEST_COLUMNS), recs,
                                    ["o"] * len(REQUEST_COLUMNS))


class _CallableModule(types.ModuleType):
    """``sim.run(scenario, set=..., out=...)``: this module, called, is the notebook API's
    ``run`` (``sim/api.py``), so that ``sim.run`` is one name whether or not the module
    was imported first (Python binds a package's submodule to its name on import)."""

    def __call__(self, *args, **kwargs):
        from sim.api import run

        return run(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
