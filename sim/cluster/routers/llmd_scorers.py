"""``llmd_scorers``: llm-d's endpoint picker (Gateway API Inference Extension scheduler).

Upstream: kubernetes-sigs/gateway-api-inference-extension (``pkg/epp/scheduling``: the
scorers and the max-score picker; weights of the default profile since v1.2, 2025-11),
llm-d/llm-d-inference-scheduler and llm-d/llm-d-kv-cache (the precise prefix scorer over
vLLM KV events).  Each replica's score is the weighted sum of scorers, each clamped to
[0, 1]; the highest total wins, ties at random:

* prefix (weight ``prefix_weight``, 3): ``view: approximate``: the approximate prefix
  plugin, prompt blocks of ``block_size`` tokens (llm-d's auto-tune: the engine's block
  size) added at dispatch to a per-replica LRU of ``lru_capacity_per_server`` blocks; the
  score is matched leading blocks / prompt blocks, at most ``max_prefix_blocks`` (256).
  ``view: events``: the precise scorer, leading blocks held per the replica's KV events,
  min-max normalised over the replicas that matched any (all equal: 1; none matched: 0);
* queue (``queue_weight``, 2): ``(max - q) / (max - min)`` of the replicas' waiting queues,
  1 when all are equal;
* KV-cache utilisation (``kv_utilization_weight``, 2): ``1 - usage``.

The queue and utilisation are metrics refreshed every ``metrics_lag_ms`` (llm-d's 50 ms
refresh): a decision reads the last scrape and scrapes anew once it is that old, so what
it reads is at most that stale.  The router believes its replica
will reuse the matched blocks (attention KV, no Mamba).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from sim.cluster.routers.base import RouteRequest, Stateless
from sim.cluster.routers.kv_router import prompt_blocks
from sim.errors import ConfigError

VIEWS = ("approximate", "events")


@dataclass(frozen=True)
class LlmdOptions:
    view: str = "approximate"
    event_lag_ms: float = 0.0
    prefix_weight: float = 3.0
    queue_weight: float = 2.0
    kv_utilization_weight: float = 2.0
    max_prefix_blocks: int = 256
    lru_capacity_per_server: int = 31250
    metrics_lag_ms: float = 50.0

    def validate(self, prefix: str) -> None:
        if self.view not in VIEWS:
            raise ConfigError(prefix + "view", f"must be one of {', '.join(VIEWS)} for "
                              f"llmd_scorers, got {self.view!r}")
        for name in ("event_lag_ms", "prefix_weight", "queue_weight", "kv_utilization_weight",
                     "metrics_lag_ms"):
            if getattr(self, name) < 0:
                raise ConfigError(prefix + name, f"must be >= 0, got {getattr(self, name)}")
        for name in ("max_prefix_blocks", "lru_capacity_per_server"):
            if getattr(self, name) < 1:
                raise ConfigError(prefix + name, f"must be >= 1, got {getattr(self, name)}")


def _clamp(x: float) -> float:
    return 0.0 if x < 0 else 1.0 if x > 1 else x


class _Llmd(Stateless):
    needs_prompt = True
    uses_view = True

    def __init__(self, o: LlmdOptions, seed: int, fleet):
        from sim.cluster.approximate import BlockHistory
        from sim.cluster.views import block_size_of

        self.o = o
        self.loads = fleet.loads
        self.n = len(self.loads)
        self.rng = random.Random(seed)
        self.kv0 = fleet.replicas[0].dep.kv
        self.bs = block_size_of(self.kv0)
        self.view = fleet.view("events", o.event_lag_ms) if o.view == "events" else None
        self.lru = (BlockHistory(self.n, o.lru_capacity_per_server)
                    if o.view == "approximate" else None)
        self.lag_ns = int(o.metrics_lag_ms * 1e6)
        self.scraped = -1
        self.metrics: list[tuple[int, float]] = []

    def _scrape(self, now: int) -> list[tuple[int, float]]:
        """The metrics as last scraped: a decision scrapes anew once the last scrape is
        ``metrics_lag_ms`` old (so what a score reads is at most that old)."""
        if self.scraped < 0 or now - self.scraped >= self.lag_ns:
            self.metrics = [(v.waiting, v.kv_usage) for v in self.loads]
            self.scraped = now
        return self.metrics

    def choose(self, req: RouteRequest) -> int:
        o = self.o
        now = req.arrival_ns
        keys = req.prompt.keys_for(self.kv0)
        blocks = list(prompt_blocks(self.kv0, keys, req.prompt_tokens,
                                    self.bs)[:o.max_prefix_blocks])
        nb = len(blocks)
        if self.view is not None:
            matched = [min(m, nb) for m in self.view.overlaps(now, req.prompt)]
            hit = [m for m in matched if m > 0]
            if not hit:
                prefix = [0.0] * self.n
            else:
                hi, lo = max(hit), min(hit)
                prefix = [0.0 if m == 0 else 1.0 if hi == lo else (m - lo) / (hi - lo)
                          for m in matched]
        else:
            matched = [self.lru.overlap(i, blocks, now) for i in range(self.n)]
            prefix = [m / nb if nb else 0.0 for m in matched]
        metrics = self._scrape(now)
        qs = [q for q, _ in metrics]
        qhi, qlo = max(qs), min(qs)
        score = []
        for i in range(self.n):
            q, usage = metrics[i]
            queue = 1.0 if qhi == qlo else (qhi - q) / (qhi - qlo)
            score.append(o.prefix_weight * _clamp(prefix[i]) + o.queue_weight * _clamp(queue)
                         + o.kv_utilization_weight * _clamp(1.0 - usage))
        best = max(score)
        tied = [i for i, s in enumerate(score) if s == best]
        i = tied[0] if len(tied) == 1 else tied[self.rng.randrange(len(tied))]
        req.predicted = matched[i] * self.bs
        if self.lru is not None:
            self.lru.add(i, blocks, now)
        return i


class LlmdScorers:
    name = "llmd_scorers"
    options = LlmdOptions

    def build(self, options, seed, fleet):
        return _Llmd(options, seed, fleet)
