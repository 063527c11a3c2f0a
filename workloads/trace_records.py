"""Trace lines as ``TraceRequest`` records: the request ids every reader gives, and a
Mooncake trace file's lines in file order.

Compiled with the hot path (``sim/native.py``): the reader runs once per record, and
its loop interpreted (the checks, the request id, the generator's resume) cost about
as much as decoding the line.  ``workloads.traces.MooncakeConfig`` owns the format
(fields, units, errors); this module is only its happy path, which does what a valid
line needs; every check is still made, and a line failing one goes to the config's
``bad`` callback, which raises the one-line error naming ``path:line``.

A line in the layout the published trace is written in (``{"timestamp": T,
"input_length": N, "output_length": M, "hash_ids": [H, ...]}``, integers only) is
read by ``layout_record``, byte by byte, straight into machine integers: no dict, no
key strings, no int object per hash id (~25 a record), which ``orjson.loads`` makes
and the replay frees again (together ~10 k CPU instructions of a ~280 k Mooncake
request).  Any other line, and any line the layout reader is unsure of, goes through
``orjson.loads`` as before: the layout reader accepts only text that is valid JSON
and that ``orjson`` decodes to exactly these values.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any, Final, NoReturn

import orjson
from librt.strings import StringWriter
from librt.vecs import append, vec
from mypy_extensions import i32, i64

from sim.config.loader import decode_line
from workloads.base import MAX_COUNT, MAX_REQUESTS, MAX_TIME_S, TraceRequest, WorkloadError, show
from workloads.hash_ids import hash_id_segments, layout_prompt

ID_DIGITS: Final = 7   # request ids: "r" + the record index, zero-padded to 7 digits
ID_PAD: Final = 10_000_000   # 10 ** ID_DIGITS

# the published trace's layout, as ``layout_record`` reads it
HEAD: Final = b'{"timestamp": '
INPUT: Final = b', "input_length": '
OUTPUT: Final = b', "output_length": '
IDS: Final = b', "hash_ids": ['
# digits a layout number may have: at most 15, so every value is below 2**53 (a
# timestamp converts to a float exactly; a hash id is in hash_id_segments' range)
MAX_DIGITS: Final = 15
NOT_LAYOUT: Final = -1   # layout_record's timestamp for a line not in the layout


def request_id(index: int) -> str:
    """Trace request ids: ``r`` + the 0-based record index (>= 0), zero-padded to
    ``ID_DIGITS`` digits: ``f"r{index:07d}"``, without the format-spec machinery (in
    the compiled build: the digits into one ``StringWriter``, no intermediate str)."""
    if index < 0 or index >= ID_PAD:
        return "r" + str(index)
    # (its seven digits from the last, into one word, then written from the first:
    # v * ceil(2**34 / 10) >> 34 is v // 10 below 2**31)
    v: i64 = index
    word: i64 = 0
    shift: i64 = 0
    while shift < 56:
        q = (v * 1717986919) >> 34
        word |= (48 + v - q * 10) << shift
        shift += 8
        v = q
    w = StringWriter()
    w.append(114)   # "r"
    while shift:
        shift -= 8
        w.append(i32((word >> shift) & 255))
    return w.getvalue()


def _literal(line: bytes, i: i64, lit: bytes) -> i64:
    """The index past ``lit`` when ``line`` holds it at ``i``, else -1 (one slice
    compared: a byte at a time costs more for these 14- to 18-byte keys)."""
    if i < 0:
        return -1
    j = i + len(lit)
    return j if line[i:j] == lit else -1


def _number(line: bytes, i: i64, n: i64) -> tuple[i64, i64]:
    """The JSON integer at ``line[i]`` written as 1 to ``MAX_DIGITS`` digits (no sign,
    no leading zero but a lone 0, as JSON has it), and the index past it; ``(0, -1)``
    when there is none there."""
    if i < 0:
        return 0, -1
    start = i
    v: i64 = 0
    while i < n:
        c: i64 = line[i]
        if c < 48 or c > 57:
            break
        if i - start == MAX_DIGITS:
            return 0, -1
        v = v * 10 + (c - 48)
        i += 1
    if i == start or (i - start > 1 and line[start] == 48):
        return 0, -1
    return v, i


def layout_record(line: bytes) -> tuple[i64, i64, i64, vec[i64]]:
    """``(timestamp, input_length, output_length, hash_ids)`` of a line written exactly
    in the published trace's layout (the four keys in that order, ``": "`` and ``", "``
    between, integers of at most ``MAX_DIGITS`` digits, at least one hash id, the line
    ending right after ``]}`` or its ``\\n``); ``NOT_LAYOUT`` as the timestamp for any
    other line.  Such a line is valid JSON, and ``orjson.loads`` makes of it a dict of
    exactly these integers (the fields checked as ever: ``mooncake_records``)."""
    ids = vec[i64]()
    n: i64 = len(line)
    if n > 0 and line[n - 1] == 10:
        n -= 1
    ts, i = _number(line, len(HEAD) if line.startswith(HEAD) else -1, n)
    n_in, i = _number(line, _literal(line, i, INPUT), n)
    n_out, i = _number(line, _literal(line, i, OUTPUT), n)
    i = _literal(line, i, IDS)
    if i < 0 or i > n:
        return NOT_LAYOUT, 0, 0, ids
    # (room for every id the rest can hold: each takes at least three bytes with its
    # separator, or the closing "]}")
    ids = vec[i64](capacity=(n - i) // 3 + 1)
    while True:
        h, i = _number(line, i, n)
        if i < 0:
            return NOT_LAYOUT, 0, 0, ids
        ids = append(ids, h)
        if i + 2 > n:
            return NOT_LAYOUT, 0, 0, ids
        c: i64 = line[i]
        d: i64 = line[i + 1]
        if c == 93 and d == 125 and i + 2 == n:   # "]}": the end
            return ts, n_in, n_out, ids
        if c != 44 or d != 32:                    # ", ": the next id
            return NOT_LAYOUT, 0, 0, ids
        i += 2


def mooncake_records(path: str, block: int, limit: int, time_scale: float,
                     bad: Callable[[dict[str, Any], str, Any], NoReturn]
                     ) -> Iterator[TraceRequest]:
    """The records of the Mooncake JSONL file ``path`` (``limit`` >= 0: the first so
    many; -1: all), ``block`` tokens a hash id, arrivals ``timestamp / 1000 *
    time_scale``; a blank line is skipped, one that is not JSON or not UTF-8 raises
    ``WorkloadError`` naming ``path:line``, and a record failing a field check is
    handed to ``bad(record, "path:line", previous timestamp)``, which raises (an arrival
    past ``MAX_TIME_S`` included).  More than ``MAX_REQUESTS`` records (with no ``limit``
    below that) is a ``WorkloadError`` at the line past them."""
    prev_ts: Any = None
    max_count = MAX_COUNT     # (a local: no module-global lookup a record)
    max_time: float = MAX_TIME_S
    index = 0
    lineno = 0
    with open(path, "rb") as fh:      # orjson decodes (and checks) UTF-8 itself
        for line in fh:
            lineno += 1
            if 0 <= limit <= index:
                return
            if index >= MAX_REQUESTS and line.strip():
                raise WorkloadError(f"{path}:{lineno}: more than {MAX_REQUESTS:,} requests, the "
                                    "most a run may have (set workload.num_requests)")
            lts, l_in, l_out, l_ids = layout_record(line)
            if (lts >= 0 and (prev_ts is None or lts >= prev_ts)
                    and 1 <= l_in <= max_count and 1 <= l_out <= max_count
                    and float(lts) / 1000.0 * time_scale <= max_time):
                # (the line's layout and its checks passed: what the general way makes
                # of it, without decoding it as a dict)
                rid = request_id(index)
                yield TraceRequest(rid, float(lts) / 1000.0 * time_scale,
                                   layout_prompt(l_ids, l_in, block, rid), l_out)
                prev_ts = lts
                index += 1
                continue
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
                    and type(n_out) is int and 1 <= n_out <= max_count
                    and ts / 1000.0 * time_scale <= max_time):
                bad(rec, f"{path}:{lineno}", prev_ts)
            rid = request_id(index)
            segs = hash_id_segments(ids, n_in, block, rid)
            if segs is None:
                bad(rec, f"{path}:{lineno}", prev_ts)
            yield TraceRequest(rid, ts / 1000.0 * time_scale, segs, n_out)
            prev_ts = ts
            index += 1
