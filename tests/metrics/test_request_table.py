"""The run's requests kept column by column (sim/rundir/request_table.py): read back, they are
exactly the records the recorder's tuples make (values and types, in arrival order),
whatever the values (blanks, NaN, huge or odd numbers), batches and order."""
from __future__ import annotations

import math
import random

import pytest

from sim.config.slo import SLOSection
from sim.rundir.records import REQUEST_COLUMNS, RequestRecord, records_in_arrival_order
from sim.rundir.request_table import RequestColumns, RequestTable

BLANK_INT = -(2 ** 63)        # the least 64-bit integer


def served_row(i: int, rng: random.Random, attributed: bool = True) -> tuple:
    """A recorder tuple of a finished request (sim/engine/record.py Recorder.finish)."""
    out = rng.choice([1, 1, 7, 300])
    row = (i, f"r{i:07d}", rng.choice(["", "s1", "s2"]), i * 0.25 + rng.random(),
           rng.randint(1, 90_000), rng.randint(0, 5000), rng.randint(0, 5000),
           rng.randint(0, 50), rng.randint(0, 3), rng.randint(0, 500), rng.random(),
           rng.random() + 0.5, rng.random() + 2.0, out, rng.randint(0, 2), rng.randint(0, 9), "",
           rng.random() * 40 if out > 1 else "", rng.random() * 40 if out > 2 else "",
           rng.randint(1, out))
    if attributed:
        row += ("", rng.randint(0, 900), rng.randint(0, 900), 0, rng.randint(0, 9), 16,
                rng.choice(["", "evicted", "align"]), rng.choice(["", f"r{i - 1:07d}"]))
    return row


def refused_row(i: int) -> tuple:
    """Recorder.reject's tuple."""
    return (i, f"r{i:07d}", "", i * 0.25, 70_000) + ("",) * 11 + ("exceeds_max_model_len",
                                                                  "", "", "")


def typed(records) -> list:
    return [[(type(v), v) for v in r] for r in records]


def build(rows: list[tuple], batch: int, slo=None) -> RequestTable:
    cols = RequestColumns()
    for k in range(0, len(rows), batch):
        cols.add(rows[k:k + batch])
    return cols.table(slo)


@pytest.mark.parametrize("attributed", [True, False])
@pytest.mark.parametrize("batch", [1, 7, 1000])
def test_the_table_reads_back_the_records_of_the_tuples_in_arrival_order(attributed, batch):
    rng = random.Random(3)
    served = [served_row(i, rng, attributed) for i in range(300) if i % 13]
    refused = [refused_row(i) for i in range(0, 300, 13)]
    rows = served + refused
    rng.shuffle(rows)                         # finish order is not arrival order
    want = records_in_arrival_order(served, refused)
    table = build(rows, batch)
    assert len(table) == 300 and isinstance(table[0], RequestRecord)
    assert typed(table) == typed(want)
    assert typed([table[i] for i in range(-300, 300)]) == typed(want + want)
    assert typed(table[5:40:3]) == typed(want[5:40:3])
    assert table == want and want == table and table != want[:-1]
    for name in REQUEST_COLUMNS:
        assert [(type(v), v) for v in table.column(name)] == \
            [(type(getattr(r, name)), getattr(r, name)) for r in want]
    with pytest.raises(IndexError):
        table[300]


def test_the_served_view_drops_refused_requests_and_computes_slo_ok():
    rng = random.Random(5)
    served = [served_row(i, rng) for i in range(200) if i % 7]
    refused = [refused_row(i) for i in range(0, 200, 7)]
    slo = SLOSection(ttft_ms=1200.0, tpot_ms=25.0)
    want = records_in_arrival_order(served, refused, slo)
    table = build(refused + served[::-1], 50, slo)
    assert typed(table) == typed(want)
    view = table.served()
    want_served = [r for r in want if not r.rejected]
    assert len(view) == len(want_served) < len(table)
    assert typed(view) == typed(want_served)
    assert typed([view[-1], view[0]]) == typed([want_served[-1], want_served[0]])
    assert list(view.column("slo_ok")) == [r.slo_ok for r in want_served]
    assert {r.slo_ok for r in want_served} == {0, 1}      # (the SLO splits them)
    assert [tuple(r) for r in view] == [tuple(r) for r in want_served]
    assert view.served() is view


def test_values_an_array_cannot_hold_exactly_are_kept_as_given():
    rng = random.Random(9)
    rows = [served_row(i, rng) for i in range(40)]
    odd = {3: ("prompt_tokens", 2 ** 70), 11: ("hit_tokens", True),
           17: ("queue_s", math.inf), 25: ("junction", BLANK_INT), 31: ("preemptions", 2.0)}
    for i, (name, v) in odd.items():
        j = 1 + REQUEST_COLUMNS.index(name)
        rows[i] = rows[i][:j] + (v,) + rows[i][j + 1:]
    nan_at = 1 + REQUEST_COLUMNS.index("ttft_s")
    rows[20] = rows[20][:nan_at] + (math.nan,) + rows[20][nan_at + 1:]
    table = build(rows, 8)
    want = records_in_arrival_order(rows, [])
    got = list(table)
    assert type(got[20].ttft_s) is float and math.isnan(got[20].ttft_s)
    fix = lambda recs: typed(r._replace(ttft_s=0.0) if i == 20 else r
                             for i, r in enumerate(recs))
    assert fix(got) == fix(want)
    for i, (name, v) in odd.items():
        assert type(getattr(got[i], name)) is type(v) and getattr(got[i], name) == v


