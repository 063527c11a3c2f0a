"""A replica's cached keys as its KV cache events tell them: a block pool of keys alone.

A router that indexes a replica's ``BlockStored`` / ``BlockRemoved`` events (as llm-d's and
Dynamo's indexers do) knows which (prefix key, group) pairs the replica's pool holds, and
at which token each key ends, but nothing of the blocks themselves.  ``MirrorPool`` holds
exactly that: one id per stored key (a key stored twice, as vLLM does when a
recomputed prefix is cached beside its old copy, is held twice and survives one
``BlockRemoved``), with the pool's hash map and per-position counts kept as the real pool
keeps them.  A ``KVCacheManager`` built over it (``pool_factory=MirrorPool``) looks a
request up with the very code the replica runs (``find_longest_cache_hit``): the hit the
events allow, every group and the Mamba states included.  It never allocates.
"""
from __future__ import annotations

from librt.vecs import append, extend, vec
from mypy_extensions import i64

from sim.cache.block_pool import GROUP_BITS, NO_KEY, Block, BlockPool
from sim.cache.coordinator import Coordinator
from sim.cache.events import EventRecords
from sim.cache.hashing import PrefixKeys
from sim.cache.key_map import KeyMap


class MirrorPool(BlockPool):
    """Keys only (see the module docstring); ``num_blocks`` is not held: ids are handed
    out as keys are stored.

    A stored key gets an id of its own (a stand-in for the replica's block), and the
    id's key and hash-unit position are kept in two vecs: no ``Block`` object per key.
    Every id's entry in ``blocks`` is the one stand-in block (``blocks[1]``), so a
    lookup over this pool runs unchanged; nothing reads a mirror block's fields.  (A
    ``Block`` a stored key cost ~5 k CPU instructions a request on a 16-replica fleet,
    the cyclic GC traversing them.)"""

    def __init__(self, num_blocks: int, hash_block_size: int, lookahead: int = 0):
        super().__init__(2, hash_block_size, lookahead)   # the null block and the stand-in
        self.free_queue.popleft()   # (no free queue: nothing is ever allocated here)
        # sized as the replica's own map (its keys are at most about the replica's): never
        # grown key by key as the replica's cache fills
        self.key_map = KeyMap(2 * num_blocks)
        self.stand_in: Block = self.blocks[1]
        self.key_of = vec[i64]([NO_KEY, NO_KEY])   # per id: the key it holds (NO_KEY: free)
        self.unit_of = vec[i64]([NO_KEY, NO_KEY])  # per id: that key's hash-unit position
        self.free_ids = vec[i64]([1])              # ids free to reuse: the first ``nfree``
        self.nfree: i64 = 1                        # (a stack: no vec grown or cut an id)
        # ids handed out so far; ``blocks``, ``key_of`` and ``unit_of`` hold at least as
        # many entries, doubled when full (no list or vec appended to a new id)
        self.n_ids: i64 = 2

    def store(self, pool_key: i64, end: i64) -> None:
        """A ``BlockStored`` key: held once more, ending at token ``end``."""
        nf = self.nfree
        if nf > 0:
            nf -= 1
            bid = self.free_ids[nf]
            self.nfree = nf
        else:
            bid = self.n_ids
            self.n_ids = bid + 1
            if bid >= len(self.key_of):
                self._more_ids()
        self.key_map.add(pool_key, bid)      # (a fresh id: never mapped yet)
        u = end // self.hash_block_size
        self.key_of[bid] = pool_key
        self.unit_of[bid] = u
        slot = (u << GROUP_BITS) | (pool_key & ((1 << GROUP_BITS) - 1))
        ix = self.at_unit
        if slot < len(ix):   # (BlockPool._count_at inline, as insert_key has it)
            ix[slot] = ix[slot] + 1
        else:
            self._count_at(pool_key, u, 1)

    def _more_ids(self) -> None:
        """Twice the room for ids: every new entry the stand-in block, no key."""
        n = len(self.key_of)
        self.blocks.extend([self.stand_in] * n)
        none = vec[i64]([NO_KEY] * n)
        self.key_of = extend(self.key_of, none)
        self.unit_of = extend(self.unit_of, none)

    def remove(self, pool_key: i64) -> None:
        """A ``BlockRemoved`` key: held once less, by its first holder (a key not held:
        nothing)."""
        bid = self.key_map.take_first(pool_key)
        if bid >= 0:
            self._freed(pool_key, bid)

    def _freed(self, pool_key: i64, bid: i64) -> None:
        """Id ``bid`` no longer holds ``pool_key`` (unmapped already)."""
        slot = (self.unit_of[bid] << GROUP_BITS) | (pool_key & ((1 << GROUP_BITS) - 1))
        ix = self.at_unit
        ix[slot] = ix[slot] - 1   # (counted when stored: the slot exists)
        self.key_of[bid] = NO_KEY
        self.unit_of[bid] = NO_KEY
        nf = self.nfree
        if nf < len(self.free_ids):
            self.free_ids[nf] = bid
        else:
            self.free_ids = append(self.free_ids, bid)
        self.nfree = nf + 1

    def clear(self) -> None:
        """``AllBlocksCleared``."""
        key_of = self.key_of
        for bid in range(1, self.n_ids):
            k = key_of[bid]
            if k >= 0:
                self.key_map.remove(k, bid)
                self._freed(k, bid)


