"""The host (CPU) tier of vLLM 0.33.0's native KV offloading: its chunk pool and its
eviction policies (``CPUOffloadingManager`` with ``lru`` or ``arc``), as behaviour.

A chunk holds one KV-cache group's ``blocks_per_chunk`` GPU blocks (a Mamba state takes
a whole chunk).  A chunk's key is ``(prefix key << GROUP_BITS) | group`` (the GPU pool's
key of the chunk's last hash unit in that group), so keys of one prefix position in two
groups differ only in their low bits, and the lower group sorts first, as vLLM's key bytes
(block hash, then the 4-byte big-endian group index) do.

What the manager does, in the order the connector calls it:

* ``lookup`` has no side effect: absent, written (ready) or still being written;
* ``prepare_store`` is the only place chunks are evicted.  Keys already resident and
  ready count as a reuse by the request, absent ones are to be stored; when the pool has
  too few free chunks the policy evicts exactly the missing count among the ready,
  unpinned chunks not offered in this call, or the whole call fails (nothing stored,
  nothing evicted);
* ``prepare_load`` pins its keys (a reuse); ``complete_load`` unpins them;
  ``complete_store`` makes written chunks ready (and evictable);
* ``request_finished`` applies the request's recency: every key it observed, head to
  tail across its groups, in the policy's way.

Recency (``lru``): a request gets a rank the first time the policy sees it; a key it
inserts or first observes ranks ``(request rank, -position)`` (deeper positions of one
request older), raised only; when the request finishes, its observed resident keys get
fresh ranks from the tail to the head (the head most recent).  Eviction takes the least
``(rank, key)`` first.  ``arc``: new keys enter T1; at a request's finish its keys move
to the recent end tail to head, the ones it reused (not inserted) from T1 to T2; eviction
follows the adaptive T1 target, evicted keys become ghosts (B1 / B2, each trimmed to the
capacity), and a store of a ghost key moves the target.
"""
from __future__ import annotations

import heapq
from typing import Final

from sim.cache.block_pool import GROUP_BITS

GROUP_MASK = (1 << GROUP_BITS) - 1

MISS = 0
HIT = 1
HIT_PENDING = 2


class AccessState:
    """What one request did to the tier (vLLM's per-request cache-access record)."""

    __slots__ = ("seen", "inserted", "reused", "store_misses", "finished",
                 "lru_rank", "positions")

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.inserted: set[int] = set()
        self.reused: set[int] = set()
        self.store_misses: set[int] = set()
        self.finished = False
        self.lru_rank = 0                 # 0: the policy has not ranked this request yet
        # prefix key (a chunk key without its group bits) -> end token: the request's order
        self.positions: dict[int, int] = {}


def _head_to_tail(seen: set[int], positions: dict[int, int]) -> list[int]:
    """Every observed key, head to tail: by position, the lower group first at one
    position (vLLM: each group's keys by position, the groups in order, then one stable
    sort by position; a key's group is its low bits, and keys at one position share their
    prefix key)."""
    order = sorted([(positions[k >> GROUP_BITS], k) for k in seen])
    return [k for _, k in order]


class Policy:
    """What the host pool asks of an eviction policy (vLLM's ``CachePolicy``)."""

    def __init__(self, capacity: int):
        self.capacity = capacity

    def insert(self, key: int, st: AccessState) -> None:
        raise NotImplementedError

    def on_store_miss(self, keys: list[int], st: AccessState) -> None:
        return None

    def on_request_access(self, keys: list[int], st: AccessState,
                          resident: dict[int, int]) -> None:
        return None

    def on_request_finished(self, order: list[int], inserted_only: set[int],
                            reused: set[int], resident: dict[int, int]) -> None:
        raise NotImplementedError

    def evict(self, n: int, protected: set[int], resident: dict[int, int]) -> list[int] | None:
        raise NotImplementedError

    def mark_evictable(self, key: int) -> None:
        return None

    def mark_non_evictable(self, key: int) -> None:
        return None


