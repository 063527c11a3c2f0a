"""The KV-cache manager facade the scheduler talks to (vLLM's ``KVCacheManager``).

``get_computed_blocks`` answers the prefix lookup (capped at ``num_tokens -
1``) and the junction; ``allocate_slots`` reserves blocks for a chunk and
caches everything the chunk completed; ``free`` returns a finished request's
blocks tail first.
"""
from __future__ import annotations


from typing import Callable

from mypy_extensions import i64

from sim.cache.block_pool import Block, BlockPool
from sim.cache.config import CacheConfig
from sim.cache.coordinator import Coordinator, get_coordinator
from sim.cache.events import KVEventLog
from sim.cache.evictions import EvictionLog
from sim.cache.hashing import PrefixHasher, PrefixKeys, Run
from sim.cache.mamba_manager import Handoffs, MambaManager
from sim.cache.managers import SingleTypeManager
from sim.cache.observers import PoolObserver
from sim.cache.request import CacheRequest
from sim.cache.seams import Admission
from sim.cache.split import SplitPolicy


class Lookup:
    """Result of a prefix lookup.  (A plain class: a dataclass's generated
    ``__init__`` is interpreted Python even in the compiled build, ~2k CPU
    instructions per lookup.)"""

    __slots__ = ("blocks", "hit", "junction", "events", "full_alone")

    def __init__(self, blocks: list[list[Block]], hit: int, junction: int,
                 events: list[dict] | None = None, full_alone: int = -1):
        self.blocks = blocks
        self.hit = hit
        self.junction = junction
        self.events = events
        self.full_alone = full_alone   # full attention's hit alone (per_group_hits), when known

    def __repr__(self) -> str:
        return (f"Lookup(hit={self.hit}, junction={self.junction}, "
                f"full_alone={self.full_alone})")


def _any_hit(new_computed: list[list[Block]]) -> bool:
    for blocks in new_computed:
        if blocks:
            return True
    return False


def _any_cached(c: Coordinator, rid: str) -> bool:
    for m in c.managers:
        if m.has_cached(rid):
            return True
    return False


