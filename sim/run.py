"""``sim run``: build the deployment a scenario describes, replay its traffic,
and write the run folder (requests.csv, summary.json, report.md + figures).

Everything written goes to a temporary folder first and is renamed into place
at the end, so a failed run leaves no partial output.
"""
from __future__ import annotations

import contextlib
import csv
import gc
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from backends.analytical import CostModel
from sim.atomic import atomic_folder
from sim.cache.kv_manager import KVCacheManager
from sim.cache.prompt import StreamRegistry
from sim.capacity import check_max_model_len, check_pool_memory
from sim.config.errors import CapacityError, ConfigError
from sim.config.gpus import get_gpu, kv_budget
from sim.config.scenario import Scenario
from sim.engine.engine import Engine
from sim.engine.record import Recorder, RequestMaker
from sim.engine.scheduler import TOO_LONG_FOR_POOL, Scheduler, SimRequest
from sim.models.layout import derive_layout
from sim.policies import get_policy
from sim.records import REQUEST_COLUMNS, SUMMARY_FIELDS, RequestRecord, records_in_arrival_order


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
    # every request in arrival order, served and refused on arrival (requests.csv)
    records: list[RequestRecord] = field(default_factory=list)


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
                               tp=tp, num_gpus=sc.gpu.count)
        except ValueError as e:
            raise ConfigError("gpu", str(e)) from None
        num_blocks = budget.num_blocks
        block_bytes = budget.block_bytes
    overridden = kvs.num_gpu_blocks_override is not None
    check_pool_memory(num_blocks, "kv_cache.num_gpu_blocks_override" if overridden else "gpu",
                      "" if overridden else " (the memory budget's pool: set "
                      "kv_cache.num_gpu_blocks_override to simulate a smaller one)")
    groups = tuple(["full"] * layout.num_attention_groups + ["mamba"] * layout.num_mamba_groups)
    policy = get_policy(sc.cache.policy)
    kv = policy.build(sc.cache, groups, layout.block_size, num_blocks, spec.spec_decode(),
                      max_model_len=sc.scheduler.max_model_len)
    if sc.scheduler.max_model_len is not None:
        check_max_model_len(kv, sc.scheduler.max_model_len, block_bytes,
                            "kv_cache.num_gpu_blocks_override" if overridden else
                            f"the memory budget of {sc.gpu.count} x {sc.gpu.type} at "
                            f"gpu_memory_utilization {sc.gpu.gpu_memory_utilization}")
    cost = cost_model(sc, layout, gpu)
    return Deployment(layout, groups, num_blocks, block_bytes, budget, cost, kv)


def _derive(sc, kvs, spec, method):
    return derive_layout(
        sc.model, tp=kvs.tensor_parallel_size,
        num_speculative_tokens=spec.num_speculative_tokens if spec.method else 0,
        mamba_cache_dtype=kvs.mamba_cache_dtype, mamba_ssm_cache_dtype=kvs.mamba_ssm_cache_dtype,
        kv_cache_dtype=kvs.kv_cache_dtype, kernel_block_size=kvs.kernel_block_size,
        block_size=kvs.block_size,
        speculative_method=("mtp" if method == "mtp" else ("eagle" if spec.method else "auto")))


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

    if prof.get("kind") == "fitted":
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


