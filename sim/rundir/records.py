"""What a run folder holds, by name: the request record (one ``requests.csv`` row,
field for column) and the fields of ``summary.json``.

Writers (``sim/commands/run.py``) and readers (``reports/``, ``sim compare``, ``sim check``,
calibration) use these names, never positions.  The compiled recorder
(``sim/engine/record.py``) builds plain tuples in this column order, arrival index
first; ``sim/rundir/request_table.py`` keeps them column by column and reads them back as
records (``sim/commands/run.py``: a run's requests, in arrival order)."""
from __future__ import annotations

from typing import NamedTuple, Union

Number = Union[int, str]          # "" in a request refused on arrival (no measurement)
Seconds = Union[float, str]
Millis = Union[float, str]


class RequestRecord(NamedTuple):
    """One request of a run, in ``requests.csv`` column order."""

    request_id: str
    session: str                      # "" outside a session
    arrival_s: float
    prompt_tokens: int
    hit_tokens: Number                # reconciled prefix hit at first admission
    attention_hit_tokens: Number      # full attention alone
    lost_tokens: Number               # attention hit given up by reconciliation
    junction: Number
    recomputed_tokens: Number
    queue_s: Seconds
    ttft_s: Seconds
    e2e_s: Seconds
    output_tokens: Number
    preemptions: Number
    mamba_states_written: Number
    # "" for a served request, else why it was refused on arrival; such a row holds only
    # request_id, session, arrival_s and prompt_tokens
    rejected: str = ""
    # (columns added later go here, at the end, with a default: older run folders read back)
    tpot_ms: Millis = ""              # (e2e - ttft) / (output_tokens - 1); "" for one token
    itl_ms: Millis = ""               # (e2e - ttft) / (output_chunks - 1): this request's mean ITL
    output_chunks: Number = ""        # steps that delivered its tokens (spec decode: < tokens)
    slo_ok: Number = ""               # 1 when it met every SLO of the scenario, 0 not; "" no SLO
    # why the prompt missed, at its first admission (sim/cache/attribution.py): with
    # hit_tokens these add up to prompt_tokens; "" with `attribution: false`
    compulsory_tokens: Number = ""    # never computed before (nor being computed)
    capacity_tokens: Number = ""      # computed and cached, then evicted
    checkpoint_tokens: Number = ""    # full attention held it; no usable Mamba state / window
    speculative_tokens: Number = ""   # lost to the EAGLE drop
    in_flight_tokens: Number = ""     # an admitted request had yet to compute it
    checkpoint_reason: str = ""       # evicted | retention | junction | align | window, or ""
    capacity_evicted_by: str = ""     # a capacity miss: the request whose allocation evicted it


REQUEST_COLUMNS: tuple[str, ...] = RequestRecord._fields
INT_COLUMNS = frozenset({"prompt_tokens", "hit_tokens", "attention_hit_tokens", "lost_tokens",
                         "junction", "recomputed_tokens", "output_tokens", "preemptions",
                         "mamba_states_written", "output_chunks", "slo_ok",
                         "compulsory_tokens", "capacity_tokens", "checkpoint_tokens",
                         "speculative_tokens", "in_flight_tokens"})
TEXT_COLUMNS = frozenset({"request_id", "session", "rejected", "checkpoint_reason",
                          "capacity_evicted_by"})
# the miss classes in requests.csv, hit first (a waterfall's order)
MISS_COLUMNS: tuple[str, ...] = ("hit_tokens", "speculative_tokens", "checkpoint_tokens",
                                 "capacity_tokens", "in_flight_tokens", "compulsory_tokens")

# latency statistics: mean and percentiles of TTFT, TPOT, ITL, end-to-end latency and
# queueing delay (arrival to first scheduled), in ms, named as `vllm bench serve` names them
LATENCY_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el", "queue_time")
LATENCY_STATS: tuple[str, ...] = ("mean", "p50", "p90", "p99")
LATENCY_FIELDS: tuple[str, ...] = tuple(f"{stat}_{metric}_ms" for metric in LATENCY_METRICS
                                        for stat in LATENCY_STATS)

# the miss classes of summary.json (``miss_<class>_tokens`` / ``_rate``; ``reusable``: what an
# unlimited attention-only cache would reuse = prompt - compulsory)
MISS_CLASSES: tuple[str, ...] = ("compulsory", "capacity", "checkpoint", "speculative",
                                 "in_flight")
MISS_FIELDS: tuple[str, ...] = (*(f"miss_{c}_tokens" for c in MISS_CLASSES), "reusable_tokens",
                                *(f"miss_{c}_rate" for c in MISS_CLASSES), "reusable_token_rate")

