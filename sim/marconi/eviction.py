"""The two eviction rules of the radix tree: LRU on leaves ("SGLang+") and Marconi's
FLOP-aware utility.  Each is a small object the tree asks three things: which nodes may be
evicted (``max_kids``), whose access time a hit refreshes (``touch_path``), and which
candidate goes first (``choose``).  ``choose`` takes the candidates' slots in slot order and,
optionally, ``tiebreak``: given the slots of equally scored candidates, the one to take (the
``before-insert`` rules take the first in the tree's depth-first order, as Marconi's code);
without it the first in slot order goes.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sim.marconi.slots import Slots, normalized


class LruLeaves:
    """SGLang+ (the paper's §5.1 baseline): SGLang's radix cache with Marconi's admission and
    SGLang's own eviction -- least recently used *leaf* first, a hit or an insertion
    refreshing every node on its path (SGLang updates ``last_access_time`` along the whole
    match).  A node that stops being a branch point keeps its state until it is a leaf."""

    name = "sglang+"
    touch_path = True
    max_kids = 0

    def choose(self, slots: Slots, idx: np.ndarray, now: float, tiebreak: Any = None) -> int:
        return _first(slots.last[idx], idx, tiebreak)


class FlopAware:
    """Marconi (§4.2): every node with at most one child is a candidate; the one with the
    lowest utility ``S(n) = recency(n) + alpha * flop_efficiency(n)`` goes, both terms
    min-max normalized over the candidates (Eq. 2).  ``alpha = 0`` is LRU over those nodes.

    Interpretations (the paper fixes neither):

    * recency(n) = 1 / (now - last access of n) on the replay's logical clock (one tick per
      lookup, insertion and eviction round), so the recency term rewards the most recently
      used nodes sharply and the efficiency term orders the long-idle ones;
    * only the node a hit ends at is refreshed, not its ancestors (§4.3: their states are not
      reused by that hit).
    """

    name = "marconi"
    touch_path = False
    max_kids = 1

    def __init__(self, alpha: float = 0.0):
        self.alpha = float(alpha)

    def choose(self, slots: Slots, idx: np.ndarray, now: float, tiebreak: Any = None) -> int:
        if len(idx) == 1:
            return int(idx[0])
        recency = normalized(1.0 / (now - slots.last[idx]))
        score = recency
        if self.alpha:
            score = recency + self.alpha * normalized(slots.eff[idx])
        return _first(score, idx, tiebreak)


def _first(score: np.ndarray, idx: np.ndarray, tiebreak: Any) -> int:
    """The slot of the lowest score: the first in slot order, or ``tiebreak``'s choice among
    those tied at it."""
    j = int(np.argmin(score))
    if tiebreak is not None:
        tied = idx[score == score[j]]
        if len(tied) > 1:
            return int(tiebreak(tied))
    return int(idx[j])

