"""The ``cluster:`` section of a scenario: how many replicas, and the router in front.

::

    cluster:
      replicas: 8                 # N identical replicas of the scenario's deployment
      # or groups, for a mixed fleet: [{count: 4}, {count: 2, set: {gpu.type: H100}}]
      router:
        policy: round_robin       # a name of sim/cluster/routers (ROUTERS)
        seed: 0                   # every random draw of the router
        # ... and the policy's own keys (its ``options`` dataclass)
      hindsight: false            # ask every replica's manager at each arrival what it would
                                  # reuse: regret, routed-away misses (costs a lookup a
                                  # replica a request)

A group's ``set`` overrides dotted fields of the scenario for its replicas only (the
deployment: model, kv_cache, gpu, cache, scheduler, speculative, backend); the workload,
seed, SLOs and the cluster itself belong to the fleet and cannot differ per replica.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from sim.errors import ConfigError
from sim.config.fields import build_section, check_int, show

# a replica group's ``set`` may change the deployment only
REPLICA_SECTIONS = ("model", "kv_cache", "gpu", "cache", "scheduler", "speculative",
                    "backend")
MAX_REPLICAS = 4096


@dataclass(frozen=True)
class RouterSection:
    """``cluster.router``: the policy's name, the seed of its draws, its own options."""

    policy: str = "round_robin"
    seed: int = 0
    options: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class ClusterSection:
    """``cluster``: replica groups ``(count, set)`` in replica order, and the router."""

    groups: tuple[tuple[int, tuple[tuple[str, Any], ...]], ...] = ((1, ()),)
    router: RouterSection = field(default_factory=RouterSection)
    hindsight: bool = False

    @property
    def replicas(self) -> int:
        return sum(n for n, _ in self.groups)

    def replica_sets(self) -> list[dict]:
        """Each replica's overrides, in replica order (``{}``: the scenario's own)."""
        out: list[dict] = []
        for n, sets in self.groups:
            out.extend(dict(sets) for _ in range(n))
        return out


def parse_cluster(value: Any) -> ClusterSection | None:
    """The ``cluster`` section (None when the scenario has none)."""
    from sim.cluster.routers import ROUTERS

    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError("cluster", f"expected a mapping (replicas, router), got {show(value)}")
    unknown = set(value) - {"replicas", "router", "hindsight"}
    if unknown:
        raise ConfigError(f"cluster.{sorted(map(str, unknown))[0]}",
                          "unknown key (known: hindsight, replicas, router)")
    hindsight = value.get("hindsight", False)
    if not isinstance(hindsight, bool):
        raise ConfigError("cluster.hindsight", f"must be true or false, got {show(hindsight)}")
    groups = _groups(value.get("replicas", 1))
    r = value.get("router") or {}
    if not isinstance(r, dict):
        raise ConfigError("cluster.router", f"expected a mapping (policy, seed, ...), got "
                          f"{show(r)}")
    r = dict(r)
    name = r.pop("policy", "round_robin")
    if not isinstance(name, str) or name not in ROUTERS:
        raise ConfigError("cluster.router.policy", f"unknown router {show(name)} (known: "
                          f"{', '.join(sorted(ROUTERS))})")
    seed = r.pop("seed", 0)
    check_int("cluster.router.", "seed", seed, 0)
    opt_cls = ROUTERS[name].options
    own = {f.name for f in fields(opt_cls) if f.init}
    for k in r:
        if k not in own:
            raise ConfigError(f"cluster.router.{k}", f"unknown key for policy {name} (known: "
                              f"{', '.join(['policy', 'seed', *sorted(own)])})")
    options = build_section(opt_cls, r, "cluster.router.")
    validate = getattr(options, "validate", None)
    if validate is not None:
        validate("cluster.router.")
    return ClusterSection(groups, RouterSection(name, seed, options), hindsight)


def _groups(value: Any) -> tuple[tuple[int, tuple[tuple[str, Any], ...]], ...]:
    where = "cluster.replicas"
    if isinstance(value, bool):
        raise ConfigError(where, f"must be a count >= 1 or a list of groups, got {show(value)}")
    if isinstance(value, int):
        check_int("cluster.", "replicas", value, 1)
        if value > MAX_REPLICAS:
            raise ConfigError(where, f"{value:,} replicas: at most {MAX_REPLICAS:,}")
        return ((value, ()),)
    if not isinstance(value, list) or not value:
        raise ConfigError(where, f"must be a count >= 1 or a non-empty list of groups "
                          f"({{count: N, set: {{field: value}}}}), got {show(value)}")
    out = []
    total = 0
    for i, g in enumerate(value):
        here = f"{where}[{i}]"
        if not isinstance(g, dict) or set(g) - {"count", "set"} or "count" not in g:
            raise ConfigError(here, f"expected {{count: N, set: {{field: value}}}}, got {show(g)}")
        n = g["count"]
        check_int(f"{here}.", "count", n, 1)
        sets = g.get("set") or {}
        if not isinstance(sets, dict):
            raise ConfigError(f"{here}.set", f"expected a mapping of dotted fields to values, "
                              f"got {show(sets)}")
        for k in sets:
            if not isinstance(k, str) or not k or k.split(".")[0] not in REPLICA_SECTIONS:
                raise ConfigError(f"{here}.set", f"{show(k)}: a replica group may set fields "
                                  f"of {', '.join(REPLICA_SECTIONS)} only (the workload, seed "
                                  f"and SLOs are the fleet's)")
        total += n
        if total > MAX_REPLICAS:
            raise ConfigError(where, f"more than {MAX_REPLICAS:,} replicas in all")
        out.append((n, tuple(sets.items())))
    return tuple(out)
