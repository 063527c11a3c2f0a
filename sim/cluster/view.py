"""What a router may read of a replica: load counters, as a front end or a metrics
endpoint would report them.  Read-only; a view never changes its replica."""
from __future__ import annotations

from typing import Any


class ReplicaView:
    """One replica's load, now: its scheduler's queues, the requests routed to it and not
    finished, and the prompt + output tokens they carry (counted by the fleet as it
    routes and as requests finish), and its KV-cache pool in use."""

    __slots__ = ("index", "_sched", "_kv", "outstanding_tokens", "routed", "finished")

    def __init__(self, index: int, sched: Any):
        self.index = index
        self._sched = sched
        self._kv = sched.kv
        self.outstanding_tokens = 0     # prompt + output tokens routed here, not finished
        self.routed = 0                 # requests routed here (refused on arrival included)
        self.finished = 0

    @property
    def waiting(self) -> int:
        """Requests queued and not running: not yet admitted, or preempted (vLLM's
        waiting queue; Vidur's pending requests)."""
        return len(self._sched.waiting)

    @property
    def running(self) -> int:
        return len(self._sched.running)

    @property
    def outstanding(self) -> int:
        """Requests routed here and not finished (waiting or running)."""
        s = self._sched
        return len(s.waiting) + len(s.running)

    @property
    def kv_usage(self) -> float:
        """The share of the pool's usable blocks in use by requests (vLLM's
        ``kv_cache_usage``)."""
        kv = self._kv
        usable = kv.usable_blocks
        return (usable - kv.num_free_blocks()) / usable if usable else 0.0
