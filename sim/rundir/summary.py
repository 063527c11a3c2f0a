"""summary.json's fields from a replay's rows (``SUMMARY_FIELDS``; a fleet's summary
reads them too, ``sim/cluster/outputs.py``): hits, latency percentiles, rates, the pool,
miss classes, the CPU tier's fields; and run.json's header."""
from __future__ import annotations


import operator
from array import array
from itertools import compress
from typing import Sequence

from sim.config.scenario import Scenario
from sim.engine.record import StepSampler
from sim.rundir.records import (LATENCY_STATS, MISS_CLASSES, OFFLOAD_SUMMARY_FIELDS,
                                SUMMARY_FIELDS, RequestRecord)
from sim.rundir.request_table import RequestTable
from sim.rundir.stats import mean, percentiles, weighted_percentiles


def column(rows, name: str):
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


def ttfts_makespan(rows) -> tuple[Sequence[float], float]:
    """The TTFTs in increasing order (summed left to right by the caller: a list) and
    the makespan (last finish - first arrival): of arrays of doubles by numpy (a sort
    and an elementwise sum: the same doubles; stable, as sorted is, for -0.0 beside 0.0),
    else value by value (and with a NaN, whose place in a sort Python and numpy do not
    agree on)."""
    ttft, arrivals, e2e = (column(rows, c) for c in ("ttft_s", "arrival_s", "e2e_s"))
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
    prompt = _isum(column(rows, "prompt_tokens"))
    hit = _isum(column(rows, "hit_tokens"))
    lost = _isum(column(rows, "lost_tokens"))
    out_tokens = _isum(column(rows, "output_tokens"))
    ttfts, makespan = ttfts_makespan(rows)
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
        "request_hit_rate": _positive(column(rows, "hit_tokens")) / n if n else 0.0,
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
    assert tuple(summary) == SUMMARY_FIELDS   # (sim/rundir/records.py names them, in file order)
    return summary


def miss_fields(rows: list[RequestRecord], prompt: int) -> dict:
    """Miss attribution totals (tokens) and their shares of the prompt tokens; ``reusable``
    is what an unlimited attention-only cache would reuse (hit + every class but
    compulsory).  None with attribution off."""
    compulsory = column(rows, "compulsory_tokens")
    out: dict = {}
    if isinstance(compulsory, array) and len(compulsory):
        # (no blank: every row attributed, each class's column an array too)
        totals = {name: _isum(column(rows, f"{name}_tokens")) for name in MISS_CLASSES}
        totals["reusable"] = _isum(column(rows, "prompt_tokens")) - _isum(compulsory)
    else:
        on = [v != "" for v in compulsory]      # rows attributed (all or none, in a run)
        totals = {name: sum(compress(column(rows, f"{name}_tokens"), on)) if any(on) else None
                  for name in MISS_CLASSES}
        if any(on):
            totals["reusable"] = sum(compress(map(operator.sub, column(rows, "prompt_tokens"),
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
    out.update(_stats("ttft", column(rows, "ttft_s")))
    # (a table's column without its blanks by numpy: the same doubles, the same order)
    tpot = rows.floats("tpot_ms") if isinstance(rows, RequestTable) else None
    out.update(_stats("tpot", tpot * 1e-3 if tpot is not None else
                      [v * 1e-3 for v in column(rows, "tpot_ms") if v != ""]))
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
    out.update(_stats("e2el", column(rows, "e2e_s")))
    out.update(_stats("queue_time", column(rows, "queue_s")))
    return out


def rate_fields(sc: Scenario, dep, rows: list[RequestRecord], makespan: float) -> dict:
    """Throughputs over the makespan (requests, output tokens, prompt + output tokens per
    second of simulated time), the arrival rate (requests, refused ones included, over
    the arrival span), and with SLOs the share of requests meeting them (refused ones
    count as missing them) and the rate of those that do."""
    n = len(rows)
    prompt = _isum(column(rows, "prompt_tokens"))
    out_tokens = _isum(column(rows, "output_tokens"))
    arrivals = column(dep.records or rows, "arrival_s")
    span = max(arrivals) - min(arrivals) if len(arrivals) else 0.0
    per_s = (lambda x: x / makespan) if makespan > 0 else (lambda x: 0.0)
    active = sc.slo.active
    # (read only with SLOs: without, the column is blank)
    good = sum(1 for v in column(rows, "slo_ok") if v == 1) if active else 0
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


def offload_summary(sc: Scenario, dep, rows, summary: dict) -> dict:
    """summary.json with the CPU tier's fields (``OFFLOAD_SUMMARY_FIELDS``) before the two
    that measure the machine; a fleet's (``dep.replicas``) are every replica's, summed, as
    its ``pool_bytes`` is."""
    conns = [r.dep.offload for r in dep.replicas] if hasattr(dep, "replicas") else [dep.offload]
    pools = [c.pool for c in conns]
    prompt = summary["prompt_tokens"]
    cpu = [v for v in column(rows, "cpu_hit_tokens") if v != ""]
    miss = [v for v in column(rows, "cpu_no_state_tokens") if v != ""]
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
