"""``requests.csv`` written column by column: the very bytes ``csv.writer`` makes of the
rows, with less work.

The csv module looks at every character of every field for one that needs quoting, and
the rows were formatted value by value through a Python call.  Here each column becomes
its text in one pass (``fmt``: a float ``format(v, ".6f")``, anything else ``str``),
and the rows are joined by commas.  A ``RequestTable`` (``sim/rundir/request_table.py``) gives
its columns straight from their arrays (``RequestTable.field_chunks``: a number column
without blanks as its numbers, any other as its text, request ids sliced from their
bytes decoded once), and a chunk of rows is one %-formatting of a row's format repeated
(``"%d,%s,%.6f,...\n"``): every field written straight into the text, with no string a
field, no row tuple and no Python call per value; rows given as tuples
(``write_rows``) are turned into columns first.

Exact: a field is written verbatim by ``csv.writer`` (QUOTE_MINIMAL, ``,`` and ``"``,
lineterminator ``\\n``) unless it holds a character that needs quoting; numbers never do.
A text column is searched once for ``,``, ``"``, ``\\r``, ``\\n`` or NUL (a superset of
what the writer quotes or refuses); a row with such a field is written by
``csv.writer`` itself, so it comes out (or fails) exactly as before."""
from __future__ import annotations

import csv
import io
import re
from array import array
from itertools import islice, repeat
from typing import IO, Any, Iterable, Sequence

from sim.engine import codecs

FLOAT_SPEC = ".6f"    # every float of requests.csv (and memory.csv's time_s)
# an integer's text: format(v, "") is str(v) for an int (and for "" and a bool), with no
# argument tuple built per call (``map(str, ...)`` calls the type: one tuple a value)
INT_SPEC = ""
CHUNK = 1 << 15       # rows formatted at a time (a million-request run's text is never whole)

# a field's %-format in a row's format (``write_table``): an int's is its str, a float's
# its .6f, a text's the text itself
INT_FIELD = "%d"
FLOAT_FIELD = "%" + FLOAT_SPEC
TEXT_FIELD = "%s"
_PLAIN = {str, int, bool}     # types whose fmt is format(v, ""): str(v)
_SEP = "\x00"                # (in no number's text)
_FLOAT_FIELD = FLOAT_FIELD + _SEP
# characters that make csv.writer quote (or refuse) a field: a superset, checked per column
_SPECIAL = re.compile('[,"\r\n\x00]')
# rows written by ``sim/engine/codecs.py`` (digit by digit) where it runs compiled; its source,
# interpreted, is slower than one %-formatting, this module's own way: its plain reference
# twin (tests set this to run it either way and compare)
BYTES_ROWS = not (codecs.__file__ or "").endswith(".py")


def fmt(v: Any) -> str:
    """A value as requests.csv writes it: a float with six decimals, anything else
    ``str`` ("" stays "")."""
    if isinstance(v, float):
        return format(v, FLOAT_SPEC)
    return str(v)


def int_texts(values: Iterable[Any]) -> list[str]:
    """``str`` of each int (and of a str or a bool: "" stays ""), by a C-level
    ``format(v, INT_SPEC)`` map."""
    return list(map(format, values, repeat(INT_SPEC)))


def float_texts(values: Sequence[float]) -> list[str]:
    """``format(v, FLOAT_SPEC)`` of each float, by one %-formatting of them all
    (``"%.6f" % v`` is the same text for every double, infinities, NaNs and -0.0
    included: both are CPython's float_repr_style 'f' at precision 6), split at a
    separator no number's text holds: no call per value."""
    n = len(values)
    return (_FLOAT_FIELD * n % tuple(values)).split(_SEP)[:n]


def any_text(values: list[Any]) -> list[str]:
    """``fmt`` of each value: by a C-level ``format`` map when every value is a str, an
    int or a bool (``format(v, "")`` is ``str(v)`` for those), else value by value."""
    if set(map(type, values)) <= _PLAIN:
        return int_texts(values)
    return list(map(fmt, values))


def column_text(values: Iterable[Any], kind: str) -> list[str]:
    """One column's fields, ``fmt`` of each value.  ``kind``: the column's storage kind
    (``sim.rundir.request_table._Column``): "i" integers (or ""), "d" floats (or ""), text
    ("t", "s"), or "o" (values of any type)."""
    if kind == "i":
        return int_texts(values)                  # (an int's str; "" stays "")
    if kind in ("t", "s"):
        return list(values)
    return any_text(list(values))                 # (a float's .6f; "" stays "")


def is_text(kind: str) -> bool:
    """Whether a column of this storage kind may hold a character to quote (numbers
    never do)."""
    return kind not in ("i", "d")


