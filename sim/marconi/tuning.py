"""Marconi's alpha, tuned the way the paper does (§4.2, "managing the balance"):

1. serve with alpha = 0 (plain recency) until the first eviction; say that came after ``n0``
   requests;
2. keep serving with alpha = 0 while logging a bootstrap window of ``multiplier x n0``
   requests (the paper: 5-15x);
3. replay the window with every alpha of a grid (the paper's 0, 0.1, ..., 2.0) and adopt the
   one with the highest token hit rate from then on.

Interpretations: the window is the trace's first ``multiplier x n0`` requests and each
candidate alpha replays it from an empty cache (the window starts at the first request, when
the cache was empty); ties go to the smaller alpha (the one closer to LRU).  A trace shorter
than its window is never tuned: alpha stays 0, as in a deployment still bootstrapping.

Marconi's published code scores each alpha otherwise: by the FLOPs saved (its per-layer
formulas) over the window's last 500 requests, and adopts the winner for the eviction made
while inserting the window's last request.  The rules ``tune_objective``, ``tune_last``,
``flops`` and ``tune_at`` (``sim.marconi.rules``) choose; :func:`window_scores` scores by them.
"""
from __future__ import annotations

from collections.abc import Sequence

from sim.marconi.costs import CostModel
from sim.marconi.eviction import FlopAware
from sim.marconi.rules import DEFAULT, Rules
from sim.marconi.runs import Request
from sim.marconi.tree import RadixTree

ALPHA_GRID: tuple[float, ...] = tuple(k / 10 for k in range(21))


def window_hit_rates(window: Sequence[Request], costs: CostModel, budget_bytes: int,
                     grid: Sequence[float], hits_at_zero: int | None = None) -> dict[float, float]:
    """Token hit rate of ``window`` replayed from an empty cache, for each alpha of ``grid``.
    ``hits_at_zero``: the window's hit tokens at alpha 0 when already known (the live run
    served the window with alpha 0), which spares that replay."""
    prompt = sum(r.prompt_tokens for r in window) or 1
    seqs = [(r.prompt_seq(), r.full_seq()) for r in window]
    rates: dict[float, float] = {}
    for alpha in grid:
        if alpha == 0 and hits_at_zero is not None:
            hits = hits_at_zero
        else:
            tree = RadixTree(costs, budget_bytes, FlopAware(alpha))
            hits = sum(tree.serve_seqs(p, s) for p, s in seqs)
        rates[float(alpha)] = hits / prompt
    return rates


def window_scores(window: Sequence[Request], costs: CostModel, budget_bytes: int,
                  grid: Sequence[float], rules: Rules = DEFAULT,
                  hits_at_zero: Sequence[int] | None = None) -> dict[float, float]:
    """Each alpha of ``grid`` scored on ``window`` replayed from an empty cache under
    ``rules``: the token hit rate (``tune_objective: token-hit``) or the FLOPs saved
    (``flops``, priced by ``rules.flops``) over the window's last ``rules.tune_last``
    requests (0: all).  ``hits_at_zero``: the window's hits, request by request, at alpha 0
    when already known.  With the default rules the scores are :func:`window_hit_rates`'."""
    last = rules.tune_last
    scored = window[-last:] if last else window
    prompt = sum(r.prompt_tokens for r in scored) or 1
    if rules.flops == "marconi":
        layers = costs.layers
        if layers is None:
            from sim.errors import ConfigError
            raise ConfigError("marconi.rules.flops", "marconi needs the model's layer shapes "
                              "(a catalogue model or a CostModel with layers)")
        saving = layers.hit_saving
    else:
        def saving(tokens: int) -> float:
            return costs.prefill_flops(0, tokens)
    seqs = [(r.prompt_seq(), r.full_seq()) for r in window]
    scores: dict[float, float] = {}
    for alpha in grid:
        if alpha == 0 and hits_at_zero is not None:
            hits = list(hits_at_zero)
        else:
            tree = RadixTree(costs, budget_bytes, FlopAware(alpha), rules)
            hits = [tree.serve_seqs(p, s) for p, s in seqs]
        if last:
            hits = hits[-last:]
        if rules.tune_objective == "token-hit":
            scores[float(alpha)] = sum(hits) / prompt
        else:
            scores[float(alpha)] = sum(saving(h) for h in hits)
    return scores


def best_alpha(rates: dict[float, float]) -> float:
    """The alpha of the highest score (hit rate or FLOPs); ties to the smaller alpha."""
    return max(rates, key=lambda a: (rates[a], -a))
