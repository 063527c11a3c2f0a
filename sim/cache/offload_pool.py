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

A resident key holds a *slot* (``KeyMap``: key -> slot, machine integers in ``librt`` vecs);
its reference count and (``lru``) its rank and evictability live in vecs indexed by the slot,
and the LRU order is a list linked through the slots (the ranks finishes hand out, in
order) beside a waiting list and a heap of slots, over vecs: no boxed integer, dict or set
per chunk on the hot path.
"""
from __future__ import annotations

from typing import Final

from librt.vecs import append, vec
from mypy_extensions import i64

from sim.cache.block_pool import GROUP_BITS
from sim.cache.key_map import IntSet, KeyMap, SlotHeap, grown

# (a literal: mypyc folds it into the code; computed from the imported GROUP_BITS it
# would be a module global read and unboxed at every use)
GROUP_MASK: Final = 31
assert GROUP_MASK == (1 << GROUP_BITS) - 1, "GROUP_MASK must follow block_pool.GROUP_BITS"

MISS: Final = 0
HIT: Final = 1
HIT_PENDING: Final = 2


# (the sets of a request's state an ``lru`` pool never reads nor writes: shared, empty)
_UNUSED: Final[set[int]] = set()


# observed keys a request searches linearly before it keeps them in a hash set too (most
# requests observe fewer: no table to build; only keys the pool holds are searched, a
# few a request, so a longer scan costs less than the set: 16 -> 64 saved 0.6 k
# instructions a Mooncake request)
SCAN_KEYS: Final = 64


class AccessState:
    """What one request did to the tier (vLLM's per-request cache-access record);
    ``arc``: whether its pool's policy reads the keys it inserted and reused."""

    def __init__(self, arc: bool = True) -> None:
        # keys observed, in the order first observed, and each one's end token (-1:
        # unknown): the first n_seen entries of buffers kept
        self.seen_keys = vec[i64]()
        self.seen_pos = vec[i64]()
        self.n_seen: i64 = 0
        self.seen: IntSet | None = None   # ... as a set, once there are many
        # (``arc`` only: the keys the request inserted, reused, and stored as a miss)
        self.inserted: set[int] = set() if arc else _UNUSED
        self.reused: set[int] = set() if arc else _UNUSED
        self.store_misses: set[int] = set() if arc else _UNUSED
        self.applied = False              # its recency applied (the pool saw its finish)
        self.lru_rank: i64 = 0            # 0: the policy has not ranked this request yet
        # (the connector hands each key's end token beside it; ``prepare_store`` and
        # ``prepare_load`` without them read it here: prefix key -> end token)
        self.pos: dict[int, int] | None = None

    def reset(self, arc: bool) -> None:
        """As new (a state reused for another request; its buffers kept)."""
        self.n_seen = 0
        self.seen = None
        if arc:
            self.inserted = set()
            self.reused = set()
            self.store_misses = set()
        self.applied = False
        self.lru_rank = 0
        self.pos = None

    def observe(self, key: i64, p: i64, absent: bool = False) -> bool:
        """The request observes ``key`` (ending at token ``p``): whether for the first
        time (then it is kept, in order).  ``absent``: the pool does not hold the key, so
        it is kept unsearched -- a second entry of a key (observed, then evicted, offered
        again) only repeats it next to itself in the finish's head-to-tail order, which
        then hands it two fresh ranks in a row: the same order."""
        keys = self.seen_keys
        seen = self.seen
        n = self.n_seen
        if seen is None:
            if not absent:
                for j in range(n):
                    if keys[j] == key:
                        return False
            if n >= SCAN_KEYS:
                seen = IntSet(2 * n)
                for j in range(n):
                    seen.add(keys[j])
                seen.add(key)
                self.seen = seen
        elif not seen.add(key) and not absent:
            return False
        if n == len(keys):
            keys = self.seen_keys = grown(keys, n + 1)
            self.seen_pos = grown(self.seen_pos, n + 1)
        keys[n] = key
        self.seen_pos[n] = p
        self.n_seen = n + 1
        return True

    def set_pos(self, pk: int, tokens: int) -> None:
        if self.pos is None:
            self.pos = {}
        self.pos[pk] = tokens

    def pos_of(self, pk: int) -> int:
        """The end token of prefix key ``pk``; -1 if unknown."""
        pos = self.pos
        return pos.get(pk, -1) if pos is not None else -1

    def positions(self, keys: vec[i64]) -> vec[i64]:
        """The end tokens of ``keys`` (chunk keys) as ``set_pos`` gave them."""
        out = vec[i64](capacity=len(keys))
        for k in keys:
            out = append(out, self.pos_of(k >> GROUP_BITS))
        return out


class Policy:
    """What the host pool asks of an eviction policy (vLLM's ``CachePolicy``).  A key
    comes with its slot in the pool (-1: not resident)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.arc = False          # (whether it reads the requests' inserted/reused keys)

    def insert(self, key: int, slot: i64, st: AccessState, p: i64) -> None:
        """``key`` (ending at token ``p``; -1: unknown) enters ``slot``."""
        raise NotImplementedError

    def on_store_miss(self, keys: list[int], st: AccessState) -> None:
        return None

    def on_request_finished(self, order: vec[i64], n: i64, st: AccessState,
                            pool: HostPool) -> None:
        """The request's observed keys finished, head to tail (``order``'s first ``n``)."""
        raise NotImplementedError

    def evict(self, n: i64, protected: set[int] | None, pool: HostPool) -> i64:
        """``n`` keys to evict, none offered in this call (``protected``, or with ``lru``
        the slots ``pool.prot`` stamps with ``pool.stamp``), written to the first ``n``
        entries of ``pool.ev_keys`` (a buffer kept: no vec a call); ``n``, or -1 if there
        are too few."""
        raise NotImplementedError

    def mark_evictable(self, key: int, slot: i64) -> None:
        return None

    def mark_non_evictable(self, key: int, slot: i64) -> None:
        return None

    def freed(self, slot: i64) -> None:
        """The slot's key left the pool (evicted)."""
        return None