def write_table(f: IO[str], header: list[str], table: Any, chunk: int = CHUNK) -> None:
    """``header`` and the rows of ``table`` (a ``RequestTable``, columns in ``header``'s
    order) as ``csv.writer(f, lineterminator="\n")`` writes ``header`` and
    ``[fmt(v) for v in row]`` of each row."""
    csv.writer(f, lineterminator="\n").writerow(header)
    if BYTES_ROWS and hasattr(table, "byte_chunks"):
        # (numbers and request ids straight from the table's arrays: no text a field)
        for n, items, fields in table.byte_chunks(chunk):
            text = rows_text(items, n)
            if text is None:
                write_fields(f, fields())
            else:
                f.write(text)
        return
    for fields in table.field_chunks(chunk):
        write_fields(f, fields)


def write_rows(f: IO[str], header: list[str], rows: Iterable[tuple], kinds: list[str],
               chunk: int = CHUNK) -> None:
    """``header`` and ``rows`` (tuples of values, columns of the storage ``kinds``; see
    ``column_text``), as ``write_table`` writes a table's; ``chunk`` rows at a time."""
    csv.writer(f, lineterminator="\n").writerow(header)
    text = list(map(is_text, kinds))
    it = iter(rows)
    while True:
        block = list(islice(it, chunk))
        if not block:
            return
        _write_block(f, [column_text(vals, kind) for vals, kind in zip(zip(*block), kinds)],
                     text)


_TEXTS = {INT_FIELD: int_texts, FLOAT_FIELD: float_texts}


def write_fields(f: IO[str], fields: list[tuple[str, Sequence[Any]]]) -> None:
    """The rows of ``fields`` (each column's %-format and values, all of one length:
    ``INT_FIELD`` ints, ``FLOAT_FIELD`` floats, ``TEXT_FIELD`` its fields as text) by
    one %-formatting of the chunk: the values interleaved into one tuple by slice
    assignment, every field written straight into the text (no string a field, no row
    tuple, no join).  A chunk with a field to quote goes through ``_write_block``."""
    if not fields or not len(fields[0][1]):
        return
    for spec, vals in fields:
        if spec == TEXT_FIELD and _SPECIAL.search("".join(vals)):
            _write_block(f, [vals if s == TEXT_FIELD else _TEXTS[s](vals) for s, vals in fields],
                         [s == TEXT_FIELD for s, _ in fields])
            return
    n = len(fields[0][1])
    if BYTES_ROWS:
        text = _bytes_rows(fields, n)
        if text is not None:
            f.write(text)
            return
    specs = []
    varying = []
    for spec, vals in fields:
        text = _constant_text(spec, vals)
        if text is None:
            specs.append(spec)
            varying.append(vals)
        else:                   # (the same field in every row: part of the row's format)
            specs.append(text.replace("%", "%%"))
    m = len(varying)
    flat: list[Any] = [None] * (n * m)
    for j, vals in enumerate(varying):
        flat[j::m] = vals
    f.write((",".join(specs) + "\n") * n % tuple(flat))


_TYPECODE = {INT_FIELD: "q", FLOAT_FIELD: "d"}
_KIND = {INT_FIELD: codecs.INT, FLOAT_FIELD: codecs.FLOAT}
# what csv.writer would quote, NUL aside (``rows_text`` counts NULs itself)
_QUOTED = re.compile('[,"\r\n]')
_QUOTED_BYTES = re.compile(b'[,"\r\n\x00]')


def _bytes_rows(fields: list[tuple[str, Sequence[Any]]], n: int) -> str | None:
    """``write_fields``' text of ``fields`` by ``codecs.rows_bytes``: the same bytes
    (its fields are those of the %-formats); None where it cannot tell (a text field not
    ASCII, an int beyond 64 bits, a value of another type): the caller formats them."""
    items: list[tuple] = []
    try:
        for spec, vals in fields:
            text = _constant_text(spec, vals)
            if text is not None:
                items.append(("c", text))
            elif spec == TEXT_FIELD:
                items.append(("t", vals))
            else:
                items.append(("n", _KIND[spec], number_bytes(vals, _TYPECODE[spec]), b""))
    except (OverflowError, TypeError):
        return None
    return rows_text(items, n)


