"""The prefix-cache hash map: pool key -> the blocks holding it.

vLLM's ``BlockPool.cached_block_hash_to_block`` maps a ``BlockHashWithGroupId``
to one block, or to several (keyed by block id, in insertion order) when
blocks with equal contents were cached apart; a lookup returns the block
inserted first.  Here a pool key is a non-negative machine integer (the
prefix key with the group id in its low bits, ``block_pool.make_key``) and a
block is named by its id.

It is an open-addressing table (linear probing, deletion by backward shift,
so no tombstones) over two ``librt`` vecs of machine integers: a probe is a
few dozen CPU instructions in the compiled build, where a ``dict`` with int
keys costs several hundred (a boxed key, its hash, the generic lookup).  The
rare keys held by several blocks keep their ids in a side dict.
"""
from __future__ import annotations

from typing import Final

from librt.vecs import append, extend, vec
from mypy_extensions import i64

EMPTY: Final = -1    # a free slot (pool keys are >= 0)
MULTI: Final = -2    # the key is held by several blocks: see KeyMap.multi
MIX: Final = 2654435761   # spreads the group bits (equal prefix keys of several groups)


def _home(key: i64, mask: i64) -> i64:
    """The slot a key probes first.  The low five bits are the group id: they
    are spread over the table so a key's groups do not probe the same run.
    (Written out where a key is probed: ~127 probes a Mooncake request, and mypyc
    does not inline a call.)"""
    return ((key >> 5) ^ ((key & 31) * MIX)) & mask


def grown(v: vec[i64], need: i64) -> vec[i64]:
    """``v`` doubled (from 64 entries when empty) until it holds ``need`` entries, its
    own kept: for buffers read as their first ``n`` entries (``EventRecords``, a pool's
    ``popped``), written by index instead of appended to."""
    if len(v) == 0:
        v = vec[i64]([0] * 64)
    while len(v) < need:
        v = extend(v, v)
    return v