# LRU ranks as one integer, unique per key: vLLM's (request rank, -position) tuples, or
# (fresh rank, 0), ordered alike, then the key's group (vLLM breaks a tie of two keys -- one
# request's, at one position, so one prefix -- by the group index ending the key's bytes):
# (rank << POS_BITS | (2**POS_BITS - 1 - position)) << GROUP_BITS | group.  Positions stay
# below 2**22 tokens, so ranks stay machine integers until 2**34 requests and finishes.
POS_BITS: Final = 22
TOP: Final = (1 << POS_BITS) - 1
SHIFT: Final = POS_BITS + GROUP_BITS
NO_RANK: Final = 1 << 61       # (above every rank; a machine integer)


class LRUPolicy(Policy):
    """vLLM's LRU policy: the evictable keys by rank, least first.  A slot's rank and
    whether it is evictable live in vecs (``rank``, ``ev``).  Ranks a request's finish
    hands out only grow, so those slots go to the tail of a list linked through the slots
    (``prv``/``nxt``, ``inl`` marking the slots in it; ``first``/``last`` its ends), in
    rank order from the head; any other (a running request's rank) waits in an unsorted
    list (``pend_r``/``pend_s``, the least rank there at most ``pend_min``) until an
    eviction could take it: then the list goes into a heap of slots (``heap``, a
    ``SlotHeap``: one entry a slot, taken out when the slot's rank changes or it stops
    being evictable).  A slot is in the linked list or the heap, not both, and leaves
    either when its rank changes; evictions mostly take the linked list's head, older than
    every running request, so most waiting entries go stale (their request finished,
    handing out list ranks) without a heap operation.  A waiting entry (rank, slot) whose
    slot no longer has that rank, is not evictable, or is in the list or the heap, is
    stale and skipped, as vLLM's lazy heap skips it."""

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.rank = vec[i64]()        # slot -> rank (-1: free)
        self.ev = vec[i64]()          # slot -> 1 if evictable
        self.nev: i64 = 0             # evictable slots
        self.heap = SlotHeap()        # slots by rank: ranks that came out of order
        self.pend_r = vec[i64]()      # (the waiting entries: the first pend_n)
        self.pend_s = vec[i64]()
        self.pend_n: i64 = 0
        self.pend_min: i64 = NO_RANK
        self.prv = vec[i64]()         # slot -> the slot before it in the list (-1: none)
        self.nxt = vec[i64]()         # slot -> the slot after it (-1: none)
        self.inl = vec[i64]()         # slot -> 1 if in the list
        self.first: i64 = -1          # the list's head (least rank; -1: empty)
        self.last: i64 = -1           # its tail (greatest rank)
        self.next_rank: i64 = 0
        # (evict's scratch: the entries selected, and those passed over as protected)
        self.sel_r = vec[i64]()
        self.sel_s = vec[i64]()
        self.def_r = vec[i64]()
        self.def_s = vec[i64]()

    def _rank_of(self, st: AccessState) -> i64:
        if st.lru_rank == 0:
            self.next_rank += 1
            st.lru_rank = self.next_rank
        return st.lru_rank

    def _fresh(self, key: i64) -> i64:
        self.next_rank += 1
        return (((self.next_rank << POS_BITS) | TOP) << GROUP_BITS) | (key & GROUP_MASK)

    def _unlink(self, s: i64) -> None:
        """Slot ``s`` out of the linked list (it is in it)."""
        prv = self.prv
        nxt = self.nxt
        p = prv[s]
        q = nxt[s]
        if p >= 0:
            nxt[p] = q
        else:
            self.first = q
        if q >= 0:
            prv[q] = p
        else:
            self.last = p
        self.inl[s] = 0

    def _link_tail(self, s: i64, last: i64) -> None:
        """Slot ``s`` (in neither the list nor the heap) linked after ``last``, the
        list's tail (-1: the list is empty)."""
        nxt = self.nxt
        self.prv[s] = last
        nxt[s] = -1
        if last >= 0:
            nxt[last] = s
        else:
            self.first = s
        self.last = s
        self.inl[s] = 1

    def _push(self, s: i64) -> None:
        """Slot ``s`` (evictable) has a new rank, or became evictable: its entry."""
        # (reads straight from the attributes: mypyc borrows them, no reference taken)
        r = self.rank[s]
        heap = self.heap
        if heap.n and heap.has(s):
            heap.remove(s)
        if self.inl[s]:
            self._unlink(s)
        last = self.last
        if last < 0 or r >= self.rank[last]:
            self._link_tail(s, last)
        else:
            n = self.pend_n
            if n == len(self.pend_r):
                self._compact_pending()
                n = self.pend_n
            self.pend_r[n] = r
            self.pend_s[n] = s
            self.pend_n = n + 1
            if r < self.pend_min:
                self.pend_min = r

    def _valid_pending(self, r: i64, s: i64) -> bool:
        return (self.ev[s] != 0 and self.rank[s] == r and not self.inl[s]
                and not self.heap.has(s))

    def _compact_pending(self) -> None:
        """The waiting list without its stale entries (its least rank exact again); its
        buffers doubled if that leaves it more than half full."""
        pr = self.pend_r
        ps = self.pend_s
        k: i64 = 0
        low: i64 = NO_RANK
        ev = self.ev
        rank = self.rank
        inl = self.inl
        heap = self.heap
        for j in range(self.pend_n):
            r = pr[j]
            s = ps[j]
            # (_valid_pending, inline: every waiting entry is tested here)
            if ev[s] != 0 and rank[s] == r and not inl[s] and not heap.has(s):
                pr[k] = r
                ps[k] = s
                k += 1
                if r < low:
                    low = r
        self.pend_n = k
        self.pend_min = low
        if 2 * k >= len(pr):
            self.pend_r = grown(pr, 2 * k + 2)
            self.pend_s = grown(ps, 2 * k + 2)

    def _release_pending(self) -> None:
        """Every live waiting entry into the heap (an eviction may take one next)."""
        pr = self.pend_r
        ps = self.pend_s
        heap = self.heap
        for j in range(self.pend_n):
            r = pr[j]
            s = ps[j]
            if self._valid_pending(r, s):
                heap.push(r, s)
        self.pend_n = 0
        self.pend_min = NO_RANK

    def _pop(self) -> tuple[i64, i64]:
        """The least (rank, slot) of the three, out of its list or heap ((-1, -1): none)."""
        f = self.first
        heap = self.heap
        if self.pend_n:
            least: i64 = NO_RANK
            if f >= 0:
                least = self.rank[f]
            if heap.n and heap.keys[0] < least:
                least = heap.keys[0]
            if self.pend_min < least:
                self._release_pending()
        if f >= 0 and (heap.n == 0 or self.rank[f] < heap.keys[0]):
            q = self.nxt[f]           # (_unlink of the head, inline)
            self.first = q
            if q >= 0:
                self.prv[q] = -1
            else:
                self.last = -1
            self.inl[f] = 0
            return self.rank[f], f
        if heap.n > 0:
            return heap.pop()
        return -1, -1

    # -- the policy -------------------------------------------------------------------
    def insert(self, key: int, slot: i64, st: AccessState, p: i64) -> None:
        while len(self.rank) <= slot:
            self.rank = append(self.rank, -1)
            self.ev = append(self.ev, 0)
            self.prv = append(self.prv, -1)
            self.nxt = append(self.nxt, -1)
            self.inl = append(self.inl, 0)
        if p < 0:
            self.rank[slot] = self._fresh(key)
        else:
            self.rank[slot] = ((((self._rank_of(st) << POS_BITS) | (TOP - p)) << GROUP_BITS)
                               | (key & GROUP_MASK))

    def access(self, key: i64, p: i64, st: AccessState, s: i64) -> None:
        """The request observes ``key`` (ending at token ``p``, in slot ``s``; -1: not
        resident) for the first time: a resident key's rank is raised to the request's
        (vLLM's ``touch`` of the keys a request looks up)."""
        r = self._rank_of(st)
        if p < 0:
            return
        if s < 0:
            return
        new = ((((r << POS_BITS) | (TOP - p)) << GROUP_BITS) | (key & GROUP_MASK))
        if self.rank[s] >= new:
            return
        self.rank[s] = new
        if self.ev[s]:
            self._push(s)

    def on_request_finished(self, order: vec[i64], n: i64, st: AccessState,
                            pool: HostPool) -> None:
        index = pool.index
        rank = self.rank
        ev = self.ev
        heap = self.heap
        nr: i64 = self.next_rank
        for j in range(n - 1, -1, -1):
            key = order[j]
            s = index.only(key)
            if s < 0:
                continue
            nr += 1      # (_fresh, inline)
            rank[s] = (((nr << POS_BITS) | TOP) << GROUP_BITS) | (key & GROUP_MASK)
            if ev[s]:
                # (_push, inline, of a rank above every other: the slot goes to the
                # list's tail, never to the waiting list)
                if heap.n and heap.has(s):
                    heap.remove(s)
                if self.inl[s]:
                    self._unlink(s)
                self._link_tail(s, self.last)
        self.next_rank = nr

    def evict(self, n: i64, protected: set[int] | None, pool: HostPool) -> i64:
        if n == 0:
            return 0
        prot = pool.prot
        stamp = pool.stamp
        rank = self.rank
        ev = self.ev
        # (a selected slot is marked not evictable at once: a second entry of it is then
        # skipped as stale; the marks are undone if too few are found.  The selected and
        # the passed-over (protected) entries go to scratch vecs kept between calls.)
        if len(self.sel_r) < n:
            self.sel_r = grown(self.sel_r, n)
            self.sel_s = grown(self.sel_s, n)
        sel_r = self.sel_r
        sel_s = self.sel_s
        nsel: i64 = 0
        ndef: i64 = 0
        while nsel < n:
            r, s = self._pop()
            if r < 0:
                break
            if not ev[s] or rank[s] != r:
                continue
            if prot[s] == stamp:
                if ndef == len(self.def_r):
                    self.def_r = grown(self.def_r, ndef + 1)
                    self.def_s = grown(self.def_s, ndef + 1)
                self.def_r[ndef] = r
                self.def_s[ndef] = s
                ndef += 1
                continue
            ev[s] = 0
            sel_r[nsel] = r
            sel_s[nsel] = s
            nsel += 1
        heap = self.heap
        def_r = self.def_r
        def_s = self.def_s
        for j in range(ndef):
            s = def_s[j]
            if not heap.has(s):
                heap.push(def_r[j], s)
        if nsel < n:
            for j in range(nsel):
                s = sel_s[j]
                ev[s] = 1
                if not heap.has(s):
                    heap.push(sel_r[j], s)
            return -1
        skey = pool.skey
        if len(pool.ev_keys) < n:
            pool.ev_keys = grown(pool.ev_keys, n)
        out = pool.ev_keys
        for j in range(n):
            s = sel_s[j]
            if heap.has(s):
                heap.remove(s)      # (its second entry: it had one in each)
            rank[s] = -1
            out[j] = skey[s]
        self.nev -= n
        return n

    def mark_evictable(self, key: int, slot: i64) -> None:
        if not self.ev[slot]:
            self.nev += 1
        self.ev[slot] = 1
        self._push(slot)

    def mark_non_evictable(self, key: int, slot: i64) -> None:
        if self.ev[slot]:
            self.nev -= 1
        self.ev[slot] = 0
        if self.heap.has(slot):
            self.heap.remove(slot)
        if self.inl[slot]:
            self._unlink(slot)


