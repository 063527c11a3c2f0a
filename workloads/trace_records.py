"""Trace lines as ``TraceRequest`` records: the request ids every reader gives, and a
Mooncake trace file's lines in file order.

A line in the layout the published trace is written in, passing every check, is read by
the compiled codec ``sim.engine.codecs.mooncake_lines`` (byte by byte into machine
integers; interpreted, the reader would cost a Mooncake request more than the rest of its
replay).  This module is its plain reference twin and the rest of the format: every other
line is read here through ``orjson`` (``Lines.other``), and ``plain_records`` reads every
line that way; a test reads random files both ways.  ``workloads.traces.MooncakeConfig``
owns the format (fields, units, errors): a line failing a check goes to the config's
``bad`` callback, which raises the one-line error naming ``path:line``.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import Any, Final, NoReturn

import orjson
from librt.vecs import vec
from mypy_extensions import i64

from sim.config.loader import decode_line
from sim.engine.codecs import TraceLimits, mooncake_lines, request_id
from workloads.base import (MAX_COUNT, MAX_REQUESTS, MAX_TIME_S, HashIds, TraceRequest,
                            WorkloadError, show)

__all__ = ["LIMIT", "TAIL", "Lines", "hash_id_segments", "mooncake_records", "plain_records",
           "request_id"]

LIMIT: Final = 1 << 53   # hash ids are integers in [0, 2**53)
TAIL: Final = "mcu/"     # the private stream past a record's ids: "mcu/<request id>"
LIMITS: Final = TraceLimits(MAX_COUNT, MAX_TIME_S, MAX_REQUESTS)


def hash_id_segments(ids: object, n_in: int, block: int, rid: str) -> HashIds | None:
    """The prompt of ``n_in`` tokens over ``block``-token hash ids (a Mooncake trace
    record) as a ``workloads.base.HashIds``: ``(h, 0, block)`` per id ``h`` (the stream
    ``mc/<h>``, named by its integer: ``workloads.base.Segment``), the last one cut to
    ``n_in``, and a private ``("mcu/<rid>", 0, rest)`` when the ids cover fewer than
    ``n_in`` tokens.  None when ``ids`` is not a list of integers in ``[0, 2**53)``
    (bools and floats included: JSON integers decode as int exactly)."""
    if not isinstance(ids, list):
        return None
    for h in ids:
        if type(h) is not int or h < 0 or h >= LIMIT:
            return None
    tail = TAIL + rid if block * len(ids) < n_in else ""
    return HashIds(vec[i64](ids), n_in, block, tail)


class Lines:
    """The lines of the Mooncake file ``path`` that the codec leaves to the general way
    (``other``), ``block`` tokens a hash id, arrivals ``timestamp / 1000 * time_scale``;
    ``bad(record, "path:line", previous timestamp)`` raises for a record failing a
    field check."""

    def __init__(self, path: str, block: int, time_scale: float,
                 bad: Callable[[dict[str, Any], str, Any], NoReturn]):
        self.path = path
        self.block = block
        self.time_scale = time_scale
        self.bad = bad

    def other(self, line: bytes, lineno: int, index: int,
              prev_ts: Any) -> tuple[TraceRequest, Any] | None:
        """Record ``index`` (0-based) read from ``line`` (line ``lineno``, 1-based) through
        ``orjson``, with its timestamp; None for a blank line.  A line that is not JSON
        or not UTF-8 raises ``WorkloadError`` naming ``path:line``, a record failing a
        field check goes to ``bad`` (an arrival past ``MAX_TIME_S`` included), and a
        record past the first ``MAX_REQUESTS`` is a ``WorkloadError``."""
        path = self.path
        if index >= MAX_REQUESTS and line.strip():
            raise WorkloadError(f"{path}:{lineno}: more than {MAX_REQUESTS:,} requests, the "
                                "most a run may have (set workload.num_requests)")
        try:
            rec = orjson.loads(line)
        except json.JSONDecodeError as e:
            if not line.strip():
                return None   # blank line
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
            self.bad(rec, f"{path}:{lineno}", prev_ts)
        tt = type(ts)
        scale = self.time_scale
        if not ((tt is int or (tt is float and math.isfinite(ts))) and ts >= 0
                and (prev_ts is None or ts >= prev_ts)
                and type(n_in) is int and 1 <= n_in <= MAX_COUNT
                and type(n_out) is int and 1 <= n_out <= MAX_COUNT
                and ts / 1000.0 * scale <= MAX_TIME_S):
            self.bad(rec, f"{path}:{lineno}", prev_ts)
        rid = request_id(index)
        segs = hash_id_segments(ids, n_in, self.block, rid)
        if segs is None:
            self.bad(rec, f"{path}:{lineno}", prev_ts)
        return TraceRequest(rid, ts / 1000.0 * scale, segs, n_out), ts


def mooncake_records(path: str, block: int, limit: int, time_scale: float,
                     bad: Callable[[dict[str, Any], str, Any], NoReturn]
                     ) -> Iterator[TraceRequest]:
    """The records of the Mooncake JSONL file ``path`` (``limit`` >= 0: the first so
    many; -1: all), ``block`` tokens a hash id, arrivals ``timestamp / 1000 *
    time_scale``; a blank line is skipped, one that is not JSON or not UTF-8 raises
    ``WorkloadError`` naming ``path:line``, and a record failing a field check is
    handed to ``bad(record, "path:line", previous timestamp)``, which raises (an arrival
    past ``MAX_TIME_S`` included).  More than ``MAX_REQUESTS`` records (with no ``limit``
    below that) is a ``WorkloadError`` at the line past them.  Lazy: the file is opened
    at the first record asked for."""
    lines = Lines(path, block, time_scale, bad)
    return mooncake_lines(path, block, limit, time_scale, LIMITS, TAIL, TraceRequest, HashIds,
                          lines.other)


def plain_records(path: str, block: int, limit: int, time_scale: float,
                  bad: Callable[[dict[str, Any], str, Any], NoReturn]
                  ) -> Iterator[TraceRequest]:
    """``mooncake_records`` with every line read through ``orjson`` (``Lines.other``):
    the plain reference the codec's records are compared with."""
    lines = Lines(path, block, time_scale, bad)
    prev_ts: Any = None
    index = 0
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if 0 <= limit <= index:
                return
            got = lines.other(line, lineno, index, prev_ts)
            if got is None:
                continue
            rec, prev_ts = got
            yield rec
            index += 1
