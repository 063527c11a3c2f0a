"""vLLM 0.33.0's KV cache events, as its ``BlockPool`` queues them.

With ``--kv-events-config '{"enable_kv_cache_events": true}'`` vLLM queues a
``BlockStored`` each time it caches blocks, a ``BlockRemoved`` for each key it drops,
and publishes the queue once per engine step.  The cache model queues the same events
at the same places into a ``KVEventLog``, one of the block pool's observers
(``sim/cache/observers.py``; ``KVCacheManager.enable_kv_events`` attaches it): with no
observer (the default) every call site costs a single truth test.

Where vLLM queues, and where we do (the pool, the managers and the cache manager call the
log's hooks):

* ``cache_full_blocks``: per group, the keys of the new full, non-null, unmasked
  blocks; the token range spans every new block, null ones included; the parent is the
  key at the group's previously cached end (which may be a null block).  Promoting a
  block that held a partial entry first removes that entry.
* ``cache_partial_block``: one key at the prompt tail (hash unit < block), unless that
  block already holds it; an older, shorter entry of the block is removed first (the
  internal-checkpoint block is re-keyed whatever it held: ``replace``).
* ``get_new_blocks``: one ``BlockRemoved`` per key of each cached block it reuses (the
  pool tells its observers each key it evicts: ``evicted``).
* ``emit_cached_block_events`` (``kv_cache_report_mode: full``): at admission with a
  hit, per group one ``BlockStored`` naming the keys at every position of the group's hit
  list -- null Mamba / sliding-window blocks and a partly hit tail block included, keys
  the pool never held; and ``IndexError`` when that list reaches past the request's
  block-size hash view (``fail``; vLLM's engine dies there).  ``fix_emit`` publishes
  only the keys the pool holds instead, and never raises.
* moves (copy-on-write of a Mamba state) and frees publish nothing.

Events are plain records (``Stored``, ``Removed``, ``Cleared``) holding prefix keys and
token positions; ``CanonicalForm`` turns them into the oracle's comparable form
(positions instead of hashes), ``sim/rundir/kv_events.py`` into vLLM's wire records.
``EventRecords`` queues the same events as (pool key, end) pairs in vecs, for a reader in
this process (a router's mirror of the replica, ``sim/cache/mirror_pool.py``): no object per
event.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Final

from librt.vecs import append, vec
from mypy_extensions import i64

from sim.cache.key_map import grown
from sim.cache.observers import PoolObserver

if TYPE_CHECKING:
    from sim.cache.block_pool import Block, BlockPool
    from sim.cache.kv_manager import KVCacheManager
    from sim.cache.request import CacheRequest

GROUP_BITS: Final = 5   # (as sim.cache.block_pool: a pool key is prefix key << 5 | group)

# where a BlockStored came from (not part of vLLM's record: tools and `sim events check`)
FULL = "full"            # cache_full_blocks
PARTIAL = "partial"      # cache_partial_block (prompt tail, Mamba junction / checkpoint)
ANNOUNCE = "announce"    # emit_cached_block_events (report_mode full)


class Stored:
    """A ``BlockStored``: ``keys[i]`` is the prefix key ending at token ``ends[i]``;
    the event's tokens are ``[tok_start, tok_end)`` of ``req``'s sequence."""

    __slots__ = ("group", "req", "keys", "ends", "block_size", "tok_start", "tok_end",
                 "parent_key", "parent_end", "source", "seq_len")

    def __init__(self, group: int, req: CacheRequest, keys: list[int], ends: list[int],
                 block_size: int, tok_start: int, tok_end: int, parent_key: int,
                 parent_end: int | None, source: str):
        self.group = group
        self.req = req
        self.keys = keys
        self.ends = ends
        self.block_size = block_size
        self.tok_start = tok_start
        self.tok_end = tok_end
        self.parent_key = parent_key      # -1: none
        self.parent_end = parent_end
        self.source = source
        self.seq_len = req.num_tokens      # (token slices stop here, as vLLM's did then)

    @property
    def pool_keys(self) -> list[int]:
        return [(k << GROUP_BITS) | self.group for k in self.keys]


class Removed:
    """A ``BlockRemoved`` of one pool key (vLLM 0.33 emits one hash per event)."""

    __slots__ = ("pool_key",)

    def __init__(self, pool_key: int):
        self.pool_key = pool_key

    @property
    def group(self) -> int:
        return self.pool_key & ((1 << GROUP_BITS) - 1)

    @property
    def key(self) -> int:
        return self.pool_key >> GROUP_BITS


class Cleared:
    """``AllBlocksCleared`` (``reset_prefix_cache``; nothing in a replay calls it)."""

    __slots__ = ()


Event = Stored | Removed | Cleared


class EventRecords:
    """The events of one pool as machine-integer records, for a reader in this process (a
    router's ``MirrorPool``, ``sim/cluster/views.py``): what a ``KVEventLog`` given it
    queues instead of event objects.

    Record ``j`` is ``(keys[j], ends[j])``: a ``BlockStored`` pool key ending at token
    ``ends[j]``, a ``BlockRemoved`` pool key (end -1), or ``AllBlocksCleared`` (key -1),
    in the order the log publishes its events (a ``BlockStored`` of several keys is one
    record each, in its order).  A published batch is ``(visible ns, end record)``:
    ``lag_ns`` after the step's outputs were processed.  The reader (``MirrorPool``'s
    ``catch_up``) applies the batches visible by a time and hands back what it read
    (``taken``)."""

    def __init__(self, lag_ns: i64 = 0) -> None:
        self.lag_ns: i64 = lag_ns
        # the records held are the first ``n`` of two buffers, doubled when full (a record
        # is two stores, not two vec appends)
        self.keys = vec[i64]([0] * 64)
        self.ends = vec[i64]([0] * 64)
        self.n: i64 = 0
        self.bat_at = vec[i64]()      # per batch: visible from (ns)
        self.bat_end = vec[i64]()     # per batch: its records end here
        self.head: i64 = 0            # records read
        self.bhead: i64 = 0           # batches read
        self.sealed: i64 = 0          # records in batches
        self.last_ns: i64 = 0         # when the latest batch was published
        self.published: i64 = 0       # records in batches so far
        self.mark: i64 = 0            # (``caching_starts``: the records' count then)

    def put(self, key: i64, end: i64) -> None:
        n = self.n
        if n == len(self.keys):
            self._room(1)
        self.keys[n] = key
        self.ends[n] = end
        self.n = n + 1

    def _room(self, more: i64) -> None:
        """Buffers with room for ``more`` records beyond those held."""
        need = self.n + more
        if need > len(self.keys):
            self.keys = grown(self.keys, need)
            self.ends = grown(self.ends, need)

    def held(self) -> list[tuple[int, int]]:
        """The records held, read or not: (key, end) each (tests, tools)."""
        return [(self.keys[j], self.ends[j]) for j in range(self.n)]

    def seal(self, now: i64) -> None:
        """The step's records are published at ``now`` (-1: at the last publication's
        time, for what a step left)."""
        if now >= 0:
            self.last_ns = now
        n: i64 = self.n
        if n > self.sealed:
            self.bat_at = append(self.bat_at, self.last_ns + self.lag_ns)
            self.bat_end = append(self.bat_end, n)
            self.published += n - self.sealed
            self.sealed = n

    def queued(self) -> bool:
        return self.n > self.sealed

    def drop_queued(self) -> None:
        """The step's records are not published (vLLM's engine died in the step)."""
        self.n = self.sealed

    def taken(self, bhead: i64, head: i64) -> None:
        """The reader read ``bhead`` batches, ``head`` records: once every batch is read,
        the read records are dropped."""
        self.head = head
        self.bhead = bhead
        if bhead == len(self.bat_at):
            keys = self.keys
            ends = self.ends
            n = self.n
            j: i64 = head
            while j < n:              # (the step's unsealed records, if any, to the front)
                keys[j - head] = keys[j]
                ends[j - head] = ends[j]
                j += 1
            self.n = n - head
            self.sealed -= head
            self.head = 0
            self.bhead = 0
            self.bat_at = vec[i64]()
            self.bat_end = vec[i64]()

    def sort_groups(self) -> None:
        """``KVEventLog.caching_ends`` on the records since ``mark``: a stable sort by
        group (each event's records share its group, so the order is that of the events
        sorted); the group read inline, a record moved only when out of order."""
        keys = self.keys
        ends = self.ends
        start: i64 = self.mark
        n: i64 = self.n
        if n - start < 2:
            return
        mask: i64 = (1 << GROUP_BITS) - 1
        # (a record's group: -1 for AllBlocksCleared; statements, not conditional
        # expressions, which box machine integers)
        prev: i64 = -1
        if keys[start] >= 0:
            prev = keys[start] & mask
        for j in range(start + 1, n):
            k = keys[j]
            g: i64 = -1
            if k >= 0:
                g = k & mask
            if g >= prev:              # (in order so far: the common case)
                prev = g
                continue
            e = ends[j]
            i: i64 = j
            while i > start:
                q = keys[i - 1]
                qg: i64 = -1
                if q >= 0:
                    qg = q & mask
                if qg <= g:
                    break
                keys[i] = q
                ends[i] = ends[i - 1]
                i -= 1
            keys[i] = k
            ends[i] = e

    def full_blocks(self, req: CacheRequest, tables: list[list[Block]],
                    group_ids: list[int], indices: list[int] | None, keys: vec[i64],
                    block_size: int, num_cached: int, num_full: int, unit: int) -> None:
        """``KVEventLog.stored_full`` as records (``keys``: those of blocks
        ``[num_cached, num_full)`` when ``indices`` is None, as the manager walked them)."""
        scale = block_size // unit
        if indices is None:
            # (written into the buffers here: a ``put`` call a record otherwise)
            n0: i64 = num_cached
            n1: i64 = num_full
            bs: i64 = block_size
            self._room(len(tables) * (n1 - n0))
            out_keys = self.keys
            out_ends = self.ends
            n = self.n
            for t in range(len(tables)):
                blocks = tables[t]
                g0: i64 = group_ids[t]
                i: i64 = n0
                while i < n1:
                    if not blocks[i].is_null:
                        out_keys[n] = (keys[i - n0] << GROUP_BITS) | g0
                        out_ends[n] = (i + 1) * bs
                        n += 1
                    i += 1
            self.n = n
            return
        block_keys = req.block_hashes.keys_at([(i + 1) * scale - 1 for i in indices])
        for t in range(len(tables)):
            blocks = tables[t]
            g: i64 = group_ids[t]
            for j in range(len(indices)):
                i = indices[j]
                if not blocks[i].is_null:
                    self.put((block_keys[j] << GROUP_BITS) | g, (i + 1) * block_size)

    def event(self, ev: Event) -> None:
        """One event object's records."""
        if isinstance(ev, Stored):
            g: i64 = ev.group
            ends = ev.ends
            for j in range(len(ev.keys)):
                self.put((ev.keys[j] << GROUP_BITS) | g, ends[j])
        elif isinstance(ev, Removed):
            self.put(ev.pool_key, -1)
        else:
            self.put(-1, -1)


