"""The compiled codecs at the engine's edges, each the twin of a plain reference kept at
its edge and compared with it by a differential test on many random inputs:

* **requests.csv's rows** (``rows_bytes``, ``write_int``, ``write_fixed6``): rows of numbers
  and short ASCII texts as CSV bytes, digit by digit in machine integers; the twin is the
  %-formatting of ``sim/rundir/requests_csv.py`` (``write_fields``), which the writer uses
  whenever this module runs as source (``BYTES_ROWS``); ``tests/metrics/test_csv_bytes.py``.
* **Mooncake trace lines** (``mooncake_lines``, ``layout_record``, ``request_id``): a line in
  the published trace's layout read byte by byte into machine integers and made a record;
  the twin is ``workloads/trace_records.py``, which reads every other line (and, as
  ``plain_records``, every line) through ``orjson`` and names a bad one by ``path:line``;
  ``tests/workloads/test_workloads_traces.py``.

Compiled with the hot path (``sim/native.py``: the compiled set is ``sim/cache`` and
``sim/engine``), where each costs a Mooncake request far more than ~2 % interpreted.  This
module imports nothing of the project: the edges (``sim/rundir``, ``workloads``) call it,
handing in what it builds (the workload's record types) and what it does not handle.

requests.csv's rows
-------------------
``"%d,%.6f,%s\n" % row``'s text at a tenth of its cost.  ``requests.csv`` costs a Mooncake
run ~22,500 CPU instructions a request through CPython's %-formatting (an int's text ~300, a
float's ``%.6f`` ~700 through ``dtoa``); here an int is a few multiplications a digit
and a float one exact product, written into one ``librt.strings.BytesWriter``.

Exact, not close: an integer's digits are its digits, and a float's six decimals are
those of its exact binary value rounded half to even (what ``"%.6f"`` prints, CPython's
correctly rounded ``dtoa``).  ``x * 1e6`` is a rounded double ``p``; Dekker's product
(``x`` split into two 26-bit halves, ``1e6`` has 14 significant bits) gives the rounding
error ``err`` exactly, ``x * 10**6 == p + err``, so the fraction ``p - floor(p) + err``
is compared with one half exactly (its sign survives the one rounding left).  Values
this does not cover (negative, -0.0, NaN, infinite, below 1e-6 or from 1e8 on) are
formatted by Python itself, field by field: rare, and the same text.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any, Final

from librt.strings import (BytesWriter, StringWriter, read_f64_le, read_i64_le, write_i16_be,
                          write_i32_be, write_i64_be, write_i64_le)
from librt.vecs import append, vec
from mypy_extensions import i16, i32, i64, u8

INT: Final = 0       # a column of int64 values (``array('q')`` bytes)
FLOAT: Final = 1     # a column of doubles (``array('d')`` bytes), ``%.6f``
TEXT: Final = 2      # a column of ASCII fields (see ``rows_bytes``)

SPLIT: Final = 134217729.0    # 2**27 + 1: Veltkamp's split of a double into 26-bit halves
MAGIC10: Final = 1717986919   # ceil(2**34 / 10): v * MAGIC10 >> 34 == v // 10 for v < 2**31
SMALL: Final = 100000000      # 10**8: the integers written from one word of digits below it


def write_int(w: BytesWriter, v: i64) -> None:
    """``str(v)``'s bytes."""
    if v < 0 or v >= SMALL:
        w.write(str(v).encode("ascii"))
        return
    if v < 10:
        w.append(u8(48 + v))
        return
    # the digits as ASCII bytes of one word, the last digit in its lowest byte
    word: i64 = 0
    shift: i64 = 0
    while v:
        q = (v * MAGIC10) >> 34
        word |= (48 + v - q * 10) << shift
        shift += 8
        v = q
    # its ``shift / 8`` (<= 8) lowest bytes, highest first: as few big-endian writes as
    # cover them (each byte an ASCII digit, below 0x80: the writes' signed values are
    # never negative)
    if shift == 64:
        write_i64_be(w, word)
        return
    if shift & 8:
        shift -= 8
        w.append(u8(word >> shift))
    if shift >= 32:
        shift -= 32
        write_i32_be(w, i32((word >> shift) & 0xFFFFFFFF))
    if shift:
        write_i16_be(w, i16(word & 0xFFFF))