class ARCPolicy(Policy):
    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.arc = True
        self.target = 0.0
        self.t1: dict[int, None] = {}
        self.t2: dict[int, None] = {}
        self.b1: dict[int, None] = {}
        self.b2: dict[int, None] = {}

    def insert(self, key: int, slot: i64, st: AccessState, p: i64) -> None:
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

    def on_request_finished(self, order: vec[i64], n: i64, st: AccessState,
                            pool: HostPool) -> None:
        inserted_only = st.inserted - st.reused
        reused = st.reused
        t1 = self.t1
        t2 = self.t2
        for j in range(n - 1, -1, -1):
            key = order[j]
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
    def _next(keys: list[int], at: list[int], pool: HostPool, protected: set[int]) -> int:
        """The next key of ``keys`` from ``at[0]`` (advanced past it) that is ready and
        unpinned and not protected; -1 if none (the scans only move forward)."""
        i = at[0]
        while i < len(keys):
            key = keys[i]
            i += 1
            if pool.ref_of(key) == 0 and key not in protected:
                at[0] = i
                return key
        at[0] = i
        return -1

    def evict(self, n: i64, protected: set[int] | None, pool: HostPool) -> i64:
        if n == 0:
            return 0
        assert protected is not None
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
                key = self._next(t1, at1, pool, protected)
                if key >= 0:
                    from_t1 = True
                    virtual_t1 -= 1
            if key < 0:
                key = self._next(t2, at2, pool, protected)
            if key < 0:
                key = self._next(t1, at1, pool, protected)
                if key < 0:
                    return -1
                from_t1 = True
                virtual_t1 -= 1
            picks.append((key, from_t1))
        if len(pool.ev_keys) < n:
            pool.ev_keys = grown(pool.ev_keys, n)
        out = pool.ev_keys
        j: i64 = 0
        for key, from_t1 in picks:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            out[j] = key
            j += 1
        for ghost in (self.b1, self.b2):
            extra = len(ghost) - self.capacity
            if extra > 0:
                for key in list(ghost)[:extra]:
                    del ghost[key]
        return n