def catch_up(pool: MirrorPool, log: EventRecords, now: i64) -> None:
    """Apply every batch of ``log`` (the replica's events as records) visible by ``now``,
    in order."""
    b: i64 = log.bhead
    nb: i64 = len(log.bat_at)
    if b == nb or log.bat_at[b] > now:
        return
    keys = log.keys
    ends = log.ends
    j: i64 = log.head
    while b < nb and log.bat_at[b] <= now:
        stop = log.bat_end[b]
        while j < stop:
            e = ends[j]
            if e >= 0:
                pool.store(keys[j], e)
            elif keys[j] >= 0:
                pool.remove(keys[j])
            else:
                pool.clear()
            j += 1
        b += 1
    log.taken(b, j)


def catch_up_each(pools: list[MirrorPool], logs: list[EventRecords], now: i64) -> None:
    """``catch_up`` of every replica, in one call (a replica with no batch visible by
    ``now`` is passed over here: most are, at most arrivals)."""
    for i in range(len(pools)):
        log = logs[i]
        b: i64 = log.bhead
        if b < len(log.bat_at) and log.bat_at[b] <= now:
            catch_up(pools[i], log, now)


def leading_blocks(pool: BlockPool, keys: PrefixKeys, group: int, scale: int, n: int) -> int:
    """How many of the first ``n`` blocks (``scale`` hash units each) of a prompt with
    ``keys`` have their key held by ``pool`` in ``group``: an attention-only indexer's
    overlap (``sim/cluster/views.py``)."""
    km = pool.key_map
    j: i64 = 0
    while j < n and km.has((keys.key((j + 1) * scale - 1) << GROUP_BITS) | group):
        j += 1
    return j


def leading_held_each(pools: list[BlockPool], blocks: vec[i64], group: i64) -> vec[i64]:
    """``leading_blocks`` of each pool (replicas of one configuration) in one call, from
    the prompt's block keys built once (``blocks``: the keys ending its first whole
    blocks, ``PrefixKeys.block_keys``), in a vec (no int object a pool)."""
    out = vec[i64]()
    n = len(blocks)
    for pool in pools:
        km = pool.key_map
        j: i64 = 0
        while j < n and km.has((blocks[j] << GROUP_BITS) | group):
            j += 1
        out = append(out, j)
    return out


class CacheIndex:
    """What a router's cache view (``sim/cluster/views.py``) answers on every arrival,
    compiled, for replicas of one configuration: the attention overlap of every replica
    and one replica's resumable hit, over each replica's cache manager (``coordinators``:
    the replicas' own, or the mirrors their events build, then with ``records`` to catch
    up first).  ``group``: the first full-attention group (>= 0)."""

    def __init__(self, coordinators: list[Coordinator], pools: list[BlockPool],
                 mirrors: list[MirrorPool] | None, records: list[EventRecords] | None,
                 group: i64) -> None:
        self.coordinators = coordinators
        self.pools = pools
        self.mirrors = mirrors      # (``pools`` as mirrors, with their ``records``)
        self.records = records
        self.group = group

    def overlaps(self, now: i64, blocks: vec[i64]) -> vec[i64]:
        """Every replica's leading whole attention blocks of the prompt whose blocks'
        keys are ``blocks``, with every batch of events delivered by ``now`` applied."""
        mirrors = self.mirrors
        records = self.records
        if mirrors is not None and records is not None:
            catch_up_each(mirrors, records, now)
        return leading_held_each(self.pools, blocks, self.group)

    def hybrid_hit(self, i: i64, keys: PrefixKeys, tokens: i64) -> i64:
        """Replica ``i``'s resumable hit (tokens) of a ``tokens``-token prompt."""
        return self.coordinators[i].find_longest_cache_hit(keys, tokens - 1)[1]
