"""The few columns of requests.csv the run report reads, without building full records.

The report reads eight of requests.csv's columns (``REPORT_COLUMNS``).  ``as_written``
takes them from the run's requests in memory through the text requests.csv holds
(``sim/commands/run.py`` ``_fmt``, then the conversion ``sim.rundir.records.read_request_records``
makes), so that the report worker can start before requests.csv is on disk
(``reports/workers.py``): the values are those ``sim report`` reads back.

No matplotlib here: the main process of ``sim run`` imports this module.
"""
from __future__ import annotations

from collections import namedtuple
from itertools import compress

from sim.rundir.records import INT_COLUMNS, TEXT_COLUMNS

# the run report's figures that read requests.csv (the others read summary.json and
# memory.csv alone)
ROW_FIGURES = ("ttft_cdf", "hit_hist")
# the columns of requests.csv the report reads (figures, miss section, messages)
REPORT_COLUMNS = ("request_id", "ttft_s", "hit_tokens", "lost_tokens", "checkpoint_tokens",
                  "checkpoint_reason", "capacity_tokens", "capacity_evicted_by")
ReportRow = namedtuple("ReportRow", REPORT_COLUMNS)    # (attributes as RequestRecord's)
_KINDS = tuple(0 if c in TEXT_COLUMNS else 1 if c in INT_COLUMNS else 2
               for c in REPORT_COLUMNS)


def _conv(v: str, kind: int):
    """A requests.csv field as ``read_request_records`` reads it."""
    return v if kind == 0 or v == "" else int(v) if kind == 1 else float(v)


def as_written(recs) -> list[list]:
    """``REPORT_COLUMNS`` of the served requests among ``recs`` (every request of a run,
    in requests.csv order: a ``sim.rundir.request_table.RequestTable`` or a list of records), as
    ``read`` would read them from the requests.csv ``sim run`` writes from ``recs``:
    column by column (``rows_of`` makes them rows)."""
    from sim.rundir.request_table import RequestTable

    if isinstance(recs, RequestTable):
        return _table_as_written(recs.served())
    from sim.rundir.requests_csv import FLOAT_SPEC
    from sim.rundir.summary import column
    from sim.rundir.requests_csv import fmt as _fmt

    def text(v, kind: int):     # (what requests.csv holds, read back)
        return _conv(_fmt(v), kind)

    keep = [not _fmt(v) for v in column(recs, "rejected")]
    out = []
    for c, k in zip(REPORT_COLUMNS, _KINDS):
        vals = column(recs, c) if all(keep) else list(compress(column(recs, c), keep))
        # the same as text(v, k), quicker for the types each kind holds
        if k == 0:
            out.append([v if type(v) is str else text(v, k) for v in vals])
        elif k == 1:
            out.append([v if type(v) is int else text(v, k) for v in vals])
        else:
            out.append([float(format(v, FLOAT_SPEC)) if type(v) is float else text(v, k)
                        for v in vals])
    return out


def _table_as_written(table) -> list[list]:
    """``as_written`` of a table's served requests: an integer column as its values
    (``int(str(v))`` is ``v``; blanks are ""), any other its requests.csv text
    (``RequestTable.column_texts``) read back as ``read_request_records`` reads it, by
    one C-level conversion a column where it has no blank (the report is drawn from
    these while requests.csv is written: this is on the report's critical path)."""
    from sim.rundir.records import REQUEST_COLUMNS

    stored = dict(zip(REQUEST_COLUMNS, table.kinds()))
    out = []
    for c, k in zip(REPORT_COLUMNS, _KINDS):
        if k == 1 and stored[c] == "i":     # (integers, "" at blanks: read back the same)
            out.append(list(table.column(c)))
            continue
        texts = table.column_texts(c)
        if k == 0:
            out.append(texts)
        elif "" in texts:
            out.append([_conv(v, k) for v in texts])
        else:
            out.append(list(map(int if k == 1 else float, texts)))
    return out


def rows_of(columns: list[list]) -> list[ReportRow]:
    """``as_written``'s columns as rows."""
    return [ReportRow._make(t) for t in zip(*columns)]
