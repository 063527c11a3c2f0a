"""Router policies, selectable by name from a scenario's ``cluster.router.policy``.

A router is one file in this folder: a policy class with ``name``, ``options`` (a frozen
dataclass of the keys it adds under ``cluster.router:``, named as its upstream names them)
and ``build(options, seed, fleet)``, which returns the ``Router`` that picks a replica for
each arrival (``base.Router``); ``fleet`` (``sim/cluster/fleet.py`` ``FleetContext``) gives
the replicas' load views (``loads``) and cache views (``view(name, lag_ms)``).  Register it below as ``"module:Class"`` (imported when a
scenario names it).  Each module's docstring cites the upstream rule it runs.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from sim.cluster.routers.base import NoOptions, RouteRequest, Router, RouterPolicy


class RouterRegistry(Mapping):
    """Policy name -> policy, imported and made on first use."""

    def __init__(self, entries: dict[str, str]):
        self._entries: dict[str, object] = dict(entries)

    def __getitem__(self, name: str) -> RouterPolicy:
        got = self._entries[name]
        if isinstance(got, str):
            module, _, cls = got.partition(":")
            got = self._entries[name] = getattr(importlib.import_module(module), cls)()
        return got  # type: ignore[return-value]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


_HERE = "sim.cluster.routers"
ROUTERS = RouterRegistry({
    "round_robin": f"{_HERE}.round_robin:RoundRobin",
    "random": f"{_HERE}.random_pick:RandomPick",
    "lor": f"{_HERE}.lor:LeastOutstandingRequests",
    "least_outstanding": f"{_HERE}.least_loaded:LeastOutstanding",
    "least_tokens": f"{_HERE}.least_loaded:LeastTokens",
    "power_of_two": f"{_HERE}.power_of_two:PowerOfTwo",
    "session_affinity": f"{_HERE}.session_affinity:SessionAffinity",
    "cache_aware": f"{_HERE}.cache_aware:CacheAware",
    "kv_router": f"{_HERE}.kv_router:KvRouter",
    "llmd_scorers": f"{_HERE}.llmd_scorers:LlmdScorers",
    "hybrid_aware": f"{_HERE}.hybrid_aware:HybridAware",
})

__all__ = ["NoOptions", "ROUTERS", "RouteRequest", "Router", "RouterPolicy", "RouterRegistry"]
