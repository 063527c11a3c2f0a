"""The requests of a run, kept column by column: what ``sim run`` holds between the end
of the replay and ``requests.csv``.

A record per request (``sim.rundir.records.RequestRecord``, a 27-field tuple of boxed numbers)
costs ~700 bytes; a million-request run held them twice (the recorder's tuples, then the
records in arrival order) and most of its peak memory was that.  Here each column is one
machine array (``array``: integers, floats, codes) or one run of bytes (request ids),
~100 bytes a request in all; the recorder hands its tuples over in batches
(``RequestColumns.add``) and records are built only when one is read
(``RequestTable``: a read-only sequence of ``RequestRecord``).

Exact by construction: a column stays an array only while every value it was given is
exactly of its type (``int`` / ``float``) or ``""`` (a request with no measurement,
marked in a byte per request beside the array); anything else (an integer beyond 64
bits, a bool, another type) turns that column into a plain list of the values as given.
Integers take the narrowest array that holds them (1 to 8 bytes), text of few distinct
values one small code each, request ids their UTF-8 bytes.  Reading back yields the
very values (and types) the recorder wrote."""
from __future__ import annotations

import operator
import struct
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import compress, repeat
from typing import Any

from sim.rundir.records import INT_COLUMNS, REQUEST_COLUMNS, TEXT_COLUMNS, RequestRecord
from sim.engine.codecs import FLOAT as CSV_FLOAT
from sim.engine.codecs import INT as CSV_INT
from sim.rundir.requests_csv import (FLOAT_FIELD, INT_FIELD, TEXT_FIELD, any_text, float_texts,
                              int_texts, number_bytes)

INT_CODES = ("b", "h", "i", "q")        # 1, 2, 4, 8 bytes: a column takes the narrowest
WIDTH = 1 + len(REQUEST_COLUMNS)   # a recorder tuple: arrival index, then every column
PAD = tuple(("",) * k for k in range(WIDTH + 1))   # the "" a short tuple is missing
# text columns of few distinct values, kept as codes into their distinct strings
CODED = ("session", "rejected", "checkpoint_reason")
UNIQUE = ("request_id",)      # text of one value a request: its bytes, one after the other
_encode = operator.methodcaller("encode", "utf-8", "surrogatepass")   # (any str, exactly)


def _blanked(out: list, flags: Iterable[int]) -> list:
    """``out`` with "" at every position ``flags`` marks (one C-level pass over the
    flags: no Python call a value)."""
    for i in compress(range(len(out)), flags):
        out[i] = ""
    return out


def _widened(data: array, code: str) -> array:
    """An integer array as a wider one (the same values)."""
    import numpy as np

    out = array(code)
    out.frombytes(np.frombuffer(data, dtype=data.typecode).astype(code).tobytes())
    return out


def _np_picked(data: array, code: str, pos: Any) -> bytes:
    """An array's numbers at ``pos`` (row positions) as bytes of ``code`` ("q": int64,
    "d": double), widened by numpy (all of them: ``requests_csv.number_bytes``)."""
    import numpy as np

    return np.frombuffer(data, dtype=data.typecode)[pos].astype(code).tobytes()


def _np_take(buf: Any, code: str, perm: Any) -> bytes:
    """The items of an array (or bytearray: code "B") in ``perm``'s order, as bytes."""
    import numpy as np

    return np.frombuffer(buf, dtype=code)[perm].tobytes()


