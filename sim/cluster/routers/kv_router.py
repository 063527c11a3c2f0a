"""``kv_router``: NVIDIA Dynamo's KV-aware router, as its code scores workers.

Upstream: ai-dynamo/dynamo ``lib/llm/src/kv_router/scheduler.rs`` (the cost model since
July 2025, PRs #1731 and #1895), ``indexer.rs`` (the radix index of KV events),
``approx.rs`` (``--no-kv-events``), defaults from ``config.rs``.  For each worker:
``cost = overlap_score_weight x prefill tokens / block size + decode blocks``, where the
prefill tokens are the worker's own not yet past their first token plus this prompt less
its overlap there, and the decode blocks the distinct full prompt blocks of the worker's
active requests with this one's (``ActiveSequences``, ``sim/engine/active_sequences.py``);
the least cost wins, ties to the smallest index tree then at random; ``router_temperature``
> 0 draws with probability proportional to ``exp(-(cost - min) / ((max - min) x T))``.

The overlap is what Dynamo's indexer counts: the leading whole attention blocks of the
prompt a worker holds.  ``view: events``: from the KV events each replica publishes
(``sim/cluster/views.py``; Dynamo keeps only full-attention events, its issue #12169).
``view: approximate``: Dynamo's ``--no-kv-events`` mode: the blocks it routed to a worker
are assumed cached for ``router_ttl_secs``, at most ``router_max_tree_size`` blocks a
worker, pruned to ``router_prune_target_ratio`` of it.  Either way the router knows only
attention blocks: for a hybrid model it over-promises whenever the replica has no Mamba
state where those blocks end.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from librt.vecs import vec
from mypy_extensions import i64

from sim.cluster.routers.base import RouteRequest
from sim.cluster.routers.selection import pick_by_cost
from sim.cluster.views import block_size_of
from sim.engine.active_sequences import ActiveSequences
from sim.errors import ConfigError

VIEWS = ("events", "approximate")


@dataclass(frozen=True)
class KvRouterOptions:
    view: str = "events"
    event_lag_ms: float = 0.0
    overlap_score_weight: float = 1.0
    router_temperature: float = 0.0
    router_ttl_secs: float = 120.0
    router_max_tree_size: int = 2 ** 20
    router_prune_target_ratio: float = 0.8

    def validate(self, prefix: str) -> None:
        if self.view not in VIEWS:
            raise ConfigError(prefix + "view", f"must be one of {', '.join(VIEWS)} for "
                              f"kv_router, got {self.view!r}")
        for name in ("event_lag_ms", "overlap_score_weight", "router_temperature",
                     "router_ttl_secs"):
            if getattr(self, name) < 0:
                raise ConfigError(prefix + name, f"must be >= 0, got {getattr(self, name)}")
        if self.router_max_tree_size < 1:
            raise ConfigError(prefix + "router_max_tree_size", "must be >= 1")
        if not 0 < self.router_prune_target_ratio <= 1:
            raise ConfigError(prefix + "router_prune_target_ratio", "must be in (0, 1]")


def prompt_blocks(kv, keys, tokens: int, bs: int = 0):
    """The prompt's whole attention blocks' keys (what Dynamo hashes and indexes), in a
    ``vec[i64]``; ``bs``: ``kv``'s attention block size, when known."""
    if not bs:
        bs = block_size_of(kv)
    scale = bs // kv.coordinator.hash_block_size
    return keys.block_keys(0, min(tokens // bs, keys.count // scale), scale)


class _KvRouter:
    needs_prompt = True
    uses_view = True
    counts_load = True      # (the fleet's door feeds ``book``: each placed request, each finish)

    def __init__(self, opts: KvRouterOptions, seed: int, fleet):
        from sim.cluster.approximate import BlockHistory

        self.o = opts
        self.fleet = fleet
        self.n = len(fleet.replicas)
        self.rng = random.Random(seed)
        self.book = ActiveSequences(self.n)
        self.kv0 = fleet.replicas[0].dep.kv
        self.bs = block_size_of(self.kv0)
        self.view = fleet.view("events", opts.event_lag_ms) if opts.view == "events" else None
        self.index = self.view.index if self.view is not None else None   # (compiled answers)
        self.history = (BlockHistory(self.n, opts.router_max_tree_size,
                                     int(opts.router_ttl_secs * 1e9),
                                     opts.router_prune_target_ratio)
                        if opts.view == "approximate" else None)

    def overlaps(self, req: RouteRequest, blocks) -> vec[i64]:
        """The whole blocks of the prompt each worker holds, as the router knows them."""
        if self.index is not None:
            return self.index.overlaps(req.arrival_ns, blocks)
        if self.view is not None:
            return self.view.overlaps(req.arrival_ns, req.prompt, blocks)
        return vec[i64]([self.history.overlap(i, blocks, req.arrival_ns)
                         for i in range(self.n)])

    def size(self, i: int) -> int:
        """Worker ``i``'s index tree (Dynamo's tie-break)."""
        if self.view is not None:
            return self.view.size(i)
        return self.history.size(i)

    def choose(self, req: RouteRequest) -> int:
        keys = req.prompt.keys_for(self.kv0)
        blocks = prompt_blocks(self.kv0, keys, req.prompt_tokens, self.bs)
        self.book.refresh()
        over = self.overlaps(req, blocks)
        costs = self.book.costs(req.prompt_tokens, over, blocks, self.bs,
                                float(self.o.overlap_score_weight))
        i = pick_by_cost(costs, self.size, self.o.router_temperature, self.rng)
        req.predicted = over[i] * self.bs
        req.blocks = blocks
        req.prefill = req.prompt_tokens - req.predicted
        if self.history is not None:
            self.history.add(i, blocks, req.arrival_ns)
        return i


class KvRouter:
    name = "kv_router"
    options = KvRouterOptions

    def build(self, options, seed, fleet):
        return _KvRouter(options, seed, fleet)
