"""``random``: a replica drawn uniformly for each request, from a generator seeded with
``cluster.router.seed`` (the same draws for the same seed).

Upstream: SGLang router ``policies/random.rs`` (uniform over the workers) and Vidur
``random_global_scheduler.py`` (``random.randint(1, N) - 1``).  Vidur draws from
Python's global generator, shared with its request generation; ours has its own.
"""
from __future__ import annotations

import random

from sim.cluster.routers.base import NoOptions, RouteRequest, Stateless


class _Random(Stateless):
    oblivious = True        # (reads no replica: decided as the trace is read, see fleet.py)
    def __init__(self, n: int, seed: int):
        self.n = n
        self.rng = random.Random(seed)

    def choose(self, req: RouteRequest) -> int:
        return self.rng.randrange(self.n)


class RandomPick:
    name = "random"
    options = NoOptions

    def build(self, options, seed, fleet):
        return _Random(len(fleet.loads), seed)
