"""The Mamba manager (vLLM 0.33.0's ``MambaManager``): align mode with prefix caching
(one running state per request, cached states only where a chunk ends at a registered
position, the prompt checkpoint, the junction, internal prefill checkpoints, copy-on-write
of partial tails, same-step deferral), and mode ``none`` without it.

Split from ``managers.py`` (the base and the attention managers) because it is half of
the per-type logic on its own; compiled with the hot path like it (``sim/native.py``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from librt.vecs import append, vec
from mypy_extensions import i64

from sim.cache.block_pool import GROUP_BITS, Block, BlockPool, make_key
from sim.cache.events import partial_is_new
from sim.cache.hashing import PrefixKeys, unit_end
from sim.cache.managers import ReqState, SingleTypeManager
from sim.cache.rules import cdiv, mamba_checkpoint_position, prefill_checkpoint_valid
from sim.cache.seams import Admission
from sim.cache.specs import GroupSpec

if TYPE_CHECKING:
    from sim.cache.request import CacheRequest


def _hit_lists(null: Block, k: i64, got: list[Block]) -> list[list[Block]]:
    """Each member's hit list: ``k`` null blocks, then its state block."""
    out: list[list[Block]] = []
    for b in got:
        c = [null] * k
        c.append(b)
        out.append(c)
    return out


