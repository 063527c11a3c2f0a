"""The two eviction rules of the radix tree: LRU on leaves ("SGLang+") and Marconi's
FLOP-aware utility.  Each is a small object the tree asks three things: which nodes may be
evicted (``max_kids``), whose access time a hit refreshes (``touch_path``), and which
candidate goes first (``choose``).
"""
from __future__ import annotations

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

    def choose(self, slots: Slots, idx: np.ndarray, now: float) -> int:
        return int(idx[int(np.argmin(slots.last[idx]))])


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

    def choose(self, slots: Slots, idx: np.ndarray, now: float) -> int:
        if len(idx) == 1:
            return int(idx[0])
        recency = normalized(1.0 / (now - slots.last[idx]))
        score = recency
        if self.alpha:
            score = recency + self.alpha * normalized(slots.eff[idx])
        return int(idx[int(np.argmin(score))])
