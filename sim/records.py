"""What a run folder holds, by name: the request record (one ``requests.csv`` row,
field for column) and the fields of ``summary.json``.

Writers (``sim/run.py``) and readers (``reports/``, ``sim compare``, ``sim check``,
calibration) use these names, never positions.  The compiled recorder
(``sim/engine/record.py``) builds plain tuples in this column order, arrival index
first; ``sim/run.py`` turns them into records once the replay is over."""
from __future__ import annotations

from typing import NamedTuple, Union

Number = Union[int, str]          # "" in a request refused on arrival (no measurement)
Seconds = Union[float, str]


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


REQUEST_COLUMNS: tuple[str, ...] = RequestRecord._fields
INT_COLUMNS = frozenset({"prompt_tokens", "hit_tokens", "attention_hit_tokens", "lost_tokens",
                         "junction", "recomputed_tokens", "output_tokens", "preemptions",
                         "mamba_states_written"})
TEXT_COLUMNS = frozenset({"request_id", "session", "rejected"})

# summary.json, in file order (wall_s and sim_requests_per_s measure the machine; every
# other field is byte-identical for the same inputs and seed)
SUMMARY_FIELDS: tuple[str, ...] = (
    "scenario", "model", "policy", "block_size", "hash_block_size", "num_gpu_blocks", "requests",
    "rejected_requests", "prompt_tokens", "hit_tokens", "token_hit_rate", "request_hit_rate",
    "lost_tokens", "lost_token_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
    "output_tokens", "makespan_s", "throughput_tok_s", "mamba_state_bytes_peak", "kv_bytes_peak",
    "evictions", "preemptions", "steps", "wall_s", "sim_requests_per_s",
)


def records_in_arrival_order(served: list[tuple], refused: list[tuple]) -> list[RequestRecord]:
    """The recorder's tuples (arrival index first) as records, in arrival order."""
    rows = sorted([*served, *refused], key=lambda t: t[0])
    return [RequestRecord(*t[1:]) for t in rows]


def read_request_records(path) -> list[RequestRecord]:
    """``requests.csv`` back into records, by column name (a folder written before a
    column existed gets its default)."""
    import csv

    out = []
    with open(path, newline="") as f:
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
