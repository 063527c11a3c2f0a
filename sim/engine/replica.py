"""One replica built from a scenario, as ``sim run`` replays it alone and a fleet holds
N of it (``sim/cluster/fleet.py``): the deployment (layout, pool, cache policy, cost
model or calibration profile, CPU tier), and what a replay of one shares with a fleet's
(quiet garbage collection, the CPU tier's per-request recorder, why a request was
refused)."""
from __future__ import annotations


import contextlib
import gc
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from backends.analytical import CostModel
from backends.base import build_backend
from sim.cache.kv_manager import KVCacheManager
from sim.models.capacity import check_max_model_len, check_pool_memory
from sim.errors import ConfigError
from sim.config.gpus import get_gpu, kv_budget
from sim.config.scenario import Scenario
from sim.engine.engine import Engine
from sim.engine.record import Recorder, RequestMaker, StepSampler, TierFigures
from sim.engine.scheduler import TOO_LONG_FOR_POOL, Scheduler, SimRequest
from sim.engine.tiered_scheduler import TieredScheduler
from sim.models.layout import derive_layout
from sim.cache.policies import PoolShape, get_policy
from sim.rundir.records import OFFLOAD_COLUMNS, RequestRecord
from sim.rundir.request_table import RequestTable


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



def build_scheduler(sc: Scenario, dep: Deployment, fast_decode: bool = True) -> Scheduler:
    """The replica's scheduler, as ``sim run`` and a fleet build it: with the CPU tier, the
    one that admits through its connector (``TieredScheduler``), the connector attached;
    a request the pool can never hold is refused on arrival."""
    cls = Scheduler if dep.offload is None else TieredScheduler
    sched = cls(sc.scheduler, dep.kv, accepted_per_step=sc.speculative.mean_accepted_tokens
                if sc.speculative.method else 0.0, fast_decode=fast_decode,
                reject_unservable=True)
    if dep.offload is not None:
        sched.attach_connector(dep.offload)
    return sched


def build_engine(sc: Scenario, dep: Deployment, streams, add, add_batch, plant: str | None,
                 jump: bool, fast_decode: bool, env=None, progress=None) -> tuple:
    """One replica's scheduler, request maker, step sampler, recorder, backend and engine,
    built alike for a run alone and for each replica of a fleet (``env``: the fleet's
    environment; ``streams``: the registry of token streams; ``add``/``add_batch``: where
    finished requests' rows go): (sched, maker, sampler, recorder, backend, engine)."""
    from sim.rundir.kv_events import attach as attach_kv_events   # (vLLM's KV events: opt-in)

    kv = dep.kv
    sched = build_scheduler(sc, dep, fast_decode)
    maker = RequestMaker(kv, streams)
    sampler = StepSampler(sched)
    if dep.offload is not None:     # the CPU tier's host chunks in memory.csv
        sampler.host = dep.offload.pool
    dep.sampler = sampler
    rec = Recorder(maker, sampler, add, add_batch)
    if dep.offload is not None:     # the CPU tier's per-request columns
        rec.tier = TierFigures()
    backend = build_backend(sc, dep, plant)   # by backend.kind (torch imported only for torch)
    dep.kv_events = attach_kv_events(sc, kv, sched)
    eng = Engine(sched, backend, maker.make, rec.finish, jump=jump,
                 progress=progress, env=env)
    eng.maker, eng.recorder, eng.sampler = maker, rec, sampler   # (called natively)
    if getattr(sc, "attribution", True):   # why each request missed (sim/cache/attribution.py)
        from sim.cache.attribution import MissAttribution
        from sim.engine.observers import MissObserver

        sched.observers.append(MissObserver(MissAttribution(kv)))
    return sched, maker, sampler, rec, backend, eng

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
    from sim.errors import InputError
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
def quiet_gc():
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


def with_tier_columns(table: RequestTable, figures: list[TierFigures]) -> RequestTable:
    """``table`` with the CPU tier's per-request columns (``OFFLOAD_COLUMNS``) from the
    recorders' ``TierFigures`` (one per replica; "" for a request refused on arrival),
    scattered by arrival index with numpy: no int object a request."""
    import numpy as np

    n = len(table)
    blank = np.ones(n, dtype=np.int64)
    values = [np.zeros(n, dtype=np.int64) for _ in OFFLOAD_COLUMNS]
    for f in figures:
        k = len(f.index)
        if not k:
            continue
        idx = np.frombuffer(f.index, dtype=np.int64, count=k)
        blank[idx] = 0
        for col, got in zip(values, (f.cpu_hit, f.no_state)):
            col[idx] = np.frombuffer(got, dtype=np.int64, count=k)
    blanks = blank if blank.any() else None
    for name, col in zip(OFFLOAD_COLUMNS, values):
        table = table.with_int_column(name, col, blanks)
    return table


def why_rejected(sched: Scheduler, r: SimRequest) -> str:
    """One request's refusal on arrival, with its numbers."""
    c = r.cache
    if r.rejected == TOO_LONG_FOR_POOL:
        return (f"request {c.request_id!r} (prompt {c.num_prompt_tokens:,} tokens, up to "
                f"{r.max_tokens:,} output tokens) needs up to {sched.blocks_needed(r):,} pool "
                f"blocks, more than the pool's {sched.usable_blocks:,} usable ({r.rejected})")
    return (f"request {c.request_id!r}: prompt of {c.num_prompt_tokens:,} tokens >= "
            f"scheduler.max_model_len {sched.max_model_len:,} ({r.rejected})")
