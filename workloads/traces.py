"""Public traces, streamed line by line: ``mooncake`` (FAST'25 JSONL with block
hash ids) and ``azure`` (Azure LLM inference 2023 CSV, token counts only)."""
from __future__ import annotations

import calendar
import csv
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NoReturn

from sim.config.loader import decode_line
from workloads.base import (MAX_COUNT, MAX_REQUESTS, MAX_TIME_S, Fields, TraceRequest,
                            WorkloadError, is_int, is_number, show, time_limit_error)
from workloads.trace_records import mooncake_records, request_id

WHERE = "workload"


def resolve(path: str, base_dir: Path | None) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute() and base_dir is not None:
        p = Path(base_dir) / p
    return p


def check_file(path: Path, name: str) -> None:
    """A trace must be a regular file: a FIFO, a device (``/dev/zero``) or a socket
    would hang or never end, and is refused naming the field."""
    import os
    import stat

    try:
        st = os.stat(path)
    except OSError:
        raise WorkloadError(f"{name}: no such file: {path}") from None
    if not stat.S_ISREG(st.st_mode):
        from sim.config.loader import file_kind

        raise WorkloadError(f"{name}: {path} is {file_kind(st.st_mode)}, not a regular file: "
                            "a trace is read from a file")


def _trace_fields(f: Fields) -> tuple[str, float, int | None]:
    path = f.str("path")
    time_scale = f.number("time_scale", 1.0, minimum=0.0)
    num_requests = f.int("num_requests", None, minimum=0, maximum=MAX_REQUESTS,
                         why="the most requests a run may have")
    return path, time_scale, num_requests


def _suffix(num_requests: int | None, time_scale: float) -> str:
    parts = []
    if time_scale != 1.0:
        parts.append(f"time x{time_scale:g}")
    if num_requests is not None:
        parts.append(f"first {num_requests}")
    return f" ({', '.join(parts)})" if parts else ""


# --------------------------------------------------------------------------- mooncake

@dataclass(frozen=True, slots=True)
class MooncakeConfig:
    """``kind: mooncake`` — Mooncake FAST'25 JSONL (``timestamp`` ms, ``input_length``,
    ``output_length``, ``hash_ids``).  Hash id ``h`` at block ``i`` is the segment
    ``(h, 0, block_tokens)`` (the stream ``mc/<h>``, named by its integer); the last
    block is cut so the prompt has exactly ``input_length`` tokens (ids beyond that
    are ignored, as the trace's README says: expand the blocks and truncate to
    ``input_length``).  Should ``input_length``
    exceed ``block_tokens * len(hash_ids)``, the rest is a private stream
    ``("mcu/<request id>", 0, rest)``.  Arrival = ``timestamp / 1000 * time_scale``.

    ``sessions: chain`` gives each record a session (requests.csv's ``session``; what a
    router's session affinity keys on): the trace's hash ids are prefix-chained (an equal
    id at position i means an equal prefix through block i), so a record whose ids extend
    all of an earlier record's ids continues that record's conversation; it joins the
    session of the longest such earlier record, else starts one named after itself.
    ``sessions: none`` (the default) leaves the column blank."""

    KIND: ClassVar[str] = "mooncake"
    KEYS: ClassVar[tuple[str, ...]] = ("kind", "path", "time_scale", "num_requests",
                                       "block_tokens", "sessions")

    path: str
    time_scale: float = 1.0
    num_requests: int | None = None     # the first N records (default: all)
    block_tokens: int = 512
    sessions: str = "none"              # none | chain

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any], where: str = WHERE) -> MooncakeConfig:
        f = Fields(m, where, cls.KEYS)
        path, time_scale, num_requests = _trace_fields(f)
        return cls(path, time_scale, num_requests, f.int("block_tokens", 512, minimum=1),
                   f.str("sessions", "none", ("none", "chain")))

    def requests(self, base_dir: Path | None = None) -> Iterator[TraceRequest]:
        path = resolve(self.path, base_dir)
        check_file(path, f"{WHERE}.path")
        if self.sessions == "chain":
            return chain_sessions(self._read(path))
        return self._read(path)

    def _read(self, path: Path) -> Iterator[TraceRequest]:
        """Records in file order (``workloads.trace_records``: a line in the trace's
        layout by the compiled codec, ``sim.engine.codecs``); a record failing a check is
        raised by ``_bad``, naming ``path:line``."""
        limit = -1 if self.num_requests is None else self.num_requests
        return mooncake_records(str(path), self.block_tokens, limit, self.time_scale,
                                self._bad)

    def _bad(self, rec: dict, where: str, prev_ts: float | None) -> NoReturn:
        """Raise the one-line error for a record that failed the fast checks."""
        for key in ("timestamp", "input_length", "output_length", "hash_ids"):
            if key not in rec:
                raise WorkloadError(f"{where}: missing field {show(key)}")
        ts = rec["timestamp"]
        if not is_number(ts) or ts < 0:
            raise WorkloadError(f"{where}: timestamp must be a number >= 0 (ms), got {show(ts)}")
        if prev_ts is not None and ts < prev_ts:
            raise WorkloadError(
                f"{where}: timestamp {ts} is before the previous record's {prev_ts}"
                " (the trace must be sorted by time)")
        for key in ("input_length", "output_length"):
            v = rec[key]
            if not is_int(v) or v < 1:
                raise WorkloadError(f"{where}: {key} must be an integer >= 1, got {show(v)}")
            if v > MAX_COUNT:
                raise WorkloadError(f"{where}: {key} must be below 2**62, got {v}")
        if ts / 1000.0 * self.time_scale > MAX_TIME_S:
            raise time_limit_error(f"{where}: timestamp", 0.0,
                                   f"{show(ts)} ms (x time_scale {self.time_scale:g}: "
                                   f"{ts / 1000.0 * self.time_scale:.3g} s)")
        # (what is left: hash_ids is not a list of integers in range)
        raise WorkloadError(f"{where}: hash_ids must be a list of integers in [0, 2**53), "
                            f"got {show(rec['hash_ids'])}")

    def describe(self) -> str:
        blk = "" if self.block_tokens == 512 else f", block {self.block_tokens}"
        ses = ", sessions by hash-id chain" if self.sessions == "chain" else ""
        return f"mooncake: {self.path}{blk}{ses}{_suffix(self.num_requests, self.time_scale)}"