class KeyMap:
    """Pool key -> block id(s); see the module docstring."""

    def __init__(self, capacity: int = 16):
        """``capacity``: the keys expected; the table starts at a power of two at
        least twice that (load <= 1/2) and doubles once it is 70% full."""
        cap = 16
        while cap < 2 * capacity:
            cap *= 2
        self.mask: i64 = cap - 1
        self.keys = vec[i64]([EMPTY] * cap)
        self.vals = vec[i64]([EMPTY] * cap)   # block id, or MULTI
        self.size: i64 = 0
        self.multi: dict[int, list[int]] = {}  # key -> block ids, first inserted first

    def __len__(self) -> int:
        return self.size

    # -- reading ---------------------------------------------------------------
    def _slot(self, key: i64) -> i64:
        """The slot holding ``key``, or -1."""
        mask = self.mask
        keys = self.keys
        i = ((key >> 5) ^ ((key & 31) * MIX)) & mask   # (_home)
        while True:
            k = keys[i]
            if k == key:
                return i
            if k == EMPTY:
                return -1
            i = (i + 1) & mask

    def has(self, key: i64) -> bool:
        return self._slot(key) >= 0

    def first(self, key: i64) -> i64:
        """The id of the first block inserted under ``key`` still holding it, or -1."""
        i = self._slot(key)
        if i < 0:
            return -1
        v = self.vals[i]
        if v == MULTI:
            return self.multi[key][0]
        return v

    def only(self, key: i64) -> i64:
        """The id of the one block holding ``key``; -1 if none, MULTI if several.  (The
        probe of ``_slot``, inline: the CPU tier's pool asks this for every key it
        touches.)"""
        mask = self.mask
        keys = self.keys
        i = ((key >> 5) ^ ((key & 31) * MIX)) & mask   # (_home)
        while True:
            k = keys[i]
            if k == key:
                return self.vals[i]
            if k == EMPTY:
                return -1
            i = (i + 1) & mask

    def maps(self, key: i64, block_id: i64) -> bool:
        """Whether block ``block_id`` holds ``key``."""
        i = self._slot(key)
        if i < 0:
            return False
        v = self.vals[i]
        if v == MULTI:
            return block_id in self.multi[key]
        return v == block_id

    def items(self) -> dict[int, list[int]]:
        """Every key and its block ids (first inserted first): tests and tools."""
        out: dict[int, list[int]] = {}
        keys = self.keys
        vals = self.vals
        for i in range(len(keys)):
            k = keys[i]
            if k != EMPTY:
                v = vals[i]
                out[k] = list(self.multi[k]) if v == MULTI else [v]
        return out

    # -- writing ---------------------------------------------------------------
    def add(self, key: i64, block_id: i64) -> bool:
        """Map ``key`` to ``block_id`` too; False if it already was."""
        mask = self.mask
        keys = self.keys
        i = ((key >> 5) ^ ((key & 31) * MIX)) & mask   # (_home)
        while True:
            k = keys[i]
            if k == key:
                v = self.vals[i]
                if v == MULTI:
                    ids = self.multi[key]
                    if block_id in ids:
                        return False
                    ids.append(block_id)
                    return True
                if v == block_id:
                    return False
                self.multi[key] = [v, block_id]
                self.vals[i] = MULTI
                return True
            if k == EMPTY:
                break
            i = (i + 1) & mask
        keys[i] = key
        self.vals[i] = block_id
        self.size += 1
        if 10 * self.size > 7 * (mask + 1):
            self._grow()
        return True

    def remove(self, key: i64, block_id: i64) -> bool:
        """Unmap ``key`` from ``block_id``; False if it was not mapped there."""
        i = self._slot(key)
        if i < 0:
            return False
        v = self.vals[i]
        if v == MULTI:
            ids = self.multi[key]
            if block_id not in ids:
                return False
            ids.remove(block_id)
            if len(ids) == 1:   # one holder left: back to a plain slot
                self.vals[i] = ids[0]
                del self.multi[key]
            return True
        if v != block_id:
            return False
        self._delete(i)
        return True

    def take_first(self, key: i64) -> i64:
        """Unmap ``key`` from its first holder (``first``'s) in one probe; that holder's
        id, or -1 if no block held it (a router's mirror dropping one copy of a key)."""
        mask = self.mask
        keys = self.keys
        i = ((key >> 5) ^ ((key & 31) * MIX)) & mask   # (_home)
        while True:
            k = keys[i]
            if k == key:
                break
            if k == EMPTY:
                return -1
            i = (i + 1) & mask
        v = self.vals[i]
        if v == MULTI:
            ids = self.multi[key]
            v = ids.pop(0)
            if len(ids) == 1:   # one holder left: back to a plain slot
                self.vals[i] = ids[0]
                del self.multi[key]
            return v
        self._delete(i)
        return v

    def put(self, key: i64, value: i64) -> None:
        """Map ``key`` to ``value`` alone, inserting or overwriting in one probe: for
        a table used as a plain key -> value map (``EvictionLog``; never several
        holders, so never ``MULTI``)."""
        mask = self.mask
        keys = self.keys
        i = ((key >> 5) ^ ((key & 31) * MIX)) & mask   # (_home)
        while True:
            k = keys[i]
            if k == key:
                self.vals[i] = value
                return
            if k == EMPTY:
                break
            i = (i + 1) & mask
        keys[i] = key
        self.vals[i] = value
        self.size += 1
        if 10 * self.size > 7 * (mask + 1):
            self._grow()

    def swap(self, key: i64, value: i64) -> i64:
        """``put``, returning the value ``key`` had (``EMPTY`` if none): one probe."""
        mask = self.mask
        keys = self.keys
        i = ((key >> 5) ^ ((key & 31) * MIX)) & mask   # (_home)
        while True:
            k = keys[i]
            if k == key:
                old = self.vals[i]
                self.vals[i] = value
                return old
            if k == EMPTY:
                break
            i = (i + 1) & mask
        keys[i] = key
        self.vals[i] = value
        self.size += 1
        if 10 * self.size > 7 * (mask + 1):
            self._grow()
        return EMPTY

    def bump(self, key: i64, delta: i64) -> i64:
        """Add ``delta`` to ``key``'s value in one probe, for a table of positive counts
        (or bit masks kept as sums of distinct bits): an absent key is inserted with
        ``delta`` (which must then be positive: KeyError otherwise), a key whose value
        reaches 0 is removed.  Returns the new value."""
        mask = self.mask
        keys = self.keys
        i = ((key >> 5) ^ ((key & 31) * MIX)) & mask   # (_home)
        while True:
            k = keys[i]
            if k == key:
                v = self.vals[i] + delta
                if v == 0:
                    self._delete(i)
                else:
                    self.vals[i] = v
                return v
            if k == EMPTY:
                break
            i = (i + 1) & mask
        if delta <= 0:
            raise KeyError(key)
        keys[i] = key
        self.vals[i] = delta
        self.size += 1
        if 10 * self.size > 7 * (mask + 1):
            self._grow()
        return delta

    def repoint(self, key: i64, block_id: i64) -> None:
        """The one block holding ``key`` is now ``block_id`` (the caller checked
        with ``only`` that exactly one block held it)."""
        self.vals[self._slot(key)] = block_id

    def _delete(self, i: i64) -> None:
        """Empty slot ``i`` and shift later members of its probe run back, so
        every key stays reachable from its home slot without tombstones."""
        keys = self.keys
        vals = self.vals
        mask = self.mask
        j = i
        while True:
            j = (j + 1) & mask
            k = keys[j]
            if k == EMPTY:
                break
            h = ((k >> 5) ^ ((k & 31) * MIX)) & mask   # (_home)
            # k may fill the hole at i iff i lies cyclically in [h, j)
            if (h <= i < j) or (j < h <= i) or (i < j < h):
                keys[i] = k
                vals[i] = vals[j]
                i = j
        keys[i] = EMPTY
        vals[i] = EMPTY
        self.size -= 1

    def _grow(self) -> None:
        old_keys = self.keys
        old_vals = self.vals
        cap = 2 * (self.mask + 1)
        self.mask = cap - 1
        self.keys = vec[i64]([EMPTY] * cap)
        self.vals = vec[i64]([EMPTY] * cap)
        mask = self.mask
        keys = self.keys
        vals = self.vals
        for j in range(len(old_keys)):
            k = old_keys[j]
            if k == EMPTY:
                continue
            i = _home(k, mask)
            while keys[i] != EMPTY:
                i = (i + 1) & mask
            keys[i] = k
            vals[i] = old_vals[j]


