"""requests.csv written column by column (sim/rundir/requests_csv.py) is byte for byte what
csv.writer writes of the same rows, whatever the text in them (commas, quotes, line
breaks, carriage returns, non-ASCII), the numbers (blanks, huge, negative, infinite,
NaN, bools) and the chunking."""
from __future__ import annotations

import csv
import io
import math
import random

import pytest

from sim.rundir import requests_csv
from sim.rundir.records import REQUEST_COLUMNS
from sim.rundir.requests_csv import fmt as _fmt

TEXTS = ["r1", "", "a,b", 'say "hi"', "two\nlines", "cr\rhere", "é-\U0001f600", " lead", "x"]


def rows_and_kinds(n: int, seed: int):
    rng = random.Random(seed)
    kinds = ["s", "t", "i", "d", "d", "o"]
    rows = []
    for i in range(n):
        rows.append((rng.choice(TEXTS), rng.choice(TEXTS[:2] + ["s1", "s2"]),
                     rng.choice([0, -3, 17, 2 ** 40, ""]),
                     rng.choice([0.0, -0.0, 1.5, 1e-7, 123456.7890125, math.inf, ""]),
                     rng.choice([math.nan, 2.5, ""]),
                     rng.choice([True, 2 ** 70, 1.25, "", "z"])))
    return rows, kinds


def reference(rows) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["a", "b", "c", "d", "e", "f"])
    for r in rows:
        w.writerow([_fmt(v) for v in r])
    return buf.getvalue()


@pytest.mark.parametrize("chunk", [1, 7, 1000])
@pytest.mark.parametrize("seed", [1, 2])
def test_the_bytes_are_csv_writers(chunk, seed):
    rows, kinds = rows_and_kinds(300, seed)
    buf = io.StringIO()
    requests_csv.write_rows(buf, ["a", "b", "c", "d", "e", "f"], rows, kinds, chunk)
    assert buf.getvalue() == reference(rows)


def test_plain_rows_take_the_joined_path_and_match():
    rows = [(f"r{i}", "s", i, i * 0.5, 1.0, "") for i in range(50)]
    buf = io.StringIO()
    requests_csv.write_rows(buf, ["a", "b", "c", "d", "e", "f"], rows,
                            ["s", "t", "i", "d", "d", "o"])
    assert buf.getvalue() == reference(rows)
    assert '"' not in buf.getvalue()


def test_no_rows_is_the_header_alone():
    buf = io.StringIO()
    requests_csv.write_rows(buf, ["a", "b"], [], ["i", "d"])
    assert buf.getvalue() == "a,b\n"


def test_a_nul_character_is_written_as_csv_writer_writes_it():
    rows = [("ok", 1, 0.5, "", "", ""), ("nul\x00inside", 2, 1.0, "", "", "")]
    buf = io.StringIO()
    requests_csv.write_rows(buf, ["a", "b", "c", "d", "e", "f"], rows,
                            ["s", "i", "d", "d", "d", "o"])
    assert buf.getvalue() == reference(rows)


# ----------------------------------------------------- a RequestTable, from its arrays


def _table_rows(seed: int, n: int = 260, odd: bool = False):
    """Recorder tuples of served and refused requests (tests/metrics/test_request_table
    builds the same kinds of rows), with request ids that need quoting or are not ASCII,
    and (``odd``) values no array holds (a bool, 2**70, a text in a number column)."""
    from tests.metrics.test_request_table import refused_row, served_row

    rng = random.Random(seed)
    rows = [served_row(i, rng) if i % 9 else refused_row(i) for i in range(n)]
    for i in rng.sample(range(n), 12):
        rid = rng.choice(["q,1", 'q"2', "é-id", "\U0001f600", "line\nbreak", "nul\x00"])
        rows[i] = rows[i][:1] + (rid + str(i),) + rows[i][2:]
    if odd:
        hit, ttft = 1 + REQUEST_COLUMNS.index("hit_tokens"), 1 + REQUEST_COLUMNS.index("ttft_s")
        rows[5] = rows[5][:hit] + (True,) + rows[5][hit + 1:]
        rows[8] = rows[8][:hit] + (2 ** 70,) + rows[8][hit + 1:]
        rows[10] = rows[10][:ttft] + ("n/a",) + rows[10][ttft + 1:]
    rng.shuffle(rows)
    return rows


def _table_reference(table) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(REQUEST_COLUMNS)
    for r in table:
        w.writerow([_fmt(v) for v in r])
    return buf.getvalue()


