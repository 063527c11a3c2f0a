"""``power_of_two``: two distinct replicas drawn at random, the less loaded one wins.

Upstream: SGLang router ``sgl-router/src/policies/power_of_two.rs`` (2025): the first
index uniform over the N workers, the second ``(first + 1 + U[0, N-2]) mod N`` (so always
another), worker 1 kept when its load <= worker 2's (the tie goes to the first draw).
SGLang compares token loads polled from each worker every few seconds and falls back to
in-flight request counts when one is missing; ``load: requests`` (the default) is that
fallback, in-flight requests now, and ``load: tokens`` the prompt + output tokens routed
and not finished, now.  With one replica there is nothing to draw.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from sim.cluster.routers.base import RouteRequest, Stateless
from sim.errors import ConfigError

LOADS = ("requests", "tokens")


@dataclass(frozen=True)
class PowerOfTwoOptions:
    load: str = "requests"

    def validate(self, prefix: str) -> None:
        if self.load not in LOADS:
            raise ConfigError(prefix + "load", f"must be one of {', '.join(LOADS)}, got "
                              f"{self.load!r}")


class _PowerOfTwo(Stateless):
    def __init__(self, views, seed: int, load: str):
        self.views = views
        self.n = len(views)
        self.rng = random.Random(seed)
        self.tokens = load == "tokens"

    def _load(self, i: int) -> int:
        v = self.views[i]
        return v.outstanding_tokens if self.tokens else v.outstanding

    def choose(self, req: RouteRequest) -> int:
        n = self.n
        if n == 1:
            return 0
        a = self.rng.randrange(n)
        b = (a + 1 + self.rng.randrange(n - 1)) % n
        return a if self._load(a) <= self._load(b) else b


class PowerOfTwo:
    name = "power_of_two"
    options = PowerOfTwoOptions

    def build(self, options, seed, fleet):
        return _PowerOfTwo(fleet.loads, seed, options.load)