def test_a_tuple_longer_than_a_record_is_refused():
    with pytest.raises(ValueError, match="more than"):
        RequestColumns().add([served_row(0, random.Random(1)) + ("x",)])


def test_columns_widen_as_larger_numbers_come_and_blanks_stay_blank():
    # each integer column takes the narrowest array that holds it; a larger value
    # (or one equal to the narrow width's blank) widens it, blanks included
    rng = random.Random(11)
    edges = [0, 127, -127, -128, 128, 32767, -32768, 2 ** 31, -(2 ** 63) + 1, 2 ** 63 - 1]
    rows = []
    for i, v in enumerate(edges * 3):
        row = refused_row(i) if i % 4 == 3 else served_row(i, rng)
        j = 1 + REQUEST_COLUMNS.index("prompt_tokens")
        rows.append(row[:j] + (v,) + row[j + 1:])
    for batch in (1, 3, 30):
        table = build(rows, batch)
        assert typed(table) == typed(records_in_arrival_order(rows, []))
    sizes = {n: table._cols[n].nbytes() for n in ("preemptions", "prompt_tokens", "session",
                                                  "hit_tokens")}
    # (1 byte each, and a blank flag each: refused rows have none; 8 each; 1-byte codes;
    # 2 bytes each, and a blank flag each)
    assert sizes == {"preemptions": 60, "prompt_tokens": 240, "session": 30,
                     "hit_tokens": 90}


def test_text_of_few_values_is_kept_once():
    rows = [served_row(i, random.Random(i)) for i in range(50)]
    j = 1 + REQUEST_COLUMNS.index("session")
    rows = [r[:j] + ("".join(["conv", str(i % 3)]),) + r[j + 1:] for i, r in enumerate(rows)]
    table = build(rows, 16)
    got = table.column("session")
    assert got == [f"conv{i % 3}" for i in range(50)]
    assert len({id(s) for s in got}) == 3            # one string object per value


def test_request_ids_of_any_text_read_back_exactly():
    ids = ["r1", "", "é-\U0001f600", "\ud800lone", "a,b\n", "r1"]
    rows = [(i, rid) + served_row(i, random.Random(i))[2:] for i, rid in enumerate(ids)]
    table = build(rows[::-1], 4)
    assert table.column("request_id") == ids and [r.request_id for r in table] == ids
    assert table[3].request_id == "\ud800lone"


@pytest.mark.parametrize("indices", [[4, 0, 3, 1, 2], [9, 2, 40, 7, 3], [2, 0, 2, 1, 0]])
def test_rows_come_out_by_arrival_index_whatever_the_indices(indices):
    # every arrival indexed 0..n-1 (a run), gaps, or (never in a run) one index twice:
    # a stable sort by index, as the list of records was
    rows = [(i, f"r{k}") + served_row(i, random.Random(k))[2:] for k, i in enumerate(indices)]
    assert typed(build(rows, 2)) == typed(records_in_arrival_order(rows, []))


def test_simulate_returns_tables_of_every_request_and_of_the_served_ones():
    from pathlib import Path

    from sim.config.scenario import load_scenario
    from sim.commands.run import simulate

    tiny = Path(__file__).resolve().parents[2] / "scenarios" / "athena-tiny.yaml"
    sc = load_scenario(tiny, {"workload.num_requests": 30, "scheduler.max_model_len": 350})
    dep, rows, s = simulate(sc)
    assert isinstance(rows, RequestTable) and isinstance(dep.records, RequestTable)
    assert len(dep.records) == s["requests"] + s["rejected_requests"]
    assert s["rejected_requests"] > 0 and len(rows) == s["requests"] > 0
    assert list(rows) == [r for r in dep.records if not r.rejected]
    assert sum(rows.column("prompt_tokens")) == s["prompt_tokens"]


def test_a_row_batch_has_every_column_in_order():
    from sim.engine.record import RowBatch

    assert tuple(name for name, *_ in RowBatch().columns()) == REQUEST_COLUMNS