def make_policy(name: str, capacity: int) -> Policy:
    if name == "arc":
        return ARCPolicy(capacity)
    if name == "lru":
        return LRUPolicy(capacity)
    raise ValueError(f"eviction_policy: must be lru or arc, got {name!r}")


class HostPool:
    """The CPU chunk pool (vLLM's ``CPUOffloadingManager``): ``num_chunks`` chunks, a
    reference count per resident key (-1 being written, 0 ready, > 0 pinned by loads),
    kept by slot (``index``: key -> slot; ``skey``, ``sref``: per slot)."""

    def __init__(self, num_chunks: int, policy: str = "lru"):
        self.num_chunks: i64 = num_chunks
        self.policy = make_policy(policy, num_chunks)
        self.arc = self.policy.arc
        pol = self.policy
        self.lru: LRUPolicy | None = pol if isinstance(pol, LRUPolicy) else None
        # (the index at most a quarter full once the pool is: short probe runs for the
        # ~50 probes a request makes; a table of at most 2**20 slots to start with)
        self.index = KeyMap(2 * num_chunks if num_chunks < (1 << 18) else (1 << 19))
        self.skey = vec[i64]()                  # slot -> key (-1: free)
        self.sref = vec[i64]()                  # slot -> reference count
        self.free_slots = vec[i64]()
        self.nfree: i64 = 0
        self.prot = vec[i64]()                  # slot -> the stamp of the last call offering it
        self.spos = vec[i64]()                  # slot -> its key's end token (-1: unknown)
        self.kslots = vec[i64]()                # (prepare_store's scratch: its keys' slots)
        self.offered = vec[i64]()               # the last offer's keys to store
        # ... and the keys it evicted, and their end tokens: the first n_evicted entries
        # of buffers kept (``evicted_now``: a vec of them)
        self.ev_keys = vec[i64]()
        self.evicted_pos = vec[i64]()
        self.n_evicted: i64 = 0
        self.none = vec[i64]()                  # (an empty vec: no new one per call)
        self.kpos = vec[i64]()                  # (offer's scratch: the keys to store's ends)
        self.order = vec[i64]()                 # (request_finished's: the keys in order
        self.order_at = vec[i64]()              # and their end tokens)
        self.stamp: i64 = 0
        self.num_evictable: i64 = 0
        self.num_pending: i64 = 0
        self.evicted: i64 = 0                   # chunks evicted so far
        self.failed: i64 = 0                    # prepare_store calls that could not allocate
        self.peak: i64 = 0                      # most chunks held at once

    # ------------------------------------------------------------------ queries --
    def lookup(self, key: i64) -> int:
        s = self.index.only(key)
        if s < 0:
            return MISS
        return HIT_PENDING if self.sref[s] < 0 else HIT

    def is_ready(self, key: i64) -> bool:
        s = self.index.only(key)
        return s >= 0 and self.sref[s] >= 0

    def ref_of(self, key: i64) -> i64:
        """The key's reference count; -2 if it is not resident."""
        s = self.index.only(key)
        return self.sref[s] if s >= 0 else -2

    @property
    def used(self) -> int:
        return self.index.size

    # ------------------------------------------------------------- bookkeeping --
    def _observe(self, key: i64, p: i64, st: AccessState, s: i64) -> None:
        """The request observes ``key`` (ending at token ``p``, in slot ``s``; -1: not
        resident; first time: the policy's ``touch``)."""
        if st.observe(key, p, s < 0):
            lru = self.lru
            if lru is not None:
                lru.access(key, p, st, s)

    def _reused(self, key: int, st: AccessState) -> None:
        if key not in st.inserted:
            st.reused.add(key)

    def _take_slot(self, key: i64) -> i64:
        if self.nfree > 0:
            self.nfree -= 1
            s = self.free_slots[self.nfree]
            self.skey[s] = key
            self.sref[s] = -1
        else:
            s = len(self.skey)
            self.skey = append(self.skey, key)
            self.sref = append(self.sref, -1)
            self.prot = append(self.prot, 0)
            self.spos = append(self.spos, -1)
        self.index.put(key, s)
        return s

    def _drop(self, key: i64) -> i64:
        """``key`` leaves the pool (evicted): its end token."""
        return self._drop_slot(key, self.index.only(key))

    def _drop_slot(self, key: i64, s: i64) -> i64:
        """``key``, in slot ``s``, leaves the pool (evicted): its end token."""
        self.index.remove(key, s)
        self.skey[s] = -1
        if self.nfree == len(self.free_slots):
            self.free_slots = append(self.free_slots, s)
        else:
            self.free_slots[self.nfree] = s
        self.nfree += 1
        self.policy.freed(s)
        return self.spos[s]

    # -------------------------------------------------------------- operations --
    def prepare_load(self, keys: vec[i64], st: AccessState,
                     kpos: vec[i64] | None = None) -> None:
        """Pin ``keys`` (ending at tokens ``kpos``; None: as ``st.set_pos`` gave them)."""
        if kpos is None:
            kpos = st.positions(keys)
        index = self.index
        sref = self.sref
        pol = self.policy
        for key in keys:
            s = index.only(key)
            r = sref[s]
            assert s >= 0 and r >= 0, "loading a chunk not written yet"
            if r == 0:
                pol.mark_non_evictable(key, s)
                self.num_evictable -= 1
            sref[s] = r + 1
        for j in range(len(keys)):
            key = keys[j]
            self._observe(key, kpos[j], st, index.only(key))
        if self.arc:
            for key in keys:
                self._reused(key, st)

    def complete_load(self, keys: vec[i64]) -> None:
        index = self.index
        sref = self.sref
        for key in keys:
            s = index.only(key)
            r = sref[s] - 1
            sref[s] = r
            if r == 0:
                self.num_evictable += 1
                self.policy.mark_evictable(key, s)

    def prepare_store(self, keys: vec[i64], st: AccessState
                      ) -> tuple[vec[i64], vec[i64]] | None:
        """(keys to store, keys evicted), or None when the pool cannot take them (the
        keys' end tokens as ``st.set_pos`` gave them)."""
        if not self.offer(keys, st.positions(keys), st):
            return None
        return self.offered, self.evicted_now

    @property
    def evicted_now(self) -> vec[i64]:
        """The keys the last offer evicted (a new vec)."""
        out = vec[i64](capacity=self.n_evicted)
        ek = self.ev_keys
        for j in range(self.n_evicted):
            out = append(out, ek[j])
        return out

    def offer(self, keys: vec[i64], kpos: vec[i64], st: AccessState, n: i64 = -1) -> bool:
        """``prepare_store`` without a tuple, the keys' end tokens beside them
        (``kpos``; the first ``n`` of both, -1: all): whether the pool takes the keys; then
        the keys to store are in ``offered`` (a new vec) and the keys evicted in the
        first ``n_evicted`` entries of ``ev_keys`` (vecs: no int object a key)."""
        index = self.index
        sref = self.sref
        to_store = self.none       # (a new vec from the first key to store)
        arc = self.arc
        lru = self.lru
        # (each key's slot, -1 if absent, kept for the protection stamps below)
        nk: i64 = len(keys) if n < 0 else n
        if len(self.kslots) < nk:
            self.kslots = grown(self.kslots, nk)
            self.kpos = grown(self.kpos, nk)
        kslots = self.kslots
        to_pos = self.kpos
        nto: i64 = 0
        for j in range(nk):
            key = keys[j]
            s = index.only(key)
            kslots[j] = s
            if s < 0:
                if nto == 0:
                    to_store = vec[i64](capacity=nk - j)
                to_store = append(to_store, key)
                p = kpos[j]
                to_pos[nto] = p
                nto += 1
                # (_observe of an absent key, inline: kept unsearched, and the policy
                # ranks the request if it has not yet -- all LRU's access does then)
                st.observe(key, p, True)
                if lru is not None and st.lru_rank == 0:
                    lru.next_rank += 1
                    st.lru_rank = lru.next_rank
                continue
            elif sref[s] < 0:
                continue                 # (being written: neither stored nor observed)
            elif arc:
                self._reused(key, st)
            self._observe(key, kpos[j], st, s)
        if arc:
            misses = [k for k in to_store if k not in st.store_misses]
            if misses:
                self.policy.on_store_miss(misses, st)
                st.store_misses.update(misses)
        self.n_evicted = 0
        if len(to_store) == 0:
            self.offered = to_store
            return True
        need = len(to_store) - (self.num_chunks - index.size)
        if need > 0:
            if need > self.num_evictable:
                self.failed += 1
                return False
            protected: set[int] | None = None
            if arc:
                protected = {keys[j] for j in range(nk)}
            else:
                self.stamp += 1
                stamp = self.stamp
                prot = self.prot
                for j in range(nk):
                    s = kslots[j]
                    if s >= 0:
                        prot[s] = stamp
            ng = self.policy.evict(need, protected, self)
            if ng < 0:
                self.failed += 1
                return False
            got = self.ev_keys
            self.num_evictable -= ng
            if len(self.evicted_pos) < ng:
                self.evicted_pos = grown(self.evicted_pos, ng)
            evicted_pos = self.evicted_pos
            if lru is not None:
                # (the LRU leaves the evicted keys' slots in its scratch, in order)
                sel = lru.sel_s
                for j in range(ng):
                    evicted_pos[j] = self._drop_slot(got[j], sel[j])
            else:
                for j in range(ng):
                    evicted_pos[j] = self._drop(got[j])
            self.n_evicted = ng
            self.evicted += ng
        pol = self.policy
        # (every key to store was absent when offered: each takes a free slot, unless a
        # key is offered twice in one call -- then the second finds the first's slot)
        twice = nto > 8
        if 1 < nto <= 8:
            for a in range(1, nto):
                for b in range(a):
                    if to_store[a] == to_store[b]:
                        twice = True
        for j in range(nto):
            key = to_store[j]
            s = -1
            if twice:
                s = index.only(key)
            if s < 0:
                s = self._take_slot(key)
            else:
                self.sref[s] = -1
            self.spos[s] = to_pos[j]
            pol.insert(key, s, st, to_pos[j])
        self.num_pending += len(to_store)
        if arc:
            st.inserted.update(to_store)
        if index.size > self.peak:
            self.peak = index.size
        self.offered = to_store
        return True

    def complete_store(self, keys: vec[i64]) -> None:
        index = self.index
        sref = self.sref
        lru = self.lru
        for key in keys:
            s = index.only(key)
            if s >= 0 and sref[s] < 0:
                sref[s] = 0
                self.num_pending -= 1
                self.num_evictable += 1
                if lru is not None:          # (LRUPolicy.mark_evictable, inline)
                    if not lru.ev[s]:
                        lru.nev += 1
                    lru.ev[s] = 1
                    lru._push(s)
                else:
                    self.policy.mark_evictable(key, s)

    def request_finished(self, st: AccessState) -> None:
        if st.applied:
            return
        st.applied = True
        n = self._head_to_tail(st)
        self.policy.on_request_finished(self.order, n, st, self)

    def _head_to_tail(self, st: AccessState) -> i64:
        """Every key ``st`` observed, head to tail, into ``order`` (its first entries: a
        buffer kept; their count returned): by position, then by key (vLLM: each group's
        keys by position, the groups in order, then one stable sort by position; a key's
        group is its low bits, and keys at one position share their prefix key).  An
        insertion sort (the keys come mostly in order already)."""
        keys = st.seen_keys
        kpos = st.seen_pos
        n: i64 = st.n_seen
        if len(self.order) < n:
            self.order = grown(self.order, n)
            self.order_at = grown(self.order_at, n)
        out = self.order
        at = self.order_at
        for j in range(n):
            k = keys[j]
            p = kpos[j]
            assert p >= 0, "an observed key without a position"
            i: i64 = j
            while i > 0 and (at[i - 1] > p or (at[i - 1] == p and out[i - 1] > k)):
                at[i] = at[i - 1]
                out[i] = out[i - 1]
                i -= 1
            at[i] = p
            out[i] = k
        return n
