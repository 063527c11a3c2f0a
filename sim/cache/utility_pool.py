"""A block pool whose cached free blocks are evicted in an order an ``EvictionOrder``
chooses (the eviction seam's second pool; ``cache.policy: marconi``).

It is vLLM's ``BlockPool`` in everything else -- the hash map, reference counts, the free
queue with uncached blocks in front and cached ones behind, the occupancy accounting --
so every rule of the managers holds unchanged.  Only which cached block an allocation
reuses differs: when the uncached free blocks at the front of the queue do not cover an
allocation, the order picks the cached free blocks to evict and the pool moves them to
the front just before the allocation pops them (so KV events and the eviction log, which
read the front of the queue, see the real victims).

Why compiled (``sim/native.py``): it subclasses the compiled ``BlockPool``, which an
interpreted class cannot.  The order itself (``sim/cache/seams.py``) is interpreted and
consulted once per block freed, hit or evicted -- never on the ``vllm`` policy's path.
"""
from __future__ import annotations

from mypy_extensions import i64

from sim.cache.block_pool import Block, BlockPool
from sim.cache.seams import EvictionOrder


class UtilityBlockPool(BlockPool):
    """``BlockPool`` with ``order`` choosing the cached blocks an allocation evicts."""

    def __init__(self, num_blocks: int, hash_block_size: int, lookahead: int,
                 order: EvictionOrder):
        super().__init__(num_blocks, hash_block_size, lookahead)
        self.order = order

    def cached_free(self) -> int:
        """Free blocks that hold a key (``occupied`` counts blocks in use and these)."""
        in_use = self.num_blocks - 1 - self.free_queue.num_free_blocks
        return int(self.occupied[0]) + int(self.occupied[1]) - in_use

    def make_room(self, n: i64) -> None:
        q = self.free_queue
        if n <= q.num_free_blocks:   # (else the pool raises, as vLLM's does)
            short = n - (q.num_free_blocks - self.cached_free())
            if short > 0:
                victims = self.order.victims(short)
                blocks = self.blocks
                for j in range(len(victims) - 1, -1, -1):   # the first victim ends in front
                    b = blocks[victims[j]]
                    q.remove(b)
                    q.insert_after(b, q.head)

    def touch(self, blocks: list[Block]) -> None:
        order = self.order
        for b in blocks:
            if b.ref_cnt == 0 and not b.is_null:
                order.taken(b.block_id)
        super().touch(blocks)

    def uncache(self, b: Block) -> None:
        if b.ref_cnt == 0 and b.key >= 0 and not b.is_null:
            self.order.taken(b.block_id)
        super().uncache(b)

    def free_tails(self, tables: list[list[Block]], start: i64) -> None:
        # (through ``free_blocks_each``, which prices what the frees release)
        lists: list[list[Block]] = []
        for blocks in tables:
            rev: list[Block] = []
            j = len(blocks) - 1
            while j >= start:
                rev.append(blocks[j])
                j -= 1
            lists.append(rev)
        self.free_blocks_each(lists)

    def free_skipped(self, tables: list[list[Block]], first: i64, last: i64,
                     drop_last: bool, last_idx: i64) -> None:
        # (through ``free_blocks_each``, which prices what the frees release)
        null = self.null_block
        lists: list[list[Block]] = []
        for blocks in tables:
            if first < last:
                freed: list[Block] = []
                for i in range(last - 1, first - 1, -1):
                    b = blocks[i]
                    if not b.is_null:
                        freed.append(b)
                        blocks[i] = null
                lists.append(freed)
            if drop_last and not blocks[last_idx].is_null:
                lists.append([blocks[last_idx]])
                blocks[last_idx] = null
        self.free_blocks_each(lists)

    def free_blocks_each(self, lists: list[list[Block]]) -> None:
        super().free_blocks_each(lists)
        # every block this call made a cached free block, priced with the longest cached
        # prefix released with it (a request's free releases its whole chain at once)
        tokens = 0
        for ordered in lists:
            for b in ordered:
                if b.ref_cnt == 0 and b.key >= 0 and not b.is_null and b.key_tokens > tokens:
                    tokens = b.key_tokens
        if tokens == 0:
            return
        order = self.order
        for ordered in lists:
            for b in ordered:   # (in the order the free queue took them: LRU ties stay LRU)
                if b.ref_cnt == 0 and b.key >= 0 and not b.is_null:
                    order.released(b.block_id, tokens)
