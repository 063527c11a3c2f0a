"""Trace lines as ``TraceRequest`` records: the request ids every reader gives, and a
Mooncake trace file's lines in file order.

Compiled with the hot path (``sim/native.py``): the reader runs once per record, and
its loop interpreted (the checks, the request id, the generator's resume) cost about
as much as decoding the line.  ``workloads.traces.MooncakeConfig`` owns the format
(fields, units, errors); this module is only its happy path, which does what a valid
line needs (one ``orjson.loads``, exact type tests, as JSON numbers decode to int or
float); every check is still made, and a line failing one goes to the config's
``bad`` callback, which raises the one-line error naming ``path:line``.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any, Final, NoReturn

import orjson

from sim.config.loader import decode_line
from workloads.base import MAX_COUNT, TraceRequest, WorkloadError, show
from workloads.hash_ids import hash_id_segments

ID_DIGITS: Final = 7   # request ids: "r" + the record index, zero-padded to 7 digits


def request_id(index: int) -> str:
    """Trace request ids: ``r`` + the 0-based record index (>= 0), zero-padded to
    ``ID_DIGITS`` digits: ``f"r{index:07d}"``, without the format-spec machinery."""
    s = str(index)
    if len(s) < ID_DIGITS:
        return "r" + "0" * (ID_DIGITS - len(s)) + s
    return "r" + s


def mooncake_records(path: str, block: int, limit: int, time_scale: float,
                     bad: Callable[[dict[str, Any], str, Any], NoReturn]
                     ) -> Iterator[TraceRequest]:
    """The records of the Mooncake JSONL file ``path`` (``limit`` >= 0: the first so
    many; -1: all), ``block`` tokens a hash id, arrivals ``timestamp / 1000 *
    time_scale``; a blank line is skipped, one that is not JSON or not UTF-8 raises
    ``WorkloadError`` naming ``path:line``, and a record failing a field check is
    handed to ``bad(record, "path:line", previous timestamp)``, which raises."""
    prev_ts: Any = None
    max_count = MAX_COUNT     # (a local: no module-global lookup a record)
    index = 0
    lineno = 0
    with open(path, "rb") as fh:      # orjson decodes (and checks) UTF-8 itself
        for line in fh:
            lineno += 1
            if 0 <= limit <= index:
                return
            try:
                rec = orjson.loads(line)
            except json.JSONDecodeError as e:
                if not line.strip():
                    continue   # blank line
                decode_line(line, path, lineno, WorkloadError)   # names a non-UTF-8 byte
                raise WorkloadError(f"{path}:{lineno}: invalid JSON ({e.msg} at column "
                                    f"{e.colno})") from None
            if type(rec) is not dict:
                raise WorkloadError(f"{path}:{lineno}: expected a JSON object, got {show(rec)}")
            ts = rec.get("timestamp")
            n_in = rec.get("input_length")
            n_out = rec.get("output_length")
            ids = rec.get("hash_ids")
            if ts is None or n_in is None or n_out is None or ids is None:
                bad(rec, f"{path}:{lineno}", prev_ts)
            tt = type(ts)
            if not ((tt is int or (tt is float and math.isfinite(ts))) and ts >= 0
                    and (prev_ts is None or ts >= prev_ts)
                    and type(n_in) is int and 1 <= n_in <= max_count
                    and type(n_out) is int and 1 <= n_out <= max_count):
                bad(rec, f"{path}:{lineno}", prev_ts)
            rid = request_id(index)
            segs = hash_id_segments(ids, n_in, block, rid)
            if segs is None:
                bad(rec, f"{path}:{lineno}", prev_ts)
            yield TraceRequest(rid, ts / 1000.0 * time_scale, segs, n_out)
            prev_ts = ts
            index += 1
