"""The compiled codecs at the engine's edges, each the twin of a plain reference kept at
its edge and compared with it by a differential test on many random inputs:

* **requests.csv's rows** (``rows_bytes``, ``write_int``, ``write_fixed6``): rows of numbers
  and short ASCII texts as CSV bytes, digit by digit in machine integers; the twin is the
  %-formatting of ``sim/rundir/requests_csv.py`` (``write_fields``), which the writer uses
  whenever this module runs as source (``BYTES_ROWS``); ``tests/metrics/test_csv_bytes.py``.

Compiled with the hot path (``sim/native.py``: the compiled set is ``sim/cache`` and
``sim/engine``), where each costs a Mooncake request far more than ~2 % interpreted.  This
module imports nothing of the project: the edges (``sim/rundir``) call it, it calls none.

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
from typing import Final

from librt.strings import (BytesWriter, read_f64_le, read_i64_le, write_i16_be, write_i32_be,
                          write_i64_be, write_i64_le)
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
