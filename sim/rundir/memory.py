"""memory.csv: the pool over time, from a replica's step sampler, as written."""
from __future__ import annotations


import csv
from array import array
from pathlib import Path
from typing import Sequence

from sim.engine.record import ROW_FIELDS, StepSampler
from sim.rundir.records import MEMORY_COLUMNS, MemoryFields, OFFLOAD_MEMORY_COLUMNS
from sim.rundir import requests_csv


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


def write_memory_csv(path: Path, fields: MemoryFields) -> None:
    """``memory.csv`` from its ``memory_fields`` (as ``csv.writer`` writes each row: at
    most MEMORY_ROWS rows, one %-formatting)."""
    with open(path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerow(fields.names)
        requests_csv.write_fields(f, fields)
