"""The two policy seams of the cache: admission (which computed states are kept) and
eviction order (which cached free block goes first).

A cache policy (``sim/cache/policies/``) builds its ``KVCacheManager`` with

* ``pool_factory`` -- the pool class (or any callable ``(num_blocks, hash_block_size,
  lookahead) -> BlockPool``).  The eviction order *is* the pool: ``BlockPool`` is vLLM's
  LRU free queue (the default, untouched and as fast as before), ``UnlimitedBlockPool``
  never evicts (``ideal``), ``UtilityBlockPool`` (``sim/cache/utility_pool.py``) asks an
  :class:`EvictionOrder` which cached free blocks go first (``marconi``);
* ``admission`` -- an :class:`Admission` the Mamba managers consult when a state becomes
  cacheable; ``None`` (the default) is vLLM's own rules, at the cost of one ``is not None``
  test per ``cache_blocks`` call.

A policy whose hits follow other rules than vLLM's lookup (``ideal``) replaces the
coordinator instead: ``KVCacheManager(coordinator_factory=...)`` takes any callable with
``get_coordinator``'s signature, ``(cfg, enable_caching, pool_factory, admission)``: the
manager's one frozen ``CacheConfig`` and the two seams above (``sim/cache/coordinator.py``:
``ideal_coordinator``).

Both seam classes are plain (interpreted) base classes rather than protocols so that the compiled
managers can hold them as typed attributes; a policy subclasses them in its own file.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.cache.request import CacheRequest


class Admission:
    """Which computed Mamba states a manager keeps (gives a pool key).

    The manager runs vLLM's sparse rules (``prefix_cache_retention_interval: 0``: the
    prompt's replay boundaries and the junction) with the positions ``boundaries``
    returns in place of the replay boundaries; the junction is always offered.  With
    ``sequence_end`` a state computed past the prompt (decode) replaces the one the
    request kept before it, so a request keeps one: its sequence's last."""

    sequence_end = False

    def boundaries(self, req: CacheRequest, num_tokens: int,
                   replay: tuple[int, ...]) -> tuple[int, ...]:
        """Positions whose states are kept for ``req`` after ``num_tokens`` computed
        tokens (``replay``: vLLM's, the prompt's replay boundaries)."""
        return replay

    def finished(self, request_id: str) -> None:
        """``request_id`` released its blocks (finished or preempted)."""


class EvictionOrder:
    """The order ``UtilityBlockPool`` evicts cached free blocks in (not LRU).

    The pool reports every block that becomes a cached free block (``released``: with
    the prefix length, in tokens, of the longest cached block released with it) and
    every one that stops being one without an eviction (``taken``: a hit, or its keys
    dropped); ``victims`` picks the ``k`` to evict now, in order, and forgets them."""

    def released(self, block_id: int, tokens: int) -> None:
        raise NotImplementedError

    def taken(self, block_id: int) -> None:
        raise NotImplementedError

    def victims(self, k: int) -> list[int]:
        raise NotImplementedError
