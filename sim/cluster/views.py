"""What a router may know of the replicas' caches (``cluster.router.view``).

* ``oracle``: each replica's own cache manager, asked directly (a lookup that changes
  nothing): the upper bound of any view.  Only ``hybrid_aware`` takes it.
* ``events``: an index built only from the KV events each replica publishes (vLLM 0.33.0's
  ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``, with their group), delivered
  ``event_lag_ms`` after the step that published them, in the batches vLLM publishes (one
  per step, after its outputs).  Per replica the index is a ``MirrorPool``
  (``sim/cache/mirror_pool.py``) under a cache manager of the replica's own configuration,
  so the hybrid hit it answers is the one the replica's lookup would give had its pool
  held exactly what the events said.  vLLM's event defects stay (the replica publishes
  them) unless ``kv_events.fix_emit`` is set.
* ``approximate``: the router's own history of what it sent where, never asking a
  replica (``sim/cluster/approximate.py``; each router says how it keeps it).

Each view answers, per replica, the *hybrid* hit (every group reconciled, Mamba state
included, under the replica's rules) and the *attention* overlap an attention-only router
computes: the leading whole attention blocks of the prompt the replica holds.
"""
from __future__ import annotations

from typing import Any

from librt.vecs import vec
from mypy_extensions import i64

from sim.cache.events import EventRecords, KVEventLog
from sim.cache.kv_manager import KVCacheManager
from sim.cache.mirror_pool import (CacheIndex, MirrorPool, catch_up_each, leading_blocks,
                                   leading_held_each)
from sim.engine.door import Prompt   # (an arrival's prompt: compiled with the engine)

VIEWS = ("oracle", "events", "approximate")


def full_group(kv: Any) -> tuple[int, int]:
    """(the first full-attention group, its block in hash units) of a cache manager;
    group -1 when it has none."""
    c = kv.coordinator
    g = next((i for i, s in enumerate(c.specs) if s.kind == "full"), -1)
    if g < 0:
        return -1, 1
    return g, c.manager_of[g].block_size // c.hash_block_size


