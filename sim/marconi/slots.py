"""Per-node numbers kept in arrays, so that an eviction scores every candidate at once.

A tree node owns a *slot*; the arrays hold, by slot, whether it is alive, its number of
children, its last access (a logical clock), its FLOP efficiency and whether the request
being served uses it (protected).  Freed slots are reused (last freed, first reused), which
keeps the arrays as small as the tree and the choices deterministic.
"""
from __future__ import annotations

import numpy as np


class Slots:
    def __init__(self, capacity: int = 256):
        self.alive = np.zeros(capacity, dtype=bool)
        self.kids = np.zeros(capacity, dtype=np.int32)
        self.last = np.zeros(capacity, dtype=np.float64)
        self.eff = np.zeros(capacity, dtype=np.float64)
        self.prot = np.zeros(capacity, dtype=bool)
        self.free: list[int] = []
        self.top = 0            # slots below this were handed out at least once

    def take(self) -> int:
        if self.free:
            s = self.free.pop()
        else:
            s = self.top
            self.top += 1
            if s >= len(self.alive):
                self._grow()
        self.alive[s] = True
        self.kids[s] = 0
        self.prot[s] = False
        return s

    def give_back(self, s: int) -> None:
        self.alive[s] = False
        self.prot[s] = False
        self.free.append(s)

    def _grow(self) -> None:
        n = 2 * len(self.alive)
        for name in ("alive", "kids", "last", "eff", "prot"):
            old = getattr(self, name)
            new = np.zeros(n, dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def candidates(self, max_kids: int) -> np.ndarray:
        """Slots alive, not protected, with at most ``max_kids`` children, in slot order."""
        top = self.top
        mask = self.alive[:top] & ~self.prot[:top] & (self.kids[:top] <= max_kids)
        return np.flatnonzero(mask)


def normalized(x: np.ndarray) -> np.ndarray:
    """Min-max normalization to [0, 1] over the candidates (Marconi's Eq. 2 normalizes both
    terms so that alpha weighs like against like); all equal -> all 1."""
    lo = x.min()
    hi = x.max()
    if hi > lo:
        return (x - lo) / (hi - lo)
    return np.ones_like(x)
