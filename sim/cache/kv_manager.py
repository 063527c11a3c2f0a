"""The KV-cache manager facade the scheduler talks to (vLLM's ``KVCacheManager``).

``get_computed_blocks`` answers the prefix lookup (capped at ``num_tokens -
1``) and the junction; ``allocate_slots`` reserves blocks for a chunk and
caches everything the chunk completed; ``free`` returns a finished request's
blocks tail first.
"""
from __future__ import annotations


from sim.cache.block_pool import Block
from sim.cache.config import CacheConfig
from sim.cache.coordinator import Coordinator
from sim.cache.hashing import PrefixHasher, PrefixKeys, Run
from sim.cache.managers import MambaManager
from sim.cache.request import CacheRequest
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
        if rid in m.num_cached:
            return True
    return False


class KVCacheManager:
    def __init__(self, cfg: CacheConfig):
        self.cfg = cfg
        self.use_eagle = cfg.eagle_drop
        hash_block_size = cfg.hash_block_size
        assert hash_block_size is not None   # resolved when the config was validated
        self.coordinator = Coordinator(
            cfg.group_specs(), cfg.num_blocks, cfg.scheduler_block_size, hash_block_size,
            use_eagle=cfg.eagle_drop, retention=cfg.prefix_cache_retention_interval,
            lookahead=cfg.num_hash_lookahead_tokens,
            prefill_lookahead=cfg.prefill_lookahead,
            num_speculative_blocks=cfg.mamba_num_speculative_blocks,
            checkpoint_rule=cfg.prompt_checkpoint, eagle_groups=cfg.eagle_groups,
            eagle_method=cfg.eagle)
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
        self.hasher = PrefixHasher(hash_block_size, cfg.num_hash_lookahead_tokens)
        self.empty: list[list[Block]] = [[] for _ in c.specs]   # "no hit", per group

    @property
    def partial_hits(self) -> bool:
        return self.coordinator.partial_hits

    def make_request(self, rid: str, runs: list[Run] | PrefixKeys,
                     report_mode: str | None = None) -> CacheRequest:
        """A request over ``runs`` (or keys built with this manager's ``hasher``)."""
        return CacheRequest(rid, runs, self.hasher, report_mode)

    # ------------------------------------------------------------------ lookup --
    def get_computed_blocks(self, req: CacheRequest, max_hit: int | None = None) -> Lookup:
        if max_hit is None:
            max_hit = req.num_tokens - 1
        c = self.coordinator
        blocks, hit, uncached = c.find_longest_cache_hit(req.block_hashes, max_hit)
        events = None
        if hit > 0 and self.cfg.report_mode == "full" and req.report_mode != "incremental":
            events = self._emit_cached_block_events(req, blocks)
        junction = hit + uncached if uncached else 0
        return Lookup(blocks, hit, junction, events,
                      c.full_alone if max_hit == req.num_tokens - 1 else -1)

    def _emit_cached_block_events(self, req: CacheRequest,
                                  blocks: list[list[Block]]) -> list[dict]:
        """vLLM publishes one key per *position* of each group's hit list.

        For Mamba the list is ``[null, ..., state]``, so this publishes keys of
        interior blocks that were never stored, and when the hit ends inside a
        Mamba block it indexes past the block-size hash view: ``IndexError``
        (still present in 0.33.0; the seed PR's defect 2).
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
                       full_sequence_must_fit: bool = False) -> bool:
        """Reserve slots for ``num_new_tokens`` and cache what they complete.

        Returns False (and changes nothing but skipped-block frees) when the
        pool cannot hold the chunk.
        """
        c = self.coordinator
        if num_new_tokens == 0 and num_new_computed == 0:
            raise ValueError("num_new_tokens must be greater than 0")
        ncb = new_computed if new_computed is not None else self.empty
        mml = self.cfg.max_model_len
        num_local = req.num_computed_tokens + num_new_computed
        total = num_local if num_local < mml else mml
        num_main = total + num_new_tokens
        # no slot past max_model_len (the drafter's lookahead slots stop there too)
        need_slot = min(num_main + num_lookahead_tokens, mml)
        rid = req.request_id
        if full_sequence_must_fit:
            # vLLM's admission gate (scheduler_reserve_full_isl, on by default):
            # the whole sequence so far must fit, not just this chunk.
            full = min(req.num_tokens, mml)
            if c.blocks_to_allocate(rid, full, ncb, total, num_local, full,
                                    admission=True) > c.pool.num_free():
                return False
        for m in c.managers:
            m.remove_skipped_blocks(rid, total)
        need = c.blocks_to_allocate(rid, need_slot, ncb, total, num_local, num_main)
        if need > c.pool.num_free():
            return False
        if new_computed is not None and _any_hit(new_computed) and not _any_cached(c, rid):
            for m in c.managers:
                m.add_local_computed(rid, ncb, num_local)
        for m in c.managers:
            m.allocate_new(rid, need_slot, num_main)
        c.cache_blocks(req, min(total + num_new_tokens, req.num_tokens))
        return True

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
        self.coordinator.cache_blocks(req, num_tokens)

    def states_written(self, req: CacheRequest) -> int:
        """Mamba states this request registered (one Mamba group's count)."""
        for m in self.coordinator.managers:
            if isinstance(m, MambaManager):
                return m.states_written.get(req.request_id, 0)
        return 0

    def free(self, req: CacheRequest) -> None:
        self.coordinator.free(req.request_id)

    def new_step_starts(self) -> None:
        self.coordinator.new_step_starts()

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
        return SplitPolicy(
            block_size=c.scheduler_block_size, hash_block_size=c.hash_block_size,
            partial_hits=partial, drop_eagle=self.cfg.eagle_drop,
            lookahead=self.cfg.num_hash_lookahead_tokens,
            shared_prefix_checkpoint=partial and self.shared_prefix_checkpoint,
            checkpoint_rule=self.cfg.prompt_checkpoint)

    @property
    def needs_aligned_split(self) -> bool:
        return any(s.kind == "mamba" and s.mamba_mode == "align" for s in self.coordinator.specs)