def find_mamba(pool: BlockPool, hashes: PrefixKeys, max_length: int, group_ids: list[int],
               block_size: int, align: int,
               miss: list[list[Block]]) -> tuple[list[list[Block]], int]:
    """The longest prefix (at most ``max_length`` tokens) at whose end every member
    ``group_ids`` holds a state, and each member's hit list; ``miss`` (an empty list
    per member, never written: the caller's) is the answer when there is none, as it
    is at most lookups (no list built for them)."""
    h = pool.hash_block_size
    null = pool.null_block
    km = pool.key_map
    g0 = group_ids[0]
    if align < block_size and block_size % align == 0:
        sf = block_size // align
        fi: i64 = max_length // align
        if hashes.count < fi:
            fi = hashes.count
        fi -= 1
        # walk the units right to left, passing over every position where the first
        # group holds no key (``BlockPool.at_unit``: no key to compute, no probe); a
        # key inside one run is unit_end(pre, offset) (PrefixKeys.key without the
        # search), the run located once per run met
        unit = hashes.unit
        la = hashes.lookahead
        ix = pool.at_unit
        nix: i64 = len(ix)
        pre: i64 = 0
        b0: i64 = 0
        nxt: i64 = -1    # last token of the located run (-1: none located yet)
        # (the block ends' keys the CPU tier's connector already computed, if any)
        mscale: i64 = block_size // h
        memo = hashes.memo
        nmemo: i64 = len(memo) if hashes.memo_scale == mscale else 0
        while fi >= 0:
            slot: i64 = ((fi + 1) << GROUP_BITS) | g0
            if slot >= nix or ix[slot] <= 0:
                fi -= 1
                continue
            q: i64 = fi + 1
            if nmemo and q % mscale == 0 and q // mscale <= nmemo:
                kf = memo[q // mscale - 1]     # (a block end the CPU tier keyed)
            else:
                e = q * unit + la
                if e <= b0 or e > nxt:
                    pre, b0, nxt = hashes.run_at(e)
                kf = unit_end(pre, e - b0)
            # cheap membership probe on the first group before the full lookup
            if km.has((kf << GROUP_BITS) | g0):
                got = pool.get_cached_block(kf, group_ids)
                if got:
                    return _hit_lists(null, fi // sf, got), (fi + 1) * align
            fi -= 1
        return miss, 0
    scale = block_size // h
    # (the keys the CPU tier's connector already computed at this scale, if any)
    memo = hashes.memo
    nmemo = len(memo) if hashes.memo_scale == scale else 0
    for i in range(max_length // block_size - 1, -1, -1):
        idx = (i + 1) * scale - 1
        if idx >= hashes.count:
            raise IndexError("list index out of range")
        kx = memo[i] if i < nmemo else hashes.key(idx)
        if not km.has((kx << GROUP_BITS) | g0):
            continue
        got = pool.get_cached_block(kx, group_ids)
        if got:
            if block_size != align and (i + 1) * block_size % align != 0:
                continue
            return _hit_lists(null, i, got), (i + 1) * block_size
    return miss, 0


# ---------------------------------------------------------------- managers --


class Handoffs:
    """One Mamba group's committed states a KV connector has not taken yet, in commit
    order: request, block and boundary tokens of each, the first ``n`` entries of three
    buffers kept (overwritten, not freed, once taken: no tuple a state)."""

    def __init__(self) -> None:
        self.rids: list[str] = []
        self.blocks: list[Block] = []
        self.ends = vec[i64]()
        self.n: i64 = 0

    def add(self, rid: str, block: Block, end: i64) -> None:
        n = self.n
        if n < len(self.rids):
            self.rids[n] = rid
            self.blocks[n] = block
            self.ends[n] = end
        else:
            self.rids.append(rid)
            self.blocks.append(block)
            self.ends = append(self.ends, end)
        self.n = n + 1

    def drop_request(self, rid: str) -> None:
        """``rid``'s entries leave (the order of the rest kept)."""
        k: i64 = 0
        for j in range(self.n):
            if self.rids[j] != rid:
                if k != j:
                    self.rids[k] = self.rids[j]
                    self.blocks[k] = self.blocks[j]
                    self.ends[k] = self.ends[j]
                k += 1
        self.n = k


class MambaManager(SingleTypeManager):
    """Mamba in ``align`` mode: one running state block per request; cached
    states only where a chunk ends at a registered position.

    In mode ``none`` (prefix caching off, ``cache.policy: none``) vLLM sizes the
    Mamba block at ``max_model_len`` tokens, so its base-manager arithmetic gives
    every request ``cdiv(n + K * max_model_len, max_model_len) = 1 + K`` blocks
    for any length ``n <= max_model_len`` and never skips one (``(n - 1) //
    max_model_len = 0``): the running state plus one per speculative token, held
    from the first allocation to the finish.  We keep that closed form rather
    than a block of ``max_model_len`` tokens, so no grid (scheduler block, hash
    unit) is ever derived from ``max_model_len``."""

    fine_lookup = True

    def __init__(self, spec: GroupSpec, pool: BlockPool, group_ids: list[int],
                 scheduler_block_size: int, num_speculative_blocks: int = 0,
                 checkpoint_rule: str = "v0.33", admission: Admission | None = None):
        super().__init__(spec, pool, group_ids, scheduler_block_size)
        # the admission seam (sim/cache/seams.py): None is vLLM's rules
        self.admission = admission
        # rid -> (block, key) per member: the decode-phase state an admission with
        # ``sequence_end`` keeps provisionally (the request's latest)
        self.sequence_end: dict[str, list[tuple[Block, int]]] = {}
        # (a caching coordinator insists on align mode: get_coordinator)
        self.align_mode = spec.mamba_mode == "align"
        self.num_spec_blocks = num_speculative_blocks
        self.checkpoint_rule = checkpoint_rule
        self.drop_eagle_checkpoint = False
        # the keys of every member cached in this step: the first ``n_cached_now`` of
        # ``cached_now`` (a handful a step, scanned; machine integers: no boxed key and no
        # set entry per state cached; ``new_step_starts`` resets the count)
        self.cached_now = vec[i64]()
        self.n_cached_now: i64 = 0
        self._null_runs: list[list[Block]] = []   # (``_null_run``)
        # a lookup's answer when no state is found: an empty list per member, shared
        # by every such lookup (nothing writes a hit list: the hit is 0 then, and a
        # zero hit's lists are only read; ``find_mamba``)
        self._miss: list[list[Block]] = []
        # (per request: the running state's fields of ``ReqState``)
        # internal prefill checkpoints: this group reserves a block per chunk
        self.ckpt_blocks = spec.prefill_checkpoint_blocks > 0 and spec.mamba_mode == "align"
        self.ckpt_align = spec.prefill_checkpoint_alignment
        # with a KV connector (the CPU tier): each member's committed states not yet
        # taken, (request, block, boundary tokens), and the requests whose own partial
        # prompt-tail state the next copy-on-write preserves (boundary tokens)
        self.has_handoffs = False
        self.handoffs: list[Handoffs] = []
        self.n_handoffs: i64 = 0          # entries over every member's Handoffs
        self.producer_tail: dict[str, int] = {}

    def enable_handoffs(self) -> None:
        self.has_handoffs = True
        self.handoffs = [Handoffs() for _g in self.group_ids]

    def _hand_off(self, mi: i64, rid: str, block: Block, end: i64) -> None:
        """Member ``mi`` committed ``rid``'s state in ``block`` at ``end`` tokens: the
        connector takes it with the step's others."""
        self.handoffs[mi].add(rid, block, end)
        self.n_handoffs += 1

    def _null_run(self, k: int) -> list[Block]:
        """``k`` null blocks (a list kept per length, never written: padding a table
        extends it from here instead of building one per member)."""
        runs = self._null_runs
        while len(runs) <= k:
            runs.append([self.pool.null_block] * len(runs))
        return runs[k]

    def checkpoint_of(self, rid: str) -> tuple[int, int] | None:
        """(position, reserved block index) of ``rid``'s current chunk's internal prefill
        checkpoint, if it has one."""
        st = self._get(rid)
        if st is None or st.ckpt_pos <= 0:
            return None
        return st.ckpt_pos, st.ckpt_idx

    def written_by(self, rid: str) -> int:
        """Mamba states ``rid`` registered (one member group's count)."""
        st = self._get(rid)
        return st.written if st is not None else 0

    def find(self, hashes: PrefixKeys, max_length: int, group_ids: list[int], drop_eagle: bool,
             align: int) -> tuple[list[list[Block]], int]:
        if len(self._miss) != len(group_ids):   # (the group ids asked about: always the same)
            self._miss = [[] for _g in group_ids]
        return find_mamba(self.pool, hashes, max_length, group_ids, self.block_size, align,
                          self._miss)

    def num_skipped_tokens(self, num_computed: i64) -> i64:
        return num_computed - 1

    def reachable_mask(self, start: int, end: int, retention: int | None,
                       boundaries: tuple[int, ...]) -> list[bool] | None:
        if retention is None:
            return None
        bs = self.block_size
        mask = [False] * (end - start)
        if retention != 0:
            per = retention // bs
            if per <= 1:
                return None
            first = (start + per) // per * per - 1
            for i in range(first - start, len(mask), per):
                mask[i] = True
        for b in boundaries:
            aligned = b // self.align * self.align
            blk = aligned // bs - 1
            if start <= blk < end:
                mask[blk - start] = True
        return mask

    def cache_indices(self, start: int, end: int, retention: int | None,
                      boundaries: tuple[int, ...]) -> list[int] | None:
        """Retention 0 keeps the boundaries' blocks alone: listed directly (increasing,
        once each), not through a mask over every block."""
        if retention is None or retention != 0:
            return super().cache_indices(start, end, retention, boundaries)
        out: list[int] = []
        bs = self.block_size
        align = self.align
        for b in boundaries:
            blk = b // align * align // bs - 1
            if start <= blk < end:
                k = len(out)
                while k > 0 and out[k - 1] > blk:
                    k -= 1
                if k > 0 and out[k - 1] == blk:
                    continue
                out.insert(k, blk)
        return out

    def remove_skipped_blocks(self, rid: str, processed: i64) -> None:
        """Free the states below the running one: the skipped range (nulls
        skipped, tail first) and the previous running state, member by member."""
        if not self.align_mode:
            return   # mode none: the one running state is never skipped
        st = self._get(rid)
        if st is None:
            return
        t = st.table
        if t is None:
            return
        n_blocks: i64 = len(t[0])
        first: i64 = 0
        last: i64 = 0
        skipped = processed - 1
        if skipped > 0:
            first = st.retired
            last = min(skipped // self.block_size, n_blocks)
        drop_last = st.has_last and st.last_state < -(-processed // self.block_size) - 1
        ls = st.last_state if st.has_last else 0
        if first >= last and not drop_last:
            return
        # the frees in the order one manager per group makes
        self.pool.free_skipped(t, first, last, drop_last, ls)
        if first < last:
            st.retired = last

    @property
    def max_blocks_per_request(self) -> int:
        """Pages one request holds at most in align mode (vLLM ``max_memory_usage_bytes``):
        the running state, the one before it, one per speculative token and the internal
        prefill checkpoint blocks.  Mode none: the running state and K speculative ones."""
        if not self.align_mode:
            return 1 + self.num_spec_blocks
        return 2 + self.num_spec_blocks + (self.spec.prefill_checkpoint_blocks
                                           if self.ckpt_blocks else 0)

    def _needs_internal_checkpoint(self, st: ReqState | None, query_start: i64,
                                   query_end: i64, checkpoint: i64, prefill_end: i64) -> bool:
        """Whether this chunk exports a state from inside itself into a reserved
        block (vLLM's ``MambaManager._needs_internal_checkpoint``): the backend
        can, and the column it would write is not already a live block."""
        if not self.ckpt_blocks or query_end < prefill_end:
            return False
        bs = self.block_size
        if not prefill_checkpoint_valid(query_start, query_end, checkpoint,
                                        self.pool.hash_block_size, bs, self.ckpt_align):
            return False
        idx = -(-query_end // bs) - 2
        if idx < 0:
            return False
        t = st.table if st is not None else None
        if not t:
            return True   # (no blocks: idx >= 0 = len)
        blocks = t[0]
        n = len(blocks)
        return (idx >= n or blocks[idx].is_null
                or (st is not None and st.allocated and idx >= n - self.num_spec_blocks))

    def blocks_to_allocate(self, rid: str, num_tokens: i64, new_computed: list[list[Block]],
                           total_computed: i64, num_local: i64, num_tokens_main: i64,
                           admission: bool = False, prefill_end: i64 = 0) -> i64:
        if self.n_cached_now:
            for g in self.group_ids:
                nc = new_computed[g]
                if nc and self.cached_in_step(nc[-1].key):
                    # A state cached by another request in this same step is not
                    # handed out: report "no room" so the request waits a step.
                    return self.pool.num_blocks + 1
        st = self._get(rid)
        t = st.table if st is not None else None
        if not self.align_mode:
            new = 1 + self.num_spec_blocks - (len(t[0]) if t else 0)
            return (new if new > 0 else 0) * self.width + self._evictable(new_computed)
        bs = self.block_size
        required = -(-num_tokens_main // bs) + self.num_spec_blocks
        nc0 = new_computed[self.group_id]
        new = required - len(nc0) - (len(t[0]) if t else 0)
        has_partial = (bool(nc0) and num_local % bs != 0) or (
            st is not None and st.partial_srcs is not None)
        if has_partial:
            new = max(new, 0) + 1
        ckpt_block = 0
        if self.ckpt_blocks:
            # keyed on the chunk end, where the worker exports the state
            pos = mamba_checkpoint_position(num_tokens_main, self.align, self.drop_eagle_checkpoint,
                                            self.pool.lookahead, self.checkpoint_rule)
            if not self._needs_internal_checkpoint(st, total_computed, num_tokens_main, pos,
                                                   prefill_end):
                pos = 0
            ckpt_block = int(pos > 0)
            if not admission:
                if pos > 0:
                    if st is None:
                        st = self._state(rid)
                    st.ckpt_pos = pos
                    st.ckpt_idx = -(-num_tokens_main // bs) - 2
                elif st is not None:
                    st.ckpt_pos = 0
                    st.ckpt_idx = 0
        if new > 0:
            cap = 1 + int(has_partial) + ckpt_block
            if st is None or not st.allocated:
                cap += self.num_spec_blocks
            new = min(new, cap)
        return new * self.width + self._evictable(new_computed)

    def allocate_new(self, rid: str, num_tokens: i64, num_tokens_main: i64) -> None:
        st = self._state(rid)
        t = st.table
        if t is None:
            t = self._new_table(st)
        b0 = t[0]
        if not self.align_mode:
            # mode none: the running state and K speculative blocks, once
            once = 1 + self.num_spec_blocks - len(b0)
            if once > 0:
                got = self.pool.take_new_blocks(once * self.width, self.group_id)
                for k in range(self.width):
                    t[k].extend(got[k * once:(k + 1) * once])
            return
        # (machine integers throughout, and while loops: a range over an i64 boxes its
        # index)
        nspec: i64 = self.num_spec_blocks
        required: i64 = -(-num_tokens_main // self.block_size) + nspec
        srcs = st.partial_srcs
        pidx = st.partial_idx
        ckpt_block: i64 = 0
        if self.ckpt_blocks and st.ckpt_pos > 0:
            ckpt_block = 1
        prev: i64 = len(b0)
        if required <= prev and srcs is None and not ckpt_block:
            st.allocated = True
            return
        was_allocated = st.allocated
        if was_allocated:
            st.has_last = True
            st.last_state = prev - 1 - nspec
        elif prev > 0:
            st.has_last = True
            st.last_state = prev - 1
        skipped = required - nspec - 1
        # the reserved checkpoint column stays a real block (the worker exports there)
        live_from = skipped - ckpt_block
        null = self.pool.null_block
        pad: i64 = live_from - prev if prev < skipped else 0   # null entries each member gets
        for blocks in t:
            if pad > 0:
                if pad <= 4:   # (a block crossing pads one: appends cost less than an extend)
                    kp: i64 = 0
                    while kp < pad:
                        blocks.append(null)
                        kp += 1
                else:
                    blocks.extend(self._null_run(pad))
            if was_allocated:
                # the speculative blocks move up past the skipped range
                idx: i64 = prev - nspec
                while idx < prev:
                    if idx < live_from:
                        blocks.append(blocks[idx])
                        blocks[idx] = null
                    else:
                        break
                    idx += 1
        new: i64 = required - len(b0)
        if new < 0:
            new = 0
        if srcs is not None:
            new += 1
        pool = self.pool
        width: i64 = self.width
        # one pop for every member: the free queue hands out the same blocks in
        # the same order as member-by-member pops (nothing in between touches it)
        # (no blocks: nothing below reads the list)
        fresh = pool.take_new_blocks(new * width, self.group_id) if new else pool.fresh
        tail: i64 = -1   # a producer's partial-tail state this copy preserves (connector)
        if self.has_handoffs and srcs is not None and was_allocated:
            at = self.producer_tail.get(rid)
            if at is not None:
                del self.producer_tail[rid]
                tail = at
        mi: i64 = 0
        while mi < width:
            blocks = t[mi]
            j = mi * new          # this member's blocks: fresh[j:j + new]
            end = j + new
            if srcs is not None:
                idx = pidx
                src = srcs[mi]
                cow = fresh[j]
                j += 1
                if was_allocated:
                    # The running request keeps writing into src: the cache entry
                    # moves to a private copy instead.
                    assert blocks[idx] is src
                    pool.move_keys(src, cow)
                    self.pending_cow[mi].append((src, cow))
                    self.has_pending_cow = True
                    src.ref_cnt += 1
                    if tail >= 0:
                        self._hand_off(mi, rid, cow, tail)
                    if cow.key >= 0:
                        self._cached_now(cow.key)
                else:
                    self._apply_cow(blocks, mi, idx, src, cow)
            while j < end:
                blocks.append(fresh[j])
                j += 1
            mi += 1
        st.allocated = True
        if srcs is not None:
            st.partial_srcs = None
            st.partial_idx = -1

    def _table_of(self, rid: str) -> list[list[Block]]:
        """``rid``'s block tables (KeyError if it has none)."""
        st = self._get(rid)
        if st is None:
            raise KeyError(rid)
        t = st.table
        if t is None:
            raise KeyError(rid)
        return t

    def _forget(self, rid: str) -> list[list[Block]] | None:
        if self.has_handoffs:
            # a freed request's states not yet taken are not offered (their blocks may
            # be handed to another request at once)
            if rid in self.producer_tail:
                del self.producer_tail[rid]
            if self.n_handoffs:
                n: i64 = 0
                for h in self.handoffs:
                    if h.n:
                        h.drop_request(rid)
                        n += h.n
                self.n_handoffs = n
        if self.admission is not None:
            if rid in self.sequence_end:
                del self.sequence_end[rid]   # (its last state stays: the sequence's end)
            self.admission.finished(rid)
        return super()._forget(rid)

    def cache_blocks(self, req: CacheRequest, num_tokens: i64, retention: int | None,
                     replay: tuple[int, ...]) -> None:
        rid = req.request_id
        adm = self.admission
        if adm is not None:
            replay = adm.boundaries(req, num_tokens, replay)
        st = self._get(rid)
        before: i64 = 0
        if st is not None and st.num_cached > 0:
            before = st.num_cached
        super().cache_blocks(req, num_tokens, retention, replay)
        if st is None:
            st = self._get(rid)
        after: i64 = 0
        if st is not None and st.num_cached > 0:
            after = st.num_cached
        if adm is not None and adm.sequence_end and after > before:
            self._keep_sequence_end(req, before, after)
        written = self._cache_partial_tail(req, num_tokens, retention)
        if after > before:
            assert st is not None
            t = st.table
            if t is None:
                raise KeyError(rid)
            for mi in range(len(t)):
                blocks = t[mi]
                for i in range(before, after):
                    b = blocks[i]
                    if b.is_null or b.key < 0:
                        continue
                    self._cached_now(b.key)
                    if self.has_handoffs:
                        self._hand_off(mi, rid, b, b.key_tokens)
                    if mi == 0:
                        written += 1
        if written:
            self._state(rid).written += written

    def _keep_sequence_end(self, req: CacheRequest, before: int, after: int) -> None:
        """Of the decode-phase states (past the prompt) just cached in blocks
        ``before .. after-1``, keep the last and take back every earlier one of this
        request: only the sequence's last state stays when it finishes."""
        t = self._table_of(req.request_id)
        npt = req.num_prompt_tokens
        last = -1
        for i in range(after - 1, before - 1, -1):
            b = t[0][i]
            if not b.is_null and b.key >= 0 and b.key_tokens > npt:
                last = i
                break
        if last < 0:
            return
        pool = self.pool
        prev = self.sequence_end.get(req.request_id)
        if prev is not None:
            for b, key in prev:
                if b.key == key:   # (still that state: not evicted and re-keyed since)
                    pool.uncache(b)
        for i in range(before, last):
            for blocks in t:
                b = blocks[i]
                if not b.is_null and b.key >= 0 and b.key_tokens > npt:
                    pool.uncache(b)
        self.sequence_end[req.request_id] = [(blocks[last], blocks[last].key) for blocks in t]

    def new_step_starts(self) -> None:
        self.n_cached_now = 0

    def _cached_now(self, key: i64) -> None:
        """Record that ``key`` was cached in this step."""
        n = self.n_cached_now
        if n < len(self.cached_now):
            self.cached_now[n] = key
        else:
            self.cached_now = append(self.cached_now, key)
        self.n_cached_now = n + 1

    def cached_in_step(self, key: i64) -> bool:
        """Whether ``key`` was cached in this step (by any request)."""
        keys = self.cached_now
        for i in range(self.n_cached_now):
            if keys[i] == key:
                return True
        return False

    def _cache_checkpoint(self, req: CacheRequest, pos: int, idx: int,
                          retention: int | None) -> int:
        """Key the reserved checkpoint block at the state the chunk exported
        (vLLM re-keys it whatever it held before).  A transient checkpoint (not
        the prompt's, not a retained boundary, not the junction) is overwritten
        by the next chunk: its block loses every key instead."""
        rid = req.request_id
        t = self._table_of(rid)
        npt = req.num_prompt_tokens
        prompt_ckpt = pos == mamba_checkpoint_position(
            npt, self.align, self.drop_eagle_checkpoint, self.pool.lookahead, self.checkpoint_rule)
        retained = False
        if not prompt_ckpt and pos % self.block_size == 0:
            blk = pos // self.block_size - 1
            mask = self.reachable_mask(blk, blk + 1, retention, ())
            retained = mask is None or mask[0]
        pool = self.pool
        if not prompt_ckpt and not retained and pos != req.shared_prefix_boundary:
            for blocks in t:
                pool.drop_keys(blocks[idx])
            return 0
        written = 0
        unit_hash = req.block_hashes.key(pos // pool.hash_block_size - 1)
        for mi, g in enumerate(self.group_ids):
            b = t[mi][idx]
            if b.is_null or b.key_tokens == pos:
                continue
            pool.drop_keys(b)
            key = make_key(unit_hash, g)
            pool.insert_key(key, b, pos)
            if pool.key_observers:   # (re-keyed whatever it held: always published)
                for o in pool.key_observers:
                    o.stored_partial(req, unit_hash, pos, pool.hash_block_size, g)
            self._cached_now(key)
            if mi == 0:
                written = 1
        return written

    def _cache_partial_tail(self, req: CacheRequest, num_tokens: i64,
                            retention: int | None) -> int:
        """Register the prompt checkpoint (or junction) state inside a block;
        returns the states the first member registered (0 or 1)."""
        st = self._get(req.request_id)
        if st is not None and st.ckpt_pos > 0:
            return self._cache_checkpoint(req, st.ckpt_pos, st.ckpt_idx, retention)
        h = self.pool.hash_block_size
        if num_tokens <= 0 or num_tokens % h != 0:
            return 0
        # (a few integer operations: cheaper than a memo keyed by the prompt length)
        latest = mamba_checkpoint_position(req.num_prompt_tokens, h, self.drop_eagle_checkpoint,
                                           self.pool.lookahead, self.checkpoint_rule)
        at_junction = (self.shared_prefix_checkpoint
                       and num_tokens == req.shared_prefix_boundary
                       and req.num_computed_tokens < num_tokens <= req.num_prompt_tokens)
        if num_tokens != latest and not at_junction:
            return 0
        idx = cdiv(num_tokens, self.block_size) - 1
        t = st.table if st is not None else None
        if t is None or idx >= len(t[0]):
            return 0
        written = 0
        registered = []
        unit_hash = -1
        for mi, g in enumerate(self.group_ids):
            src = t[mi][idx]
            if src.is_null or src.key_tokens == num_tokens:
                continue
            if unit_hash < 0:
                unit_hash = req.block_hashes.key(num_tokens // h - 1)
            obs = self.pool.key_observers
            if obs and partial_is_new(self.pool, unit_hash, src, g):
                key = self.pool.cache_partial_block(unit_hash, src, num_tokens, g)
                for o in obs:
                    o.stored_partial(req, unit_hash, num_tokens, h, g)
            else:
                key = self.pool.cache_partial_block(unit_hash, src, num_tokens, g)
            if key < 0:
                continue
            self._cached_now(key)
            registered.append(src)
            if mi == 0:
                written = 1
        if registered and num_tokens % self.block_size:
            if self.has_handoffs:
                self.producer_tail[req.request_id] = num_tokens
            if len(registered) != self.width:
                # Mid-block states are only registered on blocks this request
                # wrote itself, which every member holds alike.
                raise AssertionError("identical KV-cache groups diverged at a partial state")
            assert st is not None
            st.partial_idx = idx
            st.partial_srcs = registered
            st.num_cached = idx
        return written