def chain_sessions(records: Iterator[TraceRequest]) -> Iterator[TraceRequest]:
    """Each record with the session of the conversation it continues, or a new session
    named after itself (``MooncakeConfig``, ``sessions: chain``).

    A conversation's next turn sends the whole history again: the previous prompt, its
    answer, a new message.  So record B continues an earlier record A when B's hash ids
    extend all of A's *full* blocks (the trace's ids are prefix-chained: equal ids at
    position i mean an equal prefix through block i; A's partial last block is completed
    by its answer in B, so its id differs) and B's prompt is at least A's prompt plus A's
    answer long.  Only the earlier record with the most full blocks that B extends is
    asked (the latest of them): a B too short to continue it is a new conversation that
    shares its prefix (a system prompt, say), not a continuation of a shorter record.  A
    record with no full block continues nothing and is never continued.  A heuristic: the
    trace holds no session ids."""
    by_last: dict[int, tuple[str, int]] = {}   # last full block's id -> (session, tokens)
    for rec in records:
        seg = rec.segments
        ids = seg.ids
        n = seg.layout()[0]          # the ids the prompt uses
        length = rec.prompt_tokens
        full = length // seg.block if seg.block else 0
        if full > n:
            full = n
        session = None
        for k in range(full - 1, -1, -1):
            got = by_last.get(ids[k])
            if got is not None:       # the longest earlier prefix it extends decides
                if length >= got[1]:
                    session = got[0]
                break
        if session is None:
            session = f"s{rec.request_id}"
        if full:
            by_last[ids[full - 1]] = (session, length + rec.output_tokens)
        rec.session = session
        yield rec


# --------------------------------------------------------------------------- azure

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def parse_azure_timestamp(text: str) -> tuple[int, float]:
    """``2023-11-16 18:15:46.6805900`` (UTC) → (whole seconds since the epoch, fraction).
    Raises ``ValueError``."""
    whole, _, frac = text.strip().partition(".")
    secs = calendar.timegm(time.strptime(whole, "%Y-%m-%d %H:%M:%S"))
    if frac and not frac.isdigit():
        raise ValueError(f"bad fractional seconds {show(frac)}")
    return secs, (int(frac) / 10 ** len(frac) if frac else 0.0)


