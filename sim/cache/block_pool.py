"""Physical KV/state blocks, their reference counts, the prefix-cache hash map
and the LRU free queue — the behaviour of vLLM 0.33.0's ``BlockPool``.

Eviction order matters for exact hit lengths under memory pressure, so the
rules are kept precisely:

* a freed block whose ref count drops to 0 goes to the *back* of the free
  queue if it carries a hash (it stays hittable, LRU), to the *front* if not
  (it can never be hit, reuse it first);
* requests free their blocks tail first, so within one request the end of
  the chain is evicted first;
* allocation pops from the front and drops every hash the block carried;
* the free queue (``FreeBlockQueue``, vLLM's ``FreeKVCacheBlockQueue``) is, as in
  vLLM, a doubly linked list threaded through the blocks themselves
  (``prev_free``/``next_free``), between two sentinels: every operation is a few
  pointer updates, with no hashing or allocation;
* a block may carry several keys (a partial-prefix key beside its full-block
  key); one key may map to several blocks, and a lookup returns the block that
  was inserted first.

Beside the hash map the pool counts, per KV-cache group and per hash-unit position,
the keys mapped there (``at_unit``).  A key fingerprints one prefix length, so a
lookup that walks candidate positions (the Mamba state search, the partial keys of
full attention) can pass over every position where its group holds no key without
computing the key or probing the map: the same answer, found with less work.
"""
from __future__ import annotations

from typing import Final

from librt.vecs import append, vec
from mypy_extensions import i64

from sim.cache.key_map import KeyMap, grown
from sim.cache.observers import PoolObserver

GROUP_BITS: Final = 5  # up to 32 KV-cache groups
NO_KEY: Final = -1     # Block.key / key_tokens of a block without a key (keys are >= 0)


def make_key(block_hash: int, group_id: int) -> int:
    """``BlockHashWithGroupId`` as one int (hash in the high bits)."""
    return (block_hash << GROUP_BITS) | group_id


class Block:
    """One physical block. ``key`` is its primary pool key (``NO_KEY`` if none) and
    ``key_tokens`` the prefix length that key covers (machine integers: no boxed
    int per key in the compiled build)."""

    __slots__ = ("block_id", "ref_cnt", "key", "key_tokens", "key_unit", "is_null", "kind",
                 "prev_free", "next_free", "extra", "extra_units")

    def __init__(self, block_id: int):
        self.block_id: i64 = block_id
        self.ref_cnt: i64 = 0
        self.key: i64 = NO_KEY
        self.key_tokens: i64 = NO_KEY
        # the hash-unit position ``key`` fingerprints (``BlockPool.at_unit``'s index)
        self.key_unit: i64 = NO_KEY
        self.is_null = False
        self.kind: i64 = 0  # memory-accounting kind of the group that last allocated it
        # free-queue neighbours (meaningful only while the block is in the queue: a
        # block taken out keeps its stale ones, which nothing reads -- membership is
        # ``ref_cnt == 0``; the block itself before it first joins, never None)
        self.prev_free: Block = self
        self.next_free: Block = self
        # extra (non-primary) keys: a partial-prefix key beside the primary one (rare;
        # held on the block so the common checks read one field, not a map)
        self.extra: set[int] | None = None
        self.extra_units: dict[int, int] | None = None   # extra key -> its key_unit

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Block({self.block_id}, ref={self.ref_cnt}, tokens={self.key_tokens})"


class FreeBlockQueue:
    """vLLM's ``FreeKVCacheBlockQueue``: the free blocks in eviction order, a doubly
    linked list threaded through the blocks themselves (``prev_free``/``next_free``)
    between two sentinels, so that a block leaves from the middle (a hit on a free
    block) in a few pointer updates.  The front (``head.next_free``) is reused next.
    The pool's hot paths inline these methods, each copy marked ``# inline of
    FreeBlockQueue.<method>``."""

    def __init__(self) -> None:
        self.head = Block(-1)
        self.tail = Block(-2)
        self.head.next_free = self.tail
        self.tail.prev_free = self.head
        self.num_free_blocks: i64 = 0

    def insert_after(self, b: Block, before: Block) -> None:
        """Link ``b`` right after ``before`` (the head: the front)."""
        after = before.next_free
        before.next_free = b
        b.prev_free = before
        b.next_free = after
        after.prev_free = b
        self.num_free_blocks += 1

    def append(self, b: Block) -> None:
        """``b`` to the back (reused last)."""
        self.insert_after(b, self.tail.prev_free)

    def remove(self, b: Block) -> None:
        """Unlink ``b`` from wherever it is in the queue."""
        p = b.prev_free
        n = b.next_free
        p.next_free = n
        n.prev_free = p
        self.num_free_blocks -= 1

    def popleft(self) -> Block:
        """The front block, unlinked."""
        b = self.head.next_free
        if b is self.tail:
            raise ValueError("the free queue is empty")
        self.remove(b)
        return b

    def block_ids(self) -> list[int]:
        """The queue, front (next to be reused) to back."""
        out = []
        b = self.head.next_free
        while b is not self.tail:
            out.append(b.block_id)
            b = b.next_free
        return out


