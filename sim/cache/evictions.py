"""Which request's allocation evicted a cached key, and when.

Miss attribution (issue #17) names, for a *capacity* miss, the request whose
allocation pushed the prefix out of the pool; ``sim explain`` says the same in words.
The block pool evicts in one place (``get_new_blocks`` reusing a cached free block),
which knows neither the time nor the request: the log is one of the pool's observers
(``sim/cache/observers.py``), told the time when a step starts (``new_step``: the
scheduler's ``KVCacheManager.new_step_starts(now)``), the request when its allocation
starts (``allocating``: ``KVCacheManager.allocate_slots``), and each key the pool drops
from a block it reuses (``evicted``).  A partial key dropped because its block filled
(promotion) or a state an admission policy takes back is not an eviction.

Off by default: the pool has no observer and each call site costs one truth test
(``KVCacheManager.enable_eviction_log`` attaches the log).  Only the *last* eviction of a key
is kept: a key cached again and evicted again overwrites its entry, and a key cached
again is still "ever evicted" (callers ask the pool whether it is cached now).
"""
from __future__ import annotations

from typing import Final

from librt.vecs import append, vec
from mypy_extensions import i64

from sim.cache.key_map import KeyMap
from sim.cache.observers import PoolObserver

GROUP_MASK: Final = 31   # a pool key's group id: its low bits (block_pool.GROUP_BITS = 5)


class EvictionLog(PoolObserver):
    """Pool key -> (time in ns, request id) of its last eviction: a pool observer.

    ``watch`` is a bit mask of the group ids recorded (bit ``g``: group ``g``; -1: all).
    ``KVCacheManager.enable_eviction_log`` sets it to the first group of each run of
    identical groups: a model's six Mamba groups evict their blocks for the same
    positions together, and recording one is what attribution and ``sim explain`` read.
    Keys live in a ``KeyMap`` (machine integers, no boxed key per eviction) whose value
    is an index into the stamps, one (time, request) per allocation that evicted, held
    as a column of machine integers and one of the requests' own id strings (a million
    requests evict that many times: no tuple per stamp)."""

    __slots__ = ("table", "times", "requests", "now_ns", "request_id")

    def __init__(self) -> None:
        super().__init__()
        self.table = KeyMap(1024)
        self.times = vec[i64]()
        self.requests: list[str] = []
        self.now_ns = 0          # the time the next evictions happen at (``new_step``)
        self.request_id = ""     # the request allocating now (``allocating``)
        self.watch = -1          # group ids recorded, as a bit mask (-1: every group)

    # -- the pool's hooks ----------------------------------------------------------
    def new_step(self, now: int) -> None:
        """A step starts at ``now`` (-1: no clock, the time stays)."""
        if now >= 0:
            self.now_ns = now

    def allocating(self, request_id: str) -> None:
        self.request_id = request_id

    def record(self, key: int, time_ns: int, request_id: str) -> None:
        """``key`` (a pool key: ``make_key(block_hash, group_id)``) was evicted at
        ``time_ns`` by the allocation of ``request_id``."""
        self.times = append(self.times, time_ns)
        self.requests.append(request_id)
        self.table.put(key, len(self.requests) - 1)

    def evicted(self, key: i64) -> None:
        """``record(key)`` at the current time, for the current request (the pool's hook);
        a key of a group outside ``watch`` is not recorded."""
        if not (self.watch >> (key & GROUP_MASK)) & 1:
            return
        reqs = self.requests
        n = len(reqs)
        if n == 0 or reqs[n - 1] is not self.request_id or self.times[n - 1] != self.now_ns:
            self.times = append(self.times, self.now_ns)
            reqs.append(self.request_id)
            n += 1
        self.table.put(key, n - 1)

    def has(self, key: i64) -> bool:
        """Whether ``key`` was ever evicted (recorded)."""
        return self.table.has(key)

    def get(self, key: int) -> tuple[int, str] | None:
        """The last eviction of ``key``: (time in ns, evicting request), or None."""
        i = self.table.first(key)
        return None if i < 0 else (self.times[i], self.requests[i])

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int) and self.table.has(key)

    def __len__(self) -> int:
        return len(self.table)