class _Column:
    """One column.  ``kind`` "i": integers in an array of the narrowest width that holds
    them all (``INT_CODES``; widened as larger ones come); "d": floats; for both, a
    request with no value ("") has a 0 there and a 1 in ``blanks`` (created with the
    first ""); "t": text of few distinct values, each an index into ``words`` (``data``
    an "i" column); "s": text, UTF-8 in one ``bytearray`` (``data``), value k from
    ``starts[k]`` to ``ends[k]``; "o": a list of the values as given (other text, or
    numbers an array cannot hold exactly).  ``blank``: how many "" ``blanks`` marks."""

    __slots__ = ("kind", "data", "blank", "blanks", "words", "ids", "starts", "ends")

    def __init__(self, kind: str):
        self.kind = kind
        self.data: Any = ([] if kind == "o" else _Column("i") if kind == "t"
                          else bytearray() if kind == "s"
                          else array("b" if kind == "i" else "d"))
        self.blank = 0
        self.blanks: bytearray | None = None
        self.words: list[str] = []          # "t": the distinct values, by first use
        self.ids: dict[str, int] = {}       # "t": value -> its index in words
        self.starts = array("q")            # "s": where each value's bytes start / end
        self.ends = array("q")

    def __len__(self) -> int:
        return len(self.ends) if self.kind == "s" else len(self.data)

    def extend(self, vals: tuple) -> None:
        kind = self.kind
        if kind == "o":
            self.data.extend(vals)
            return
        types = list(map(type, vals))
        if kind in "ts":
            if types.count(str) != len(vals):
                return self._as_list(vals)
            if kind == "t":
                return self._extend_coded(vals)
            text = "".join(vals)
            base = len(self.data)
            if text.isascii():             # (a byte a character: lengths as they are)
                lens: Iterable[int] = map(len, vals)
                self.data += text.encode("ascii")
            else:
                raw = list(map(_encode, vals))
                lens = map(len, raw)
                self.data += b"".join(raw)
            import numpy as np

            # (each value's end, and its start, by numpy: no int object a bound)
            ends = np.cumsum(np.fromiter(lens, dtype=np.int64, count=len(vals))) + base
            starts = np.empty_like(ends)
            if len(ends):
                starts[0] = base
                starts[1:] = ends[:-1]
            self.starts.frombytes(starts.tobytes())
            self.ends.frombytes(ends.tobytes())
            return
        want = int if kind == "i" else float
        n_want = types.count(want)
        if n_want == len(vals):
            return self._put(vals, vals, None)
        n = types.count(str)
        if n_want + n != len(vals):
            return self._as_list(vals)            # another type (a bool, a subclass)
        if not n_want:                          # (a column nobody fills: slo_ok, ...)
            flags = b"\x01" * n
        else:
            flags = bytes([t is str for t in types])
        if set(compress(vals, flags)) != {""}:  # a text other than ""
            return self._as_list(vals)
        zero = want()
        self._put([zero if f else v for v, f in zip(vals, flags)] if n < len(vals)
                  else None, vals, flags)

    def extend_buffer(self, buf: Any, code: str, n: int, blanks: Any) -> None:
        """Append ``n`` numbers from a buffer of 64-bit values (``code`` "q": integers,
        "d": doubles; ``sim.engine.record.RowBatch``'s vecs), a blank ("") where
        ``blanks`` (a buffer of 64-bit 0/1 flags, or None: none) has a 1 (its number is
        0 there): what ``extend`` makes of the same values as a tuple, without a boxed
        number per value."""
        import numpy as np

        got = np.frombuffer(buf, dtype=code, count=n)
        flags = None
        if blanks is not None:
            fl = np.frombuffer(blanks, dtype="q", count=n)
            if fl.any():
                flags = fl.astype(np.uint8).tobytes()
        kind = self.kind
        if kind == "o" or (kind == "i") != (code == "q"):
            # (a column that already holds what no array can: the values as given)
            vals = got.tolist()
            if flags is not None:
                vals = ["" if f else v for v, f in zip(vals, flags)]
            return self._as_list(tuple(vals)) if kind != "o" else self.data.extend(vals)
        data = self.data
        if kind == "i" and n:
            lo, hi = int(got.min()), int(got.max())
            width = data.typecode
            for c in INT_CODES[INT_CODES.index(width):]:
                top = 1 << (8 * array(c).itemsize - 1)
                if -top <= lo and hi < top:
                    break
            if c != width:
                data = self.data = _widened(data, c)
            raw = got.astype(c).tobytes() if c != "q" else got.tobytes()
        else:
            raw = got.tobytes()
        self._append(data, raw, n, flags)

    def extend_blank(self, n: int) -> None:
        """Append ``n`` blanks (""): what ``extend`` makes of ``("",) * n``, without
        looking at each value (a number column: zeros flagged blank; a coded one: the
        code of "")."""
        kind = self.kind
        if n <= 0 or kind not in "idt":
            self.extend(("",) * n)
            return
        if kind == "t":
            ids = self.ids
            code = ids.get("")
            if code is None:
                code = ids[""] = len(self.words)
                self.words.append("")
            codes = (code,) * n
            self.data._put(codes, codes, None)
            return
        data = self.data
        self._append(data, bytes(n * data.itemsize), n, b"\x01" * n)

    def _extend_coded(self, vals: tuple) -> None:
        ids = self.ids
        if not ids.keys() >= set(vals):
            for v in dict.fromkeys(vals):          # (first use order: deterministic)
                if v not in ids:
                    ids[v] = len(self.words)
                    self.words.append(v)
        self.data._put(tuple(map(ids.__getitem__, vals)), vals, None)

    def _put(self, nums: Sequence[Any] | None, vals: tuple, flags: bytes | None) -> None:
        """Append exact numbers (``None``: zeros; 0 where ``flags`` marks a blank),
        widening an integer array as needed; ``vals``, as given, if even 64 bits cannot
        hold them.  (``struct`` packs them: ``array(code, values)`` parses each value
        as a call's argument, several times slower.)"""
        data = self.data
        n = len(vals)
        if nums is None:
            raw = bytes(n * data.itemsize)
        else:
            try:
                raw = struct.pack(f"{n}{data.typecode}", *nums)
            except struct.error:                   # out of this width's range
                wide = self._wider(nums, vals)
                if wide is None:
                    return                         # beyond 64 bits: kept as given
                data, raw = wide
        self._append(data, raw, n, flags)

    def _append(self, data: array, raw: bytes, n: int, flags: bytes | None) -> None:
        """``n`` packed numbers onto ``data`` (the column's array), with their blank
        flags (None: none blank)."""
        n0 = len(data)
        data.frombytes(raw)
        if flags is not None:
            if self.blanks is None:
                self.blanks = bytearray(n0)
            self.blanks += flags
            self.blank += flags.count(1)
        elif self.blanks is not None:
            self.blanks += bytes(n)

    def _wider(self, nums: Sequence[Any], vals: tuple) -> tuple[array, bytes] | None:
        """Integers that do not fit the column's width: the column widened to the
        narrowest width that holds them all, and their bytes at that width (None, the
        column a list of the values as given, when 64 bits do not hold them).  They are
        packed once at 64 bits and their range read from those (not ``min``/``max`` of
        the numbers, which compares them one by one)."""
        import numpy as np

        try:
            raw = struct.pack(f"{len(nums)}q", *nums)
        except struct.error:
            self._as_list(vals)
            return None
        got = np.frombuffer(raw, dtype="q")
        lo, hi = int(got.min()), int(got.max())
        data = self.data
        for code in INT_CODES[INT_CODES.index(data.typecode) + 1:]:
            top = 1 << (8 * array(code).itemsize - 1)
            if -top <= lo and hi < top:
                break
        data = self.data = _widened(data, code)
        return data, (raw if code == "q" else got.astype(code).tobytes())

    def _as_list(self, vals: tuple) -> None:
        self.data = list(self.values())
        self.kind = "o"
        self.blank = 0
        self.blanks = None
        self.words, self.ids, self.starts, self.ends = [], {}, array("q"), array("q")
        self.data.extend(vals)

    def values(self, pos: Sequence[int] | None = None) -> Iterable[Any]:
        """The values as the recorder gave them, all or those at ``pos``."""
        data = self.data
        kind = self.kind
        if kind == "t":
            return map(self.words.__getitem__, data.values(pos))
        if kind == "s":
            return map(self.at, range(len(self.ends)) if pos is None else pos)
        if self.blank and self.blank == len(data):        # (a column nobody filled)
            return repeat("", len(data) if pos is None else len(pos))
        got: Iterable[Any] = data if pos is None else map(data.__getitem__, pos)
        if not self.blank:
            return got
        bl: Any = self.blanks
        return _blanked(list(got), bl if pos is None else map(bl.__getitem__, pos))

    def texts(self, lo: int, hi: int, pos: Sequence[int] | None, state: list) -> list[str]:
        """Rows ``lo`` to ``hi`` (of ``pos``'s rows, in a view) as requests.csv writes
        them: ``requests_csv.fmt`` of each value ``values`` gives, a column at a time
        (``format`` of the numbers, "" at the blanks, request ids
        sliced from their bytes decoded once) with no Python call per value.  ``state``:
        an empty list on the first call, the same list on the next chunks (what a
        column keeps between them)."""
        kind = self.kind
        data = self.data
        n = hi - lo
        if kind in ("i", "d") and not (self.blank and self.blank == len(data)):
            vals = self._numbers(lo, hi, pos)
            out = int_texts(vals) if kind == "i" else float_texts(vals)
            bl = self.blanks
            if not (self.blank and bl is not None):
                return out
            return _blanked(out, bl[lo:hi] if pos is None else map(bl.__getitem__, pos[lo:hi]))
        if kind == "t":
            codes = data.data
            ids = codes[lo:hi] if pos is None else map(codes.__getitem__, pos[lo:hi])
            return list(map(self.words.__getitem__, ids))
        if kind == "s":
            if not state:     # (the bytes decoded once: ASCII, a byte a character)
                state.append(data.decode("ascii") if data.isascii() else None)
            whole = state[0]
            rows = range(lo, hi) if pos is None else pos[lo:hi]
            if whole is None:
                return list(map(self.at, rows))
            return list(map(whole.__getitem__, map(slice, map(self.starts.__getitem__, rows),
                                                   map(self.ends.__getitem__, rows))))
        if kind == "o":       # its values, formatted one by one
            return any_text(self._objects(lo, hi, pos))
        # (a number column nobody filled: every field "")
        return [""] * n

    def _objects(self, lo: int, hi: int, pos: Sequence[int] | None) -> list[Any]:
        """An "o" column's values of rows ``lo`` to ``hi`` (of ``pos``'s rows)."""
        data = self.data
        return data[lo:hi] if pos is None else list(map(data.__getitem__, pos[lo:hi]))

    def bytes_item(self, lo: int, hi: int, pos: Sequence[int] | None) -> tuple:
        """Rows ``lo`` to ``hi`` (of ``pos``'s rows) as ``requests_csv.rows_text`` takes a
        column: the field every row has (``("c", text)``), numbers as the bytes of 64-bit
        values and their blank flags, request ids as their bytes and each one's end (when
        stored back to back, in row order), any other column as its texts."""
        kind = self.kind
        n = hi - lo
        if kind in ("i", "d"):
            data = self.data
            code = "q" if kind == "i" else "d"
            if self.blank and self.blank == len(data):
                return ("c", "")
            raw = number_bytes(data[lo:hi], code) if pos is None else \
                _np_picked(data, code, pos[lo:hi])
            flags = b""
            if self.blank:
                bl = self.blanks
                flags = bytes(bl[lo:hi]) if pos is None else _np_take(bl, "B", pos[lo:hi])
                if flags.count(0) == n:
                    flags = b""
                elif not flags.count(0):
                    return ("c", "")
            if not flags and raw == raw[:8] * n:
                return ("c", (INT_FIELD if kind == "i" else FLOAT_FIELD)
                        % struct.unpack(code, raw[:8]))
            return ("n", CSV_INT if kind == "i" else CSV_FLOAT, raw, flags)
        if kind == "t":
            return ("t", self.texts(lo, hi, pos, []))   # (one field in all: rows_text sees it)
        if kind == "s":
            if pos is None and n:
                starts, ends = self.starts, self.ends
                base = starts[lo]
                if starts[lo + 1:hi].tobytes() == ends[lo:hi - 1].tobytes():   # back to back
                    import numpy as np

                    rel = np.frombuffer(ends, dtype="q", count=n, offset=8 * lo) - base
                    return ("b", bytes(self.data[base:ends[hi - 1]]), rel.tobytes())
            return ("t", self.texts(lo, hi, pos, []))
        vals = self._objects(lo, hi, pos)
        if vals.count("") == n:
            return ("c", "")
        return ("t", any_text(vals))

    def fields(self, lo: int, hi: int, pos: Sequence[int] | None,
               state: list) -> tuple[str, Sequence[Any]]:
        """Rows ``lo`` to ``hi`` as ``requests_csv`` formats a row: a number column with no
        blank as its %-format (``INT_FIELD``, ``FLOAT_FIELD``) and its numbers, any other
        as ``TEXT_FIELD`` and ``texts``."""
        kind = self.kind
        if kind in ("i", "d") and not self.blank:
            return (INT_FIELD if kind == "i" else FLOAT_FIELD), self._numbers(lo, hi, pos)
        return TEXT_FIELD, self.texts(lo, hi, pos, state)

    def _numbers(self, lo: int, hi: int, pos: Sequence[int] | None) -> Sequence[Any]:
        """A number column's values of rows ``lo`` to ``hi`` (of ``pos``'s rows, in a
        view), blanks as their stored 0: a slice of the array, or the picked values."""
        data = self.data
        return data[lo:hi] if pos is None else list(map(data.__getitem__, pos[lo:hi]))

    def at(self, i: int) -> Any:
        kind = self.kind
        if kind == "t":
            return self.words[self.data.at(i)]
        if kind == "s":
            return self.data[self.starts[i]:self.ends[i]].decode("utf-8", "surrogatepass")
        if self.blank and self.blanks is not None and self.blanks[i]:
            return ""
        return self.data[i]

    def reorder(self, perm: Any) -> None:
        """Put the values in ``perm``'s order (a numpy array of positions)."""
        kind = self.kind
        if kind == "t":
            self.data.reorder(perm)
        elif kind == "s":
            for name in ("starts", "ends"):
                moved = array("q")
                moved.frombytes(_np_take(getattr(self, name), "q", perm))
                setattr(self, name, moved)
        elif kind == "o":
            data = self.data
            self.data = [data[i] for i in array("q", perm.tobytes())]
        else:
            moved = array(self.data.typecode)
            moved.frombytes(_np_take(self.data, self.data.typecode, perm))
            self.data = moved
            if self.blanks is not None:
                self.blanks = bytearray(_np_take(self.blanks, "B", perm))

    def nbytes(self) -> int:
        """What the stored values take (not the strings a list points to)."""
        if self.kind == "t":
            return self.data.nbytes()
        if self.kind == "s":
            return len(self.data) + 2 * len(self.ends) * self.ends.itemsize
        blanks = len(self.blanks) if self.blanks is not None else 0
        return len(self.data) * (self.data.itemsize if self.kind != "o" else 8) + blanks


