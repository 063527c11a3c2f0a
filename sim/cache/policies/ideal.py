"""``cache.policy: ideal``: the upper bound of every hit, with unlimited memory.

``checkpoints: every_unit`` (the default) keeps a reusable state -- attention KV and
Mamba state alike -- at every hash-unit boundary of every prefix any request has
computed, forever: a hybrid model then reuses what full attention alone would with
unlimited memory.  No vLLM check-point rule applies: no align grid (so no align-mode
chunk split), no retention, no junction flag, no EAGLE drop and no lookahead in the
keys; a hit is the longest computed prefix, floored to the hash unit (the ``vllm``
policy's resolved ``hash_block_size``), below the request's last token.

``checkpoints: vllm`` keeps every vLLM rule (align grid, retention, junction flag,
EAGLE, internal prefill checkpoints: the ``vllm`` policy's manager, unchanged) and
lifts only the memory limit.  Where memory does not bind it equals ``vllm``; the two
bounds split every loss of ``vllm`` into capacity (``vllm`` to ``ideal(checkpoints:
vllm)``) and check-point granularity (to ``ideal``).

Unlimited memory, in a run of a million requests: neither variant allocates for the
size it reports.  The pool is an ``UnlimitedBlockPool`` (``sim/cache/coordinator.py``):
it reports 2**40 blocks, so no request ever waits for blocks, is preempted or is
refused as too long for the pool, but it creates block objects lazily, at least
doubling when the free blocks without a key run short, and never evicts a cached
block; ``checkpoints: vllm`` thus holds one block object per state vLLM would keep
(a block per ``block_size`` tokens per attention group, the sparse Mamba states)
plus the running requests' tables.  ``every_unit`` keeps its states in a content
index instead (``IdealCoordinator``): one machine integer per distinct hash unit,
whatever the number of KV-cache groups, in an open-addressing table that doubles as it
fills (``bench/sim_bench.py million --set cache.policy=ideal``: 1,000,000 synthetic
requests, 4.9 M keys in a 134 MB table, 0.93 GiB peak RSS, 496 pool block objects), and its
pool holds only the running requests' tables (as with caching off, hit tokens
included).  The memory columns of its runs therefore report the working set, not the
cache; the cache is unbounded by definition.
"""
from __future__ import annotations

from dataclasses import dataclass

from sim.cache.coordinator import UnlimitedBlockPool, ideal_coordinator
from sim.cache.kv_manager import KVCacheManager
from sim.cache.policies.base import CacheSwitches, PoolShape
from sim.cache.policies.none import NoCachePolicy
from sim.cache.policies.vllm import VllmPolicy
from sim.errors import ConfigError

CHECKPOINTS = ("every_unit", "vllm")


@dataclass(frozen=True)
class IdealOptions:
    """The ``ideal`` policy's own key under ``cache:``."""

    checkpoints: str = "every_unit"    # every_unit | vllm: where reusable states exist

    def validate(self, prefix: str) -> None:
        if self.checkpoints not in CHECKPOINTS:
            raise ConfigError(prefix + "checkpoints", f"must be {' or '.join(CHECKPOINTS)}, "
                                                      f"got {self.checkpoints!r}")


class IdealPolicy:
    """Unlimited memory; a state at every hash unit (``every_unit``) or where vLLM
    keeps one (``vllm``)."""

    name = "ideal"
    options = IdealOptions

    def build(self, switches: CacheSwitches, options: IdealOptions,
              shape: PoolShape) -> KVCacheManager:
        vllm = VllmPolicy().cache_config(switches, shape)
        if options.checkpoints == "vllm":
            return KVCacheManager(vllm, pool_factory=UnlimitedBlockPool)
        unit = vllm.hash_block_size
        assert unit is not None   # resolved when the config was validated
        return KVCacheManager(NoCachePolicy().cache_config(shape),
                              coordinator_factory=ideal_coordinator(unit))
