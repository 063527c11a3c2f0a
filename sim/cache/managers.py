"""Per-type KV-cache managers: the common base, full attention, sliding window (Mamba in
``sim/cache/mamba_manager.py``).

One manager per KV-cache group, as in vLLM 0.33.0's
``single_type_kv_cache_manager``.  Each keeps the request's block table
(``req_blocks``), caches blocks as chunks complete, and answers "longest
cached prefix" for its kind.  The lookups are module-level functions over a
*spec group* (groups with identical specs are looked up jointly: a hit must
exist in every member group).

Behaviour that decides hit lengths, in one place:

* full attention: left-to-right whole blocks, then (fine-grained mode) the
  highest partial key inside the first missing block; EAGLE drops one hash
  unit (fine) or one block; partial keys are registered only at the prompt's
  last hash boundary (``n - 1`` without EAGLE, ``n`` with it);
* sliding window: right-to-left search for enough contiguous blocks to cover
  the window (+1 block with EAGLE, then dropped);
* Mamba: right-to-left for the single rightmost cached state; never drops
  for EAGLE; a state exists only where a chunk ended on a block boundary, at
  the prompt checkpoint, or at the junction when the shared-prefix flag is on.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from librt.vecs import vec
from mypy_extensions import i64

from sim.cache.block_pool import GROUP_BITS, Block, BlockPool
from sim.cache.events import partial_is_new
from sim.cache.hashing import PrefixKeys, unit_end
from sim.cache.rules import cdiv
from sim.cache.specs import GroupSpec

if TYPE_CHECKING:
    from sim.cache.request import CacheRequest


# ----------------------------------------------------------------- lookups --

def find_full(pool: BlockPool, hashes: PrefixKeys, max_length: int, group_ids: list[int],
              block_size: int, drop_eagle: bool, align: int) -> tuple[list[list[Block]], int]:
    h = pool.hash_block_size
    fine = align < block_size and block_size % align == 0
    scale = block_size // h
    computed: list[list[Block]] = [[] for _g in group_ids]
    n_view = hashes.count // scale
    km = pool.key_map
    g0 = group_ids[0]
    nb: i64 = max_length // block_size
    if n_view < nb:
        nb = n_view
    if len(group_ids) == 1 and nb > 0:
        # one group: walk the hash map directly, and the keys run by run (the key of
        # block j ends at token e = (j + 1) * block_size + lookahead; inside one run
        # it is unit_end(pre, e - begin): PrefixKeys.key without the search, as in
        # find_mamba)
        c0 = computed[0]
        step = scale * hashes.unit
        e = step + hashes.lookahead
        pre: i64 = 0
        b0: i64 = 0
        nxt: i64 = -1    # last token of the located run (-1: none located yet)
        ix0 = pool.at_unit
        nix0: i64 = len(ix0)
        # (the keys the CPU tier's connector already computed at this scale, if any)
        memo = hashes.memo
        nmemo: i64 = len(memo) if hashes.memo_scale == scale else 0
        j = 0
        while j < nb:
            # (no key of this group at the block's end: the walk stops there)
            slot0: i64 = (((j + 1) * scale) << GROUP_BITS) | g0
            if slot0 >= nix0 or ix0[slot0] <= 0:
                break
            if j < nmemo:
                kj = memo[j]
            else:
                if e > nxt:
                    pre, b0, nxt = hashes.run_at(e)
                kj = unit_end(pre, e - b0)
            bid = km.first((kj << GROUP_BITS) | g0)
            if bid < 0:
                break
            c0.append(pool.blocks[bid])
            j += 1
            e += step
    elif len(group_ids) > 1:
        for j in range(nb):
            got = pool.get_cached_block(hashes.key((j + 1) * scale - 1), group_ids)
            if not got:
                break
            for c, b in zip(computed, got):
                c.append(b)
    hit = len(computed[0]) * block_size
    if fine:
        sf = block_size // align
        first = len(computed[0]) * sf
        hi: i64 = min(first + sf - 1, max_length // align)
        if hashes.count < hi:
            hi = hashes.count
        # the partial keys inside the first missing block, right to left, passing
        # over the positions where the first group holds no key (as in find_mamba)
        fi = hi - 1
        unit = hashes.unit
        la = hashes.lookahead
        ix = pool.at_unit
        nix: i64 = len(ix)
        pre = 0
        b0 = 0
        nxt = -1
        while fi >= first:
            slot: i64 = ((fi + 1) << GROUP_BITS) | g0
            if slot >= nix or ix[slot] <= 0:
                fi -= 1
                continue
            e = (fi + 1) * unit + la
            if e <= b0 or e > nxt:
                pre, b0, nxt = hashes.run_at(e)
            kf = unit_end(pre, e - b0)
            if km.has((kf << GROUP_BITS) | g0):
                got = pool.get_cached_block(kf, group_ids)
                if got:
                    for c, b in zip(computed, got):
                        c.append(b)
                    hit = (fi + 1) * align
                    break
            fi -= 1
    if drop_eagle and hit > 0:
        hit -= min(align, block_size)
    hit -= hit % align
    nb = cdiv(hit, block_size)
    for c in computed:
        if len(c) > nb:
            del c[nb:]
    return computed, hit


def swa_contiguous_blocks(window: int, block_size: int, use_eagle: bool) -> int:
    return cdiv(window - 1, block_size) + (1 if use_eagle else 0)


def find_swa(pool: BlockPool, hashes: PrefixKeys, max_length: int, group_ids: list[int],
             block_size: int, window: int, drop_eagle: bool,
             align: int) -> tuple[list[list[Block]], int]:
    h = pool.hash_block_size
    scale = block_size // h
    need = swa_contiguous_blocks(window, block_size, drop_eagle)
    max_blocks = max_length // block_size
    null = pool.null_block
    computed: list[list[Block]] = [[null] * max_blocks for _g in group_ids]
    run = 0
    found = False
    for i in range(max_blocks - 1, -1, -1):
        # vLLM indexes the block-size view; past its end it raises IndexError
        idx = (i + 1) * scale - 1
        if idx >= hashes.count:
            raise IndexError("list index out of range")
        got = pool.get_cached_block(hashes.key(idx), group_ids)
        if got:
            if run == 0 and block_size != align:
                post = i if drop_eagle else i + 1
                if (post * block_size) % align != 0:
                    continue
            for c, b in zip(computed, got):
                c[i] = b
            run += 1
            if run >= need:
                for c in computed:
                    del c[i + run:]
                found = True
                break
        else:
            run = 0
    if not found:
        for c in computed:
            del c[run:]
        while block_size != align and len(computed[0]) * block_size % align != 0:
            for c in computed:
                c.pop()
    if drop_eagle and computed[0]:
        for c in computed:
            c.pop()
        while block_size != align and len(computed[0]) * block_size % align != 0:
            for c in computed:
                c.pop()
    return computed, len(computed[0]) * block_size


class ReqState:
    """One request's bookkeeping in one manager: everything that was a per-request
    dict entry (block table, cached count, partially hit block, and the Mamba
    manager's running-state fields), in one object found with one dict lookup per
    call (machine integers: no boxed int per field).  A field's "absent" value stands
    for a missing entry; the object lives from the request's first touch to
    ``_forget``."""

    def __init__(self) -> None:
        self.table: list[list[Block]] | None = None   # one block list per member
        self.num_cached: i64 = -1          # blocks registered (-1: none yet)
        self.partial_idx: i64 = -1         # the partially hit block's index (-1: none)
        self.partial_srcs: list[Block] | None = None   # ... and that block of each member
        # Mamba (align mode): the previous running state's index, the first index not
        # yet freed below it, whether the request was allocated, states registered,
        # and the current chunk's internal prefill checkpoint (position 0: none)
        self.has_last = False
        self.last_state: i64 = 0
        self.retired: i64 = 0
        self.allocated = False
        self.written: i64 = 0
        self.ckpt_pos: i64 = 0
        self.ckpt_idx: i64 = 0


class SingleTypeManager:
    """Block table bookkeeping common to every kind (vLLM's base manager).

    One manager serves a *run* of consecutive KV-cache groups with identical
    specs (Nemotron-H-8B: one attention group, then six identical Mamba
    groups).  vLLM keeps one manager per group, and every member of such a
    run sees the same request with the same positions, so the decisions
    (how many blocks, which indices to free, where a state is cached) are
    identical; only the physical blocks differ.  We decide once and apply the
    pool operations member by member, in group order, so the free queue
    evolves exactly as with one manager per group.  Reads of per-block state
    (reference counts, keys) stay per member.

    ``states[rid].table`` holds one block list per member; all have the same
    length and the same null pattern.
    """

    fine_lookup = False
    admission_cap: int | None = None  # SWA: per-request block cap of the admission gate
    # whether ``reachable_mask`` reads sparse retention's boundaries (the base and full
    # attention keep every block: no boundary list is built for them)
    reads_boundaries = True

    def __init__(self, spec: GroupSpec, pool: BlockPool, group_ids: list[int],
                 scheduler_block_size: int):
        self.spec = spec
        self.pool = pool
        self.group_ids = list(group_ids)
        # (machine integers: read at every allocation and caching call)
        self.group_id: i64 = self.group_ids[0]
        self.width: i64 = len(self.group_ids)
        self.block_size: i64 = spec.block_size
        self.align: i64 = scheduler_block_size  # cache-hit alignment; lowered when fine-grained
        self.use_eagle = False
        self.shared_prefix_checkpoint = False
        # rid -> its bookkeeping here (block tables, cached count, partial hit, ...)
        self.states: dict[str, ReqState] = {}
        # the last (rid, state) found: a request's allocation and caching ask its state
        # five or six times in a row, each a str-keyed dict lookup (~140 CPU
        # instructions compiled) where an identity test is one (``_get``)
        self._last_rid: str | None = None
        self._last_st: ReqState | None = None
        self._no_boundaries: tuple[int, ...] = ()   # (no sparse retention)
        self._no_keys = vec[i64]()   # (``stored_full``'s keys when blocks are listed)
        self.pending_cow: list[list[tuple[Block, Block]]] = [[] for _g in self.group_ids]
        self.has_pending_cow = False

    def find(self, hashes: PrefixKeys, max_length: int, group_ids: list[int], drop_eagle: bool,
             align: int) -> tuple[list[list[Block]], int]:
        raise NotImplementedError

    def table(self, rid: str) -> list[Block]:
        """The block table of the first member group (empty if none)."""
        st = self._get(rid)
        if st is None:
            return []
        t = st.table
        return t[0] if t else []

    def _get(self, rid: str) -> ReqState | None:
        """``rid``'s bookkeeping, None before its first touch (``states.get`` behind a
        one-entry memo: the memo holds a state only while it is in ``states``, and None
        only while ``rid`` has none -- an admission asks several times about a request
        not yet allocated; ``_state`` and ``_forget`` keep it true)."""
        if rid is self._last_rid:
            return self._last_st
        st = self.states.get(rid)
        self._last_rid = rid
        self._last_st = st
        return st

    def _state(self, rid: str) -> ReqState:
        """``rid``'s bookkeeping, made on first touch."""
        st = self._get(rid)
        if st is None:
            st = ReqState()
            self.states[rid] = st
            self._last_rid = rid
            self._last_st = st
        return st

    def _new_table(self, st: ReqState) -> list[list[Block]]:
        t: list[list[Block]] = []
        k: i64 = 0
        while k < self.width:   # (a range over an i64 would box each index)
            t.append([])
            k += 1
        st.table = t
        return t

    def has_cached(self, rid: str) -> bool:
        """Whether ``rid`` registered blocks here (vLLM: ``num_cached_block`` has it)."""
        st = self._get(rid)
        return st is not None and st.num_cached >= 0

    # sizing ------------------------------------------------------------------
    def num_skipped_tokens(self, num_computed: i64) -> i64:
        return 0

    def _evictable(self, new_computed: list[list[Block]], skip: i64 = 0) -> i64:
        """Hit blocks (over all members) that sit in the free queue."""
        if len(new_computed[self.group_id]) <= skip:
            return 0   # (the members' hit lists have one length: none has a block here)
        n: i64 = 0
        for g in self.group_ids:
            nc = new_computed[g]
            j: i64 = skip
            m: i64 = len(nc)
            while j < m:   # (from ``skip`` by index: no slice copied)
                b = nc[j]
                if b.ref_cnt == 0 and not b.is_null:
                    n += 1
                j += 1
        return n

    def blocks_to_allocate(self, rid: str, num_tokens: i64, new_computed: list[list[Block]],
                           total_computed: i64, num_local: i64, num_tokens_main: i64,
                           admission: bool = False, prefill_end: i64 = 0) -> i64:
        """Blocks the pool must hand out for all members (``new_computed`` is
        indexed by group id)."""
        bs = self.block_size
        required = -(-num_tokens // bs)
        if admission and self.admission_cap is not None:
            required = min(required, self.admission_cap)
        st = self._get(rid)
        t = st.table if st is not None else None
        have = len(t[0]) if t else 0
        if st is not None and st.num_cached >= 0:
            return max(required - have, 0) * self.width
        skipped_blocks = self.num_skipped_tokens(total_computed) // bs
        nc0 = new_computed[self.group_id]
        new = max(required - max(skipped_blocks, len(nc0) + have), 0)
        skip_new = max(0, skipped_blocks - have)
        if nc0 and num_local % bs:
            new += 1
        return new * self.width + self._evictable(new_computed, skip_new)

    # allocation --------------------------------------------------------------
    def add_local_computed(self, rid: str, new_computed: list[list[Block]],
                           num_local: i64, num_external: i64 = 0) -> None:
        st = self._state(rid)
        t = st.table
        assert not t or not t[0]
        t = self._new_table(st)
        skipped = self.num_skipped_tokens(num_local + num_external) // self.block_size
        null = self.pool.null_block
        hit = 0
        for blocks, g in zip(t, self.group_ids):
            nc = new_computed[g]
            if skipped > 0:
                nc = nc[skipped:]
            self.pool.touch(nc)
            if skipped > 0:
                blocks.extend([null] * skipped)
            blocks.extend(nc)
            hit = len(nc)
        st.num_cached = len(t[0])
        if hit and num_local % self.block_size:
            idx = num_local // self.block_size
            st.partial_idx = idx
            st.partial_srcs = [blocks[-1] for blocks in t]
            st.num_cached = idx

    def allocate_external(self, rid: str, num_local: i64, num_external: i64) -> None:
        """Fresh blocks for the tokens a KV connector loads past the local hit (vLLM's
        ``allocate_external_computed_blocks``): up to the loaded end, past what the
        group skips (a Mamba group: the one block holding the loaded state)."""
        total = num_local + num_external
        skipped = self.num_skipped_tokens(total)
        if skipped > 0 and total - skipped < num_external:
            num_external = total - skipped
        if num_external <= 0:
            return
        st = self._state(rid)
        t = st.table
        if t is None:
            t = self._new_table(st)
        new = -(-total // self.block_size) - len(t[0])
        if new <= 0:
            return
        fresh = self.pool.take_new_blocks(new * self.width, self.group_id)
        j = 0
        for mi in range(self.width):
            blocks = t[mi]
            end = j + new
            while j < end:
                blocks.append(fresh[j])
                j += 1

    def _apply_cow(self, blocks: list[Block], member: int, idx: int, src: Block,
                   cow: Block) -> None:
        assert blocks[idx] is src
        blocks[idx] = cow
        self.pending_cow[member].append((src, cow))
        self.has_pending_cow = True
        cow.ref_cnt += 1

    def allocate_new(self, rid: str, num_tokens: i64, num_tokens_main: i64) -> None:
        st = self._state(rid)
        t = st.table
        if t is None:
            t = self._new_table(st)
        srcs = st.partial_srcs
        idx = st.partial_idx
        if srcs is not None:
            st.partial_srcs = None
            st.partial_idx = -1
        new = -(-num_tokens // self.block_size) - len(t[0])
        if srcs is None and new <= 0:
            return
        if new < 0:
            new = 0
        per = new + (1 if srcs is not None else 0)
        # one pop for every member (same blocks, same order as member by member)
        fresh = self.pool.take_new_blocks(per * self.width, self.group_id)
        j = 0
        for mi in range(self.width):
            blocks = t[mi]
            end = j + per
            if srcs is not None:
                self._apply_cow(blocks, mi, idx, srcs[mi], fresh[j])
                j += 1
            while j < end:
                blocks.append(fresh[j])
                j += 1

    def take_pending_cow(self) -> list[list[tuple[Block, Block]]]:
        """This step's copy-on-write pairs, one list per member."""
        out = self.pending_cow
        self.pending_cow = [[] for _g in self.group_ids]
        self.has_pending_cow = False
        return out

    # caching -----------------------------------------------------------------
    def reachable_mask(self, start: int, end: int, retention: int | None,
                       boundaries: tuple[int, ...]) -> list[bool] | None:
        return None

    def cache_indices(self, start: int, end: int, retention: int | None,
                      boundaries: tuple[int, ...]) -> list[int] | None:
        """The indices in ``[start, end)`` of the blocks to register, increasing (None:
        every one): those ``reachable_mask`` marks."""
        mask = self.reachable_mask(start, end, retention, boundaries)
        if mask is None:
            return None
        out: list[int] = []
        for j in range(len(mask)):   # (an index loop: enumerate is generic)
            if mask[j]:
                out.append(start + j)
        return out

    def cache_blocks(self, req: CacheRequest, num_tokens: i64, retention: int | None,
                     replay: tuple[int, ...]) -> None:
        """Cache the full blocks ``num_tokens`` completed.  ``replay``: the prompt's
        replay boundaries (read only with sparse retention)."""
        rid = req.request_id
        st = self._get(rid)
        num_cached: i64 = 0
        if st is not None and st.num_cached > 0:
            num_cached = st.num_cached
        keys = req.block_hashes
        hashed: i64 = keys.count * self.pool.hash_block_size
        done: i64 = num_tokens
        if hashed < done:
            done = hashed
        num_full: i64 = done // self.block_size
        if num_cached >= num_full:
            return
        if st is None:
            st = self._state(rid)
        boundaries = self._no_boundaries   # (only sparse retention reads them)
        if retention is not None and self.reads_boundaries:
            boundaries = replay   # (the request's own tuple: no copy unless it grows)
            spb = req.shared_prefix_boundary
            if spb:
                boundaries = replay + ((spb, spb - self.block_size) if self.use_eagle
                                       else (spb,))
        indices = self.cache_indices(num_cached, num_full, retention, boundaries)
        pool = self.pool
        scale = self.block_size // pool.hash_block_size
        block_keys = self._no_keys
        if indices is None:
            # every block: keys in a vec, registered as a range (no index list)
            t = st.table
            if t is None:
                raise KeyError(rid)
            block_keys = keys.block_keys(num_cached, num_full, scale)
            for mi in range(self.width):
                pool.cache_full_range(block_keys, t[mi], num_cached, self.block_size,
                                      self.group_ids[mi])
        else:   # (decided once for every member)
            if indices:
                t = st.table
                if t is None:
                    raise KeyError(rid)
                listed = keys.keys_at([(i + 1) * scale - 1 for i in indices])
                for mi in range(self.width):
                    pool.cache_full_blocks(listed, t[mi], indices, self.block_size,
                                           self.group_ids[mi])
        obs = pool.key_observers
        if obs:
            t = st.table
            if t is None:
                raise KeyError(rid)
            for o in obs:
                o.stored_full(req, t, self.group_ids, indices, block_keys, self.block_size,
                              num_cached, num_full, pool.hash_block_size)
        st.num_cached = num_full

    # freeing -----------------------------------------------------------------
    def _forget(self, rid: str) -> list[list[Block]] | None:
        # (``get`` + ``del`` rather than ``dict.pop``, which the compiled build calls
        # generically at ~600 CPU instructions a time)
        st = self._get(rid)
        if st is None:
            return None
        del self.states[rid]
        self._last_rid = None
        self._last_st = None
        return st.table

    def free(self, rid: str) -> None:
        """Return every member's blocks, tail first (leading nulls skipped)."""
        t = self._forget(rid)
        if not t:
            return
        b0 = t[0]
        i = 0
        while i < len(b0) and b0[i].is_null:
            i += 1
        # each member's blocks from i, tail first
        self.pool.free_tails(t, i)

    def _remove_range(self, rid: str, first: int, last: int) -> None:
        st = self._get(rid)
        t = st.table if st is not None else None
        if t is None or first >= last:
            return
        last = min(last, len(t[0]))
        null = self.pool.null_block
        lists: list[list[Block]] = []
        for blocks in t:
            freed: list[Block] = []
            for i in range(last - 1, first - 1, -1):
                if blocks[i] is null:
                    break
                freed.append(blocks[i])
                blocks[i] = null
            lists.append(freed)
        self.pool.free_blocks_each(lists)

    def remove_skipped_blocks(self, rid: str, processed: i64) -> None:
        skipped = self.num_skipped_tokens(processed)
        if skipped <= 0:
            return
        st = self._get(rid)
        t = st.table if st is not None else None
        if t is None:
            return
        self._remove_range(rid, 0, min(skipped // self.block_size, len(t[0])))

    def new_step_starts(self) -> None:
        return None


class FullAttentionManager(SingleTypeManager):
    fine_lookup = True
    reads_boundaries = False

    def find(self, hashes: PrefixKeys, max_length: int, group_ids: list[int], drop_eagle: bool,
             align: int) -> tuple[list[list[Block]], int]:
        return find_full(self.pool, hashes, max_length, group_ids, self.block_size,
                         drop_eagle, align)

    def cache_blocks(self, req: CacheRequest, num_tokens: i64, retention: int | None,
                     replay: tuple[int, ...]) -> None:
        super().cache_blocks(req, num_tokens, retention, replay)
        h = self.pool.hash_block_size
        if self.block_size == h:
            return
        limit = req.num_prompt_tokens if self.use_eagle else req.num_prompt_tokens - 1
        units: i64 = limit // h
        if req.block_hashes.count < units:
            units = req.block_hashes.count
        boundary = units * h
        if boundary == 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return
        st = self._get(req.request_id)
        if st is None:
            raise KeyError(req.request_id)
        t = st.table
        if t is None:
            raise KeyError(req.request_id)
        idx = boundary // self.block_size
        if idx >= len(t[0]):
            return
        unit_hash = -1
        obs = self.pool.key_observers
        for blocks, g in zip(t, self.group_ids):
            if blocks[idx].is_null:
                continue
            if unit_hash < 0:
                unit_hash = req.block_hashes.key(boundary // h - 1)
            if obs and partial_is_new(self.pool, unit_hash, blocks[idx], g):
                self.pool.cache_partial_block(unit_hash, blocks[idx], boundary, g)
                for o in obs:
                    o.stored_partial(req, unit_hash, boundary, h, g)
            else:
                self.pool.cache_partial_block(unit_hash, blocks[idx], boundary, g)


class SlidingWindowManager(SingleTypeManager):
    def find(self, hashes: PrefixKeys, max_length: int, group_ids: list[int], drop_eagle: bool,
             align: int) -> tuple[list[list[Block]], int]:
        return find_swa(self.pool, hashes, max_length, group_ids, self.block_size,
                        self.spec.window, drop_eagle, align)

    def num_skipped_tokens(self, num_computed: i64) -> i64:
        n = num_computed - self.spec.window + 1
        return n if n > 0 else 0

    def reachable_mask(self, start: int, end: int, retention: int | None,
                       boundaries: tuple[int, ...]) -> list[bool] | None:
        align = self.align
        bs = self.block_size
        if align % bs != 0:
            return None
        need = swa_contiguous_blocks(self.spec.window, bs, self.use_eagle)
        shift = 1 if self.use_eagle else 0
        mask = [False] * (end - start)
        seg = align if retention is None else (None if retention == 0 else retention)
        if seg is not None:
            per = seg // bs
            if need >= per:
                return None
            for i in range(start, end):
                if i >= shift and (i - shift) % per >= per - need:
                    mask[i - start] = True
        if retention is not None:
            for b in boundaries:
                aligned = b // align * align
                e = aligned // bs + shift
                for j in range(max(start, e - need), min(end, e)):
                    mask[j - start] = True
        return mask