def _kind(name: str) -> str:
    if name in TEXT_COLUMNS:
        return "t" if name in CODED else "s" if name in UNIQUE else "o"
    return "i" if name in INT_COLUMNS else "d"


def _arrival_order(idx: array) -> Any:
    """The rows' positions by arrival index (a stable sort: rows of one index, which a
    run never has, keep their order, as the list of records did)."""
    import numpy as np

    return np.argsort(np.frombuffer(idx, dtype=idx.typecode), kind="stable")


class RequestColumns:
    """The recorder's tuples (``sim/engine/record.py``: arrival index first, then the
    columns of ``RequestRecord`` in order; a shorter tuple's missing columns are "")
    as they come, in batches, in any order; ``table()`` puts them in arrival order."""

    def __init__(self) -> None:
        self.index = _Column("i")
        self.columns = {name: _Column(_kind(name)) for name in REQUEST_COLUMNS}
        self.n = 0

    def add(self, rows: list[tuple]) -> None:
        if not rows:
            return
        lens = set(map(len, rows))          # (one pass: most batches have one length)
        if max(lens) > WIDTH:
            raise ValueError(f"a request row has more than {WIDTH} fields")
        if min(lens) < WIDTH:
            rows = [t + PAD[WIDTH - len(t)] for t in rows]
        cols = zip(*rows)
        self.index.extend(next(cols))
        for col, vals in zip(self.columns.values(), cols):
            col.extend(vals)
        self.n += len(rows)

    def add_batch(self, batch: Any) -> None:
        """A ``sim.engine.record.RowBatch``'s rows (its columns read as buffers): the
        same table as ``add`` of the same rows as tuples."""
        n = batch.n
        if not n:
            return
        self.index.extend_buffer(batch.index, "q", n, None)
        cols = self.columns
        for name, kind, vals, blanks in batch.columns():
            col = cols[name]
            if kind == "-" or (kind == "t" and vals.count("") == n):
                col.extend_blank(n)         # (a text column blank in every row: common)
            elif kind == "t":
                col.extend(tuple(vals))
            else:
                col.extend_buffer(vals, "q" if kind == "i" else "d", n, blanks)
        self.n += n

    def table(self, slo=None) -> RequestTable:
        """Every request in arrival order (the columns are moved, not copied: this
        builder is empty afterwards); with an active ``slo`` (``sim.config.slo.SLOSection``)
        each served request's ``slo_ok`` says whether it met every objective."""
        idx = self.index.data
        if any(map(int.__gt__, idx, idx[1:])):
            perm = _arrival_order(idx)
            for col in self.columns.values():
                col.reorder(perm)
            del perm
        cols = self.columns
        if slo is not None and slo.active:
            met = slo.met
            ok = _Column("i")
            ok.extend(tuple(
                "" if why else int(met(ttft, tpot * 1e-3 if tpot != "" else 0.0, e2e))
                for why, ttft, tpot, e2e in zip(*(cols[c].values() for c in
                                                  ("rejected", "ttft_s", "tpot_ms", "e2e_s")))))
            cols["slo_ok"] = ok
        for col in cols.values():
            col.ids = {}            # (only ever needed to add more)
        out = RequestTable(cols, None, self.n)
        self.index = _Column("i")        # (empty again: the columns moved to the table)
        self.columns = {name: _Column(_kind(name)) for name in REQUEST_COLUMNS}
        self.n = 0
        return out