class IntSet:
    """A small set of non-negative machine integers (open addressing, linear probing, no
    deletion; a table doubling once half full): the keys a request of the CPU tier
    observed, once it has observed more than a linear scan should search
    (``sim/cache/offload_pool.py``)."""

    def __init__(self, capacity: i64 = 16) -> None:
        cap: i64 = 16
        while cap < 2 * capacity:
            cap *= 2
        self.mask: i64 = cap - 1
        self.keys = vec[i64]([-1] * cap)
        self.size: i64 = 0

    def add(self, key: i64) -> bool:
        """Add ``key``; whether it is new."""
        mask = self.mask
        keys = self.keys
        i = ((key >> 5) ^ ((key & 31) * MIX)) & mask
        while True:
            k = keys[i]
            if k == key:
                return False
            if k < 0:
                break
            i = (i + 1) & mask
        keys[i] = key
        self.size += 1
        if 2 * self.size > mask:
            self._grow()
        return True

    def _grow(self) -> None:
        old = self.keys
        cap = 2 * (self.mask + 1)
        mask = cap - 1
        keys = vec[i64]([-1] * cap)
        for j in range(len(old)):
            k = old[j]
            if k < 0:
                continue
            i = ((k >> 5) ^ ((k & 31) * MIX)) & mask
            while keys[i] >= 0:
                i = (i + 1) & mask
            keys[i] = k
        self.mask = mask
        self.keys = keys


def sift_up(hk: vec[i64], hv: vec[i64], pos: vec[i64], i: i64, key: i64, val: i64) -> None:
    """Place (key, val) at index ``i`` or above in a binary min-heap over ``hk``/``hv``;
    ``pos``, when not empty, follows each value's index (``SlotHeap``)."""
    track = len(pos) > 0
    while i > 0:
        p = (i - 1) >> 1
        if hk[p] <= key:
            break
        hk[i] = hk[p]
        hv[i] = hv[p]
        if track:
            pos[hv[i]] = i
        i = p
    hk[i] = key
    hv[i] = val
    if track:
        pos[val] = i


