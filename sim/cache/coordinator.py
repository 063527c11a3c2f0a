"""Reconciles the KV-cache groups of a hybrid model into one hit length.

vLLM 0.33.0's ``HybridKVCacheCoordinator``: groups with identical specs form a
*spec group*, full attention is looked up first, and a fixed point shrinks the
candidate length until every spec group holds a hit there.  EAGLE groups may
look one ``eagle_proof_margin`` past the candidate and drop once per
candidate; Mamba never drops.  A single-group model uses the one manager
directly (``UnitaryKVCacheCoordinator``).  With prefix caching off every lookup
misses (``NoPrefixCacheCoordinator``, ``cache.policy: none``); the ``ideal`` policy
keeps a state at every hash unit of every computed prefix (``IdealCoordinator``) in
a pool that never runs out (``UnlimitedBlockPool``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Final

from librt.vecs import vec
from mypy_extensions import i64

from sim.cache.block_pool import Block, BlockPool
from sim.cache.config import CacheConfig
from sim.cache.hashing import PrefixKeys
from sim.cache.key_map import KeyMap
from sim.cache.mamba_manager import MambaManager
from sim.cache.managers import FullAttentionManager, SingleTypeManager, SlidingWindowManager
from sim.cache.rules import cdiv, eagle_proof_margin, replay_boundaries
from sim.cache.seams import Admission
from sim.cache.specs import GroupSpec

if TYPE_CHECKING:
    from sim.cache.request import CacheRequest

MANAGER_BY_KIND: dict[str, type[SingleTypeManager]] = {
    "full": FullAttentionManager,
    "swa": SlidingWindowManager,
    "mamba": MambaManager,
}

# the block count an unlimited pool reports: more than any run can ever ask for
UNLIMITED_BLOCKS: Final = 1 << 40


class UnlimitedBlockPool(BlockPool):
    """A block pool that never runs out and never evicts (``cache.policy: ideal``).

    It reports ``UNLIMITED_BLOCKS`` blocks (so admission, allocation and the
    scheduler's "can never fit" check always pass) but holds Block objects only for
    the blocks ever handed out: memory grows with the blocks a run really occupies
    (the cached states it keeps plus the running requests' tables), never with the
    reported size.  Before an allocation it makes sure the free queue's front holds
    enough blocks without a key, adding fresh ones there (at least doubling the
    materialised count, so the growth is amortised), so the pop never reaches a
    cached block: nothing is ever evicted.  Uncached free blocks precede cached ones
    in the queue (freed uncached blocks go to the front, cached ones to the back), so
    the count of free blocks without a key is the free count minus the cached free
    ones (``occupied`` counts in-use and cached free blocks)."""

    def __init__(self, num_blocks: int, hash_block_size: int, lookahead: int = 0):
        # (``num_blocks``, whatever it is, is not what this pool holds: the seam's
        # ``pool_factory`` signature)
        super().__init__(2, hash_block_size, lookahead)   # the null block and one more
        self.virgin = UNLIMITED_BLOCKS - 2   # reported free blocks not materialised yet
        self.num_blocks = UNLIMITED_BLOCKS
        self.free_queue.num_free_blocks += self.virgin

    def make_room(self, n: i64) -> None:
        q = self.free_queue
        free = q.num_free_blocks - self.virgin       # materialised free blocks
        in_use = len(self.blocks) - 1 - free
        cached_free = int(self.occupied[0]) + int(self.occupied[1]) - in_use
        short = n - (free - cached_free)
        if short > 0:
            grow = len(self.blocks)
            if grow < short:
                grow = short
            if grow > self.virgin:
                grow = self.virgin
            first = len(self.blocks)
            fresh = [Block(first + i) for i in range(grow)]
            self.blocks.extend(fresh)
            for b in reversed(fresh):   # (the lowest id ends up at the front)
                q.insert_after(b, q.head)
            q.num_free_blocks -= grow   # (they were counted free while virgin)
            self.virgin -= grow


class SpecGroup:
    __slots__ = ("spec", "group_ids", "cls", "use_eagle", "is_full", "is_mamba")

    def __init__(self, spec: GroupSpec, group_ids: list[int], cls: type[SingleTypeManager],
                 use_eagle: bool):
        self.spec, self.group_ids, self.cls, self.use_eagle = spec, group_ids, cls, use_eagle
        # (the kind tests of every lookup pass, without a string comparison)
        self.is_full = spec.kind == "full"
        self.is_mamba = spec.kind == "mamba"


class Coordinator:
    """What every coordinator shares: the pool, one manager per run of identical groups,
    EAGLE group flags, caching and allocation over every manager.  How a hit length is
    found and how many tokens are cacheable depend on the layout: ``get_coordinator``
    picks ``UnitaryCoordinator`` (one group) or ``HybridCoordinator`` (several), as
    vLLM's ``get_kv_cache_coordinator`` does."""

    def __init__(self, cfg: CacheConfig,
                 pool_factory: Callable[[int, int, int], BlockPool] | None = None,
                 admission: Admission | None = None, caching: bool = True, unit: int = 0):
        """Reads the layout and vLLM's switches from ``cfg`` once: what the hot paths read
        is copied to typed attributes here (a ``CacheConfig`` is an interpreted class,
        whose fields the compiled build reads by a generic lookup).  ``caching`` False:
        prefix caching off, so the switches that only concern cached prefixes (EAGLE,
        retention, the EAGLE groups, admission) are off with it.  ``unit`` > 0: the
        ideal cache's hash unit, in place of the config's, without vLLM's hashing
        switches (no lookahead, no prefill runway, the default checkpoint rule)."""
        specs = cfg.group_specs()
        num_blocks: int = cfg.num_blocks
        scheduler_block_size: int = cfg.scheduler_block_size
        hash_block_size: int = unit
        lookahead: int = 0
        prefill_lookahead: int = 0
        checkpoint_rule: str = "v0.33"
        if unit <= 0:
            h = cfg.hash_block_size
            assert h is not None   # resolved when the config was validated
            hash_block_size = h
            lookahead = cfg.num_hash_lookahead_tokens
            prefill_lookahead = cfg.prefill_lookahead
            checkpoint_rule = cfg.prompt_checkpoint
        use_eagle: bool = False
        retention: int | None = None
        eagle_groups: str | tuple[int, ...] = "all"
        eagle_method: bool = False
        if caching:
            use_eagle = cfg.eagle_drop
            retention = cfg.prefix_cache_retention_interval
            eagle_groups = cfg.eagle_groups
            eagle_method = cfg.eagle
        else:
            admission = None
        num_speculative_blocks: int = cfg.mamba_num_speculative_blocks
        self.specs = specs
        self.scheduler_block_size: i64 = scheduler_block_size
        self.hash_block_size = hash_block_size
        self.reprefillable: i64 = max(0, prefill_lookahead - 1)
        # the eviction seam: the pool class a policy builds (vLLM's LRU queue by default)
        self.pool = (BlockPool(num_blocks, hash_block_size, lookahead) if pool_factory is None
                     else pool_factory(num_blocks, hash_block_size, lookahead))
        self.pool.kind_of_group = [1 if s.kind == "mamba" else 0 for s in specs]
        # Unflagged groups: with EAGLE every group counts as an EAGLE group.
        # A served model flags the groups holding the drafter's layers (full
        # attention) whenever the drafter is EAGLE-like, lookahead or not; with
        # no flagged group vLLM falls back to flagging every group when the
        # legacy drop is on (unit tests, the oracle).
        annotated: set[int] = set()
        if isinstance(eagle_groups, tuple):   # explicit is_eagle_group flags, as given
            annotated = set(eagle_groups)
        elif eagle_method and eagle_groups == "attention":
            annotated = {i for i, s in enumerate(specs) if s.kind == "full"}
        self.eagle_group_ids: set[int] = annotated
        if use_eagle and not annotated:
            self.eagle_group_ids = set(range(len(specs)))
        self.drop_eagle_group_ids = set(self.eagle_group_ids) if use_eagle else set()
        self.drop_eagle = bool(self.drop_eagle_group_ids)
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
                                 num_speculative_blocks, checkpoint_rule, admission)
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
        self.retention_zero = retention is not None and retention == 0
        self._one_full = False
        # a lookup's answer before it is filled (one placeholder list in every slot, each
        # slot filled before returning), copied (a list copy costs less than a list
        # multiplied)
        self._no_hits: list[list[Block]] = [[]] * len(specs)
        self.full_alone = -1   # full attention's hit alone in the last lookup (-1: unknown)
        self.unitary = False
        self.partial_hits = False
        self.align = scheduler_block_size
        # the managers that cache, and whether each counts as an EAGLE group when it does
        # (two lists: no tuple to unpack per call)
        self._cacheable: list[SingleTypeManager] = []
        self._cacheable_eagle: list[bool] = []
        self.spec_groups: list[SpecGroup] = []
        self._arrange(specs, hash_block_size, scheduler_block_size)

    def _arrange(self, specs: list[GroupSpec], hash_block_size: int,
                 scheduler_block_size: int) -> None:
        """Spec groups, hit alignment and cacheable managers of this layout."""
        raise NotImplementedError

    def find_longest_cache_hit(self, hashes: PrefixKeys, max_length: int
                               ) -> tuple[list[list[Block]], int, int]:
        """Per-group hit blocks, reconciled hit length, uncached common prefix."""
        raise NotImplementedError

    def num_cacheable_tokens(self, num_computed: i64, use_eagle: bool, block_size: i64) -> i64:
        raise NotImplementedError

    def _find(self, g: SpecGroup, hashes: PrefixKeys, max_length: int,
              drop_eagle: bool) -> tuple[list[list[Block]], int]:
        m = self.manager_of[g.group_ids[0]]
        return m.find(hashes, max_length, g.group_ids, drop_eagle, self.align)

    def _margin(self, g: SpecGroup) -> int:
        m = self.manager_of[g.group_ids[0]]
        return eagle_proof_margin(m.block_size, self.hash_block_size,
                                  self.partial_hits and m.fine_lookup)

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
    def replay(self, req: CacheRequest) -> tuple[int, ...]:
        """The replay boundaries of ``req``'s prompt, kept on the request once computed
        (a tuple of boxed positions: built anew at each caching call they cost ~2 k CPU
        instructions a request); the prompt never changes, and ``replay_by`` tells a
        value another coordinator computed."""
        if req.replay_by is not self:
            req.replay = replay_boundaries(req.num_prompt_tokens, self.scheduler_block_size,
                                           self.drop_eagle)
            req.replay_by = self
        return req.replay

    def cache_blocks(self, req: CacheRequest, num_computed: i64) -> None:
        ret = self.retention
        # only sparse retention reads the replay boundaries
        replay = self.replay(req) if ret is not None else ()
        eagle = self._cacheable_eagle
        ms = self._cacheable
        for i in range(len(ms)):
            m = ms[i]
            m.cache_blocks(req, self.num_cacheable_tokens(num_computed, eagle[i], m.block_size),
                           ret, replay)

    def blocks_to_allocate(self, rid: str, num_tokens: i64, new_computed: list[list[Block]],
                           total_computed: i64, num_local: i64, num_tokens_main: i64,
                           admission: bool = False, prefill_end: i64 = 0) -> i64:
        """Blocks every group needs; ``new_computed`` is indexed by group id.

        ``prefill_end`` matters only under retention 0, where Mamba reserves an
        internal prefill checkpoint on the chunk reaching it alone (vLLM passes
        0 otherwise: every chunk publishes a state)."""
        if not self.retention_zero:
            prefill_end = 0
        n = 0
        for m in self.managers:
            n += m.blocks_to_allocate(rid, num_tokens, new_computed, total_computed,
                                      num_local, num_tokens_main, admission, prefill_end)
        return n

    def free(self, rid: str) -> None:
        for m in self.managers:
            m.free(rid)

    def new_step_starts(self) -> None:
        for m in self.mamba_managers:
            m.new_step_starts()


class UnitaryCoordinator(Coordinator):
    """One KV-cache group: its manager's hit is the hit (vLLM's
    ``UnitaryKVCacheCoordinator``); no reconciliation, no fine-grained hits."""

    def _arrange(self, specs: list[GroupSpec], hash_block_size: int,
                 scheduler_block_size: int) -> None:
        self.unitary = True
        m = self.managers[0]
        self.align = m.block_size
        m.use_eagle = 0 in self.drop_eagle_group_ids
        self._cacheable = [m]
        self._cacheable_eagle = [False]
        self.spec_groups = [SpecGroup(specs[0], [0], type(m), 0 in self.drop_eagle_group_ids)]

    def find_longest_cache_hit(self, hashes: PrefixKeys, max_length: int
                               ) -> tuple[list[list[Block]], int, int]:
        self.full_alone = -1
        g = self.spec_groups[0]
        blocks, hit = self._find(g, hashes, max_length, g.use_eagle)
        return [blocks[0]], hit, 0

    def find_per_group(self, hashes: PrefixKeys, max_length: int,
                       kinds: tuple[str, ...] | None = None) -> list[int]:
        """The one group alone is the lookup itself: vLLM's unitary coordinator has no
        per-group probe, and its EAGLE drop takes no proof margin (the hybrid probe's
        ``max_length + margin`` would report a block more than the hit)."""
        if kinds is not None and self.spec_groups[0].spec.kind not in kinds:
            return [0]
        return [self.find_longest_cache_hit(hashes, max_length)[1]]

    def num_cacheable_tokens(self, num_computed: i64, use_eagle: bool, block_size: i64) -> i64:
        n = num_computed - self.reprefillable
        return n if n > 0 else 0


class HybridCoordinator(Coordinator):
    """Several KV-cache groups reconciled to one hit by a fixed point (vLLM's
    ``HybridKVCacheCoordinator``)."""

    def _arrange(self, specs: list[GroupSpec], hash_block_size: int,
                 scheduler_block_size: int) -> None:
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
        self._cacheable = list(self.managers)
        self._cacheable_eagle = [m.use_eagle for m in self.managers]
        # With one full-attention spec group, looked up first, the first pass of
        # find_longest_cache_hit is exactly that group's hit alone (find_per_group)
        self._one_full = sum(1 for g in groups if g.spec.kind == "full") == 1
        self._found: list[list[list[Block]] | None] = [None] * len(groups)
        self._found_len = vec[i64]([0] * len(groups))

    def find_longest_cache_hit(self, hashes: PrefixKeys, max_length: int
                               ) -> tuple[list[list[Block]], int, int]:
        groups = self.spec_groups
        ng = len(groups)
        self.full_alone = -1
        hit_length = max_length
        first_pass = self._one_full
        longest = 0
        # per spec group (index in ``groups``): its members' hit blocks, hit length (the
        # coordinator's scratch lists, reset here: two lists built and freed a lookup
        # otherwise; nothing keeps them past the call, and no lookup runs inside one)
        found = self._found
        found_len = self._found_len
        for idx in range(ng):
            found[idx] = None
            found_len[idx] = 0
        simple = ng == 2 and groups[0].is_full
        verified: i64 = 0    # spec groups whose EAGLE drop was verified (bit idx)
        h = self.hash_block_size
        while True:
            curr = hit_length
            for idx in range(ng):
                g = groups[idx]
                if g.is_full and found[idx] is not None:
                    if found_len[idx] < curr:
                        curr = found_len[idx]
                    continue
                drop = g.use_eagle and not (verified >> idx) & 1
                lim = curr
                if drop and not g.is_mamba:
                    lim = min(curr + self._margin(g), hashes.count * h)
                blocks, new = self._find(g, hashes, lim, drop)
                if drop:
                    verified |= 1 << idx
                elif new < curr:
                    verified = 0
                curr = new
                if first_pass and g.is_full:
                    self.full_alone = new   # (idx 0, the full group, on its first pass)
                    first_pass = False
                found[idx] = blocks
                found_len[idx] = new
                if curr > longest:
                    longest = curr
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break
        out: list[list[Block]] = self._no_hits.copy()
        for idx in range(ng):
            g = groups[idx]
            got = found[idx]
            ids = g.group_ids
            if got is None:
                for gid in ids:
                    out[gid] = []
                continue
            if g.is_full:
                nb = cdiv(hit_length, self.manager_of[ids[0]].block_size)
                for c in got:
                    if len(c) > nb:
                        del c[nb:]
            for k in range(len(ids)):
                out[ids[k]] = got[k]
        return out, hit_length, longest - hit_length

    def num_cacheable_tokens(self, num_computed: i64, use_eagle: bool, block_size: i64) -> i64:
        # (statements, not min/max or conditional expressions: those box machine ints)
        sbs = self.scheduler_block_size
        aligned = num_computed
        if not self.partial_hits:
            aligned = num_computed // sbs * sbs
        if use_eagle and aligned > 0:
            fin = num_computed - self.reprefillable
            if fin < 0:
                fin = 0
            fin_aligned = fin
            if not self.partial_hits:
                fin_aligned = fin // sbs * sbs
            if fin_aligned + block_size < fin:
                return fin_aligned + block_size
            return fin
        return aligned


class NoPrefixCacheCoordinator(Coordinator):
    """Prefix caching off (vLLM's ``KVCacheCoordinatorNoPrefixCache``, what
    ``--no-enable-prefix-caching`` builds): every lookup misses, nothing is cached,
    the managers only keep the running requests' block tables (a Mamba group in mode
    ``none``: the running state and K speculative blocks per request)."""

    def __init__(self, cfg: CacheConfig,
                 pool_factory: Callable[[int, int, int], BlockPool] | None = None,
                 unit: int = 0):
        super().__init__(cfg, pool_factory, None, False, unit)

    def _arrange(self, specs: list[GroupSpec], hash_block_size: int,
                 scheduler_block_size: int) -> None:
        self._cacheable = []
        self._cacheable_eagle = []
        self.spec_groups = []

    def find_longest_cache_hit(self, hashes: PrefixKeys, max_length: int
                               ) -> tuple[list[list[Block]], int, int]:
        self.full_alone = 0
        return [[] for _ in self.specs], 0, 0

    def find_per_group(self, hashes: PrefixKeys, max_length: int,
                       kinds: tuple[str, ...] | None = None) -> list[int]:
        return [0] * len(self.specs)

    def num_cacheable_tokens(self, num_computed: i64, use_eagle: bool, block_size: i64) -> i64:
        return 0

    def cache_blocks(self, req: CacheRequest, num_computed: i64) -> None:
        return None


class IdealCoordinator(NoPrefixCacheCoordinator):
    """``cache.policy: ideal``: a reusable state (attention KV and Mamba state alike)
    at every hash-unit boundary of every prefix any request has computed, kept
    forever, so a hybrid model reuses what full attention alone would with unlimited
    memory: the upper bound of every hit.

    The states live in a content index (one pool key per distinct unit, whatever the
    number of groups: a million-request run holds one machine integer per distinct
    ``hash_block_size`` tokens, in ``KeyMap``'s open-addressing table), not in pool
    blocks; the pool (an ``UnlimitedBlockPool``) holds the running requests' tables as
    with caching off, hit tokens included.  A request's units are indexed as its
    tokens are scheduled (vLLM caches a block at allocation too).  With a Mamba group
    a state is only produced by the forward that computes it, so units indexed in a
    step become visible at the next step (vLLM defers a request that would use a
    state cached in its own step); full attention alone sees them at once, as in
    vLLM.  Keys are chained prefix keys, so a unit is indexed only after every unit
    before it: the indexed prefixes are closed under truncation and the longest hit
    is found by bisection."""

    def __init__(self, cfg: CacheConfig, unit: int):
        """Of ``cfg`` only the layout, the pool size and the speculative blocks are used
        (``unit`` is the hash unit; every vLLM switch is off)."""
        super().__init__(cfg, UnlimitedBlockPool, unit)
        self.unit = unit
        self.index = KeyMap(1024)
        self.deferred = any(s.kind == "mamba" for s in self.specs)
        self.pending: list[int] = []          # units indexed this step (deferred)
        self.indexed: dict[str, int] = {}     # request -> its units indexed so far

    def _has(self, hashes: PrefixKeys, k: int) -> bool:
        return self.index.has(hashes.key(k - 1))

    def find_longest_cache_hit(self, hashes: PrefixKeys, max_length: int
                               ) -> tuple[list[list[Block]], int, int]:
        lo = 0                                  # units known indexed
        hi = min(max_length // self.unit, hashes.count)
        if hi > 0 and self._has(hashes, hi):
            lo = hi
        else:
            hi -= 1                             # units possibly indexed
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._has(hashes, mid):
                    lo = mid
                else:
                    hi = mid - 1
        hit = lo * self.unit
        self.full_alone = hit
        return [[] for _ in self.specs], hit, 0

    def find_per_group(self, hashes: PrefixKeys, max_length: int,
                       kinds: tuple[str, ...] | None = None) -> list[int]:
        _, hit, _ = self.find_longest_cache_hit(hashes, max_length)
        return [hit if kinds is None or s.kind in kinds else 0 for s in self.specs]

    def cache_blocks(self, req: CacheRequest, num_computed: i64) -> None:
        keys = req.block_hashes
        n = min(num_computed // self.unit, keys.count)
        rid = req.request_id
        start = self.indexed.get(rid, 0)
        if n <= start:
            return
        self.indexed[rid] = n
        got = keys.keys_at([i for i in range(start, n)])
        if self.deferred:
            self.pending.extend(got)
        else:
            index = self.index
            for k in got:
                index.add(k, 0)

    def free(self, rid: str) -> None:
        super().free(rid)
        if rid in self.indexed:
            del self.indexed[rid]

    def new_step_starts(self) -> None:
        if self.pending:
            index = self.index
            for k in self.pending:
                index.add(k, 0)
            self.pending = []
        super().new_step_starts()


def get_coordinator(cfg: CacheConfig, enable_caching: bool = True,
                    pool_factory: Callable[[int, int, int], BlockPool] | None = None,
                    admission: Admission | None = None) -> Coordinator:
    """The coordinator for ``cfg``'s layout (vLLM's ``get_kv_cache_coordinator``).

    ``enable_caching`` False: prefix caching off (EAGLE's rules, which only concern
    cached prefixes, are off with it); ``pool_factory`` and ``admission``: the policy
    seams (``sim/cache/seams.py``; None: vLLM's LRU pool and admission rules).  A
    policy with other hit rules passes its own factory of this signature to
    ``KVCacheManager`` (``ideal_coordinator``)."""
    if not enable_caching:
        return NoPrefixCacheCoordinator(cfg, pool_factory)
    specs = cfg.group_specs()
    for s in specs:
        if s.kind == "mamba" and s.mamba_mode != "align":
            raise AssertionError("Mamba prefix caching requires mamba_cache_mode='align'")
    if len(specs) == 1:
        return UnitaryCoordinator(cfg, pool_factory, admission)
    return HybridCoordinator(cfg, pool_factory, admission)


def ideal_coordinator(unit: int) -> Callable[..., Coordinator]:
    """A ``get_coordinator``-shaped factory of the ideal cache at ``unit`` tokens
    (``cache.policy: ideal``): the config's layout, pool size and speculative blocks are
    used; every vLLM switch (hash unit, lookahead, EAGLE, retention, seams) is not."""

    def build(cfg: CacheConfig, enable_caching: bool = True,
              pool_factory: Callable[[int, int, int], BlockPool] | None = None,
              admission: Admission | None = None) -> Coordinator:
        return IdealCoordinator(cfg, unit)

    return build
