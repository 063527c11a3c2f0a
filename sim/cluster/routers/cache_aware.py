"""``cache_aware``: SGLang's cache-aware router (sgl-router, later the model gateway).

Upstream: sgl-project/sglang ``sgl-router/src/policies/cache_aware.rs`` and ``tree.rs``
(2024-2025), ``sgl-model-gateway`` (after PR #14650, 2025-12-08).  Per request:

* imbalance: with every worker's load (requests dispatched and not finished), the fleet is
  imbalanced when ``max - min > balance_abs_threshold`` and ``max > min x
  balance_rel_threshold`` (both strict); then the least loaded wins (the lowest index);
* otherwise the prompt is matched against the router's approximate tree (what it sent
  where, ``sim/cluster/approximate.py`` ``RunTree``); when matched / prompt >
  ``cache_threshold`` (strict), an owner of the deepest node matched wins, else the worker
  with the smallest tree (2024 router, sgl-router 2025) or the least loaded (gateway);
* the prompt is inserted into the tree for the chosen worker; every
  ``eviction_interval_secs`` each worker's least recently used leaves go until it holds at
  most ``max_tree_size``.

SGLang's tree is over the request's text; our workloads carry token identities, not text,
so the tree here is over tokens (a "character" is a token, an edge a run of consecutive
tokens of one stream): ``max_tree_size`` counts tokens.  ``preset`` fills the defaults of
each version (explicit keys win):

| preset | cache_threshold | abs | rel | eviction (s) | max_tree_size | below threshold |
|---|---|---|---|---|---|---|
| sglang-router-2024 | 0.5 | 32 | 1.0001 | 60 | 2^24 | smallest tree |
| sgl-router-2025 | 0.3 | 64 | 1.5 | 120 | 2^26 | smallest tree |
| sgl-gateway-2025-12 (default) | 0.3 | 64 | 1.5 | 120 | 2^26 | least loaded |

The 2024 router stamps the whole matched or inserted path with the time and names the
first tenant of the deepest node; the gateway stamps the node reached and names its
creator.  The router believes its chosen worker will reuse the tokens of the prompt the
tree says that worker was sent (``routed_hit_tokens``): attention KV by text, no Mamba.
"""
from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from sim.cluster.routers.base import RouteRequest, Stateless, least
from sim.errors import ConfigError

OUTSTANDING = attrgetter("outstanding")   # (a view's load: no lambda called per replica)

PRESETS = {
    "sglang-router-2024": dict(cache_threshold=0.5, balance_abs_threshold=32,
                               balance_rel_threshold=1.0001, eviction_interval_secs=60.0,
                               max_tree_size=2 ** 24, fallback="smallest_tree",
                               stamp_path=True, owner="first"),
    "sgl-router-2025": dict(cache_threshold=0.3, balance_abs_threshold=64,
                            balance_rel_threshold=1.5, eviction_interval_secs=120.0,
                            max_tree_size=2 ** 26, fallback="smallest_tree",
                            stamp_path=True, owner="first"),
    "sgl-gateway-2025-12": dict(cache_threshold=0.3, balance_abs_threshold=64,
                                balance_rel_threshold=1.5, eviction_interval_secs=120.0,
                                max_tree_size=2 ** 26, fallback="least_load",
                                stamp_path=False, owner="creator"),
}


@dataclass(frozen=True)
class CacheAwareOptions:
    preset: str = "sgl-gateway-2025-12"
    view: str = "approximate"
    cache_threshold: float | None = None
    balance_abs_threshold: int | None = None
    balance_rel_threshold: float | None = None
    eviction_interval_secs: float | None = None
    max_tree_size: int | None = None

    def validate(self, prefix: str) -> None:
        if self.preset not in PRESETS:
            raise ConfigError(prefix + "preset", f"must be one of {', '.join(PRESETS)}, got "
                              f"{self.preset!r}")
        if self.view != "approximate":
            raise ConfigError(prefix + "view", "cache_aware keeps its own tree: approximate "
                              f"only, got {self.view!r}")
        for name in ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold",
                     "eviction_interval_secs", "max_tree_size"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ConfigError(prefix + name, f"must be >= 0, got {v}")

    def resolved(self) -> dict:
        out = dict(PRESETS[self.preset])
        for k in ("cache_threshold", "balance_abs_threshold", "balance_rel_threshold",
                  "eviction_interval_secs", "max_tree_size"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out


class _CacheAware(Stateless):
    needs_prompt = False

    def __init__(self, opts: CacheAwareOptions, seed: int, fleet):
        from sim.cluster.approximate import RunTree

        self.p = opts.resolved()
        self.loads = fleet.loads
        self.tree = RunTree(len(self.loads), self.p["stamp_path"], self.p["owner"])
        self.next_evict = int(self.p["eviction_interval_secs"] * 1e9)

    def choose(self, req: RouteRequest) -> int:
        p = self.p
        now = req.arrival_ns
        if self.next_evict and now >= self.next_evict:
            self.tree.evict(p["max_tree_size"])
            step = int(p["eviction_interval_secs"] * 1e9)
            self.next_evict = (now // step + 1) * step
        loads = [v.outstanding for v in self.loads]
        hi, lo = max(loads), min(loads)
        tokens = req.prompt_tokens
        if hi - lo > p["balance_abs_threshold"] and hi > lo * p["balance_rel_threshold"]:
            i = least(self.loads, OUTSTANDING)
        else:
            matched, owner = self.tree.match(req.segments, now)
            rate = matched / tokens if tokens else 0.0
            if rate > p["cache_threshold"] and owner >= 0:
                i = owner
            elif p["fallback"] == "smallest_tree":
                i = min(range(len(loads)), key=lambda k: (self.tree.size[k], k))
            else:
                i = least(self.loads, OUTSTANDING)
        req.predicted = self.tree.held_by(req.segments, i)
        self.tree.insert(req.segments, i, now)
        return i


class CacheAware:
    name = "cache_aware"
    options = CacheAwareOptions

    def build(self, options, seed, fleet):
        return _CacheAware(options, seed, fleet)
