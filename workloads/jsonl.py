"""``kind: jsonl`` — our own request format, one JSON object per line (see
``workloads/README.md``), plus :func:`write_jsonl` to save any workload in it."""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, ClassVar

from sim.config.fields import control_problem
from sim.config.loader import decode_line
from workloads.base import (MAX_COUNT, MAX_REQUESTS, MAX_TIME_S, Fields, Segment,
                            TraceRequest, WorkloadError, is_int, is_number, segment_name, show)
from workloads.traces import _suffix, _trace_fields, check_file, resolve

WHERE = "workload"

#: ``NAME:LEN`` or ``NAME@OFF:LEN``; NAME is any run of characters other than
#: whitespace, ``@`` and ``:`` (so ``out/r0000001`` and ``mc/17`` are fine).
_SEG = re.compile(r"^([^\s@:]+)(?:@(\d+))?:(\d+)$")

LINE_KEYS = ("id", "arrival_s", "prompt", "segments", "output_tokens", "session", "after", "think_s",
             "priority")


def parse_prompt(text: str) -> list[Segment]:
    """``"S:24 U:8"`` / ``"S@24:8"`` → segments.  Raises ``ValueError``."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"expected a non-empty string like 'S:24 U:8', got {show(text)}")
    segs: list[Segment] = []
    for part in text.split():
        m = _SEG.match(part)
        if not m:
            raise ValueError(f"bad segment {show(part)} (want NAME:LEN or NAME@OFF:LEN)")
        if control_problem(m.group(1)):
            raise ValueError(f"segment name {control_problem(m.group(1))}")
        length = int(m.group(3))
        if length < 1:
            raise ValueError(f"segment {show(part)} has no tokens")
        segs.append((m.group(1), int(m.group(2) or 0), length))
    return segs


def format_prompt(segments: Iterable[Segment]) -> str:
    """Segments → the string form (``NAME:LEN``, or ``NAME@OFF:LEN`` when OFF > 0).
    Only valid when every name matches the string grammar."""
    return " ".join(f"{segment_name(n)}:{l}" if o == 0 else f"{segment_name(n)}@{o}:{l}"
                    for n, o, l in segments)


def parse_segments(value: Any) -> list[Segment]:
    """``[["S", 0, 24], ["U", 0, 8]]`` → segments.  Raises ``ValueError``."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"segments must be a non-empty list of [name, offset, length], got {show(value)}")
    segs: list[Segment] = []
    for i, item in enumerate(value):
        if not isinstance(item, (list, tuple)) or len(item) != 3:
            raise ValueError(f"segments[{i}] must be [name, offset, length], got {show(item)}")
        name, off, length = item
        if not isinstance(name, str) or not name:
            raise ValueError(f"segments[{i}] name must be a non-empty string, got {show(name)}")
        if control_problem(name):
            raise ValueError(f"segments[{i}] name {control_problem(name)}")
        if not is_int(off) or off < 0:
            raise ValueError(f"segments[{i}] offset must be an integer >= 0, got {show(off)}")
        if not is_int(length) or length < 1:
            raise ValueError(f"segments[{i}] length must be an integer >= 1, got {show(length)}")
        if length > MAX_COUNT:
            raise ValueError(f"segments[{i}] length must be below 2**62, got {length}")
        segs.append((name, int(off), int(length)))
    return segs


def request_to_dict(req: TraceRequest) -> dict[str, Any]:
    """One line of the jsonl format (``segments`` form; optional fields only when set)."""
    d: dict[str, Any] = {"id": req.request_id, "arrival_s": req.arrival_s,
                         "segments": [[segment_name(n), o, l] for n, o, l in req.segments],
                         "output_tokens": req.output_tokens}
    if req.session is not None:
        d["session"] = req.session
    if req.after is not None:
        d["after"] = req.after
        d["think_s"] = req.think_s
    if req.priority:
        d["priority"] = req.priority
    return d


def write_jsonl(requests: Iterable[TraceRequest], out: str | Path | IO[str]) -> int:
    """Write requests in the jsonl format (streamed); returns how many were written."""
    if isinstance(out, (str, Path)):
        with open(out, "w", encoding="utf-8") as fh:
            return write_jsonl(requests, fh)
    n = 0
    for req in requests:
        out.write(json.dumps(request_to_dict(req), separators=(",", ":")))
        out.write("\n")
        n += 1
    return n