def rows_text(items: list[tuple], n: int) -> str | None:
    """``n`` rows of columns given as ``items``, each ``("c", text)`` (the same field in
    every row), ``("n", codecs.INT or FLOAT, bytes of int64s or doubles, blank flags:
    a byte a row, or b"" for none)``, ``("t", texts)`` or ``("b", bytes, int64 end of
    each field)``: the text ``write_fields`` makes of them, by ``codecs.rows_bytes``;
    None when a field would be quoted by csv.writer or is not ASCII (the caller writes
    those rows its own way)."""
    kinds: list[int] = []
    literals: list[bytes] = []
    data: list[bytes] = []
    aux: list[bytes] = []
    widths: list[int] = []
    pending: list[str] = []       # constant fields (and commas) before the next varying one
    for j, item in enumerate(items):
        sep = "," if j else ""
        tag = item[0]
        if tag == "t" and n and item[1].count(item[1][0]) == n:
            item = ("c", item[1][0])       # (the same text in every row)
            tag = "c"
        if tag == "c":
            if _SPECIAL.search(item[1]):
                return None
            pending.append(sep + item[1])
            continue
        if tag == "t":
            # (NUL-joined: a field holding one is one csv.writer refuses; see _width)
            joined = "\x00".join(item[1])
            if not joined.isascii() or _QUOTED.search(joined) or \
                    joined.count("\x00") != n - 1:
                return None
            kinds.append(codecs.TEXT)
            data.append(joined.encode("ascii"))
            aux.append(b"")
            widths.append(_width(joined, n))
        elif tag == "b":
            blob = item[1]
            if not blob.isascii() or _QUOTED_BYTES.search(blob):
                return None
            kinds.append(codecs.TEXT)
            data.append(blob)
            aux.append(item[2])
            widths.append(-1)
        else:
            kinds.append(item[1])
            data.append(item[2])
            aux.append(item[3])
            widths.append(0)
        pending.append(sep)
        literals.append("".join(pending).encode("utf-8"))
        pending.clear()
    pending.append("\n")
    literals.append("".join(pending).encode("utf-8"))
    return codecs.rows_bytes(kinds, literals, data, aux, widths, n).decode("utf-8")


def number_bytes(vals: Sequence[Any], code: str) -> bytes:
    """``vals`` as the bytes of an ``array(code)`` (a narrower array widened by numpy:
    no Python int a value)."""
    if isinstance(vals, array):
        if vals.typecode == code:
            return vals.tobytes()
        if vals.typecode in _WIDENS[code]:
            import numpy as np

            return np.frombuffer(vals, dtype=vals.typecode).astype(code).tobytes()
    return array(code, vals).tobytes()


# the array typecodes numpy widens exactly to int64 ("q") or double ("d")
_WIDENS = {"q": "bBhHiIlq", "d": "fd"}


def _width(joined: str, n: int) -> int:
    """The length of each of the ``n`` NUL-joined fields of ``joined`` (no field holds a
    NUL) when they all have one, else -2 (``rows_bytes`` then looks for each NUL)."""
    width = (len(joined) + 1) // n - 1
    if (width + 1) * n - 1 == len(joined) and joined[width::width + 1] == "\x00" * (n - 1):
        return width
    return -2


def _constant_text(spec: str, vals: Sequence[Any]) -> str | None:
    """The field a column writes in every row, when it writes the same one in all
    (``spec % v`` of its one value); None for a column whose fields differ (or might:
    a list of floats, where 0.0 == -0.0 but their texts differ, is never taken for
    constant).  A run's constant columns (no preemption, no SLO, blank ones) then cost
    no formatting at all: a quarter of a Mooncake run's fields.  An array is compared by
    its bytes (one value's bytes repeated: no number boxed), a list by ``count``."""
    n = len(vals)
    if isinstance(vals, array):
        raw = vals.tobytes()
        if raw != raw[:vals.itemsize] * n:
            return None
    elif spec == FLOAT_FIELD or vals.count(vals[0]) != n:
        return None
    return spec % (vals[0],)


def _write_block(f: IO[str], columns: list[list[str]], text: list[bool]) -> None:
    """The rows of ``columns`` (each a column's fields as text, all of one length);
    ``text``: the columns that may hold a character to quote (numbers never do)."""
    if not columns or not columns[0]:
        return
    odd: set[int] = set()      # rows with a field csv.writer would quote or refuse
    for col, maybe in zip(columns, text):
        if maybe and _SPECIAL.search("".join(col)):
            odd.update(i for i, v in enumerate(col) if _SPECIAL.search(v))
    if not odd:
        f.write("\n".join(map(",".join, zip(*columns))))
        f.write("\n")
        return
    buf = io.StringIO()
    wb = csv.writer(buf, lineterminator="\n")
    lines = []
    for i, row in enumerate(zip(*columns)):
        if i in odd:
            buf.seek(0)
            buf.truncate()
            wb.writerow(row)
            lines.append(buf.getvalue()[:-1])
        else:
            lines.append(",".join(row))
    f.write("\n".join(lines))
    f.write("\n")
