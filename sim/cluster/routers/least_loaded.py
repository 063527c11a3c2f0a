"""``least_outstanding`` and ``least_tokens``: the replica with the least work routed to it
and not finished, the lowest replica id on ties.

``least_outstanding`` counts requests (waiting or running: what a front end has in flight
to each backend, SGLang's per-worker load, the fallback of its ``power_of_two``);
``least_tokens`` counts their prompt + output tokens (a request's whole size, routed and
not finished), the load a token-aware balancer tracks.
"""
from __future__ import annotations

from operator import attrgetter

from sim.cluster.routers.base import NoOptions, RouteRequest, Stateless, least


class _Least(Stateless):
    """The replica whose view reads least in ``field``, the lowest index on ties."""

    def __init__(self, views, field: str):
        self.views = views
        self.read = attrgetter(field)

    def choose(self, req: RouteRequest) -> int:
        return least(self.views, self.read)


class LeastOutstanding:
    name = "least_outstanding"
    options = NoOptions

    def build(self, options, seed, fleet):
        return _Least(fleet.loads, "outstanding")


class LeastTokens:
    name = "least_tokens"
    options = NoOptions

    def build(self, options, seed, fleet):
        return _Least(fleet.loads, "outstanding_tokens")