def _pct(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    k = (len(sorted_vals) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


@contextlib.contextmanager
def _quiet_gc():
    """Collect cyclic garbage less often during a replay.

    A replay allocates millions of short-lived containers (run tuples, block
    lists, SimPy events) and very few cycles; CPython's default thresholds
    re-scan the young ones every 700 allocations and the whole heap (block
    pool included) every few hundred thousand.  Objects built before the
    replay are frozen (never scanned) and the young generation is scanned every
    50,000 allocations: the same garbage is collected, ~3% fewer instructions
    per simulated request.  Settings are restored afterwards."""
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def simulate(sc: Scenario, progress: Callable[[int], None] | None = None, jump: bool = True,
             fast_decode: bool = True, plant: str | None = None):
    """Run the scenario; returns (deployment, records, summary dict).  ``records`` are the
    served requests (``RequestRecord``, in arrival order); ``deployment.records`` holds
    every request, those refused on arrival included (what ``write_run`` writes)."""
    from workloads import build_workload

    t_wall = time.perf_counter()
    dep = build_deployment(sc)
    kv = dep.kv
    sched = Scheduler(sc.scheduler, kv, accepted_per_step=sc.speculative.mean_accepted_tokens
                      if sc.speculative.method else 0.0, fast_decode=fast_decode,
                      reject_unservable=True)
    maker = RequestMaker(kv, StreamRegistry())
    rec = Recorder(maker)
    mamba_gids = [i for i, g in enumerate(dep.groups) if g == "mamba"]
    attn_gids = [i for i, g in enumerate(dep.groups) if g == "full"]
    on_finish: Callable[[SimRequest], None] = rec.finish

    base_dir = sc.path.parent
    traces = build_workload(sc.workload, sc.seed, base_dir)
    torch_backend = None
    if sc.backend.kind == "torch":
        torch_backend = build_torch_backend(sc, dep, sched, plant)
        step_time, sums_time = torch_backend.step_time, None   # every step runs for real

        def finish_and_forget(r: SimRequest) -> None:
            torch_backend.forget(r.rid)
            rec.finish(r)
        on_finish = finish_and_forget
    else:
        step_time, sums_time = dep.cost.step_time, dep.cost.time_from_sums
    eng = Engine(sched, step_time, sums_time, maker.make, on_finish, jump=jump,
                 progress=progress)
    with _quiet_gc():
        eng.run(traces)     # (the engine's progress guard raises a CapacityError)
    if not rec.rows and eng.rejected:
        raise CapacityError(f"every request was rejected ({len(eng.rejected):,}); the first: "
                            f"{why_rejected(sched, eng.rejected[0])}")
    for r in eng.rejected:
        rec.reject(r)
    dep.records = records_in_arrival_order(rec.rows, rec.rejected_rows)
    rows = [r for r in dep.records if not r.rejected]
    wall = time.perf_counter() - t_wall
    summary = summarize(sc, dep, rows, eng, sched, wall, mamba_gids, attn_gids)
    if torch_backend is not None:
        recs = torch_backend.stats.records
        resumed = [v for v in recs if v.resumed_at > 0]
        summary["verify_requests"] = len(recs)
        summary["verify_resumed"] = len(resumed)
        summary["verify_max_abs_err"] = max((v.max_abs_err for v in recs), default=0.0)
        summary["torch_forward_s"] = torch_backend.stats.forward_s
        dep.verify = recs
    return dep, rows, summary


def why_rejected(sched: Scheduler, r: SimRequest) -> str:
    """One request's refusal on arrival, with its numbers."""
    c = r.cache
    if r.rejected == TOO_LONG_FOR_POOL:
        return (f"request {c.request_id!r} (prompt {c.num_prompt_tokens:,} tokens, up to "
                f"{r.max_tokens:,} output tokens) needs up to {sched.blocks_needed(r):,} pool "
                f"blocks, more than the pool's {sched.usable_blocks:,} usable ({r.rejected})")
    return (f"request {c.request_id!r}: prompt of {c.num_prompt_tokens:,} tokens >= "
            f"scheduler.max_model_len {sched.max_model_len:,} ({r.rejected})")


def build_torch_backend(sc: Scenario, dep, sched, plant: str | None = None):
    """The real-compute backend over this deployment's blocks (import torch lazily)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ConfigError("backend.kind", 'torch is not installed: pip install -e ".[torch]" (on a '
                          'machine without a GPU first: pip install torch --index-url '
                          'https://download.pytorch.org/whl/cpu)') from None
    import torch as _t

    from backends.torch_backend.backend import TorchBackend
    from backends.torch_backend.config import TorchModelConfig

    b = sc.backend
    pattern = sc.model.pattern or ""
    n_layers = b.layers or (len(pattern) if pattern else 4)
    cfg = TorchModelConfig.scaled(sc.model, num_layers=n_layers, width_div=b.width_div,
                                  dtype=b.dtype, seed=sc.seed)
    device = b.device
    if device == "auto":
        device = "cuda" if _t.cuda.is_available() else "cpu"
    if device == "cuda" and not _t.cuda.is_available():
        raise ConfigError("backend.device", "cuda requested but no GPU is visible")
    return TorchBackend(cfg, dep.kv, sched, dep.num_blocks, dep.layout.block_size, device=device,
                        verify=b.verify, plant=plant)


def summarize(sc, dep, rows, eng, sched, wall, mamba_gids, attn_gids) -> dict:
    n = len(rows)
    prompt = sum(r.prompt_tokens for r in rows)
    hit = sum(r.hit_tokens for r in rows)
    lost = sum(r.lost_tokens for r in rows)
    out_tokens = sum(r.output_tokens for r in rows)
    ttfts = sorted(r.ttft_s for r in rows)
    makespan = (max((r.arrival_s + r.e2e_s for r in rows), default=0.0)
                - min((r.arrival_s for r in rows), default=0.0))
    pool = dep.kv.pool
    page = dep.block_bytes
    summary = {
        "scenario": sc.name,
        "model": sc.model.name,
        "policy": sc.cache.policy,
        "block_size": dep.layout.block_size,
        "hash_block_size": dep.kv.coordinator.hash_block_size,
        "num_gpu_blocks": dep.num_blocks,
        "requests": n,
        "rejected_requests": len(eng.rejected),   # refused on arrival (requests.csv rejected)
        "prompt_tokens": prompt,
        "hit_tokens": hit,
        "token_hit_rate": hit / prompt if prompt else 0.0,
        "request_hit_rate": sum(1 for r in rows if r.hit_tokens > 0) / n if n else 0.0,
        "lost_tokens": lost,
        "lost_token_rate": lost / prompt if prompt else 0.0,
        "ttft_mean_s": sum(ttfts) / n if n else float("nan"),
        "ttft_p50_s": _pct(ttfts, 0.50),
        "ttft_p90_s": _pct(ttfts, 0.90),
        "ttft_p99_s": _pct(ttfts, 0.99),
        "output_tokens": out_tokens,
        "makespan_s": makespan,
        "throughput_tok_s": out_tokens / makespan if makespan > 0 else 0.0,
        "mamba_state_bytes_peak": max(pool.peak_by_group(mamba_gids), 0) * page,
        "kv_bytes_peak": max(pool.peak_by_group(attn_gids), 0) * page,
        "evictions": pool.evicted_keys,
        "preemptions": sched.preemptions,
        "steps": eng.steps,
        "wall_s": wall,
        "sim_requests_per_s": n / wall if wall > 0 else 0.0,
    }
    assert tuple(summary) == SUMMARY_FIELDS   # (sim/records.py names them, in file order)
    return summary


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
    }


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6f}"
    return str(v)


def write_run(out_dir: Path, sc: Scenario, dep, rows, summary, report: bool = True,
              extra: Callable[[Path], None] | None = None,
              command: list[str] | None = None) -> Path:
    """Write the run folder atomically (temp folder, then rename); ``extra(folder)``
    may add files of its own before the folder moves into place.  ``run.json`` holds the
    report header plus what re-runs the run (``sim/provenance.py``); ``command`` is the
    command line recorded there."""
    from reports.run_report import write_report
    from sim.provenance import run_record

    with atomic_folder(out_dir, kind="run") as tmp:
        with open(tmp / "requests.csv", "w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(REQUEST_COLUMNS)
            for r in (getattr(dep, "records", None) or rows):
                w.writerow([_fmt(v) for v in r])
        # wall_s and sim_requests_per_s measure this machine; every other field (and
        # every other file but run.json's command and commit) is byte-identical for the
        # same inputs and seed.
        with open(tmp / "summary.json", "w") as f:
            # allow_nan=False: NaN is not JSON; a NaN here is a bug and must show
            json.dump(summary, f, indent=1, sort_keys=False, allow_nan=False)
            f.write("\n")
        with open(tmp / "run.json", "w") as f:
            json.dump({**run_header(sc, dep), **run_record(sc, command)}, f, indent=1)
            f.write("\n")
        if report:
            write_report(tmp)
        if extra is not None:
            extra(tmp)
    return Path(out_dir)