class BlockPool:
    """``num_blocks`` blocks; block 0 is the null block (never freed/cached)."""

    def __init__(self, num_blocks: int, hash_block_size: int, lookahead: int = 0):
        if num_blocks < 2:
            raise ValueError("num_blocks must be at least 2 (one is the null block)")
        # (machine integers: read at every allocation, caching call and lookup)
        self.num_blocks: i64 = num_blocks
        self.hash_block_size: i64 = hash_block_size
        self.lookahead: i64 = lookahead
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue()
        for b in self.blocks:
            self.free_queue.append(b)
        self.null_block = self.free_queue.popleft()
        self.null_block.is_null = True
        # the prefix-cache hash map: pool key -> the block(s) holding it
        self.key_map = KeyMap(2 * num_blocks)   # (a block may hold a partial key too)
        self.evicted_keys: i64 = 0  # keys dropped because their block was reused
        # Memory accounting: a block is *occupied* from allocation until it is
        # freed without a key or reused; cached (hittable) free blocks count.
        # ``kind_of_group`` maps a group id to an accounting kind (set by the
        # coordinator: 0 attention, 1 Mamba).
        self.kind_of_group: list[int] = []
        self.occupied = vec[i64]([0, 0])   # (machine integers: no boxing per update)
        self.peak = vec[i64]([0, 0])
        # what watches the pool (sim/cache/observers.py: the KV event log, the eviction
        # log); empty: nobody, one truth test per call site
        self.observers: list[PoolObserver] = []
        self.key_observers: list[PoolObserver] = []   # (those of them hearing the keying)
        # keys mapped at each hash-unit position u, per group g, at (u << GROUP_BITS) | g
        # (see the module docstring; grown as longer prefixes are keyed)
        self.at_unit = vec[i64]()
        # ``take_new_blocks``' list: the blocks of the latest allocation first
        self.fresh: list[Block] = []
        # ``free_skipped``'s scratch: the non-null indices of the range it frees
        self._live = vec[i64]()
        # the ids of the blocks handed out since a KV connector asked (``popping``: the
        # first ``n_popped`` of ``popped``; machine integers, no Python int an id)
        self.popping = False
        self.popped = vec[i64]()
        self.n_popped: i64 = 0

    # -- lookups -------------------------------------------------------------
    def get_cached_block(self, block_hash: int, group_ids: list[int]) -> list[Block] | None:
        out = []
        km = self.key_map
        blocks = self.blocks
        base = block_hash << GROUP_BITS
        for gid in group_ids:
            bid = km.first(base | gid)
            if bid < 0:
                return None
            out.append(blocks[bid])
        return out

    def contains(self, key: int, block_id: int) -> bool:
        return self.key_map.maps(key, block_id)

    def cached_items(self) -> dict[int, list[int]]:
        """Every cached pool key and the ids of the blocks holding it (tests, tools)."""
        return self.key_map.items()

    # -- hash map maintenance -------------------------------------------------
    def _count_at(self, key: i64, unit: i64, d: i64) -> None:
        """``d`` more keys of ``key``'s group mapped at hash-unit position ``unit``."""
        slot = (unit << GROUP_BITS) | (key & ((1 << GROUP_BITS) - 1))
        ix = self.at_unit
        if slot >= len(ix):
            # (grown to twice the slots needed: amortised, and a run's longest prefix
            # bounds it)
            grown = vec[i64]([0] * (2 * slot + 2))
            for i in range(len(ix)):
                grown[i] = ix[i]
            ix = self.at_unit = grown
        ix[slot] = ix[slot] + d

    def insert_key(self, key: i64, block: Block, num_tokens: i64, unit: i64 = -1) -> None:
        """Map ``key`` to ``block``: its primary key (covering ``num_tokens``) if it has
        none, else an extra one.  ``unit``: the hash-unit position ``key`` fingerprints
        (-1: ``num_tokens``'s)."""
        bk = block.key
        if bk == key:
            return
        if not self.key_map.add(key, block.block_id):
            return   # (already mapped to this block)
        u: i64 = unit if unit >= 0 else num_tokens // self.hash_block_size
        slot = (u << GROUP_BITS) | (key & ((1 << GROUP_BITS) - 1))
        ix = self.at_unit
        if slot < len(ix):   # inline of BlockPool._count_at (a call a key cached)
            ix[slot] = ix[slot] + 1
        else:
            self._count_at(key, u, 1)
        if bk < 0:
            block.key = key
            block.key_tokens = num_tokens
            block.key_unit = u
        else:
            if block.extra is None:
                block.extra = set()
                block.extra_units = {}
            block.extra.add(key)
            eu = block.extra_units
            assert eu is not None
            eu[key] = u

    def _unmap_keys(self, block: Block, out: list[int] | None) -> None:
        """Unmap every key of ``block``; with ``out``, append the keys that were mapped
        to it (primary first)."""
        key = block.key
        extra = block.extra
        unit = block.key_unit
        block.key = NO_KEY
        block.key_tokens = NO_KEY
        block.key_unit = NO_KEY
        km = self.key_map
        bid = block.block_id
        if key >= 0 and km.remove(key, bid):
            self._count_at(key, unit, -1)
            if out is not None:
                out.append(key)
        if extra is not None:
            units = block.extra_units
            assert units is not None
            block.extra = None
            block.extra_units = None
            for k in extra:
                if km.remove(k, bid):
                    self._count_at(k, units[k], -1)
                    if out is not None:
                        out.append(k)

    def remove_keys(self, block: Block) -> list[int]:
        """Unmap every key of ``block``; the keys that were mapped to it."""
        out: list[int] = []
        self._unmap_keys(block, out)
        return out

    def drop_keys(self, block: Block) -> None:
        """Unmap every key of ``block`` (vLLM's ``_remove_cached_block_hashes``); the
        observers told the keys that were mapped to it (``dropped``: the KV event log's
        ``BlockRemoved``s).  With none, no key is listed."""
        obs = self.key_observers
        if not obs:
            self._unmap_keys(block, None)
            return
        gone = self.remove_keys(block)
        if gone:
            for o in obs:
                o.dropped(gone)

    def move_keys(self, src: Block, dst: Block) -> None:
        """Re-point every key of ``src`` to ``dst`` (Mamba partial-tail CoW)."""
        num_tokens = src.key_tokens
        key = src.key
        if (key >= 0 and dst.key < 0 and src.extra is None and dst.extra is None
                and self.key_map.only(key) == src.block_id):
            # the common case (one key, mapped to src alone; dst fresh): the same
            # end state as remove + insert, in one map operation (the key stays at
            # its position: ``at_unit`` unchanged)
            self.key_map.repoint(key, dst.block_id)
            dst.key = key
            dst.key_tokens = num_tokens
            dst.key_unit = src.key_unit
            src.key = NO_KEY
            src.key_tokens = NO_KEY
            src.key_unit = NO_KEY
            return
        # each key keeps the position it fingerprints (an extra key's own)
        units: dict[int, int] = {}
        if key >= 0:
            units[key] = src.key_unit
        if src.extra_units is not None:
            units.update(src.extra_units)
        for k in self.remove_keys(src):
            self.insert_key(k, dst, num_tokens, units[k])

    # -- caching ---------------------------------------------------------------
    def cache_full_blocks(self, block_hashes: list[int], blocks: list[Block],
                          indices: list[int], block_size: int, group_id: int) -> None:
        """Key ``blocks[indices[j]]`` by ``block_hashes[j]``, the hash at that
        block's end."""
        j = 0
        for i in indices:
            blk = blocks[i]
            h = block_hashes[j]
            j += 1
            if blk.is_null:
                continue
            key = make_key(h, group_id)
            if blk.key >= 0:
                # partial -> full promotion of the same block drops its old keys
                self.drop_keys(blk)
            self.insert_key(key, blk, (i + 1) * block_size)

    def cache_full_range(self, block_hashes: vec[i64], blocks: list[Block], first: i64,
                         block_size: i64, group_id: i64) -> None:
        """``cache_full_blocks`` of the consecutive blocks ``first`` ..
        ``first + len(block_hashes) - 1`` (keys in a vec: no index list, no boxed key)."""
        n = len(block_hashes)
        base = (first + 1) * block_size
        j: i64 = 0
        while j < n:
            blk = blocks[first + j]
            h = block_hashes[j]
            if not blk.is_null:
                key = (h << GROUP_BITS) | group_id
                if blk.key >= 0:
                    # partial -> full promotion of the same block drops its old keys
                    self.drop_keys(blk)
                self.insert_key(key, blk, base + j * block_size)
            j += 1

    def cache_partial_block(self, unit_hash: i64, block: Block, num_tokens: i64,
                            group_id: i64) -> i64:
        """Register ``unit_hash``, the hash of the unit ending at ``num_tokens`` (a
        hash-unit boundary inside ``block``); the pool key, or ``NO_KEY`` for the null
        block (a machine integer: no int object a call)."""
        if block.is_null:
            return NO_KEY
        end = num_tokens // self.hash_block_size * self.hash_block_size
        key = (unit_hash << GROUP_BITS) | group_id
        bk = block.key
        if bk >= 0 and bk != key:
            kt = block.key_tokens
            if kt >= 0 and kt < end and not self.contains(key, block.block_id):
                self.drop_keys(block)
        self.insert_key(key, block, end)
        return key

    def free_block_ids(self) -> list[int]:
        """The free queue, front (next to be reused) to back."""
        return self.free_queue.block_ids()

    # -- allocation and freeing -----------------------------------------------
    def num_free(self) -> int:
        return self.free_queue.num_free_blocks

    def make_room(self, n: i64) -> None:
        """Arrange the free queue before ``n`` blocks are taken from its front (a pool
        that chooses its own victims, or grows, overrides this; vLLM's takes them as
        they come)."""

    def get_new_blocks(self, n: i64, group_id: i64 = 0) -> list[Block]:
        """``n`` blocks from the front of the free queue, in a new list."""
        return self.take_new_blocks(n, group_id)[:n]

    def take_new_blocks(self, n: i64, group_id: i64 = 0) -> list[Block]:
        """``get_new_blocks`` into the pool's own list, valid until the next call: its
        first ``n`` entries are the blocks (the cache managers read them at once; no
        list is built and freed per allocation)."""
        self.make_room(n)
        q = self.free_queue
        if n > q.num_free_blocks:
            raise ValueError(f"Cannot get {n} free blocks from the pool")
        head = q.head
        out = self.fresh
        while len(out) < n:   # (grown once to the largest allocation; every slot below n written)
            out.append(head)
        occ = self.occupied
        kind = self.kind_of_group[group_id] if self.kind_of_group else 0
        km = self.key_map
        obs = self.observers
        ix = self.at_unit
        # (with a KV connector: each block's id listed in ``popped`` as it is taken)
        popping = self.popping
        m: i64 = self.n_popped
        pv = self.popped
        if popping and m + n > len(pv):
            pv = self.popped = grown(pv, m + n)
        i: i64 = 0
        while i < n:
            # inline of FreeBlockQueue.popleft (once per block; the count once, below)
            b = head.next_free
            nxt = b.next_free
            head.next_free = nxt
            nxt.prev_free = head
            key = b.key
            if key >= 0:
                if b.extra is None and km.remove(key, b.block_id):
                    # the common eviction: one key (mapped to this block; counted at its
                    # position, which ``insert_key`` made room for)
                    # inline of BlockPool._count_at
                    slot = (b.key_unit << GROUP_BITS) | (key & ((1 << GROUP_BITS) - 1))
                    ix[slot] = ix[slot] - 1
                    b.key = NO_KEY
                    b.key_tokens = NO_KEY
                    b.key_unit = NO_KEY
                    self.evicted_keys += 1
                    if obs:
                        # (each observer told the keys of the groups it watches only)
                        for ob in obs:
                            if (ob.watch >> (key & 31)) & 1:
                                ob.evicted(key)
                else:
                    gone = self.remove_keys(b)
                    self.evicted_keys += len(gone)
                    if obs:
                        for gk in gone:
                            for ob in obs:
                                if (ob.watch >> (gk & 31)) & 1:
                                    ob.evicted(gk)
                k = b.kind
                occ[k] = occ[k] - 1
            b.ref_cnt += 1
            b.kind = kind
            out[i] = b
            if popping:
                pv[m + i] = b.block_id
            i += 1
        q.num_free_blocks -= n   # (n <= the free count, checked above: no sentinel popped)
        if popping:
            self.n_popped = m + n
        o = occ[kind] + n
        occ[kind] = o
        if o > self.peak[kind]:
            self.peak[kind] = o
        return out

    def start_popping(self) -> None:
        """List the ids of the blocks handed out from now on (``popped``), from none."""
        self.popping = True
        self.n_popped = 0

    def stop_popping(self) -> None:
        self.popping = False
        self.n_popped = 0

    def peak_by_group(self, group_ids: list[int]) -> int:
        """Peak occupied blocks of the accounting kind of ``group_ids``."""
        if not group_ids or not self.kind_of_group:
            return 0
        return self.peak[self.kind_of_group[group_ids[0]]]

    def touch(self, blocks: list[Block]) -> None:
        for b in blocks:
            if b.is_null:
                continue
            if b.ref_cnt == 0:
                self.free_queue.remove(b)
            b.ref_cnt += 1

    def uncache(self, b: Block) -> None:
        """Drop every key of ``b``: an admission policy taking back a state it kept
        (``cache.policy: marconi``'s provisional sequence end; vLLM never does).  A free
        block then moves to the front of the queue, as a block freed without a key."""
        if b.is_null or (b.key < 0 and b.extra is None):
            return
        self.drop_keys(b)
        if b.ref_cnt == 0:
            q = self.free_queue
            q.remove(b)
            q.insert_after(b, q.head)
            self.occupied[b.kind] -= 1

    def free_blocks(self, ordered: list[Block]) -> None:
        """Release one reference of each block; order = eviction priority."""
        self.free_blocks_each([ordered])

    def _free_one(self, b: Block, cursor: Block) -> Block:
        """Release one reference of ``b`` (not the null block), as one ``free_blocks``
        call does: left unreferenced, it goes to the back of the free queue if it has
        a key, else right after ``cursor`` -- the call's last block moved to the front
        (the head at the call's start), so the call's unhashed blocks keep their order
        ahead of earlier calls' ones.  Returns the cursor for the call's next block."""
        b.ref_cnt -= 1
        if b.ref_cnt != 0:
            return cursor
        q = self.free_queue
        q.num_free_blocks += 1
        if b.key < 0:
            self.occupied[b.kind] -= 1
            # inline of FreeBlockQueue.insert_after (the count above)
            nx = cursor.next_free
            cursor.next_free = b
            b.prev_free = cursor
            b.next_free = nx
            nx.prev_free = b
            return b
        # inline of FreeBlockQueue.append (the count above)
        tail = q.tail
        p = tail.prev_free
        p.next_free = b
        b.prev_free = p
        b.next_free = tail
        tail.prev_free = b
        return cursor

    def free_tails(self, tables: list[list[Block]], start: i64) -> None:
        """``free_blocks`` of each list of ``tables`` from ``start``, tail first, list
        after list (a finished request's blocks, member by member; no reversed
        copies)."""
        head = self.free_queue.head
        for blocks in tables:
            cursor = head
            j: i64 = len(blocks) - 1
            while j >= start:
                b = blocks[j]
                j -= 1
                if not b.is_null:
                    cursor = self._free_one(b, cursor)

    def free_skipped(self, tables: list[list[Block]], first: i64, last: i64,
                     drop_last: bool, last_idx: i64) -> None:
        """For each list of ``tables`` in turn: ``free_blocks`` of its blocks ``last - 1``
        down to ``first`` (those not null), then, with ``drop_last``, of its block
        ``last_idx`` (if not null); each freed entry becomes the null block (a Mamba
        request's skipped states and its previous running state, member by member,
        as one manager per group frees them; no lists).  The members' tables have one
        null pattern (``SingleTypeManager``): the first one's non-null entries of the
        range, found once, are every member's (the rest of the range is not read)."""
        head = self.free_queue.head
        null = self.null_block
        live = self._live
        nl: i64 = 0
        if first < last and tables:
            b0 = tables[0]
            i = last - 1
            while i >= first:
                if not b0[i].is_null:
                    if nl < len(live):
                        live[nl] = i
                    else:
                        live = self._live = append(live, i)
                    nl += 1
                i -= 1
        for blocks in tables:
            if nl:
                cursor = head
                k: i64 = 0
                while k < nl:
                    i = live[k]
                    b = blocks[i]
                    blocks[i] = null
                    cursor = self._free_one(b, cursor)
                    k += 1
            if drop_last:
                b = blocks[last_idx]
                if not b.is_null:
                    blocks[last_idx] = null
                    self._free_one(b, head)

    def free_blocks_each(self, lists: list[list[Block]]) -> None:
        """``free_blocks(l)`` for each ``l`` in turn, in one call: each call appends its
        hashed blocks to the back (in order) and moves its unhashed ones to the front
        (keeping their order, ahead of earlier calls' ones): ``_free_one``."""
        head = self.free_queue.head
        for ordered in lists:
            cursor = head
            for b in ordered:
                if not b.is_null:
                    cursor = self._free_one(b, cursor)
