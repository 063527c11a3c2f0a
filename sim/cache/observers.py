"""What watches a block pool: one observer protocol, held as a list on the pool.

vLLM reports what its cache did through stats objects and ``take_events()``; the cache
model reports it to the observers on ``BlockPool.observers``: the KV event log
(``sim/cache/events.py``: vLLM's ``BlockStored`` / ``BlockRemoved`` queue) and the
eviction log (``sim/cache/evictions.py``: who evicted which key, when), each attached by
its ``KVCacheManager`` entry point (``enable_kv_events``, ``enable_eviction_log``).
Every call site tests the list first (``if pool.observers:``): with none attached (the
default) a site costs one truth test, and no key, list or event is made for anybody.  The
hooks of the cache's keying (``looked_up``, ``dropped``, ``caching_*``, ``stored_*``, and
``flush``, the step's batch of them) go to
the observers that hear them only (``hears_keys``: ``BlockPool.key_observers``): the
eviction log, on in every run that attributes misses, costs those sites nothing.

``PoolObserver`` is a plain (compiled) base class whose hooks do nothing: an observer
overrides the ones it needs, and the compiled pool and managers call them through the
class's method table.  The hooks, in the order a step meets them:

* ``new_step(now)``: ``KVCacheManager.new_step_starts`` (``now``: the step's time in ns,
  -1 when the caller has no clock, as a case file);
* ``looked_up(req, hit, blocks, kv)``: ``get_computed_blocks`` found ``hit`` tokens
  (``blocks``: its hit, per group);
* ``allocating(request_id)``: ``allocate_slots`` for that request starts (what its
  allocation evicts is its doing);
* ``evicted(key)``: ``get_new_blocks`` dropped ``key`` from a block it reuses, for a key
  of a group in the observer's ``watch`` mask only (the pool tests the mask inline, no
  call for the others);
* ``dropped(keys)``: the keys that were mapped to a block were dropped without an
  eviction (a partial key promoted to a full block, a re-keyed Mamba state, a state an
  admission policy takes back), primary first;
* ``caching_starts()`` / ``caching_ends()``: around one ``cache_blocks`` of every group;
* ``stored_full(...)``: a manager keyed full blocks (``cache_full_blocks``);
* ``stored_partial(...)``: a manager keyed a partial block (``cache_partial_block``) that
  did not hold the key;
* ``flush(now)``: the step's outputs are processed at ``now`` (the scheduler's ``update_from_output``;
  vLLM's engine core calls ``take_events`` there).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from librt.vecs import vec
from mypy_extensions import i64

if TYPE_CHECKING:
    from sim.cache.block_pool import Block
    from sim.cache.kv_manager import KVCacheManager
    from sim.cache.request import CacheRequest


class PoolObserver:
    """What watches a block pool (see the module docstring); every hook is a no-op.

    ``watch``: the group ids whose evicted keys ``evicted`` hears, as a bit mask (bit
    ``g``: group ``g``; -1: every group; 0, the default: none).  ``hears_keys``: whether
    it hears the cache's keying (``looked_up``, ``dropped``, ``flush``, ``caching_starts`` /
    ``caching_ends``, ``stored_full``, ``stored_partial``); False, the default: those
    hooks are not called on it."""

    __slots__ = ("watch", "hears_keys")

    def __init__(self) -> None:
        self.watch: i64 = 0
        self.hears_keys = False

    def new_step(self, now: int) -> None:
        """A step starts at ``now`` ns (-1: no clock); the previous one is over."""

    def looked_up(self, req: CacheRequest, hit: int, blocks: list[list[Block]],
                  kv: KVCacheManager) -> None:
        """A prefix lookup of ``req`` hit ``hit`` tokens (``blocks``: per group)."""

    def allocating(self, request_id: str) -> None:
        """An allocation for ``request_id`` starts: its evictions are its doing."""

    def evicted(self, key: i64) -> None:
        """``key`` (a pool key of a watched group) was dropped from a block reused now."""

    def dropped(self, keys: list[int]) -> None:
        """``keys``, mapped to one block, were dropped without an eviction."""

    def caching_starts(self) -> None:
        """One ``cache_blocks`` over every group starts."""

    def caching_ends(self) -> None:
        """That ``cache_blocks`` is done."""

    def stored_full(self, req: CacheRequest, tables: list[list[Block]], group_ids: list[int],
                    indices: list[int] | None, block_keys: vec[i64], block_size: int,
                    num_cached: int, num_full: int, unit: int) -> None:
        """Each member group (``tables[i]``: group ``group_ids[i]``'s blocks) keyed its
        blocks ``[num_cached, num_full)``, those at ``indices`` only (None: every one, with
        their keys in ``block_keys``, as the manager walked them; empty otherwise)."""

    def stored_partial(self, req: CacheRequest, unit_hash: int, end: int, unit: int,
                       group: int) -> None:
        """Group ``group`` keyed ``unit_hash``, the hash unit ending at token ``end``, on a
        block that did not hold it."""

    def flush(self, now: i64 = -1) -> None:
        """The step's outputs are processed at ``now`` ns (vLLM's ``take_events``)."""
