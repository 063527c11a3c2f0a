"""A replica's cached keys as its KV cache events tell them: a block pool of keys alone.

A router that indexes a replica's ``BlockStored`` / ``BlockRemoved`` events (as llm-d's and
Dynamo's indexers do) knows which (prefix key, group) pairs the replica's pool holds, and
at which token each key ends, but nothing of the blocks themselves.  ``MirrorPool`` holds
exactly that: one stand-in block per stored key (a key stored twice, as vLLM does when a
recomputed prefix is cached beside its old copy, is held twice and survives one
``BlockRemoved``), with the pool's hash map and per-position counts kept as the real pool
keeps them.  A ``KVCacheManager`` built over it (``pool_factory=MirrorPool``) looks a
request up with the very code the replica runs (``find_longest_cache_hit``): the hit the
events allow, every group and the Mamba states included.  It never allocates.
"""
from __future__ import annotations

from librt.vecs import vec
from mypy_extensions import i64

from sim.cache.block_pool import GROUP_BITS, Block, BlockPool
from sim.cache.events import EventRecords
from sim.cache.hashing import PrefixKeys


class MirrorPool(BlockPool):
    """Keys only (see the module docstring); ``num_blocks`` is not held: blocks are made
    as keys are stored."""

    def __init__(self, num_blocks: int, hash_block_size: int, lookahead: int = 0):
        super().__init__(2, hash_block_size, lookahead)   # the null block and one spare
        self.spare: list[Block] = [self.blocks[1]]
        self.free_queue.popleft()   # (no free queue: nothing is ever allocated here)

    def store(self, pool_key: i64, end: i64) -> None:
        """A ``BlockStored`` key: held once more, ending at token ``end``."""
        if self.spare:
            b = self.spare.pop()
        else:
            b = Block(len(self.blocks))
            self.blocks.append(b)
        self.insert_key(pool_key, b, end)

    def remove(self, pool_key: i64) -> None:
        """A ``BlockRemoved`` key: held once less (a key not held: nothing)."""
        bid = self.key_map.first(pool_key)
        if bid >= 0:
            b = self.blocks[bid]
            self._unmap_keys(b, None)
            self.spare.append(b)

    def clear(self) -> None:
        """``AllBlocksCleared``."""
        for b in self.blocks[1:]:
            if b.key >= 0:
                self._unmap_keys(b, None)
                self.spare.append(b)


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
    """``catch_up`` of every replica, in one call."""
    for i in range(len(pools)):
        catch_up(pools[i], logs[i], now)


def leading_blocks(pool: BlockPool, keys: PrefixKeys, group: int, scale: int, n: int) -> int:
    """How many of the first ``n`` blocks (``scale`` hash units each) of a prompt with
    ``keys`` have their key held by ``pool`` in ``group``: an attention-only indexer's
    overlap (``sim/cluster/views.py``)."""
    km = pool.key_map
    j: i64 = 0
    while j < n and km.has((keys.key((j + 1) * scale - 1) << GROUP_BITS) | group):
        j += 1
    return j


def leading_held_each(pools: list[BlockPool], blocks: vec[i64], group: i64) -> list[int]:
    """``leading_blocks`` of each pool (replicas of one configuration) in one call, from
    the prompt's block keys built once (``blocks``: the keys ending its first whole
    blocks, ``PrefixKeys.block_keys``)."""
    out: list[int] = []
    n = len(blocks)
    for pool in pools:
        km = pool.key_map
        j: i64 = 0
        while j < n and km.has((blocks[j] << GROUP_BITS) | group):
            j += 1
        out.append(j)
    return out
