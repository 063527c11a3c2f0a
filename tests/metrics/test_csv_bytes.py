"""Numbers written digit by digit (sim/engine/codecs.py, compiled) are the very text of ``str`` and
``"%.6f"``: every int, every double (exact halves between two six-decimal values and their
neighbours included), and whole chunks of requests.csv rows either way."""
from __future__ import annotations

import io
import math
import random
import struct
from array import array

import pytest
from librt.strings import BytesWriter

from sim.engine import codecs

from sim.rundir import requests_csv


def fixed6(x: float) -> str:
    w = BytesWriter()
    codecs.write_fixed6(w, x)
    return w.getvalue().decode("ascii")


def int_text(v: int) -> str:
    w = BytesWriter()
    codecs.write_int(w, v)
    return w.getvalue().decode("ascii")


def test_the_compiled_build_writes_rows_digit_by_digit():
    from sim import native

    assert requests_csv.BYTES_ROWS == (native.mode() == "compiled")


def test_ints_are_their_str():
    rng = random.Random(1)
    values = list(range(-20, 2000)) + [10 ** k + d for k in range(1, 19) for d in (-1, 0, 1)]
    values += [rng.randrange(-2 ** 63, 2 ** 63) for _ in range(3000)]
    values += [rng.randrange(0, 10 ** rng.randint(1, 9)) for _ in range(3000)]
    values += [2 ** 63 - 1, -2 ** 63]
    assert [int_text(v) for v in values] == [str(v) for v in values]


def test_doubles_are_their_six_decimals_ties_included():
    rng = random.Random(2)
    values = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-6, 5e-7, 1.5e-6, 2.5e-6, 1e-7,
              0.0078125, 123.0000005, 99999999.9999995, 1e8, 1e8 - 1e-6, -1.5, 5e-324,
              1e308, 0.1 + 0.2]
    # exact halves: x * 10**6 == k + 1/2 (dyadic fractions whose denominators 10**6 cancels)
    for j in range(1, 24):
        for k in range(0, 4000, 7):
            values.append((2 * k + 1) / 2 ** j)
    for _ in range(4000):
        t = (2 * rng.randrange(0, 10 ** 13) + 1) / 2e6        # (halves, as doubles)
        values += [t, math.nextafter(t, 0.0), math.nextafter(t, math.inf)]
        values.append(10 ** rng.uniform(-8, 9))
        values.append(rng.randrange(0, 10 ** 13) / 1e9)       # (ns as seconds)
        values.append(rng.randrange(0, 2 ** 53) / 2 ** rng.randrange(0, 80))
        values.append(struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0])
    assert [fixed6(x) for x in values] == ["%.6f" % x for x in values]


def _fields(rng: random.Random, n: int):
    I, F, T = requests_csv.INT_FIELD, requests_csv.FLOAT_FIELD, requests_csv.TEXT_FIELD
    out = []
    for _ in range(rng.randrange(1, 9)):
        t = rng.choice("iqbhcfdsvnx")
        if t == "i":
            out.append((I, array("q", [rng.choice([0, 7, rng.randrange(-5, 10 ** 9),
                                                   rng.randrange(0, 2 ** 62)])
                                       for _ in range(n)])))
        elif t == "q":
            out.append((I, [rng.randrange(0, 10 ** 6) for _ in range(n)]))      # (a list)
        elif t in "bh":
            lim = 100 if t == "b" else 30000
            out.append((I, array(t, [rng.randrange(-lim, lim) for _ in range(n)])))
        elif t == "c":
            out.append((I, array("q", [42] * n)))                            # (constant)
        elif t == "f":
            out.append((F, array("d", [rng.choice([0.0, -0.0, math.nan, -1.5, 1e9,
                                                   rng.random() * 10 ** rng.randrange(-8, 9)])
                                       for _ in range(n)])))
        elif t == "d":
            out.append((F, [rng.random() * 100 for _ in range(n)]))               # (a list)
        elif t == "s":
            out.append((T, ["r%07d" % rng.randrange(10 ** 7) for _ in range(n)]))  # (one width)
        elif t == "v":
            out.append((T, [rng.choice(["", "x", "evicted", "a;b", "0123456789abcdefXY"])
                            for _ in range(n)]))                              # (widths vary)
        elif t == "n":
            out.append((T, [rng.choice(["é", "a"]) for _ in range(n)]))      # (not ASCII)
        else:
            out.append((I, [2 ** 70] * (n - 1) + [1]))                   # (beyond 64 bits)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_rows_are_the_percent_formattings_bytes(seed, monkeypatch):
    rng = random.Random(seed)
    for _ in range(40):
        n = rng.randrange(1, 60)
        fields = _fields(rng, n)
        texts = []
        for on in (False, True):
            monkeypatch.setattr(requests_csv, "BYTES_ROWS", on)
            buf = io.StringIO()
            requests_csv.write_fields(buf, fields)
            texts.append(buf.getvalue())
        assert texts[1] == texts[0]
        assert texts[0].count("\n") == n


def test_only_what_it_can_tell_is_written_digit_by_digit():
    I, T = requests_csv.INT_FIELD, requests_csv.TEXT_FIELD
    assert requests_csv._bytes_rows([(T, ["é", "a"])], 2) is None
    assert requests_csv._bytes_rows([(I, [2 ** 70, 1])], 2) is None
    assert requests_csv._bytes_rows([(I, [1.5, 2])], 2) is None
    assert requests_csv._bytes_rows([(I, array("q", [3, 41])), (T, ["ab", "c"])], 2) == \
        "3,ab\n41,c\n"
    assert requests_csv._width("ab\x00cd\x00ef", 3) == 2
    assert requests_csv._width("ab\x00c\x00def", 3) == -2
    assert requests_csv._width("\x00\x00", 3) == 0
    assert requests_csv._width("abc", 1) == 3


@pytest.mark.parametrize("on", [False, True])
def test_a_table_is_written_the_same_either_way(on, monkeypatch):
    from tests.metrics.test_request_table import build, served_row
    from tests.metrics.test_requests_csv import _table_reference, _table_rows

    from sim.rundir.records import REQUEST_COLUMNS

    monkeypatch.setattr(requests_csv, "BYTES_ROWS", on)
    rng = random.Random(4)
    plain = build([served_row(i, rng, attributed=bool(i % 3)) for i in range(300)], 70)
    odd = build(_table_rows(5, 300, odd=True), 70)     # (numbers no array holds)
    for table in (build(_table_rows(3, 400), 70), plain, odd):
        for view in (table, table.served()):
            buf = io.StringIO()
            requests_csv.write_table(buf, list(REQUEST_COLUMNS), view, 64)
            assert buf.getvalue() == _table_reference(view)