# summary.json, in file order (wall_s and sim_requests_per_s measure the machine; every
# other field is byte-identical for the same inputs and seed)
SUMMARY_FIELDS: tuple[str, ...] = (
    "scenario", "model", "policy", "block_size", "hash_block_size", "num_gpu_blocks", "requests",
    "rejected_requests", "prompt_tokens", "hit_tokens", "token_hit_rate", "request_hit_rate",
    "lost_tokens", "lost_token_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
    "output_tokens", "makespan_s", "throughput_tok_s", "mamba_state_bytes_peak", "kv_bytes_peak",
    "evictions", "preemptions", "steps",
    # as `vllm bench serve` names and reports them (ms; throughputs per s of simulated time)
    *LATENCY_FIELDS,
    "request_throughput", "output_throughput", "total_token_throughput", "arrival_rate",
    "slo_attainment", "request_goodput",
    # memory per GPU: the pool, and what it held at once (any step; unlike the two peaks
    # above, which need not coincide)
    "pool_bytes", "occupied_bytes_peak", "in_use_bytes_peak",
    # miss attribution (sim/cache/attribution.py): tokens per class, then shares of the
    # prompt tokens; null with `attribution: false`
    *MISS_FIELDS,
    "wall_s", "sim_requests_per_s",
)

# memory.csv (sim/engine/record.py StepSampler): one row per engine step, thinned evenly
MEMORY_COLUMNS: tuple[str, ...] = ("time_s", "kv_blocks", "mamba_blocks", "in_use_blocks",
                                   "cached_blocks", "running", "waiting")

# the CPU tier (``kv_offloading``; sim/cache/offload.py), written only when it is on, after
# the columns and fields above: per request the tokens its first admission loaded from the
# host pool, and those the pool held in every attention group past the hit but could not
# serve (no Mamba state at a deeper chunk boundary, or off the Mamba chunk grid); the run's
# host pool (``host_pool_bytes`` per GPU, as ``pool_bytes``; ``kv_offloading_size_bytes``
# over the replica), bytes moved over every GPU's link, host hits and evictions; the host
# chunks held at each memory row
OFFLOAD_COLUMNS: tuple[str, ...] = ("cpu_hit_tokens", "cpu_no_state_tokens")
OFFLOAD_SUMMARY_FIELDS: tuple[str, ...] = (
    "kv_offloading_size_bytes", "host_chunks", "host_chunk_bytes", "host_pool_bytes",
    "cpu_hit_tokens", "cpu_token_hit_rate", "cpu_request_hit_rate", "offload_loaded_bytes",
    "offload_stored_bytes", "host_evictions", "host_store_failures", "host_chunks_peak",
    "miss_cpu_no_state_tokens", "miss_cpu_no_state_rate")
OFFLOAD_MEMORY_COLUMNS: tuple[str, ...] = ("host_chunks",)


class MemoryFields(list):
    """memory.csv's columns as written: ``(%-format, values)`` each, in order, and their
    ``names`` (``MEMORY_COLUMNS``, then the CPU tier's, then a fleet's ``replica``) --
    which columns a run has is known where they are built, not guessed from a count."""

    def __init__(self, names: tuple[str, ...], fields) -> None:
        super().__init__(fields)
        self.names = tuple(names)
        if len(self.names) != len(self):
            raise ValueError(f"{len(self)} memory columns for {len(self.names)} names")


def records_in_arrival_order(served: list[tuple], refused: list[tuple],
                             slo=None) -> list[RequestRecord]:
    """The recorder's tuples (arrival index first) as records, in arrival order; with an
    active ``slo`` (``sim.config.slo.SLOSection``) each served record's ``slo_ok`` says
    whether it met every objective.  A list of full records (~700 bytes a request):
    ``simulate`` keeps its requests as ``sim.rundir.request_table.RequestColumns`` instead, which
    reads back the same records (tests/metrics/test_request_table.py holds it to this)."""
    rows = sorted([*served, *refused], key=lambda t: t[0])
    out = [RequestRecord(*t[1:]) for t in rows]
    if slo is not None and slo.active:
        out = [r if r.rejected else r._replace(slo_ok=int(slo.met(
            r.ttft_s, r.tpot_ms * 1e-3 if r.tpot_ms != "" else 0.0, r.e2e_s))) for r in out]
    return out


def read_request_records(path) -> list[RequestRecord]:
    """``requests.csv`` back into records, by column name (a folder written before a
    column existed gets its default)."""
    import csv

    from sim.config.loader import open_input

    out = []
    with open_input(path, text=True, newline="") as f:
        rd = csv.reader(f)
        header = next(rd)
        for rec in rd:
            vals = {}
            for name, v in zip(header, rec):
                if name not in REQUEST_COLUMNS:
                    continue
                if name in TEXT_COLUMNS or v == "":
                    vals[name] = v
                elif name in INT_COLUMNS:
                    vals[name] = int(v)
                else:
                    vals[name] = float(v)
            out.append(RequestRecord(**vals))
    return out