class RequestTable(Sequence):
    """Requests of a run in arrival order, read as ``RequestRecord``s (built on each
    read: hold on to the records you need, not to many at once).  ``served()`` is the
    view of those not refused on arrival; ``column(name)`` one field of every request
    (fast: no record built)."""

    __slots__ = ("_cols", "_pos", "_n")

    def __init__(self, cols: dict[str, _Column], pos: Sequence[int] | None, n: int):
        self._cols = cols
        self._pos = pos          # the rows of this view (None: all of them)
        self._n = n

    def __len__(self) -> int:
        return self._n

    def _row(self, i: int) -> RequestRecord:
        if not -self._n <= i < self._n:
            raise IndexError("request index out of range")
        j = self._pos[i] if self._pos is not None else i % self._n
        return RequestRecord._make([c.at(j) for c in self._record_cols()])

    def _record_cols(self) -> list[_Column]:
        """The columns of ``RequestRecord`` (a fleet's table has more after them)."""
        cols = list(self._cols.values())
        return cols if len(cols) == len(REQUEST_COLUMNS) else cols[:len(REQUEST_COLUMNS)]

    def names(self) -> list[str]:
        """Every column's name, in requests.csv order: ``REQUEST_COLUMNS``, then any added
        (``with_column``: a fleet's ``replica``, the CPU tier's)."""
        return list(self._cols)

    def with_column(self, name: str, values: Sequence[Any]) -> RequestTable:
        """This table (every request, in arrival order) with one more column after the
        others: ``values``, one per request in arrival order (ints, or "")."""
        return self._with(name, len(values), lambda col: col.extend(tuple(values)))

    def with_int_column(self, name: str, values: Any, blanks: Any) -> RequestTable:
        """``with_column`` of integers given as a buffer of 64-bit values, one per request
        in arrival order, "" where ``blanks`` (a buffer of 64-bit 0/1 flags, or None:
        none) has a 1: the same table, without a boxed number per request."""
        n = len(memoryview(values).cast("B")) // 8
        return self._with(name, n, lambda col: col.extend_buffer(values, "q", n, blanks))

    def _with(self, name: str, n: int, fill: Any) -> RequestTable:
        """This table with a new integer column ``name`` of ``n`` values that ``fill``
        puts into it."""
        if self._pos is not None or n != self._n or name in self._cols:
            raise ValueError(f"cannot add column {name!r} to this table")
        col = _Column("i")
        fill(col)
        col.ids = {}
        return RequestTable({**self._cols, name: col}, None, self._n)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._row(k) for k in range(*i.indices(self._n))]
        return self._row(i)

    def _columns(self) -> Iterator[Iterable[Any]]:
        return (c.values(self._pos) for c in self._record_cols())

    def __iter__(self) -> Iterator[RequestRecord]:
        return map(RequestRecord._make, zip(*self._columns()))

    def kinds(self) -> list[str]:
        """Each column's storage kind, in ``REQUEST_COLUMNS`` order: "i" integers (or
        ""), "d" floats (or ""), "t"/"s" text, "o" values of any type (writers format a
        column by its kind: ``sim/rundir/requests_csv.py``)."""
        return [c.kind for c in self._cols.values()]

    def field_chunks(self, chunk: int) -> Iterator[list[tuple[str, Sequence[Any]]]]:
        """The rows ``chunk`` at a time, each chunk its columns' %-formats and values
        (``_Column.fields``; ``sim/rundir/requests_csv.py`` formats them)."""
        cols = list(self._cols.values())
        states: list[list] = [[] for _ in cols]
        for lo in range(0, self._n, chunk):
            hi = min(lo + chunk, self._n)
            yield [c.fields(lo, hi, self._pos, st) for c, st in zip(cols, states)]

    def byte_chunks(self, chunk: int) -> Iterator[tuple[int, list[tuple], Callable[[], list]]]:
        """The rows ``chunk`` at a time, each chunk its row count, its columns as
        ``requests_csv.rows_text`` takes them (``_Column.bytes_item``) and a callable
        giving the same chunk as ``field_chunks`` does (for a chunk with a field that
        needs quoting)."""
        cols = list(self._cols.values())
        pos = self._pos
        states: list[list] = [[] for _ in cols]
        for lo in range(0, self._n, chunk):
            hi = min(lo + chunk, self._n)
            yield (hi - lo, [c.bytes_item(lo, hi, pos) for c in cols],
                   lambda lo=lo, hi=hi: [c.fields(lo, hi, pos, st)
                                         for c, st in zip(cols, states)])

    def column_texts(self, name: str) -> list[str]:
        """One field of every request as requests.csv writes it (``_Column.texts``: no
        Python call a value)."""
        return self._cols[name].texts(0, self._n, self._pos, [])

    def column(self, name: str) -> Sequence[Any]:
        """One field of every request, in order, without building records: read-only
        (the column's own array when it can be, else a new list)."""
        col = self._cols[name]
        if self._pos is None and not col.blank and col.kind in ("i", "d", "o"):
            return col.data
        return list(col.values(self._pos))

    def floats(self, name: str) -> Any:
        """A number column's values without its blanks, in order, as a numpy array of
        doubles (what ``[float(v) for v in column(name) if v != ""]`` holds); None for a
        column of values of any type (read it with ``column``)."""
        col = self._cols[name]
        if col.kind not in ("i", "d"):
            return None
        import numpy as np

        data = col.data
        got = np.frombuffer(data, dtype=data.typecode) if len(data) else \
            np.zeros(0, dtype=data.typecode)
        keep = None
        if col.blank:
            bl = col.blanks
            keep = np.frombuffer(bl, dtype=np.uint8) == 0 if len(bl) else np.zeros(0, bool)
        if self._pos is not None:
            pos = np.frombuffer(self._pos, dtype="q") if len(self._pos) else \
                np.zeros(0, dtype="q")
            got = got[pos]
            keep = keep[pos] if keep is not None else None
        if keep is not None:
            got = got[keep]
        return got.astype(np.float64)

    def served(self) -> RequestTable:
        """The requests not refused on arrival (a view: nothing is copied)."""
        col = self._cols["rejected"]
        if col.kind == "t" and not any(col.words):
            return self                  # (no request refused: no "rejected" but "")
        rejected = col.values(self._pos)
        keep = array("q", (i for i, why in enumerate(rejected) if not why))
        if len(keep) == self._n:
            return self
        if self._pos is not None:
            keep = array("q", map(self._pos.__getitem__, keep))
        return RequestTable(self._cols, keep, len(keep))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(map(operator.eq, self, other))

    __hash__ = None      # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RequestTable({self._n:,} requests)"


