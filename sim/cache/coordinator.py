"""Reconciles the KV-cache groups of a hybrid model into one hit length.

vLLM 0.33.0's ``HybridKVCacheCoordinator``: groups with identical specs form a
*spec group*, full attention is looked up first, and a fixed point shrinks the
candidate length until every spec group holds a hit there.  EAGLE groups may
look one ``eagle_proof_margin`` past the candidate and drop once per
candidate; Mamba never drops.  A single-group model uses the one manager
directly (``UnitaryKVCacheCoordinator``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from sim.cache.block_pool import Block, BlockPool
from sim.cache.hashing import PrefixKeys
from sim.cache.managers import (
    FullAttentionManager,
    MambaManager,
    SingleTypeManager,
    SlidingWindowManager,
)
from sim.cache.rules import cdiv, eagle_proof_margin, replay_boundaries
from sim.cache.specs import GroupSpec

if TYPE_CHECKING:
    from sim.cache.request import CacheRequest

MANAGER_BY_KIND: dict[str, type[SingleTypeManager]] = {
    "full": FullAttentionManager,
    "swa": SlidingWindowManager,
    "mamba": MambaManager,
}


class SpecGroup:
    __slots__ = ("spec", "group_ids", "cls", "use_eagle")

    def __init__(self, spec: GroupSpec, group_ids: list[int], cls: type[SingleTypeManager],
                 use_eagle: bool):
        self.spec, self.group_ids, self.cls, self.use_eagle = spec, group_ids, cls, use_eagle


class Coordinator:
    def __init__(self, specs: list[GroupSpec], num_blocks: int, scheduler_block_size: int,
                 hash_block_size: int, use_eagle: bool, retention: int | None,
                 lookahead: int = 0, prefill_lookahead: int = 0,
                 num_speculative_blocks: int = 0, checkpoint_rule: str = "v0.33",
                 eagle_groups: str = "all", eagle_method: bool = False):
        self.specs = specs
        self.scheduler_block_size = scheduler_block_size
        self.hash_block_size = hash_block_size
        self.reprefillable = max(0, prefill_lookahead - 1)
        self.pool = BlockPool(num_blocks, hash_block_size, lookahead)
        self.pool.kind_of_group = [1 if s.kind == "mamba" else 0 for s in specs]
        # Unflagged groups: with EAGLE every group counts as an EAGLE group.
        # A served model flags the groups holding the drafter's layers (full
        # attention) whenever the drafter is EAGLE-like, lookahead or not; with
        # no flagged group vLLM falls back to flagging every group when the
        # legacy drop is on (unit tests, the oracle).
        annotated = ({i for i, s in enumerate(specs) if s.kind == "full"}
                     if eagle_method and eagle_groups == "attention" else set())
        self.eagle_group_ids: set[int] = annotated
        if use_eagle and not annotated:
            self.eagle_group_ids = set(range(len(specs)))
        self.drop_eagle_group_ids = set(self.eagle_group_ids) if use_eagle else set()
        if self.eagle_group_ids and scheduler_block_size < prefill_lookahead:
            raise ValueError(
                f"multi-module MTP with prefix caching requires scheduler_block_size "
                f"(={scheduler_block_size}) >= num_speculative_tokens (={prefill_lookahead})")
        # one manager per run of consecutive groups with identical specs
        self.managers: list[SingleTypeManager] = []
        self.manager_of: list[SingleTypeManager] = []   # group id -> its manager
        gid = 0
        while gid < len(specs):
            spec = specs[gid]
            end = gid + 1
            while end < len(specs) and specs[end] == spec:
                end += 1
            members = list(range(gid, end))
            cls = MANAGER_BY_KIND[spec.kind]
            m: SingleTypeManager
            if cls is MambaManager:
                m = MambaManager(spec, self.pool, members, scheduler_block_size,
                                 num_speculative_blocks, checkpoint_rule)
            else:
                m = cls(spec, self.pool, members, scheduler_block_size)
            self.managers.append(m)
            self.manager_of.extend([m] * len(members))
            gid = end
        self.mamba_managers = [m for m in self.managers if isinstance(m, MambaManager)]
        if use_eagle:
            for mm in self.mamba_managers:
                mm.drop_eagle_checkpoint = True
        self.retention = retention
        self._one_full = False
        self.full_alone = -1   # full attention's hit alone in the last lookup (-1: unknown)
        self._replay_memo: dict[int, tuple[int, ...]] = {}
        self.unitary = len(specs) == 1
        if self.unitary:
            self.partial_hits = False
            self.align = self.managers[0].block_size
            self.managers[0].use_eagle = 0 in self.drop_eagle_group_ids
            self._cacheable = [(self.managers[0], False)]
            self.spec_groups = [SpecGroup(specs[0], [0], type(self.managers[0]),
                                          0 in self.drop_eagle_group_ids)]
            return
        self.partial_hits = (
            any(s.kind == "mamba" and s.mamba_mode == "align" and s.block_size > hash_block_size
                for s in specs)
            and all(m.fine_lookup or m.block_size == hash_block_size for m in self.managers))
        self.align = hash_block_size if self.partial_hits else scheduler_block_size
        for m in self.managers:
            m.align = self.align
        groups: list[SpecGroup] = []
        for gid, spec in enumerate(specs):
            eag = gid in self.drop_eagle_group_ids
            cls = type(self.manager_of[gid])
            for g in groups:
                if g.spec == spec and g.cls is cls:
                    g.group_ids.append(gid)
                    g.use_eagle = g.use_eagle or eag
                    break
            else:
                groups.append(SpecGroup(spec, [gid], cls, eag))
        groups.sort(key=lambda g: g.spec.kind != "full")
        self.spec_groups = groups
        for g in groups:
            if g.use_eagle:
                for gid in g.group_ids:
                    self.manager_of[gid].use_eagle = True
        self._cacheable = [(m, m.use_eagle) for m in self.managers]
        # With one full-attention spec group, looked up first, the first pass of
        # find_longest_cache_hit is exactly that group's hit alone (find_per_group)
        self._one_full = sum(1 for g in groups if g.spec.kind == "full") == 1

    # ---------------------------------------------------------------- lookup --
    def _find(self, g: SpecGroup, hashes: PrefixKeys, max_length: int,
              drop_eagle: bool) -> tuple[list[list[Block]], int]:
        m = self.manager_of[g.group_ids[0]]
        return m.find(hashes, max_length, g.group_ids, drop_eagle, self.align)

    def _margin(self, g: SpecGroup) -> int:
        m = self.manager_of[g.group_ids[0]]
        return eagle_proof_margin(m.block_size, self.hash_block_size,
                                  self.partial_hits and m.fine_lookup)

    def find_longest_cache_hit(self, hashes: PrefixKeys, max_length: int
                               ) -> tuple[list[list[Block]], int, int]:
        """Per-group hit blocks, reconciled hit length, uncached common prefix."""
        n = len(self.specs)
        self.full_alone = -1
        if self.unitary:
            g = self.spec_groups[0]
            blocks, hit = self._find(g, hashes, max_length, g.use_eagle)
            return [blocks[0]], hit, 0
        hit_length = max_length
        first_pass = self._one_full
        longest = 0
        blocks_by_group: list[list[Block] | None] = [None] * n
        len_by_group = [0] * n
        simple = len(self.spec_groups) == 2 and self.spec_groups[0].spec.kind == "full"
        verified: set[int] = set()
        h = self.hash_block_size
        while True:
            curr = hit_length
            for idx, g in enumerate(self.spec_groups):
                first = g.group_ids[0]
                if g.spec.kind == "full" and blocks_by_group[first] is not None:
                    curr = min(curr, len_by_group[first])
                    continue
                drop = g.use_eagle and idx not in verified
                lim = curr
                if drop and g.spec.kind != "mamba":
                    lim = min(curr + self._margin(g), hashes.count * h)
                blocks, new = self._find(g, hashes, lim, drop)
                if drop:
                    verified.add(idx)
                elif new < curr:
                    verified.clear()
                curr = new
                if first_pass and g.spec.kind == "full":
                    self.full_alone = new   # (idx 0, the full group, on its first pass)
                    first_pass = False
                for gid, b in zip(g.group_ids, blocks):
                    blocks_by_group[gid] = b
                    len_by_group[gid] = new
                longest = max(longest, curr)
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break
        for g in self.spec_groups:
            if g.spec.kind != "full":
                continue
            nb = cdiv(hit_length, self.manager_of[g.group_ids[0]].block_size)
            for gid in g.group_ids:
                got = blocks_by_group[gid]
                if got is not None:
                    del got[nb:]
                    len_by_group[gid] = hit_length
        return ([b if b is not None else [] for b in blocks_by_group], hit_length,
                longest - hit_length)

    def find_per_group(self, hashes: PrefixKeys, max_length: int,
                       kinds: tuple[str, ...] | None = None) -> list[int]:
        """Each spec group's hit evaluated alone (with its own EAGLE drop);
        ``kinds`` restricts the work to some kinds (others report 0)."""
        out = [0] * len(self.specs)
        h = self.hash_block_size
        for g in self.spec_groups:
            if kinds is not None and g.spec.kind not in kinds:
                continue
            lim = max_length
            if g.use_eagle and g.spec.kind != "mamba":
                lim = min(max_length + self._margin(g), hashes.count * h)
            _, hit = self._find(g, hashes, lim, g.use_eagle)
            for gid in g.group_ids:
                out[gid] = hit
        return out

    # --------------------------------------------------------------- caching --
    def num_cacheable_tokens(self, num_computed: int, use_eagle: bool, block_size: int) -> int:
        if self.unitary:
            return max(0, num_computed - self.reprefillable)
        aligned = num_computed if self.partial_hits else \
            num_computed // self.scheduler_block_size * self.scheduler_block_size
        if use_eagle and aligned > 0:
            fin = max(0, num_computed - self.reprefillable)
            fin_aligned = fin if self.partial_hits else \
                fin // self.scheduler_block_size * self.scheduler_block_size
            return min(fin, fin_aligned + block_size)
        return aligned

    def replay(self, req: CacheRequest) -> tuple[int, ...]:
        """The replay boundaries of ``req``'s prompt (memoised by prompt length)."""
        n = req.num_prompt_tokens
        got = self._replay_memo.get(n)
        if got is None:
            if len(self._replay_memo) > 100_000:
                self._replay_memo.clear()
            got = self._replay_memo[n] = replay_boundaries(
                n, self.scheduler_block_size, bool(self.drop_eagle_group_ids))
        return got

    def cache_blocks(self, req: CacheRequest, num_computed: int) -> None:
        ret = self.retention
        # only sparse retention reads the replay boundaries
        replay = self.replay(req) if ret is not None else ()
        for m, eagle in self._cacheable:
            m.cache_blocks(req, self.num_cacheable_tokens(num_computed, eagle, m.block_size),
                           ret, replay)

    def blocks_to_allocate(self, rid: str, num_tokens: int, new_computed: list[list[Block]],
                           total_computed: int, num_local: int, num_tokens_main: int,
                           admission: bool = False) -> int:
        """Blocks every group needs; ``new_computed`` is indexed by group id."""
        n = 0
        for m in self.managers:
            n += m.blocks_to_allocate(rid, num_tokens, new_computed, total_computed,
                                      num_local, num_tokens_main, admission)
        return n

    def free(self, rid: str) -> None:
        for m in self.managers:
            m.free(rid)

    def new_step_starts(self) -> None:
        for m in self.mamba_managers:
            m.new_step_starts()