def write_fixed6(w: BytesWriter, x: float) -> None:
    """``"%.6f" % x``'s bytes (see the module docstring)."""
    if x == 0.0 and math.copysign(1.0, x) > 0.0:
        w.write(b"0.000000")
        return
    if not (1e-6 <= x < 1e8):   # (NaN fails it too)
        w.write(("%.6f" % x).encode("ascii"))
        return
    p = x * 1e6
    c = SPLIT * x
    hi = c - (c - x)
    lo = x - hi
    err = -((p - hi * 1e6) - lo * 1e6)     # x * 10**6 == p + err, exactly
    n: i64 = math.floor(p)
    d = ((p - float(n)) - 0.5) + err       # (p - n and its difference with 1/2: exact)
    if d > 0.0 or (d == 0.0 and n & 1 == 1):
        n += 1
    whole = n // 1000000
    write_int(w, whole)
    # the point, then six digits (zero-padded) as the six lowest bytes of one word,
    # written as four bytes and two
    v = n - whole * 1000000
    word: i64 = 0
    shift: i64 = 0
    while shift < 48:
        q = (v * MAGIC10) >> 34
        word |= (48 + v - q * 10) << shift
        shift += 8
        v = q
    w.append(46)
    write_i32_be(w, i32((word >> 16) & 0xFFFFFFFF))
    write_i16_be(w, i16(word & 0xFFFF))


def rows_bytes(kinds: list[int], literals: list[bytes], data: list[bytes], aux: list[bytes],
               widths: list[int], n: i64) -> bytes:
    """``n`` rows: before each column ``j`` the bytes ``literals[j]`` (the constant fields
    and the commas between varying ones), then its field in this row, then
    ``literals[-1]`` (the row's last constant fields and its newline).  Row ``i`` of an
    INT or FLOAT column is the int64 or double at byte ``8 * i`` of ``data[j]``, or
    nothing where ``aux[j]`` (one byte a row, or empty: none) has a 1.  A TEXT column's
    fields are in ``data[j]``: each ``widths[j]`` bytes and a NUL after it when that is
    >= 0; at -1, field ``i`` ends where ``aux[j]``'s int64 ``i`` says (and starts where
    the previous one ended); at -2, NUL-joined."""
    m: i64 = len(kinds)
    # each literal as one byte (>= 0), nothing (-1) or bytes to write (-2): most are a comma
    one = vec[i64]()
    kind = vec[i64]()
    width = vec[i64]()
    flagged = vec[i64]()     # a number column with blank flags (1) or none (0)
    at_text = vec[i64]()     # a TEXT column's next field (its offset in its bytes)
    j: i64 = 0
    while j < m:
        lit = literals[j]
        one = append(one, lit[0] if len(lit) == 1 else -1 if not lit else -2)
        kind = append(kind, kinds[j])
        width = append(width, widths[j])
        flagged = append(flagged, 1 if len(aux[j]) else 0)
        at_text = append(at_text, 0)
        j += 1
    w = BytesWriter()
    tail = literals[m]
    i: i64 = 0
    while i < n:
        at: i64 = 8 * i
        j = 0
        while j < m:
            b = one[j]
            if b >= 0:
                w.append(u8(b))
            elif b == -2:
                w.write(literals[j])
            k = kind[j]
            if k == TEXT:
                src = data[j]
                start = at_text[j]
                wd = width[j]
                end: i64 = start + wd
                nxt: i64 = end + 1
                if wd == -1:
                    end = read_i64_le(aux[j], at)
                    nxt = end
                elif wd < 0:
                    end = start
                    while end < len(src) and src[end] != 0:
                        end += 1
                    nxt = end + 1
                _copy(w, src, start, end)
                at_text[j] = nxt
            else:
                if flagged[j] and aux[j][i]:
                    pass                     # (a blank: an empty field)
                elif k == INT:
                    write_int(w, read_i64_le(data[j], at))
                else:
                    write_fixed6(w, read_f64_le(data[j], at))
            j += 1
        w.write(tail)
        i += 1
    return w.getvalue()


def _copy(w: BytesWriter, src: bytes, start: i64, end: i64) -> None:
    """``src[start:end]`` appended, eight bytes a read while they last."""
    while end - start >= 8:
        write_i64_le(w, read_i64_le(src, start))
        start += 8
    while start < end:
        w.append(u8(src[start]))
        start += 1