def attention_blocks(pool: Any, kv: Any, keys: Any, tokens: int,
                     shape: tuple[int, int, int] | None = None) -> int:
    """Leading whole attention blocks of a ``tokens``-token prompt whose key ``pool``
    holds in the first full-attention group: what an attention-only indexer (Dynamo's,
    llm-d's) counts as the overlap (no Mamba group, no EAGLE drop).  ``shape``: ``kv``'s
    (group, block in hash units, hash unit), when known."""
    g, scale, unit = shape if shape is not None else (*full_group(kv),
                                                      kv.coordinator.hash_block_size)
    if g < 0:
        return 0
    n = min(tokens // (scale * unit), keys.count // scale)
    return leading_blocks(pool, keys, g, scale, n)


def _shape(kv: Any) -> tuple[int, int, int]:
    return (*full_group(kv), kv.coordinator.hash_block_size)


def block_size_of(kv: Any) -> int:
    """The attention block size (tokens) of a replica's cache (its first group's when it
    has no full attention)."""
    c = kv.coordinator
    for s, m in zip(c.specs, c.manager_of):
        if s.kind == "full":
            return m.block_size
    return c.manager_of[0].block_size


def _attention_each(view: Any, prompt: Prompt, blocks: Any = None) -> Any:
    """``attention_blocks`` of every replica: one compiled call when the replicas share
    one configuration (one set of keys, one group layout), else replica by replica.
    ``blocks``: the prompt's whole attention blocks' keys under the first replica's
    configuration, when the caller built them (``kv_router.prompt_blocks``)."""
    kvs = view.kvs
    if view.uniform:
        g, scale, unit = view.shapes[0]
        if g < 0:
            return vec[i64]([0] * len(kvs))
        if blocks is None:       # (the keys walked once for every pool)
            keys = prompt.keys_for(kvs[0])
            blocks = keys.block_keys(0, min(prompt.tokens // (scale * unit),
                                            keys.count // scale), scale)
        return leading_held_each(view.pools, blocks, g)
    return vec[i64]([view.attention_blocks(i, prompt) for i in range(len(kvs))])


def _uniform(kvs: list) -> bool:
    c0 = kvs[0].cfg
    return all(kv.cfg == c0 for kv in kvs)


class _ManagersView:
    """What both views answer from a list of cache managers (``kvs``: the replicas' own,
    or the mirrors their events build), one per replica."""

    def __init__(self, kvs: list, records: list | None = None):
        """``records``: when ``kvs`` are mirrors, each one's event records (the index
        catches them up before it answers)."""
        self.kvs = kvs
        self.shapes = [_shape(kv) for kv in kvs]
        self.uniform = _uniform(kvs)
        self.pools = [kv.pool for kv in kvs]
        self.group = self.shapes[0][0] if self.uniform else -1   # (the fast path's)
        # the compiled answers a router asks on every arrival (replicas of one
        # configuration with full attention; None otherwise): ``index.overlaps`` is
        # ``overlaps`` given the blocks, ``index.hybrid_hit`` is ``hybrid_hit`` given
        # the keys, without this class's Python frames
        self.index: CacheIndex | None = None
        if self.group >= 0:
            self.index = CacheIndex([kv.coordinator for kv in kvs], self.pools,
                                    self.pools if records is not None else None, records,
                                    self.group)

    def attention_each(self, prompt: Prompt, blocks: Any = None) -> Any:
        """The leading whole attention blocks of the prompt each replica holds, in a
        ``vec[i64]`` (``blocks``: as for ``_attention_each``)."""
        if blocks is not None and self.group >= 0:   # (the common call: one compiled call)
            return leading_held_each(self.pools, blocks, self.group)
        return _attention_each(self, prompt, blocks)

    def overlaps(self, now: int, prompt: Prompt, blocks: Any = None) -> Any:
        """``advance(now)``, then ``attention_each``: what an arrival asks first."""
        self.advance(now)
        return self.attention_each(prompt, blocks)

    def hybrid_hit(self, i: int, prompt: Prompt, keys: Any = None) -> int:
        """Replica ``i``'s resumable hit as this view knows it; ``keys``: the prompt's keys
        under the first replica's configuration, when the caller has them."""
        kv = self.kvs[i]
        if keys is None or not self.uniform:
            keys = prompt.keys_for(kv)
        return kv.coordinator.find_longest_cache_hit(keys, prompt.tokens - 1)[1]

    def attention_blocks(self, i: int, prompt: Prompt) -> int:
        kv = self.kvs[i]
        return attention_blocks(kv.pool, kv, prompt.keys_for(kv), prompt.tokens,
                                self.shapes[i])

    def size(self, i: int) -> int:
        """Keys replica ``i``'s pool or index holds (Dynamo's tie-break: the smaller
        index tree)."""
        return len(self.kvs[i].pool.key_map)


class OracleView(_ManagersView):
    """The replicas' own managers (``view: oracle``)."""

    name = "oracle"

    def __init__(self, replicas: list):
        super().__init__([r.dep.kv for r in replicas])

    def advance(self, now: int) -> None:
        pass


class EventsView(_ManagersView):
    """An index of each replica's cache built from its KV events (``view: events``): its
    ``kvs`` are cache managers over ``MirrorPool``s."""

    name = "events"

    def __init__(self, replicas: list, lag_ns: int):
        self.lag_ns = lag_ns
        # each replica's events as records (``EventRecords``), in its publish order, and
        # read replica by replica: replicas publish out of time order (each is run as far
        # as the fleet needs it), and none waits behind another replica's later batch
        self.records = [EventRecords(lag_ns) for _ in replicas]
        super().__init__([KVCacheManager(r.dep.kv.cfg, pool_factory=MirrorPool)
                          for r in replicas], self.records)

    def advance(self, now: int) -> None:
        """Apply every batch delivered by ``now``."""
        catch_up_each(self.pools, self.records, now)


def _no_sink(step: int, events: list) -> None:
    """(a log queueing records hands no batch to a sink)"""


def attach_events(view: EventsView, replicas: list, sc) -> None:
    """Have every replica publish its KV events to ``view`` after each step as records:
    its log queues them there (``KVEventLog(records=...)``: no object per event), or,
    when the run writes its own stream (``sim run --kv-events``), each published batch of
    event objects is turned into records too (``EventRecords.event``)."""
    sec = sc.kv_events
    for rep, records in zip(replicas, view.records):
        kv = rep.dep.kv
        log = kv.event_log
        if log is None:
            kv.enable_kv_events(KVEventLog(_no_sink, report_mode=sec.report_mode,
                                           fix_emit=sec.fix_emit, records=records))
            continue
        first = log.sink          # (the run's own stream too: both get every batch)

        def tee(step: int, events: list, first=first, records=records,
                sched=rep.sched) -> None:
            first(step, events)
            for ev in events:
                records.event(ev)
            records.seal(sched.publish_time)

        log.sink = tee
