"""``session_affinity``: a session sticks to one replica; a request without one, by its
first prompt block.

The key is the request's ``session`` (multi-turn workloads; Mooncake with
``workload.sessions: chain``), or, without one, the identity of its first
``affinity_tokens`` prompt tokens; it is hashed (BLAKE2b, the same on every machine and
run) onto the replicas, as a consistent-hash or sticky-session front end does.  When that
replica has more than ``max_outstanding`` requests routed and not finished, the request
goes to the least loaded replica instead (fewest outstanding, the lowest id on ties);
``max_outstanding: null`` (the default) never overrides the hash.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from operator import attrgetter

from sim.cluster.routers.base import RouteRequest, Stateless, least
from sim.errors import ConfigError

OUTSTANDING = attrgetter("outstanding")   # (a view's load: no lambda called per replica)


@dataclass(frozen=True)
class SessionAffinityOptions:
    max_outstanding: int | None = None
    affinity_tokens: int = 512

    def validate(self, prefix: str) -> None:
        if self.max_outstanding is not None and self.max_outstanding < 0:
            raise ConfigError(prefix + "max_outstanding", f"must be >= 0 or null, got "
                              f"{self.max_outstanding}")
        if self.affinity_tokens < 1:
            raise ConfigError(prefix + "affinity_tokens", f"must be >= 1, got "
                              f"{self.affinity_tokens}")


def prefix_key(prompt, tokens: int) -> str:
    """The identity of a prompt's first ``tokens`` tokens: its segments ``(stream, offset,
    length)`` cut there, as text."""
    parts = []
    left = tokens
    for seg in prompt:
        name, off, n = seg
        take = n if n < left else left
        parts.append(f"{name}:{off}:{take}")
        left -= take
        if left <= 0:
            break
    return "|".join(parts)


class _SessionAffinity(Stateless):
    def __init__(self, views, max_outstanding: int | None, tokens: int):
        self.views = views
        self.n = len(views)
        self.max_outstanding = max_outstanding
        self.tokens = tokens
        # without a load cap it reads no replica: decided as the trace is read (fleet.py)
        self.oblivious = max_outstanding is None

    def choose(self, req: RouteRequest) -> int:
        key = req.session if req.session else "p|" + prefix_key(req.segments, self.tokens)
        h = int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"),
                                           digest_size=8).digest(), "big")
        i = h % self.n
        cap = self.max_outstanding
        if cap is not None and self.views[i].outstanding > cap:
            return least(self.views, OUTSTANDING)
        return i


class SessionAffinity:
    name = "session_affinity"
    options = SessionAffinityOptions

    def build(self, options, seed, fleet):
        return _SessionAffinity(fleet.loads, options.max_outstanding, options.affinity_tokens)