def sift_down(hk: vec[i64], hv: vec[i64], pos: vec[i64], n: i64, i: i64, key: i64,
              val: i64) -> None:
    """Place (key, val) at index ``i`` or below among the first ``n`` entries of a binary
    min-heap over ``hk``/``hv``; ``pos`` as in ``sift_up``."""
    track = len(pos) > 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and hk[c + 1] < hk[c]:
            c += 1
        if hk[c] >= key:
            break
        hk[i] = hk[c]
        hv[i] = hv[c]
        if track:
            pos[hv[i]] = i
        i = c
    hk[i] = key
    hv[i] = val
    if track:
        pos[val] = i


class PairHeap:
    """A binary min-heap of (key, value) machine-integer pairs over two vecs, least key
    first (equal keys in heap order); no boxing, no tuple per entry: the CPU tier's job
    completions (time seen, job id), a stale entry told apart by its caller."""

    def __init__(self) -> None:
        self.keys = vec[i64]()
        self.vals = vec[i64]()
        self.n: i64 = 0
        self.nopos = vec[i64]()   # (no positions followed)

    def __len__(self) -> int:
        return self.n

    def first(self) -> i64:
        """The least key (the caller checked the heap is not empty)."""
        return self.keys[0]

    def clear(self) -> None:
        """Empty (the vecs' storage kept)."""
        self.n = 0

    def push(self, key: i64, val: i64) -> None:
        n = self.n
        if n == len(self.keys):
            self.keys = append(self.keys, key)
            self.vals = append(self.vals, val)
        sift_up(self.keys, self.vals, self.nopos, n, key, val)
        self.n = n + 1

    def pop(self) -> tuple[i64, i64]:
        """The least entry (the caller checked the heap is not empty)."""
        hs = self.keys
        hj = self.vals
        top_s = hs[0]
        top_j = hj[0]
        n = self.n - 1
        self.n = n
        if n > 0:
            sift_down(hs, hj, self.nopos, n, 0, hs[n], hj[n])
        return top_s, top_j


class SlotHeap:
    """A binary min-heap of slots by a machine-integer key, each slot at most once, its
    position kept by slot (``pos``; -1: absent), so a slot's entry is removed in place:
    the CPU tier's LRU holds only live entries here (a raised or refreshed rank removes
    the old one), and a pop is never a stale entry."""

    def __init__(self) -> None:
        self.keys = vec[i64]()
        self.slots = vec[i64]()
        self.pos = vec[i64]()     # slot -> its index in the heap, -1 if absent
        self.n: i64 = 0

    def __len__(self) -> int:
        return self.n

    def has(self, s: i64) -> bool:
        return s < len(self.pos) and self.pos[s] >= 0

    def first(self) -> i64:
        """The least key (the caller checked the heap is not empty)."""
        return self.keys[0]

    def clear(self) -> None:
        pos = self.pos
        sl = self.slots
        for i in range(self.n):
            pos[sl[i]] = -1
        self.n = 0

    def push(self, key: i64, s: i64) -> None:
        """Add slot ``s`` (not in the heap) with ``key``."""
        pos = self.pos
        while len(pos) <= s:
            pos = append(pos, -1)
        self.pos = pos
        n = self.n
        if n == len(self.keys):
            self.keys = append(self.keys, key)
            self.slots = append(self.slots, s)
        self.n = n + 1
        sift_up(self.keys, self.slots, self.pos, n, key, s)

    def pop(self) -> tuple[i64, i64]:
        """The least (key, slot), removed (the caller checked the heap is not empty)."""
        key = self.keys[0]
        s = self.slots[0]
        self.pos[s] = -1
        n = self.n - 1
        self.n = n
        if n > 0:
            sift_down(self.keys, self.slots, self.pos, n, 0, self.keys[n], self.slots[n])
        return key, s

    def remove(self, s: i64) -> None:
        """Take slot ``s`` (in the heap) out."""
        i = self.pos[s]
        self.pos[s] = -1
        n = self.n - 1
        self.n = n
        if i == n:
            return
        key = self.keys[n]
        t = self.slots[n]
        if i > 0 and self.keys[(i - 1) >> 1] > key:
            sift_up(self.keys, self.slots, self.pos, i, key, t)
        else:
            sift_down(self.keys, self.slots, self.pos, n, i, key, t)