# LRU ranks as one integer, unique per key: vLLM's (request rank, -position) tuples, or
# (fresh rank, 0), ordered alike, then the key's group (vLLM breaks a tie of two keys -- one
# request's, at one position, so one prefix -- by the group index ending the key's bytes):
# (rank << POS_BITS | (2**POS_BITS - 1 - position)) << GROUP_BITS | group.  Positions stay
# below 2**22 tokens, so ranks stay machine integers until 2**34 requests and finishes.
POS_BITS: Final = 22
TOP: Final = (1 << POS_BITS) - 1
SHIFT: Final = POS_BITS + GROUP_BITS


class LRUPolicy(Policy):
    """vLLM's LRU policy: the evictable keys by rank, least first.  Ranks a request's
    finish hands out only grow, so they go to the end of a sorted list (``fifo``, read from
    ``head``); any other goes to a heap.  ``owner`` maps a rank to its key; a rank a key no
    longer has (or no longer evictable) is skipped, as vLLM's lazy heap skips it."""

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.ranks: dict[int, int] = {}       # key -> rank
        self.owner: dict[int, int] = {}       # rank -> key
        self.evictable: set[int] = set()
        self.heap: list[int] = []
        self.fifo: list[int] = []
        self.head = 0
        self.next_rank = 0

    def _rank_of(self, st: AccessState) -> int:
        if st.lru_rank == 0:
            self.next_rank += 1
            st.lru_rank = self.next_rank
        return st.lru_rank

    def _set(self, key: int, rank: int) -> None:
        old = self.ranks.get(key, -1)
        if old >= 0:
            del self.owner[old]
        self.ranks[key] = rank
        self.owner[rank] = key

    def _fresh(self, key: int) -> int:
        self.next_rank += 1
        return (((self.next_rank << POS_BITS) | TOP) << GROUP_BITS) | (key & GROUP_MASK)

    def _push(self, key: int) -> None:
        rank = self.ranks[key]
        fifo = self.fifo
        if len(fifo) == self.head or rank >= fifo[len(fifo) - 1]:
            fifo.append(rank)
        else:
            heapq.heappush(self.heap, rank)
        if len(self.heap) + len(fifo) - self.head >= max(256, 4 * len(self.evictable)):
            self._rebuild()

    def _rebuild(self) -> None:
        """Drop the stale entries: every evictable key's rank, in order, in the list."""
        ranks = self.ranks
        self.fifo = sorted([ranks[k] for k in self.evictable])
        self.head = 0
        self.heap = []

    def _pop(self) -> int:
        """The least rank of the two (-1: none)."""
        heap = self.heap
        fifo = self.fifo
        h = self.head
        if h < len(fifo) and (not heap or fifo[h] < heap[0]):
            self.head = h + 1
            if self.head > 4096 and 2 * self.head > len(fifo):
                self.fifo = fifo[self.head:]
                self.head = 0
            return fifo[h]
        if heap:
            return heapq.heappop(heap)
        return -1

    def insert(self, key: int, st: AccessState) -> None:
        pos = st.positions.get(key >> GROUP_BITS)
        if pos is None:
            self._set(key, self._fresh(key))
        else:
            self._set(key, (((self._rank_of(st) << POS_BITS) | (TOP - pos)) << GROUP_BITS)
                      | (key & GROUP_MASK))

    def on_request_access(self, keys: list[int], st: AccessState,
                          resident: dict[int, int]) -> None:
        r = self._rank_of(st) << POS_BITS
        ranks = self.ranks
        for key in keys:
            pos = st.positions.get(key >> GROUP_BITS)
            if pos is None or key not in resident:
                continue
            rank = ((r | (TOP - pos)) << GROUP_BITS) | (key & GROUP_MASK)
            if ranks[key] >= rank:
                continue
            self._set(key, rank)
            if key in self.evictable:
                self._push(key)

    def on_request_finished(self, order: list[int], inserted_only: set[int],
                            reused: set[int], resident: dict[int, int]) -> None:
        for k in range(len(order) - 1, -1, -1):
            key = order[k]
            if key not in resident:
                continue
            self._set(key, self._fresh(key))
            if key in self.evictable:
                self._push(key)

    def evict(self, n: int, protected: set[int], resident: dict[int, int]) -> list[int] | None:
        if n == 0:
            return []
        owner = self.owner
        evictable = self.evictable
        selected: list[int] = []
        deferred: list[int] = []
        while len(selected) < n:
            rank = self._pop()
            if rank < 0:
                break
            key = owner.get(rank, -1)
            if key < 0 or key not in evictable or rank in selected:
                continue
            if key in protected:
                deferred.append(rank)
                continue
            selected.append(rank)
        heap = self.heap
        if len(selected) < n:
            for e in selected:
                heapq.heappush(heap, e)
            for e in deferred:
                heapq.heappush(heap, e)
            return None
        for e in deferred:
            heapq.heappush(heap, e)
        out: list[int] = []
        ranks = self.ranks
        for rank in selected:
            key = owner.pop(rank)
            evictable.discard(key)
            del ranks[key]
            out.append(key)
        if len(heap) + len(self.fifo) - self.head >= max(256, 4 * len(evictable)):
            self._rebuild()
        return out

    def mark_evictable(self, key: int) -> None:
        self.evictable.add(key)
        self._push(key)

    def mark_non_evictable(self, key: int) -> None:
        self.evictable.discard(key)


