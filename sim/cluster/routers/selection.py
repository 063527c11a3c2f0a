"""Dynamo's worker selection over its costs (``lib/llm/src/kv_router/scheduler.rs``;
ai-dynamo/dynamo, July 2025 cost model, PRs #1731 and #1895).  The load each cost counts
(prefill tokens not past the first token, active prompt blocks) is kept per worker by
``ActiveSequences`` (``sim/engine/active_sequences.py``), as Dynamo's ``sequence.rs``
keeps it: the router asks it on every arrival, so it lives in the compiled engine.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from sim.engine.active_sequences import least


def pick_by_cost(costs: Any, size_of: Callable[[int], Any], temperature: float,
                 rng) -> int:
    """Dynamo's selection: at temperature 0 the least cost, ties to the smallest index
    tree (``size_of(i)``: worker i's, asked of the tied workers only), then uniformly at
    random; above 0 a draw with probability proportional to
    ``exp(-(cost - min) / ((max - min) x temperature))`` (uniform when all are equal).
    ``costs``: a ``vec[float]`` (``ActiveSequences.costs``)."""
    if temperature <= 0:
        tied = least(costs)
        if len(tied) > 1:
            sizes = [size_of(i) for i in tied]
            small = min(sizes)
            tied = [i for i, s in zip(tied, sizes) if s == small]
        return tied[0] if len(tied) == 1 else tied[rng.randrange(len(tied))]
    lo = min(costs)
    hi = max(costs)
    if hi == lo:
        return rng.randrange(len(costs))
    w = [math.exp(-(c - lo) / ((hi - lo) * temperature)) for c in costs]
    x = rng.random() * sum(w)
    for i, wi in enumerate(w):
        x -= wi
        if x < 0:
            return i
    return len(w) - 1
