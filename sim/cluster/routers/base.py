"""What a router is given and what it answers.

A router sees each arriving request (``RouteRequest``: what a front end knows of it) and
the replicas through read-only views (``sim.cluster.view.ReplicaView``: load counters;
cache views come with the routers that read them), and names a replica.  It never reaches
into a replica's scheduler or cache.  ``finished`` tells it a request it routed has
finished (a front end sees the response end), for routers that keep counters of their own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from sim.engine.door import RouteRequest   # (compiled with the engine: made every arrival)


@dataclass(frozen=True)
class NoOptions:
    """A policy that adds no keys of its own under ``cluster.router:``."""


class Router(Protocol):
    """Picks a replica (its index) for each arrival, in arrival order; a router that
    predicts a hit sets ``req.predicted`` (requests.csv ``routed_hit_tokens``).
    ``placed`` (optional) hears where the request went and whether the replica took it,
    with the replica's request; ``finished`` (optional) that it finished.  A router that
    counts Dynamo's load (``counts_load = True``, its ``book`` an ``ActiveSequences``)
    sets ``req.blocks`` and ``req.prefill`` as it chooses, and the fleet's door
    (``sim/engine/door.py``) adds each request the replica took to the book and finishes
    it there."""

    def choose(self, req: RouteRequest) -> int: ...

    def finished(self, replica: int, req: RouteRequest) -> None: ...


class RouterPolicy(Protocol):
    """One router policy: a name, its own ``cluster.router`` keys, how it builds a router."""

    name: str
    options: type[Any]

    def build(self, options: Any, seed: int, fleet: Any) -> Router: ...


class Stateless:
    """A router that keeps no counters of its own (``finished`` is a no-op)."""

    def finished(self, replica: int, req: RouteRequest) -> None:
        pass


def least(views: Sequence[Any], load) -> int:
    """The replica of least ``load(view)``, the lowest index on ties (``load``: an
    ``operator.attrgetter`` where it can be, so that no lambda is called per replica)."""
    loads = list(map(load, views))
    return loads.index(min(loads))