@dataclass(frozen=True, slots=True)
class AzureConfig:
    """``kind: azure`` — Azure LLM inference trace 2023 CSV (``TIMESTAMP``,
    ``ContextTokens``, ``GeneratedTokens``).  Arrival = seconds since the first row
    × ``time_scale``; each prompt is a private stream ``("az/<request id>", 0,
    ContextTokens)`` (the trace has no prefix information)."""

    KIND: ClassVar[str] = "azure"
    KEYS: ClassVar[tuple[str, ...]] = ("kind", "path", "time_scale", "num_requests")

    path: str
    time_scale: float = 1.0
    num_requests: int | None = None     # the first N rows (default: all)

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any], where: str = WHERE) -> AzureConfig:
        f = Fields(m, where, cls.KEYS)
        return cls(*_trace_fields(f))

    def requests(self, base_dir: Path | None = None) -> Iterator[TraceRequest]:
        path = resolve(self.path, base_dir)
        check_file(path, f"{WHERE}.path")
        return self._read(path)

    def _read(self, path: Path) -> Iterator[TraceRequest]:
        with open(path, "rb") as fh:
            reader = csv.reader(_text_lines(fh, str(path)))
            try:
                header = next(reader)
            except StopIteration:
                raise WorkloadError(f"{path}:1: empty file (expected a header "
                                    f"{','.join(AZURE_COLUMNS)})") from None
            except csv.Error as e:
                raise WorkloadError(f"{path}:1: bad CSV ({e})") from None
            header = [h.strip().lstrip("\ufeff") for h in header]
            missing = [c for c in AZURE_COLUMNS if c not in header]
            if missing:
                raise WorkloadError(f"{path}:1: header lacks column(s) {', '.join(missing)}"
                                    f" (got {','.join(header)})")
            col = [header.index(c) for c in AZURE_COLUMNS]
            origin: tuple[int, float] | None = None
            prev = 0.0
            index = 0
            while self.num_requests is None or index < self.num_requests:
                if index >= MAX_REQUESTS:
                    raise WorkloadError(f"{path}:{reader.line_num + 1}: more than "
                                        f"{MAX_REQUESTS:,} requests, the most a run may have "
                                        "(set workload.num_requests)")
                try:
                    row = next(reader)
                except StopIteration:
                    return
                except csv.Error as e:
                    raise WorkloadError(f"{path}:{reader.line_num}: bad CSV ({e})") from None
                where = f"{path}:{reader.line_num}"
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(header):
                    raise WorkloadError(f"{where}: expected {len(header)} columns, got {len(row)}")
                ts_text, ctx_text, gen_text = (row[i].strip() for i in col)
                try:
                    ts = parse_azure_timestamp(ts_text)
                except ValueError:
                    raise WorkloadError(f"{where}: bad TIMESTAMP {show(ts_text)}"
                                        " (want YYYY-MM-DD HH:MM:SS[.fraction])") from None
                ctx = _count(ctx_text, "ContextTokens", where)
                gen = _count(gen_text, "GeneratedTokens", where)
                if origin is None:
                    origin = ts
                rel = (ts[0] - origin[0]) + (ts[1] - origin[1])
                if rel < prev:
                    raise WorkloadError(f"{where}: TIMESTAMP {ts_text} is before the previous row's"
                                        " (the trace must be sorted by time)")
                prev = rel
                if rel * self.time_scale > MAX_TIME_S:
                    raise time_limit_error(f"{where}: TIMESTAMP", 0.0,
                                           f"{ts_text} ({rel * self.time_scale:.3g} s after the "
                                           "first row, x time_scale)")
                rid = request_id(index)
                yield TraceRequest(rid, rel * self.time_scale, [(f"az/{rid}", 0, ctx)], gen)
                index += 1

    def describe(self) -> str:
        return f"azure: {self.path}{_suffix(self.num_requests, self.time_scale)}"


def _text_lines(fh, source: str) -> Iterator[str]:
    """A binary file's lines as text (endings kept, as csv wants); a line that is not
    UTF-8 is a ``WorkloadError`` naming ``source:line``."""
    for lineno, line in enumerate(fh, 1):
        yield decode_line(line, source, lineno, WorkloadError)


def _count(text: str, column: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise WorkloadError(f"{where}: {column} must be an integer >= 1, got {show(text)}") from None
    if value < 1:
        raise WorkloadError(f"{where}: {column} must be an integer >= 1, got {value}")
    if value > MAX_COUNT:
        raise WorkloadError(f"{where}: {column} must be below 2**62, got {value}")
    return value