# ------------------------------------------------------------------ Mooncake trace lines
#
# A line in the layout the published trace is written in (``{"timestamp": T,
# "input_length": N, "output_length": M, "hash_ids": [H, ...]}``, integers only) is read by
# ``layout_record``, byte by byte, straight into machine integers: no dict, no key strings,
# no int object per hash id (~25 a record), which ``orjson.loads`` makes and the replay frees
# again (together ~10 k CPU instructions of a ~280 k Mooncake request); and the loop over the
# lines, the checks and the request id run here too (interpreted, they cost about as much as
# decoding the line).  ``workloads.traces.MooncakeConfig`` owns the format (fields, units,
# errors); this is only its happy path, which does what a valid line needs: every check is
# still made, and any other line goes to the caller's ``other``, which reads it through
# ``orjson`` or raises the one-line error naming ``path:line``.  The layout reader accepts
# only text that is valid JSON and that ``orjson`` decodes to exactly these values.

ID_DIGITS: Final = 7   # request ids: "r" + the record index, zero-padded to 7 digits
ID_PAD: Final = 10_000_000   # 10 ** ID_DIGITS

# the published trace's layout, as ``layout_record`` reads it
HEAD: Final = b'{"timestamp": '
INPUT: Final = b', "input_length": '
OUTPUT: Final = b', "output_length": '
IDS: Final = b', "hash_ids": ['
# digits a layout number may have: at most 15, so every value is below 2**53 (a
# timestamp converts to a float exactly; a hash id is in the range the reader allows)
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
    exactly these integers (the fields checked as ever: ``mooncake_lines``)."""
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


class TraceLimits:
    """What a Mooncake record may hold (the workload's limits, handed in): token counts in
    ``[1, max_count]``, arrivals (seconds) up to ``max_time``, at most ``max_requests``
    records."""

    def __init__(self, max_count: int, max_time: float, max_requests: int) -> None:
        self.max_count: i64 = max_count
        self.max_time = max_time
        self.max_requests: i64 = max_requests


def mooncake_lines(path: str, block: i64, limit: i64, time_scale: float, limits: TraceLimits,
                   tail_prefix: str, request: Callable[..., Any], prompt: Callable[..., Any],
                   other: Callable[[bytes, int, int, Any], Any]) -> Iterator[Any]:
    """The records of the Mooncake JSONL file ``path`` (``limit`` >= 0: the first so many;
    -1: all), ``block`` tokens a hash id, arrivals ``timestamp / 1000 * time_scale``.

    A line in the trace's layout that passes every check (``limits``; timestamps in
    file order) is ``request(rid, arrival, prompt(ids, input_length, block, tail),
    output_length)``: ``rid`` is ``request_id`` of the record's index, ``tail`` the
    private stream ``tail_prefix + rid`` when the ids cover fewer than ``input_length``
    tokens (else ``""``).  Every other line, and any line once ``max_requests`` records
    are read, is ``other(line, lineno, index, previous timestamp)``: None for a line that
    holds no record (blank), else ``(record, its timestamp)``; it raises for a bad line."""
    prev_ts: Any = None
    max_count = limits.max_count      # (locals: no attribute read a record)
    max_time = limits.max_time
    max_requests = limits.max_requests
    index: i64 = 0
    lineno: i64 = 0
    with open(path, "rb") as fh:
        for line in fh:
            lineno += 1
            if 0 <= limit <= index:
                return
            if index < max_requests:
                lts, l_in, l_out, l_ids = layout_record(line)
                if (lts >= 0 and (prev_ts is None or lts >= prev_ts)
                        and 1 <= l_in <= max_count and 1 <= l_out <= max_count
                        and float(lts) / 1000.0 * time_scale <= max_time):
                    # (the line's layout and its checks passed: what the general way
                    # makes of it, without decoding it as a dict)
                    rid = request_id(index)
                    tail = tail_prefix + rid if block * len(l_ids) < l_in else ""
                    yield request(rid, float(lts) / 1000.0 * time_scale,
                                  prompt(l_ids, l_in, block, tail), l_out)
                    prev_ts = lts
                    index += 1
                    continue
            got = other(line, lineno, index, prev_ts)
            if got is None:
                continue
            rec, prev_ts = got
            yield rec
            index += 1