@pytest.mark.parametrize("code", ["q", "d"])
def test_numbers_from_a_buffer_make_the_column_a_tuple_of_them_makes(code):
    # widening from 1 to 8 bytes, blanks among them, batches of any size
    from librt.vecs import append, vec
    from mypy_extensions import i64

    from sim.rundir.request_table import _Column

    rng = random.Random(13)
    edges = [0, 127, -128, 128, 32767, -32768, 2 ** 31, -(2 ** 63), 2 ** 63 - 1]
    vals = [rng.choice(edges) if code == "q" else rng.choice([0.0, -0.0, 1.5, 1e300, math.inf,
                                                              -math.inf, 2.0 ** -1074])
            for _ in range(200)]
    blank = [rng.random() < 0.2 for _ in vals]
    want, got = _Column("i" if code == "q" else "d"), _Column("i" if code == "q" else "d")
    start = 0
    for size in (1, 7, 60, 132):
        part = range(start, start + size)
        want.extend(tuple("" if blank[i] else vals[i] for i in part))
        buf = vec[i64]() if code == "q" else vec[float]()
        flags = vec[i64]()
        for i in part:
            buf = append(buf, 0 if blank[i] and code == "q" else 0.0 if blank[i] else vals[i])
            flags = append(flags, int(blank[i]))
        got.extend_buffer(buf, code, size, flags)
        start += size
    assert [(type(v), v) for v in got.values()] == [(type(v), v) for v in want.values()]
    assert got.data.typecode == want.data.typecode and got.blank == want.blank == sum(blank)


@pytest.mark.parametrize("kind", ["i", "d", "t", "s", "o"])
def test_blanks_appended_at_once_make_the_column_blanks_given_as_values_make(kind):
    # extend_blank's shortcuts (zeros flagged blank, the code of "") against extend of
    # the same "" values, between batches of other values (a coded column meets "" first
    # or later; an integer column already widened)
    from sim.rundir.request_table import _Column

    fill = {"i": [5, 70000, -3], "d": [0.5, -0.0, 2.0], "t": ["a", "b", "a"],
            "s": ["r1", "r2", "r3"], "o": ["x", 7, None]}[kind]
    for blank_first in (True, False):
        want, got = _Column(kind), _Column(kind)
        for step in ((("blank", 3), ("vals", fill), ("blank", 1), ("blank", 0))
                     if blank_first else (("vals", fill), ("blank", 4), ("vals", fill))):
            what, arg = step
            if what == "vals":
                want.extend(tuple(arg))
                got.extend(tuple(arg))
            else:
                want.extend(("",) * arg)
                got.extend_blank(arg)
        assert [(type(v), v) for v in got.values()] == [(type(v), v) for v in want.values()]
        assert got.blank == want.blank and got.words == want.words and got.ids == want.ids
        if kind in "id":
            assert got.data.typecode == want.data.typecode and got.blanks == want.blanks


@pytest.mark.parametrize("attribution", [True, False])
def test_a_replay_recorded_column_by_column_equals_one_recorded_as_tuples(attribution):
    # the recorder's two paths (RowBatch buffers, the tuples of Recorder.finish) give the
    # same table, refused requests and requests without attribution included
    from pathlib import Path

    from sim.config.scenario import load_scenario
    from sim.commands.run import simulate

    mooncake = Path(__file__).resolve().parents[2] / "scenarios" / "mooncake-conversation.yaml"
    sc = load_scenario(mooncake, {"workload.num_requests": 300, "attribution": attribution,
                                  "scheduler.max_model_len": 30000})

    def table(batches: bool):
        def prepare(dep, sched, eng):
            if not batches:
                eng.recorder.keep_batch = None
        dep, _, s = simulate(sc, prepare=prepare)
        assert s["rejected_requests"] > 0
        return dep.records

    assert typed(table(True)) == typed(table(False))


@pytest.mark.parametrize("attributed", [True, False])
def test_the_reports_columns_of_a_table_are_what_its_requests_csv_reads_back(attributed,
                                                                             tmp_path):
    """``reports.rows.as_written`` of a table (one text conversion a column) gives the
    report's columns of the served requests exactly as reading the requests.csv written
    from the same table does: refused requests left out, blanks "", odd ids, values and
    types; and as the record-by-record path gives them from the table's records."""
    from reports.rows import REPORT_COLUMNS, as_written
    from sim.rundir import requests_csv
    from sim.rundir.records import read_request_records

    rng = random.Random(11)
    ids = ["a,b\n", 'q"x', "é-\U0001f600"]
    served = [served_row(i, rng, attributed) for i in range(200) if i % 9]
    served = [(r[0], ids[k]) + r[2:] if k < len(ids) else r for k, r in enumerate(served)]
    rows = served + [refused_row(i) for i in range(0, 200, 9)]
    rng.shuffle(rows)
    table = build(rows, 16)
    path = tmp_path / "requests.csv"
    with open(path, "w", newline="") as f:
        requests_csv.write_table(f, list(REQUEST_COLUMNS), table)
    back = [r for r in read_request_records(path) if not r.rejected]
    want = [[(type(v), v) for v in (getattr(r, c) for r in back)] for c in REPORT_COLUMNS]
    got = as_written(table)
    assert [[(type(v), v) for v in col] for col in got] == want
    assert as_written(list(table)) == got
    assert len(got[0]) == len(served) and set(ids) <= set(got[0])
