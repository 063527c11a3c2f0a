"""``hybrid_aware`` (ours): Dynamo's cost, knowing the prefix a replica would *resume*.

Every router above scores a replica by attention-block overlap, which for a hybrid model
over-promises: a replica resumes a prefix only where it kept a Mamba state, after the EAGLE
drop and the reconciliation of every KV-cache group.  This router asks, per replica, for
that reconciled hit -- the lookup the replica's own cache manager runs, every group and its
align / retention / EAGLE / junction rules included -- and combines it with load as
``kv_router`` does (``sim/engine/active_sequences.py``: ``overlap_score_weight x prefill
tokens / block size + decode blocks``, least cost, ``router_temperature``):

* the overlap it scores is the resumable hit plus ``attention_credit`` x the attention
  blocks held beyond it (default 1: all of them).  A replica holding a prefix's attention
  blocks without a state there is where the prefix's requests ran: sending the next one
  there puts the states it leaves (its prompt's end, the next turn's resume point) where
  the prefix lives.  Scoring the resumable hit alone (credit 0) scatters a prefix's
  requests while no replica has a state for it yet, and reuses less (measured on the athena
  and Mooncake fleets: README);
* ties go to the replica that would resume the most now, then Dynamo's rule (the smaller
  index, then at random): where attention-only routers see equals, this one does not;
* its belief (``routed_hit_tokens``) is the resumable hit: it never over-promises.

``view: events`` (default) answers from the KV events each replica publishes alone
(``sim/cluster/views.py``: the Mamba groups' events say where states live), delivered
``event_lag_ms`` after each step; ``view: oracle`` asks each replica's manager directly:
the upper bound of any view.  With the events on time (lag 0) and ``kv_events.fix_emit``
the two agree; what vLLM 0.33.0's own events cannot tell a router is in the README.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from librt.vecs import vec
from mypy_extensions import i64

from sim.cluster.routers.base import RouteRequest
from sim.cluster.routers.selection import pick_by_cost
from sim.engine.active_sequences import ActiveSequences, least
from sim.errors import ConfigError

VIEWS = ("events", "oracle")


@dataclass(frozen=True)
class HybridAwareOptions:
    view: str = "events"
    event_lag_ms: float = 0.0
    overlap_score_weight: float = 1.0
    router_temperature: float = 0.0
    attention_credit: float = 1.0

    def validate(self, prefix: str) -> None:
        if not 0 <= self.attention_credit <= 1:
            raise ConfigError(prefix + "attention_credit", f"must be in [0, 1], got "
                              f"{self.attention_credit}")
        if self.view not in VIEWS:
            raise ConfigError(prefix + "view", f"must be one of {', '.join(VIEWS)} for "
                              f"hybrid_aware, got {self.view!r}")
        for name in ("event_lag_ms", "overlap_score_weight", "router_temperature"):
            if getattr(self, name) < 0:
                raise ConfigError(prefix + name, f"must be >= 0, got {getattr(self, name)}")


class _HybridAware:
    needs_prompt = True
    uses_view = True
    counts_load = True      # (the fleet's door feeds ``book``: each placed request, each finish)

    def __init__(self, opts: HybridAwareOptions, seed: int, fleet):
        from sim.cluster.views import block_size_of

        self.o = opts
        self.n = len(fleet.replicas)
        self.rng = random.Random(seed)
        self.book = ActiveSequences(self.n)
        self.kv0 = fleet.replicas[0].dep.kv
        self.bs = block_size_of(self.kv0)
        self.scale = self.bs // self.kv0.coordinator.hash_block_size
        self.view = fleet.view(opts.view, opts.event_lag_ms)
        self.index = self.view.index     # (its compiled answers, when it has them)
        self.weight = float(opts.overlap_score_weight)
        # every cost is its bound and the least one wins (no draw)
        self.bound_exact = opts.attention_credit >= 1 and opts.router_temperature <= 0

    def choose(self, req: RouteRequest) -> int:
        prompt = req.prompt
        tokens = req.prompt_tokens
        keys = prompt.keys_for(self.kv0)
        bs = self.bs
        # (kv_router.prompt_blocks, inline: the whole attention blocks' keys)
        blocks = keys.block_keys(0, min(tokens // bs, keys.count // self.scale), self.scale)
        book = self.book
        book.refresh()
        view = self.view
        index = self.index
        if index is not None:                       # (whole attention blocks held)
            att = index.overlaps(req.arrival_ns, blocks)
        else:
            att = view.overlaps(req.arrival_ns, prompt, blocks)
        # the overlap scored is credit x att + (1 - credit) x h, h the resumable hit
        # (0 <= h <= att): the cost with the attention overlap is a lower bound, exact at
        # credit 1 (Dynamo's arithmetic, as kv_router's)
        bound = book.costs(tokens, att, blocks, bs, self.weight)
        req.blocks = blocks
        tied = None
        if self.bound_exact:                        # (credit 1, temperature 0)
            tied = least(bound)
            if len(tied) == 1:                      # (no tie to break: one lookup)
                i = tied[0]
                # (``_believe`` at credit 1, inline)
                req.predicted = (index.hybrid_hit(i, keys, prompt.tokens) if index is not None
                                 else view.hybrid_hit(i, prompt, keys))
                req.prefill = tokens - att[i] * bs
                return i
        return self._choose(req, blocks, att, bound, tied)

    def _believe(self, req: RouteRequest, i: int, att: vec[i64], h: int) -> int:
        """Replica ``i`` chosen: the router believes its resumable hit ``h``
        (``routed_hit_tokens``) and scored ``over`` tokens of overlap there: the prompt's
        other tokens are the prefill Dynamo's book counts (``req.prefill``)."""
        credit = self.o.attention_credit
        req.predicted = h
        over = credit * (att[i] * self.bs) + (1 - credit) * h
        req.prefill = req.prompt_tokens - int(over)
        return i

    def _choose(self, req: RouteRequest, blocks, att: vec[i64], bound: vec[float],
                tied: list[int] | None) -> int:
        """The rest: ties (``tied``: the least-cost workers, when every cost is its
        bound), a credit below 1 (exact costs where a bound can still win), a
        temperature."""
        n = self.n
        bs = self.bs
        w = self.weight
        credit = self.o.attention_credit
        book = self.book
        view = self.view
        hits: list[int | None] = [None] * n

        def hit(i: int) -> int:
            got = hits[i]
            if got is None:
                got = hits[i] = view.hybrid_hit(i, req.prompt)
            return got

        def cost(i: int) -> float:
            if credit >= 1:
                return bound[i]
            over = credit * (att[i] * bs) + (1 - credit) * hit(i)
            return book.cost(i, req.prompt_tokens, over, blocks, bs, w)

        if self.o.router_temperature > 0:
            costs = vec[float]([cost(i) for i in range(n)])
            i = pick_by_cost(costs, lambda k: (-hit(k), view.size(k)),
                             self.o.router_temperature, self.rng)
        else:
            # least cost; ties to the larger hit, then Dynamo's smaller index, then at random
            if tied is None:
                # (a credit below 1) the best bound first (h = att), exact costs (a lookup
                # each) only while a bound can still beat the best found
                order = sorted(range(n), key=lambda k: bound[k])
                best = float("inf")
                tied = []
                for k in order:
                    if bound[k] > best:
                        break
                    c = cost(k)
                    if c < best:
                        best, tied = c, [k]
                    elif c == best:
                        tied.append(k)
            if len(tied) > 1:
                top = max(hit(k) for k in tied)
                tied = [k for k in tied if hit(k) == top]
            if len(tied) > 1:
                small = min(view.size(k) for k in tied)
                tied = [k for k in tied if view.size(k) == small]
            i = tied[0] if len(tied) == 1 else tied[self.rng.randrange(len(tied))]
        return self._believe(req, i, att, hit(i))


class HybridAware:
    name = "hybrid_aware"
    options = HybridAwareOptions

    def build(self, options, seed, fleet):
        return _HybridAware(options, seed, fleet)
