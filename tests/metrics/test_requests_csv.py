"""requests.csv written column by column (sim/requests_csv.py) is byte for byte what
csv.writer writes of the same rows, whatever the text in them (commas, quotes, line
breaks, carriage returns, non-ASCII), the numbers (blanks, huge, negative, infinite,
NaN, bools) and the chunking."""
from __future__ import annotations

import csv
import io
import math
import random

import pytest

from sim import requests_csv
from sim.run import _fmt

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
    requests_csv.write(buf, ["a", "b", "c", "d", "e", "f"], rows, kinds, _fmt, chunk)
    assert buf.getvalue() == reference(rows)


def test_plain_rows_take_the_joined_path_and_match():
    rows = [(f"r{i}", "s", i, i * 0.5, 1.0, "") for i in range(50)]
    buf = io.StringIO()
    requests_csv.write(buf, ["a", "b", "c", "d", "e", "f"], rows,
                       ["s", "t", "i", "d", "d", "o"], _fmt)
    assert buf.getvalue() == reference(rows)
    assert '"' not in buf.getvalue()


def test_no_rows_is_the_header_alone():
    buf = io.StringIO()
    requests_csv.write(buf, ["a", "b"], [], ["i", "d"], _fmt)
    assert buf.getvalue() == "a,b\n"


def test_a_nul_character_is_written_as_csv_writer_writes_it():
    rows = [("ok", 1, 0.5, "", "", ""), ("nul\x00inside", 2, 1.0, "", "", "")]
    buf = io.StringIO()
    requests_csv.write(buf, ["a", "b", "c", "d", "e", "f"], rows,
                       ["s", "i", "d", "d", "d", "o"], _fmt)
    assert buf.getvalue() == reference(rows)
