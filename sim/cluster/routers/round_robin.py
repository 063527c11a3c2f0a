"""``round_robin``: request k goes to replica k mod N.

Upstream: SGLang router ``sgl-router/src/policies/round_robin.rs`` (a counter from 0,
``fetch_add`` then modulo the workers) and Vidur
``vidur/scheduler/global_scheduler/round_robin_global_scheduler.py`` (``counter %
num_replicas``, counter from 0): the same rule.
"""
from __future__ import annotations

from sim.cluster.routers.base import NoOptions, RouteRequest, Stateless


class _RoundRobin(Stateless):
    oblivious = True        # (reads no replica: decided as the trace is read, see fleet.py)
    def __init__(self, n: int):
        self.n = n
        self.counter = 0

    def choose(self, req: RouteRequest) -> int:
        i = self.counter % self.n
        self.counter += 1
        return i


class RoundRobin:
    name = "round_robin"
    options = NoOptions

    def build(self, options, seed, fleet):
        return _RoundRobin(len(fleet.loads))
