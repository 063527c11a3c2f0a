"""The one percentile method of the project: numpy's default ("linear").

Every summary field, report table and figure takes its percentiles from here,
so a figure and the table beside it can never disagree.  ``linear`` is the
method numpy names "linear" (type 7 of Hyndman & Fan), which is also what
``vllm bench serve`` reports through ``np.percentile``.

Computed here from the sorted values with numpy's own arithmetic (its virtual index, its
neighbours, its two-branch interpolation), bit for bit what ``np.percentile`` returns
(tested): calling ``np.percentile`` itself costs more than the answer, as its first call
imports ``numpy.ma`` (~20 ms, through ``np.unique``) on ``sim run``'s way to its report.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``; NaN when there are none."""
    return percentiles(values, [q])[0]


def percentiles(values: Sequence[float] | np.ndarray, qs: Sequence[float]) -> list[float]:
    """Several percentiles of the same values in one pass (NaN for each when there are
    none, or when one is NaN, as numpy answers; a ``q`` outside 0..100 is numpy's
    ``ValueError``)."""
    if len(values) == 0:
        return [math.nan] * len(qs)
    if not all(0 <= q <= 100 for q in qs):
        raise ValueError("Percentiles must be in the range [0, 100]")
    v = np.sort(np.asarray(values, dtype=float))     # (NaN sorts last)
    n = len(v)
    if math.isnan(v[-1]):
        return [math.nan] * len(qs)
    return [_linear(v, n, q) for q in qs]


def _linear(v: np.ndarray, n: int, q: float) -> float:
    """numpy's "linear" percentile ``q`` (0..100) of the ``n`` sorted values ``v``: the
    virtual index ``(n - 1) * q / 100`` between its floor and the next position (both
    the last one at or past the end, where numpy also counts the gap from index -1),
    and numpy's lerp, whose branch depends on the gap."""
    vi = (n - 1) * (q / 100)
    if vi >= n - 1:
        a = b = float(v[-1])
        return _lerp(a, b, vi + 1.0)
    lo = math.floor(vi)
    return _lerp(float(v[lo]), float(v[lo + 1]), vi - lo)


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's interpolation between neighbours ``a`` and ``b`` at ``t``: from ``b``
    back when ``t`` is at least one half, else from ``a`` (so that the result matches
    ``np.percentile`` bit for bit)."""
    d = b - a
    return b - d * (1 - t) if t >= 0.5 else a + d * t


def mean(values: Sequence[float] | np.ndarray) -> float:
    """The arithmetic mean; NaN when there are none."""
    if len(values) == 0:
        return math.nan
    return float(np.mean(np.asarray(values, dtype=float)))


def weighted_percentiles(values: Sequence[float] | np.ndarray,
                         counts: Sequence[int] | np.ndarray, qs: Sequence[float]) -> list[float]:
    """Percentiles of a multiset given as distinct ``values`` with their ``counts``,
    equal to :func:`percentiles` of the values repeated ``counts`` times (the same
    ``linear`` method), without building that array: a run's inter-token latencies
    are kept as a histogram of a few thousand distinct values over millions of tokens."""
    v = np.asarray(values, dtype=float)
    c = np.asarray(counts, dtype=np.int64)
    keep = c > 0
    v, c = v[keep], c[keep]
    n = int(c.sum())
    if n == 0:
        return [math.nan] * len(qs)
    order = np.argsort(v, kind="stable")
    v, c = v[order], c[order]
    ends = np.cumsum(c)              # ends[j]: count of values <= v[j]
    out = []
    for q in qs:
        pos = (q / 100.0) * (n - 1)   # numpy's virtual index for "linear"
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        a = float(v[int(np.searchsorted(ends, lo, side="right"))])
        b = float(v[int(np.searchsorted(ends, hi, side="right"))])
        out.append(_lerp(a, b, pos - lo))
    return out