class KVCacheManager:
    def __init__(self, cfg: CacheConfig, enable_caching: bool = True,
                 pool_factory: Callable[[int, int, int], BlockPool] | None = None,
                 admission: Admission | None = None,
                 coordinator_factory: Callable[..., Coordinator] | None = None):
        """``enable_caching`` False is vLLM's ``--no-enable-prefix-caching`` (every lookup
        misses; ``cache.policy: none``).  The policy seams (``sim/cache/seams.py``):
        ``pool_factory`` builds the pool from ``(num_blocks, hash_block_size, lookahead)``
        and so decides the eviction order (None: vLLM's LRU ``BlockPool``;
        ``UnlimitedBlockPool``: never runs out nor evicts); ``admission``: which computed
        Mamba states are kept (None: vLLM's rules).  ``coordinator_factory`` builds the
        coordinator from ``(cfg, enable_caching, pool_factory, admission)``, as
        ``get_coordinator`` does (None: ``get_coordinator``, vLLM's choice by layout); a
        policy whose hits follow other rules builds its own (``ideal``: a state at every
        hash unit, ``sim/cache/policies/ideal.py``).  The hash unit and
        lookahead the requests' keys are made with are the coordinator's and its pool's."""
        self.cfg = cfg
        # (read on every allocation: the config is an interpreted class, whose fields
        # the compiled build reads by a generic attribute lookup)
        self.max_model_len: int = cfg.max_model_len
        self.report_mode: str | None = cfg.report_mode
        self.use_eagle = cfg.eagle_drop
        self.enable_caching = enable_caching
        build = get_coordinator if coordinator_factory is None else coordinator_factory
        self.coordinator = build(cfg, enable_caching, pool_factory, admission)
        c = self.coordinator
        self.shared_prefix_checkpoint = (cfg.shared_prefix_checkpoint and bool(c.eagle_group_ids)
                                         and c.partial_hits and c.reprefillable == 0)
        for m in c.managers:
            if isinstance(m, MambaManager) and self.shared_prefix_checkpoint:
                m.shared_prefix_checkpoint = True
        if cfg.max_in_flight_tokens is not None:
            from sim.cache.managers import SlidingWindowManager

            for m in c.managers:
                if isinstance(m, SlidingWindowManager):
                    # vLLM SlidingWindowSpec.max_admission_blocks_per_request
                    n = min(m.spec.window - 1 + max(0, cfg.prefill_lookahead - 1)
                            + cfg.max_in_flight_tokens, cfg.max_model_len)
                    m.admission_cap = -(-n // m.block_size) + 1
        self.last_copies: list[tuple[str, Block, Block]] = []
        self.pool = c.pool
        self.event_log: KVEventLog | None = None   # (the KV event log among its observers)
        self.hasher = PrefixHasher(c.hash_block_size, c.pool.lookahead)
        self.empty: list[list[Block]] = [[] for _ in c.specs]   # "no hit", per group
        # (with a KV connector: every Mamba group's committed states, and its group id)
        self.handoff_groups: list[int] = []
        self.handoff_lists: list[Handoffs] = []

    @property
    def partial_hits(self) -> bool:
        return self.coordinator.partial_hits

    # ------------------------------------------------------- what callers may read --
    # The scheduler, the engine and the assembly read the cache through these (never
    # through ``coordinator`` or ``pool``), so a policy may build its manager freely.
    @property
    def hash_block_size(self) -> int:
        return self.coordinator.hash_block_size

    @property
    def group_kinds(self) -> list[str]:
        """Each KV-cache group's kind (full | swa | mamba), in layout order."""
        return [s.kind for s in self.coordinator.specs]

    @property
    def scheduler_block_size(self) -> int:
        return self.coordinator.scheduler_block_size

    @property
    def group_block_sizes(self) -> list[int]:
        """Each KV-cache group's block size, in layout order."""
        return [m.block_size for m in self.coordinator.manager_of]

    def truncate_hit(self, blocks: list[list[Block]], num_tokens: int) -> list[list[Block]]:
        """A lookup's hit lists cut at ``num_tokens`` (a block boundary of every group;
        vLLM's ``truncate_computed_blocks``: a Mamba list may be shorter)."""
        out: list[list[Block]] = []
        for gid in range(len(blocks)):
            n = num_tokens // self.coordinator.manager_of[gid].block_size
            out.append(blocks[gid][:n])
        return out

    def remaining_blocks(self, req: CacheRequest, num_tokens: int, num_main: int,
                         prefill_end: int) -> int:
        """Blocks ``req`` still needs to hold ``num_tokens`` slots (``num_main`` of the
        target model) past what it holds (vLLM's ``_request_remaining_blocks``)."""
        n = req.num_computed_tokens
        return self.coordinator.blocks_to_allocate(req.request_id, num_tokens, self.empty, n, n,
                                                   num_main, True, prefill_end)

    @property
    def min_block_size(self) -> int:
        return min(m.block_size for m in self.coordinator.managers)

    @property
    def usable_blocks(self) -> int:
        """Pool blocks a request may hold (all but the null block)."""
        return self.coordinator.pool.num_blocks - 1

    def num_free_blocks(self) -> int:
        """Blocks free or evictable (cached, unreferenced) in the pool."""
        return self.coordinator.pool.num_free()

    def occupancy(self) -> tuple[int, int, int]:
        """(attention blocks occupied, Mamba blocks occupied, blocks in use): occupied
        from allocation until freed, cached or not; in use = referenced by a request."""
        pool = self.coordinator.pool
        occ = pool.occupied
        return occ[0], occ[1], pool.num_blocks - 1 - pool.free_queue.num_free_blocks

    def peak_blocks(self, kind: str) -> int:
        """Peak occupied blocks of the groups of ``kind`` (full | mamba); 0 without any."""
        gids = [i for i, s in enumerate(self.coordinator.specs) if s.kind == kind]
        return max(self.coordinator.pool.peak_by_group(gids), 0)

    @property
    def evicted_keys(self) -> int:
        """Cached keys evicted so far (a block evicted with several keys counts each)."""
        return self.coordinator.pool.evicted_keys

    def blocks_per_request(self, num_slots: int) -> int:
        """The most pool blocks one request of ``num_slots`` slots holds, over every group:
        vLLM's per-request accounting (``max_memory_usage_bytes`` in pages, as its start-up
        check and its max-concurrency figure count them).  A full-attention group holds a
        block per ``block_size`` slots; a Mamba group (align mode) its running state, the
        one before it, one block per speculative token and the internal prefill checkpoint
        blocks (2 + K [+ 1], whatever the length); a sliding-window group at most its
        admission cap."""
        n = 0
        for m in self.coordinator.managers:
            n += self.group_blocks_per_request(m, num_slots) * m.width
        return n

    def blocks_per_request_by_run(self, num_slots: int) -> list[tuple[str, int, int]]:
        """(kind, blocks per group, groups) for each run of identical groups."""
        return [(m.spec.kind, self.group_blocks_per_request(m, num_slots), m.width)
                for m in self.coordinator.managers]

    @staticmethod
    def group_blocks_per_request(m: SingleTypeManager, num_slots: int) -> int:
        """One manager's share of ``blocks_per_request`` (per member group)."""
        if isinstance(m, MambaManager):
            return m.max_blocks_per_request
        blocks = -(-num_slots // m.block_size)
        cap = m.admission_cap
        return cap if cap is not None and cap < blocks else blocks

    def prefill_checkpoint(self, req: CacheRequest) -> tuple[int, int] | None:
        """The internal prefill checkpoint of ``req``'s chunk this step, if it has one:
        (position, index in the Mamba block table of the block that holds it).  The worker
        exports the state after ``position`` tokens into that block (vLLM's
        ``compute_mamba_prefill_checkpoints``)."""
        for m in self.coordinator.mamba_managers:
            if m.ckpt_blocks:
                return m.checkpoint_of(req.request_id)
        return None

    def admission_blocks(self, req: CacheRequest) -> int:
        """Blocks the admission gate asks for ``req`` now without a prefix hit: its whole
        sequence so far (what a waiting request is refused on)."""
        mml = self.max_model_len
        full = req.num_tokens if req.num_tokens < mml else mml
        return self.coordinator.blocks_to_allocate(req.request_id, full, self.empty, 0, 0,
                                                   full, True)

    def make_request(self, rid: str, runs: list[Run] | PrefixKeys,
                     report_mode: str | None = None) -> CacheRequest:
        """A request over ``runs`` (or keys built with this manager's ``hasher``)."""
        return CacheRequest(rid, runs, self.hasher, report_mode)

    # ------------------------------------------------------------------ lookup --
    def get_computed_blocks(self, req: CacheRequest, max_hit: int | None = None) -> Lookup:
        # (a plain int, not the optional argument: an i64 stored there is boxed)
        limit: int = req.num_tokens - 1 if max_hit is None else max_hit
        c = self.coordinator
        blocks, hit, uncached = c.find_longest_cache_hit(req.block_hashes, limit)
        events = None
        obs = self.pool.key_observers
        if obs:    # (KV events on: the log announces a hit in report mode full)
            for o in obs:
                o.looked_up(req, hit, blocks, self)
        if (hit > 0 and self.report_mode == "full" and req.report_mode != "incremental"
                and self.event_log is None):
            events = self._emit_cached_block_events(req, blocks)
        junction = hit + uncached if uncached else 0
        return Lookup(blocks, hit, junction, events,
                      c.full_alone if limit == req.num_tokens - 1 else -1)

    def _emit_cached_block_events(self, req: CacheRequest,
                                  blocks: list[list[Block]]) -> list[dict] | None:
        """vLLM publishes one key per *position* of each group's hit list.

        For Mamba the list is ``[null, ..., state]``, so this publishes keys of
        interior blocks that were never stored, and when the hit ends inside a
        Mamba block it indexes past the block-size hash view: ``IndexError``
        (still present in 0.33.0; the seed PR's defect 2).  With KV events on the
        event log queues them instead and the ``IndexError`` ends the log
        (``sim/cache/events.py``: ``KVEventLog.looked_up``, ``announce``).
        """
        out = []
        h = self.coordinator.hash_block_size
        for gid, gb in enumerate(blocks):
            if not gb:
                continue
            bs = self.coordinator.manager_of[gid].block_size
            view_len = req.block_hashes.count // (bs // h)
            if len(gb) > view_len:
                raise IndexError("list index out of range")
            out.append({"group": gid, "keys": len(gb),
                        "tokens": min(len(gb) * bs, req.num_tokens)})
        return out

    def per_group_hits(self, req: CacheRequest, max_hit: int | None = None,
                       kinds: tuple[str, ...] | None = None) -> list[int]:
        if max_hit is None:
            max_hit = req.num_tokens - 1
        return self.coordinator.find_per_group(req.block_hashes, max_hit, kinds)

    # -------------------------------------------------------------- allocation --
    def allocate_slots(self, req: CacheRequest, num_new_tokens: int, num_new_computed: int = 0,
                       new_computed: list[list[Block]] | None = None,
                       num_lookahead_tokens: int = 0,
                       full_sequence_must_fit: bool = False, num_external: int = 0,
                       delay_cache: bool = False, reserved: int = 0) -> bool:
        """Reserve slots for ``num_new_tokens`` and cache what they complete.

        ``num_external``: tokens a KV connector loads past the local hit (their blocks are
        allocated now, after every group's hit blocks; ``delay_cache``: nothing is cached
        until the load is done); ``reserved``: blocks the allocation must leave free (an
        async load's reservation for the in-flight prefills).  Returns False (and changes
        nothing but skipped-block frees) when the pool cannot hold the chunk.
        """
        c = self.coordinator
        if num_new_tokens == 0 and num_new_computed == 0 and num_external == 0:
            raise ValueError("num_new_tokens must be greater than 0")
        ncb = new_computed if new_computed is not None else self.empty
        # (machine integers, the least of two by comparison: min() of an i64 and an int,
        # or a conditional expression of them, boxes both in the compiled build)
        mml: i64 = self.max_model_len
        num_local: i64 = req.num_computed_tokens + num_new_computed
        total = num_local + num_external
        if mml < total:
            total = mml
        num_main = total + num_new_tokens
        # no slot past max_model_len (the drafter's lookahead slots stop there too)
        need_slot = num_main + num_lookahead_tokens
        if mml < need_slot:
            need_slot = mml
        rid = req.request_id
        obs = c.pool.observers
        if obs:
            for o in obs:
                o.allocating(rid)   # (whose allocation evicts: miss attribution)
        # the scheduler's prefill boundary (resumed requests replay their outputs)
        nt1 = req.num_tokens - 1
        prefill_end = req.num_prompt_tokens if req.num_prompt_tokens > nt1 else nt1
        if full_sequence_must_fit:
            # vLLM's admission gate (scheduler_reserve_full_isl, on by default):
            # the whole sequence so far must fit, not just this chunk.
            full = req.num_tokens
            if mml < full:
                full = mml
            if c.blocks_to_allocate(rid, full, ncb, total, num_local, full,
                                    admission=True, prefill_end=prefill_end) > c.pool.num_free():
                return False
        for m in c.managers:
            m.remove_skipped_blocks(rid, total)
        tc = total
        if num_external > 0:
            tc = num_local + num_external
        need = c.blocks_to_allocate(rid, need_slot, ncb, tc, num_local, num_main,
                                    prefill_end=prefill_end)
        if need > c.pool.num_free() - reserved:
            return False
        if num_external > 0:
            if not _any_cached(c, rid):
                # every group's hit blocks first, then every group's blocks for the
                # external tokens (a group's new blocks cannot evict another's hit)
                for m in c.managers:
                    m.add_local_computed(rid, ncb, num_local, num_external)
                for m in c.managers:
                    m.allocate_external(rid, num_local, num_external)
        elif new_computed is not None and _any_hit(new_computed) and not _any_cached(c, rid):
            for m in c.managers:
                m.add_local_computed(rid, ncb, num_local)
        for m in c.managers:
            m.allocate_new(rid, need_slot, num_main)
        if delay_cache:
            return True
        done = total + num_new_tokens
        if req.num_tokens < done:
            done = req.num_tokens
        kobs = c.pool.key_observers
        if kobs:
            self._cache_blocks_watched(kobs, req, done)
        else:
            c.cache_blocks(req, done)
        return True

    def group_tables(self, rid: str) -> list[list[Block]]:
        """``rid``'s block table in every group, in group order (empty lists if none)."""
        out: list[list[Block]] = []
        for m in self.coordinator.managers:
            st = m._get(rid)
            t = st.table if st is not None else None
            for mi in range(m.width):
                out.append(t[mi] if t else [])
        return out

    def group_table(self, rid: str, gid: int) -> list[Block]:
        """``rid``'s block table in group ``gid`` (empty if none)."""
        m = self.coordinator.manager_of[gid]
        st = m._get(rid)
        t = st.table if st is not None else None
        return t[gid - m.group_ids[0]] if t else []

    def remove_skipped(self, req: CacheRequest, processed: int) -> None:
        """Free the blocks no group needs past ``processed`` computed tokens (vLLM does
        this for a finished request before a KV connector sees its table: a Mamba group
        lets go of its superseded state)."""
        for m in self.coordinator.managers:
            m.remove_skipped_blocks(req.request_id, processed)

    def enable_offload_handoffs(self) -> None:
        """A KV connector reads the Mamba states the cache commits (``take_offload_handoffs``)
        and the blocks each step hands out (``BlockPool.start_popping``, ``popped``)."""
        self.handoff_groups.clear()
        self.handoff_lists.clear()
        for m in self.coordinator.mamba_managers:
            m.enable_handoffs()
            for mi in range(len(m.handoffs)):
                self.handoff_groups.append(m.group_ids[mi])
                self.handoff_lists.append(m.handoffs[mi])

    def has_offload_handoffs(self) -> bool:
        """Whether the cache committed Mamba states for the connector since they were
        last taken."""
        for m in self.coordinator.mamba_managers:
            if m.n_handoffs:
                return True
        return False

    def take_offload_handoffs(self) -> bool:
        """This step's committed Mamba states (vLLM's ``take_boundary_state_offloads``);
        whether there are any.  They are in ``handoff_lists``, one ``Handoffs`` (request,
        block, boundary tokens of each, in commit order; ``n`` of them, 0 for a group with
        none this step) per Mamba group, the group of each in ``handoff_groups``, groups
        in order: the groups' own buffers (no copy, the same lists every step), which the
        taker empties with ``clear_offload_handoffs`` once it has read them."""
        return self.has_offload_handoffs()

    def clear_offload_handoffs(self) -> None:
        """The states ``take_offload_handoffs`` gave are taken: their buffers emptied."""
        for h in self.handoff_lists:
            h.n = 0
        for m in self.coordinator.mamba_managers:
            m.n_handoffs = 0

    def group_blocks(self, req: CacheRequest, kind: str) -> list:
        """The block table of the first group of ``kind`` for ``req`` (empty if none)."""
        for m in self.coordinator.managers:
            if m.spec.kind == kind:
                return m.table(req.request_id)
        return []

    def release_cow_copies(self) -> None:
        """Drop the refs retained for this step's copy-on-write copies (vLLM frees them
        at the end of ``schedule()``); the copies themselves are kept in
        ``last_copies`` for a compute backend to perform before the forward."""
        pending = False
        for m in self.coordinator.managers:
            if m.has_pending_cow:
                pending = True
                break
        if not pending:   # (the common step: nothing to copy, no lists built)
            if self.last_copies:
                self.last_copies = []
            return
        copies: list[tuple[str, Block, Block]] = []
        retained: list[Block] = []
        for m in self.coordinator.managers:
            if not m.has_pending_cow:
                continue
            for pairs in m.take_pending_cow():   # one list per member group, in group order
                for src, dst in pairs:
                    copies.append((m.spec.kind, src, dst))
                    retained.extend((src, dst))
        if copies or self.last_copies:
            self.last_copies = copies
        if retained:
            self.pool.free_blocks(retained)

    def cache_blocks(self, req: CacheRequest, num_tokens: int) -> None:
        """Cache what ``num_tokens`` computed tokens completed (vLLM calls this from
        update_from_output with speculative decoding)."""
        obs = self.pool.key_observers
        if obs:
            self._cache_blocks_watched(obs, req, num_tokens)
        else:
            self.coordinator.cache_blocks(req, num_tokens)

    def _cache_blocks_watched(self, obs: list[PoolObserver], req: CacheRequest,
                              num_tokens: int) -> None:
        """``cache_blocks`` with the pool's observers told where it starts and ends (the KV
        event log puts a manager's events, several identical groups cached together, in
        vLLM's order: group after group)."""
        for o in obs:
            o.caching_starts()
        self.coordinator.cache_blocks(req, num_tokens)
        for o in obs:
            o.caching_ends()

    def states_written(self, req: CacheRequest) -> int:
        """Mamba states this request registered (one Mamba group's count)."""
        for m in self.coordinator.managers:
            if isinstance(m, MambaManager):
                return m.written_by(req.request_id)
        return 0

    def free(self, req: CacheRequest) -> None:
        self.coordinator.free(req.request_id)

    def new_step_starts(self, now: int = -1) -> None:
        """A step starts at ``now`` ns (-1: no clock, as a case file): the pool's observers
        are told (the KV event log publishes the previous step's events; the eviction
        log's clock is set)."""
        self.coordinator.new_step_starts()
        obs = self.pool.observers
        if obs:
            for o in obs:
                o.new_step(now)

    def enable_kv_events(self, log: KVEventLog) -> None:
        """Queue vLLM's KV cache events into ``log`` from now on (``sim/cache/events.py``):
        one more observer of the pool."""
        self._observe(log)
        self.event_log = log

    def enable_eviction_log(self, log: EvictionLog) -> None:
        """Record from now on which request's allocation evicted each cached key, and when
        (``sim/cache/evictions.py``; the time is the one ``new_step_starts`` is given):
        one more observer of the pool.  Only the first group of each run of identical
        groups is recorded (``log.watch``)."""
        mask = 0
        for g in self.coordinator.spec_groups:
            if g.group_ids:
                mask |= 1 << g.group_ids[0]
        log.watch = mask if mask else -1
        self._observe(log)

    def _observe(self, o: PoolObserver) -> None:
        """``o`` among the pool's observers (once: attached again, it stays where it is)."""
        for had in self.pool.observers:
            if had is o:
                return
        self.pool.observers.append(o)
        if o.hears_keys:
            self.pool.key_observers.append(o)

    @property
    def eviction_log(self) -> EvictionLog | None:
        """The eviction log among the pool's observers (None: off)."""
        for o in self.pool.observers:
            if isinstance(o, EvictionLog):
                return o
        return None

    def eviction_of(self, pool_key: int) -> tuple[int, str] | None:
        """The last eviction of ``pool_key`` (``make_key(block_hash, group_id)``): (time in
        ns, evicting request), or None (never evicted, or no eviction log enabled)."""
        log = self.eviction_log
        return log.get(pool_key) if log is not None else None

    # ------------------------------------------------------------- inspection --
    def cached_positions(self, req: CacheRequest, gid: int) -> list[int]:
        """Positions on the hash grid where group ``gid`` holds this prefix."""
        h = self.coordinator.hash_block_size
        pool = self.pool
        keys = req.block_hashes
        return [(i + 1) * h for i in range(keys.count)
                if pool.get_cached_block(keys.key(i), [gid])]

    def split_policy(self) -> SplitPolicy:
        """The scheduler's align-mode split, configured as this manager."""
        c = self.coordinator
        partial = (c.partial_hits and any(s.kind == "mamba" for s in c.specs)
                   and c.hash_block_size < c.scheduler_block_size)
        mamba = [s for s in c.specs if s.kind == "mamba"]
        return SplitPolicy(
            block_size=c.scheduler_block_size, hash_block_size=c.hash_block_size,
            partial_hits=partial, drop_eagle=self.cfg.eagle_drop,
            lookahead=self.cfg.num_hash_lookahead_tokens,
            shared_prefix_checkpoint=partial and self.shared_prefix_checkpoint,
            checkpoint_rule=self.cfg.prompt_checkpoint,
            prefill_checkpoints=bool(mamba) and all(
                s.mamba_mode == "align" and s.prefill_checkpoint_blocks > 0 for s in mamba),
            prefill_checkpoint_alignment=mamba[0].prefill_checkpoint_alignment if mamba else 0)

    @property
    def needs_aligned_split(self) -> bool:
        return any(s.kind == "mamba" and s.mamba_mode == "align" for s in self.coordinator.specs)