class ARCPolicy(Policy):
    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.target = 0.0
        self.t1: dict[int, None] = {}
        self.t2: dict[int, None] = {}
        self.b1: dict[int, None] = {}
        self.b2: dict[int, None] = {}

    def insert(self, key: int, st: AccessState) -> None:
        self.t1[key] = None
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def on_store_miss(self, keys: list[int], st: AccessState) -> None:
        for key in reversed(keys):
            if key in self.b1:
                delta = max(1.0, len(self.b2) / len(self.b1))
                self.target = min(self.target + delta, float(self.capacity))
                del self.b1[key]
                self.b1[key] = None
            elif key in self.b2:
                delta = max(1.0, len(self.b1) / len(self.b2))
                self.target = max(self.target - delta, 0.0)
                del self.b2[key]
                self.b2[key] = None

    def on_request_finished(self, order: list[int], inserted_only: set[int],
                            reused: set[int], resident: dict[int, int]) -> None:
        t1 = self.t1
        t2 = self.t2
        for key in reversed(order):
            if key in inserted_only:
                if key in t1:
                    del t1[key]
                    t1[key] = None
                elif key in t2:
                    del t2[key]
                    t2[key] = None
                continue
            if key in reused:
                if key in t1:
                    del t1[key]
                    t2[key] = None
                elif key in t2:
                    del t2[key]
                    t2[key] = None

    @staticmethod
    def _next(keys: list[int], at: list[int], resident: dict[int, int],
              protected: set[int]) -> int:
        """The next key of ``keys`` from ``at[0]`` (advanced past it) that is ready and
        unpinned and not protected; -1 if none (the scans only move forward)."""
        i = at[0]
        while i < len(keys):
            key = keys[i]
            i += 1
            if resident[key] == 0 and key not in protected:
                at[0] = i
                return key
        at[0] = i
        return -1

    def evict(self, n: int, protected: set[int], resident: dict[int, int]) -> list[int] | None:
        if n == 0:
            return []
        t1 = list(self.t1)
        t2 = list(self.t2)
        at1 = [0]
        at2 = [0]
        virtual_t1 = len(self.t1)
        picks: list[tuple[int, bool]] = []
        for _ in range(n):
            key = -1
            from_t1 = False
            if virtual_t1 >= int(self.target):
                key = self._next(t1, at1, resident, protected)
                if key >= 0:
                    from_t1 = True
                    virtual_t1 -= 1
            if key < 0:
                key = self._next(t2, at2, resident, protected)
            if key < 0:
                key = self._next(t1, at1, resident, protected)
                if key < 0:
                    return None
                from_t1 = True
                virtual_t1 -= 1
            picks.append((key, from_t1))
        out: list[int] = []
        for key, from_t1 in picks:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            out.append(key)
        for ghost in (self.b1, self.b2):
            extra = len(ghost) - self.capacity
            if extra > 0:
                for key in list(ghost)[:extra]:
                    del ghost[key]
        return out



def make_policy(name: str, capacity: int) -> Policy:
    if name == "arc":
        return ARCPolicy(capacity)
    if name == "lru":
        return LRUPolicy(capacity)
    raise ValueError(f"eviction_policy: must be lru or arc, got {name!r}")