def parse_line(rec: Any, seen: set[str], last_arrival: float | None, time_scale: float = 1.0
               ) -> TraceRequest:
    """One decoded jsonl record → request.  ``seen`` holds the ids of earlier lines;
    ``last_arrival`` the latest (scaled) arrival so far.  Raises ``ValueError``."""
    if not isinstance(rec, dict):
        raise ValueError(f"expected a JSON object, got {show(rec)}")
    for key in rec:
        if key not in LINE_KEYS:
            raise ValueError(f"unknown field {show(key)} (allowed: {', '.join(LINE_KEYS)})")
    rid = rec.get("id")
    if not isinstance(rid, str) or not rid:
        raise ValueError(f"id must be a non-empty string, got {show(rid)}")
    for key in ("id", "session", "after"):
        v = rec.get(key)
        if isinstance(v, str) and control_problem(v):
            raise ValueError(f"{key} {control_problem(v)}")
    if rid in seen:
        raise ValueError(f"duplicate id {show(rid)}")
    after = rec.get("after")
    if after is not None:
        if not isinstance(after, str) or not after:
            raise ValueError(f"after must be a request id string, got {show(after)}")
        if after not in seen:
            raise ValueError(f"after {show(after)} names no earlier request")
    session = rec.get("session")
    if session is not None and (not isinstance(session, str) or not session):
        raise ValueError(f"session must be a non-empty string, got {show(session)}")
    think = rec.get("think_s", 0.0)
    if not is_number(think) or think < 0:
        raise ValueError(f"think_s must be a number >= 0, got {show(think)}")
    if think * time_scale > MAX_TIME_S:
        raise ValueError(f"think_s {think:g} s (x time_scale) is past the {MAX_TIME_S:,.0f} s "
                         "(~31.7 years) the simulator's clock holds")
    if think and after is None:
        raise ValueError("think_s is only meaningful with after")
    if "arrival_s" in rec:
        arrival = rec["arrival_s"]
        if not is_number(arrival) or arrival < 0:
            raise ValueError(f"arrival_s must be a number >= 0, got {show(arrival)}")
        arrival = float(arrival) * time_scale
        if arrival > MAX_TIME_S:
            raise ValueError(f"arrival_s {show(rec['arrival_s'])} (x time_scale: {arrival:.3g} s) "
                             f"is past the {MAX_TIME_S:,.0f} s (~31.7 years) the simulator's "
                             "clock holds")
    elif after is not None:
        arrival = last_arrival if last_arrival is not None else 0.0
    else:
        raise ValueError("missing field 'arrival_s' (required unless 'after' is given)")
    if after is None and last_arrival is not None and arrival < last_arrival:
        raise ValueError(f"arrival_s {arrival:g} is before the previous request's {last_arrival:g}"
                         " (requests without 'after' must be in arrival order)")
    has_prompt, has_segs = "prompt" in rec, "segments" in rec
    if has_prompt == has_segs:
        raise ValueError("give exactly one of 'prompt' or 'segments'")
    segs = parse_prompt(rec["prompt"]) if has_prompt else parse_segments(rec["segments"])
    out = rec.get("output_tokens")
    if not is_int(out) or out < 1:
        raise ValueError(f"output_tokens must be an integer >= 1, got {show(out)}")
    if out > MAX_COUNT:
        raise ValueError(f"output_tokens must be below 2**62, got {out}")
    priority = rec.get("priority", 0)
    if not is_int(priority):
        raise ValueError(f"priority must be an integer (lower is served first), got {show(priority)}")
    if abs(priority) > MAX_COUNT:
        raise ValueError(f"priority must lie within +-2**62, got {priority}")
    return TraceRequest(rid, arrival, segs, int(out), session=session, after=after,
                        think_s=float(think) * time_scale, priority=int(priority))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {show(k)}")
        out[k] = v
    return out


@dataclass(frozen=True, slots=True)
class JsonlConfig:
    """``kind: jsonl`` — our format; ``time_scale`` multiplies ``arrival_s`` and
    ``think_s``; ``num_requests`` keeps the first N requests."""

    KIND: ClassVar[str] = "jsonl"
    KEYS: ClassVar[tuple[str, ...]] = ("kind", "path", "time_scale", "num_requests")

    path: str
    time_scale: float = 1.0
    num_requests: int | None = None

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any], where: str = WHERE) -> JsonlConfig:
        return cls(*_trace_fields(Fields(m, where, cls.KEYS)))

    def requests(self, base_dir: Path | None = None) -> Iterator[TraceRequest]:
        path = resolve(self.path, base_dir)
        check_file(path, f"{WHERE}.path")
        return self._read(path)

    def _read(self, path: Path) -> Iterator[TraceRequest]:
        seen: set[str] = set()
        last: float | None = None
        n = 0
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, 1):
                if self.num_requests is not None and n >= self.num_requests:
                    return
                line = decode_line(raw, str(path), lineno, WorkloadError)
                if not line.strip():
                    continue
                if n >= MAX_REQUESTS:
                    raise WorkloadError(f"{path}:{lineno}: more than {MAX_REQUESTS:,} requests, "
                                        "the most a run may have (set workload.num_requests)")
                try:
                    rec = json.loads(line, object_pairs_hook=_no_duplicates)
                    req = parse_line(rec, seen, last, self.time_scale)
                except json.JSONDecodeError as e:
                    raise WorkloadError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})"
                                        ) from None
                except ValueError as e:
                    raise WorkloadError(f"{path}:{lineno}: {e}") from None
                seen.add(req.request_id)
                if req.after is None:
                    last = req.arrival_s
                yield req
                n += 1

    def describe(self) -> str:
        return f"jsonl: {self.path}{_suffix(self.num_requests, self.time_scale)}"