@pytest.mark.parametrize("chunk", [1, 7, 1000])
@pytest.mark.parametrize("odd", [False, True])
@pytest.mark.parametrize("batch", [5, 1000])
def test_a_table_is_written_from_its_arrays_as_csv_writer_writes_its_records(chunk, odd,
                                                                              batch):
    from tests.metrics.test_request_table import build

    table = build(_table_rows(batch + chunk, odd=odd), batch)
    kinds = table.kinds()
    assert {"i", "d", "t", "s", "o"} <= set(kinds)         # (every storage kind met)
    as_given = {n for n, k in zip(REQUEST_COLUMNS, kinds) if k == "o"}
    assert ({"hit_tokens", "ttft_s"} <= as_given) == odd    # (numbers no array holds)
    for view in (table, table.served()):
        buf = io.StringIO()
        requests_csv.write_table(buf, list(REQUEST_COLUMNS), view, chunk)
        assert buf.getvalue() == _table_reference(view)
    assert len(table.served()) < len(table)


def test_a_table_of_ascii_ids_blanks_and_empty_columns_takes_the_joined_path():
    from tests.metrics.test_request_table import build, served_row

    rng = random.Random(4)
    rows = [served_row(i, rng, attributed=False) for i in range(120)]
    table = build(rows, 50)
    text = io.StringIO()
    requests_csv.write_table(text, list(REQUEST_COLUMNS), table, 33)
    assert text.getvalue() == _table_reference(table)
    assert '"' not in text.getvalue()
    assert ",," in text.getvalue()                          # (blanks are empty fields)


def test_an_empty_table_is_the_header_alone():
    from tests.metrics.test_request_table import build

    buf = io.StringIO()
    requests_csv.write_table(buf, list(REQUEST_COLUMNS), build([], 10), 8)
    assert buf.getvalue() == ",".join(REQUEST_COLUMNS) + "\n"


def test_any_text_is_fmt_of_each_value_whatever_their_types():
    import enum

    import numpy as np

    class Flag(enum.IntEnum):
        ON = 1

    class Count(int):
        def __str__(self):
            return f"count {int(self)}"

    mixes = [["a", "", "b,c"], [0, -3, 2 ** 70, True, "", "x"], [1.5, "", 2],
             [np.float64(0.25), 3], [Flag.ON, 1], [Count(4), "y"], [None, 1], []]
    for values in mixes:
        assert requests_csv.any_text(values) == [_fmt(v) for v in values]


def test_float_texts_is_format_of_each_double():
    import struct

    rng = random.Random(8)
    values = [rng.random() * 10 ** rng.randint(-9, 14) for _ in range(3000)]
    values += [math.inf, -math.inf, math.nan, -math.nan, -0.0, 0.0, 1e308, -1e-308, 5e-324,
               2.5e-7, 5e-7, 1.5e-6, 1234567.8900005, 0.1 + 0.2]
    values += [struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
               for _ in range(3000)]       # any bit pattern: subnormals, NaN payloads
    assert requests_csv.float_texts(values) == [format(v, ".6f") for v in values]
    assert requests_csv.float_texts([]) == []


def test_constant_columns_are_written_as_the_field_every_row_has():
    """A column with one field in every row goes into the row's format as that text
    (``write_fields``): the same bytes as csv.writer's, for arrays (compared by their
    bytes: -0.0 is not 0.0), lists (a list of floats is never taken for constant:
    0.0 == -0.0), text holding a "%", and a column that differs in its last row only."""
    from array import array

    F, I, T = requests_csv.FLOAT_FIELD, requests_csv.INT_FIELD, requests_csv.TEXT_FIELD
    n = 40
    cols = [
        (I, array("b", [0] * n)), (I, array("q", [7] * (n - 1) + [8])),
        (F, array("d", [-0.0] * n)), (F, array("d", [0.0] * (n - 1) + [-0.0])),
        (F, [0.0] * (n - 1) + [-0.0]), (F, [2.5] * n), (I, [3] * n), (I, [True] * n),
        (T, ["50%"] * n), (T, ["a%d"] * (n - 1) + ["b"]), (T, [""] * n),
        (I, array("i", range(n))),
    ]
    buf = io.StringIO()
    requests_csv.write_fields(buf, cols)
    ref = io.StringIO()
    w = csv.writer(ref, lineterminator="\n")
    for i in range(n):
        w.writerow([_fmt(vals[i]) if spec != I else str(int(vals[i])) for spec, vals in cols])
    assert buf.getvalue() == ref.getvalue()
    first = buf.getvalue().splitlines()[0]
    assert first.startswith("0,7,-0.000000,0.000000,0.000000,2.500000,3,1,50%,a%d,,0")
    every = io.StringIO()                        # (every column constant: no value left)
    requests_csv.write_fields(every, [(I, array("b", [0] * 3)), (T, ["5%"] * 3)])
    assert every.getvalue() == "0,5%\n" * 3
    assert requests_csv._constant_text(I, array("b", [0] * n)) == "0"
    assert requests_csv._constant_text(F, [0.0] * n) is None   # (a list of floats)
    assert requests_csv._constant_text(I, array("q", [7] * (n - 1) + [8])) is None