class HostPool:
    """The CPU chunk pool (vLLM's ``CPUOffloadingManager``): ``num_chunks`` chunks, a
    reference count per resident key (-1 being written, 0 ready, > 0 pinned by loads)."""

    def __init__(self, num_chunks: int, policy: str = "lru"):
        self.num_chunks = num_chunks
        self.policy = make_policy(policy, num_chunks)
        self.ref: dict[int, int] = {}           # resident key -> reference count
        self.num_evictable = 0
        self.num_pending = 0
        self.evicted = 0                        # chunks evicted so far
        self.failed = 0                         # prepare_store calls that could not allocate
        self.peak = 0                           # most chunks held at once

    # ------------------------------------------------------------------ queries --
    def lookup(self, key: int) -> int:
        r = self.ref.get(key)
        if r is None:
            return MISS
        return HIT_PENDING if r < 0 else HIT

    def is_ready(self, key: int) -> bool:
        r = self.ref.get(key)
        return r is not None and r >= 0

    @property
    def used(self) -> int:
        return len(self.ref)

    # ------------------------------------------------------------- bookkeeping --
    def _record(self, keys: list[int], st: AccessState, reused: list[int] | None = None) -> None:
        new = []
        for key in keys:
            if key in st.seen:
                continue
            st.seen.add(key)
            new.append(key)
        if new:
            self.policy.on_request_access(new, st, self.ref)
        if reused:
            ins = st.inserted
            for key in reused:
                if key not in ins:
                    st.reused.add(key)

    # -------------------------------------------------------------- operations --
    def prepare_load(self, keys: list[int], st: AccessState) -> None:
        ref = self.ref
        pol = self.policy
        for key in keys:
            r = ref[key]
            assert r >= 0, "loading a chunk not written yet"
            if r == 0:
                pol.mark_non_evictable(key)
                self.num_evictable -= 1
            ref[key] = r + 1
        self._record(keys, st, keys)

    def complete_load(self, keys) -> None:
        ref = self.ref
        for key in keys:
            r = ref[key] - 1
            ref[key] = r
            if r == 0:
                self.num_evictable += 1
                self.policy.mark_evictable(key)

    def prepare_store(self, keys: list[int], st: AccessState) -> tuple[list[int], list[int]] | None:
        """(keys to store, keys evicted), or None when the pool cannot take them."""
        ref = self.ref
        to_store = []
        ready = []
        for key in keys:
            r = ref.get(key)
            if r is None:
                to_store.append(key)
            elif r >= 0:
                ready.append(key)
        misses = [k for k in to_store if k not in st.store_misses]
        if misses:
            self.policy.on_store_miss(misses, st)
            st.store_misses.update(misses)
        recorded = set(to_store)
        recorded.update(ready)
        self._record([k for k in keys if k in recorded], st, ready)
        if not to_store:
            return [], []
        need = len(to_store) - (self.num_chunks - len(ref))
        evicted: list[int] = []
        if need > 0:
            if need > self.num_evictable:
                self.failed += 1
                return None
            got = self.policy.evict(need, set(keys), ref)
            if got is None:
                self.failed += 1
                return None
            self.num_evictable -= len(got)
            for key in got:
                del ref[key]
            evicted = got
            self.evicted += len(got)
        pol = self.policy
        for key in to_store:
            ref[key] = -1
            pol.insert(key, st)
        self.num_pending += len(to_store)
        st.inserted.update(to_store)
        if len(ref) > self.peak:
            self.peak = len(ref)
        return to_store, evicted

    def complete_store(self, keys) -> None:
        ref = self.ref
        for key in keys:
            r = ref.get(key)
            if r is not None and r < 0:
                ref[key] = 0
                self.num_pending -= 1
                self.num_evictable += 1
                self.policy.mark_evictable(key)

    def request_finished(self, st: AccessState) -> None:
        if st.finished:
            return
        st.finished = True
        order = _head_to_tail(st.seen, st.positions)
        self.policy.on_request_finished(order, st.inserted - st.reused, st.reused, self.ref)