class KVEventLog(PoolObserver):
    """The event queue of one block pool, published once per step: a pool observer
    (``sim/cache/observers.py``) whose hooks queue what vLLM queues there.

    ``clock()`` names the step that starts (the scheduler's time); ``sink(step, events)``
    receives each step's non-empty batch, as vLLM's publisher does.  ``report_mode`` is
    the default ``kv_cache_report_mode`` of requests that set none.  After ``fail`` (the
    ``IndexError`` vLLM raises while announcing a hit) nothing more is recorded: vLLM's
    engine died there.  Given ``records`` (an ``EventRecords``), the log queues its events
    there as machine-integer records instead (no sink, no object; ``unpublished`` stays
    empty)."""

    def __init__(self, sink: Callable[[int, list[Event]], None],
                 clock: Callable[[], int] | None = None, report_mode: str | None = None,
                 fix_emit: bool = False, records: EventRecords | None = None):
        super().__init__()
        self.records = records
        self.watch = -1             # (every evicted key is a BlockRemoved)
        self.hears_keys = True
        self.sink = sink
        self.clock = clock
        self.report_mode = report_mode
        self.fix_emit = fix_emit
        self.pending: list[Event] = []
        self.step = 0
        self.error: dict[str, Any] | None = None   # {step, type, message, request, group}
        self.unpublished: list[Event] = []
        self.published = 0          # events handed to the sink
        # each request's first prefix lookup (request, hit), for tools that judge the stream
        # (``sim events check``): not part of what vLLM publishes
        self.lookups: list[tuple[CacheRequest, int]] | None = None
        self._looked_up: set[str] = set()
        self._mark = 0              # (``caching_starts``: the queue's length then)

    # -- the step boundary (``KVCacheManager.new_step_starts``) --------------------
    def new_step(self, now: int) -> None:
        """Publish the previous step's events; the step that starts is ``clock()``'s."""
        self.flush()
        if self.clock is not None:
            self.step = self.clock()

    def flush(self, now: i64 = -1) -> None:
        """Publish what this step queued (``take_events`` + ``publish``); ``now``: when
        (the step's outputs were processed; -1: at a step's start, for what was left)."""
        r = self.records
        if r is not None:
            r.seal(now)
            return
        if self.pending:
            events = self.pending
            self.pending = []
            self.published += len(events)
            self.sink(self.step, events)

    def queued(self) -> bool:
        """Whether events wait to be published at the step's end."""
        r = self.records
        return r.queued() if r is not None else len(self.pending) > 0

    # -- the pool's hooks ----------------------------------------------------------
    def looked_up(self, req: CacheRequest, hit: int, blocks: list[list[Block]],
                  kv: KVCacheManager) -> None:
        """A prefix lookup (``get_computed_blocks``): kept when ``lookups`` is a list;
        with the request's report mode (else the log's) ``full``, the hit announced
        (``emit_cached_block_events``)."""
        if self.lookups is not None and self.error is None:
            rid = req.request_id
            if rid not in self._looked_up:
                self._looked_up.add(rid)
                self.lookups.append((req, hit))
        mode = req.report_mode if req.report_mode is not None else self.report_mode
        if hit > 0 and mode == "full":
            announce(self, req, blocks, kv.group_block_sizes, kv.pool)

    def evicted(self, key: i64) -> None:
        """``get_new_blocks`` reused a block holding ``key``: a ``BlockRemoved``."""
        if self.error is None:
            r = self.records
            if r is not None:
                r.put(key, -1)
            else:
                self.pending.append(Removed(key))

    def dropped(self, keys: list[int]) -> None:
        """A block's keys were dropped (vLLM's ``_remove_cached_block_hashes`` +
        ``_emit_block_removed_events``): a ``BlockRemoved`` each, primary first."""
        if self.error is None:
            r = self.records
            for k in keys:
                if r is not None:
                    r.put(k, -1)
                else:
                    self.pending.append(Removed(k))

    def caching_starts(self) -> None:
        r = self.records
        if r is not None:
            r.mark = r.n
        else:
            self._mark = len(self.pending)

    def caching_ends(self) -> None:
        """Order the events queued by this ``cache_blocks`` by group, stably.  A manager
        serving several identical groups caches them together (full blocks of every group,
        then the partial entries); vLLM caches group after group."""
        r = self.records
        if r is not None:
            r.sort_groups()
            return
        pending = self.pending
        start = self._mark
        # (a stable insertion sort in place: a few events, mostly in order already)
        for j in range(start + 1, len(pending)):
            ev = pending[j]
            g = _group_of(ev)
            i = j
            while i > start and _group_of(pending[i - 1]) > g:
                pending[i] = pending[i - 1]
                i -= 1
            if i != j:
                pending[i] = ev

    def stored_full(self, req: CacheRequest, tables: list[list[Block]], group_ids: list[int],
                    indices: list[int] | None, walked: vec[i64], block_size: int,
                    num_cached: int, num_full: int, unit: int) -> None:
        """``cache_full_blocks`` of each member group: blocks ``[num_cached, num_full)``
        were cached, those at ``indices`` (the unmasked ones; None: all, their keys
        ``walked``) keyed."""
        if self.error is not None:
            return
        r = self.records
        if r is not None:
            r.full_blocks(req, tables, group_ids, indices, walked, block_size, num_cached,
                          num_full, unit)
            return
        scale = block_size // unit
        block_keys: list[int] = []
        if indices is None:
            indices = [i for i in range(num_cached, num_full)]
            for j in range(len(walked)):
                block_keys.append(walked[j])
        else:
            block_keys = req.block_hashes.keys_at([(i + 1) * scale - 1 for i in indices])
        parent_key = -1
        parent_end = None
        if num_cached > 0:
            parent_end = num_cached * block_size
            parent_key = req.block_hashes.key(num_cached * scale - 1)
        for blocks, g in zip(tables, group_ids):
            keys: list[int] = []
            ends: list[int] = []
            for j in range(len(indices)):
                i = indices[j]
                if not blocks[i].is_null:
                    keys.append(block_keys[j])
                    ends.append((i + 1) * block_size)
            self.add(Stored(g, req, keys, ends, block_size, num_cached * block_size,
                            num_full * block_size, parent_key, parent_end, FULL))

    def stored_partial(self, req: CacheRequest, unit_hash: int, end: int, unit: int,
                       group: int) -> None:
        """``cache_partial_block``: one key, the last hash unit before ``end``."""
        if self.error is not None:
            return
        r = self.records
        if r is not None:
            r.put((unit_hash << GROUP_BITS) | group, end)
            return
        parent_key = -1
        parent_end = None
        if end > unit:
            parent_end = end - unit
            parent_key = req.block_hashes.key(end // unit - 2)
        self.add(Stored(group, req, [unit_hash], [end], unit, end - unit, end, parent_key,
                        parent_end, PARTIAL))

    # -- queueing ------------------------------------------------------------------------
    def add(self, ev: Event) -> None:
        if self.error is None:
            r = self.records
            if r is not None:
                r.event(ev)
            else:
                self.pending.append(ev)

    def fail(self, type_name: str, message: str, request: str, group: int) -> None:
        """vLLM raised here (its engine dies): keep what this step queued as unpublished
        and record nothing more."""
        if self.error is not None:
            return
        self.error = {"step": self.step, "type": type_name, "message": message,
                      "request": request, "group": group}
        self.unpublished = self.pending
        self.pending = []
        if self.records is not None:
            self.records.drop_queued()


def _group_of(ev: Event) -> int:
    return -1 if isinstance(ev, Cleared) else ev.group


# ----------------------------------------------------------------- call sites --
def partial_is_new(pool: BlockPool, unit_hash: int, block: Block, group: int) -> bool:
    """Whether ``cache_partial_block`` will publish: the block does not hold the key yet."""
    key = (unit_hash << GROUP_BITS) | group
    return block.key != key and not pool.contains(key, block.block_id)


def announce(log: KVEventLog, req: CacheRequest, blocks: list[list[Block]],
             block_sizes: list[int], pool: BlockPool) -> list[dict] | None:
    """``emit_cached_block_events`` for a hit (``blocks`` per group).  Returns the
    per-group summary ``sim case`` prints, or None when vLLM raised (``log.fail``)."""
    out: list[dict] = []
    unit = pool.hash_block_size
    keys = req.block_hashes
    for gid, gb in enumerate(blocks):
        if not gb:
            continue
        bs = block_sizes[gid]
        scale = bs // unit
        view_len = keys.count // scale
        k = len(gb)
        if k > view_len and not log.fix_emit:
            log.fail("IndexError", "list index out of range", req.request_id, gid)
            return None
        ends: list[int] = []
        hashes: list[int] = []
        for i in range(k if k <= view_len else view_len):
            h = keys.key((i + 1) * scale - 1)
            if log.fix_emit and (gb[i].is_null
                                 or not pool.contains((h << GROUP_BITS) | gid, gb[i].block_id)):
                continue   # a key the pool does not hold under this block: not published
            hashes.append(h)
            ends.append((i + 1) * bs)
        tokens = min(k * bs, req.num_tokens)
        if hashes:   # (vLLM publishes nothing for a group without hashes)
            log.add(Stored(gid, req, hashes, ends, bs, 0, tokens, -1, None, ANNOUNCE))
        out.append({"group": gid, "keys": k, "tokens": tokens})
    return out


# ------------------------------------------------------------- canonical form --
class CanonicalForm:
    """The oracle's comparable form (``sched_oracle.py``, README "KV cache events"):
    hashes become positions, and a removed (key, group) the ``[req, start, end]`` of the
    first ``BlockStored`` that named it in the run (``[null, null, null]`` if none did)."""

    def __init__(self) -> None:
        self.ident: dict[int, list] = {}

    def event(self, ev: Event) -> dict:
        if isinstance(ev, Stored):
            b = ev.block_size
            rid = ev.req.request_id
            blocks = []
            for pk, end in zip(ev.pool_keys, ev.ends):
                blocks.append([end - b, end])
                if pk not in self.ident:
                    self.ident[pk] = [rid, end - b, end]
            return {"type": "BlockStored", "group": ev.group, "req": rid, "blocks": blocks,
                    "block_size": b, "num_token_ids": ev.tok_end - ev.tok_start,
                    "parent_end": ev.parent_end}
        if isinstance(ev, Removed):
            got = self.ident.get(ev.pool_key)
            return {"type": "BlockRemoved", "group": ev.group,
                    "blocks": [list(got) if got is not None else [None, None, None]]}
        return {"type": "AllBlocksCleared"}

    def events(self, evs: list[Event]) -> list[dict]:
        return [self.event(e) for e in evs]
