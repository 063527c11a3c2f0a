"""Per-type KV-cache managers: full attention, sliding window, Mamba (align).

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

from dataclasses import dataclass

from sim.cache.block_pool import GROUP_BITS, Block, BlockPool
from sim.cache.rules import cdiv, mamba_checkpoint_position


@dataclass(frozen=True)
class GroupSpec:
    """A KV-cache group: ``kind`` is full | swa | mamba."""

    kind: str
    block_size: int
    window: int = 0
    mamba_mode: str = "align"

    @property
    def label(self) -> str:
        return f"swa:{self.window}" if self.kind == "swa" else self.kind


# ----------------------------------------------------------------- lookups --

def find_full(pool: BlockPool, hashes: list[int], max_length: int, group_ids: list[int],
              block_size: int, drop_eagle: bool, align: int) -> tuple[list[list[Block]], int]:
    h = pool.hash_block_size
    fine = align < block_size and block_size % align == 0
    scale = block_size // h
    computed: list[list[Block]] = [[] for _ in group_ids]
    n_view = len(hashes) // scale
    get = pool.get_cached_block
    for j in range(min(max_length // block_size, n_view)):
        got = get(hashes[(j + 1) * scale - 1], group_ids)
        if not got:
            break
        for c, b in zip(computed, got):
            c.append(b)
    hit = len(computed[0]) * block_size
    if fine:
        sf = block_size // align
        first = len(computed[0]) * sf
        hi = min(first + sf - 1, max_length // align, len(hashes))
        for fi in range(hi - 1, first - 1, -1):
            got = get(hashes[fi], group_ids)
            if not got:
                continue
            for c, b in zip(computed, got):
                c.append(b)
            hit = (fi + 1) * align
            break
    if drop_eagle and hit > 0:
        hit -= min(align, block_size)
    hit -= hit % align
    nb = cdiv(hit, block_size)
    for c in computed:
        del c[nb:]
    return computed, hit


def swa_contiguous_blocks(window: int, block_size: int, use_eagle: bool) -> int:
    return cdiv(window - 1, block_size) + (1 if use_eagle else 0)


def find_swa(pool: BlockPool, hashes: list[int], max_length: int, group_ids: list[int],
             block_size: int, window: int, drop_eagle: bool,
             align: int) -> tuple[list[list[Block]], int]:
    h = pool.hash_block_size
    scale = block_size // h
    need = swa_contiguous_blocks(window, block_size, drop_eagle)
    max_blocks = max_length // block_size
    null = pool.null_block
    computed: list[list[Block]] = [[null] * max_blocks for _ in group_ids]
    run = 0
    found = False
    get = pool.get_cached_block
    for i in range(max_blocks - 1, -1, -1):
        # vLLM indexes the block-size view; past its end it raises IndexError
        idx = (i + 1) * scale - 1
        if idx >= len(hashes):
            raise IndexError("list index out of range")
        got = get(hashes[idx], group_ids)
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


def find_mamba(pool: BlockPool, hashes: list[int], max_length: int, group_ids: list[int],
               block_size: int, align: int) -> tuple[list[list[Block]], int]:
    h = pool.hash_block_size
    computed: list[list[Block]] = [[] for _ in group_ids]
    null = pool.null_block
    get = pool.get_cached_block
    cached = pool.cached
    g0 = group_ids[0]
    if align < block_size and block_size % align == 0:
        sf = block_size // align
        for fi in range(min(max_length // align, len(hashes)) - 1, -1, -1):
            # cheap membership probe on the first group before the full lookup
            if ((hashes[fi] << GROUP_BITS) | g0) not in cached:
                continue
            got = get(hashes[fi], group_ids)
            if got:
                k = fi // sf
                for c, b in zip(computed, got):
                    c.extend([null] * k)
                    c.append(b)
                return computed, (fi + 1) * align
        return computed, 0
    scale = block_size // h
    for i in range(max_length // block_size - 1, -1, -1):
        idx = (i + 1) * scale - 1
        if idx >= len(hashes):
            raise IndexError("list index out of range")
        if ((hashes[idx] << GROUP_BITS) | g0) not in cached:
            continue
        got = get(hashes[idx], group_ids)
        if got:
            if block_size != align and (i + 1) * block_size % align != 0:
                continue
            for c, b in zip(computed, got):
                c.extend([null] * i)
                c.append(b)
            return computed, (i + 1) * block_size
    return computed, 0


# ---------------------------------------------------------------- managers --

class SingleTypeManager:
    """Block table bookkeeping common to every kind (vLLM's base manager)."""

    fine_lookup = False

    def __init__(self, spec: GroupSpec, pool: BlockPool, group_id: int,
                 scheduler_block_size: int):
        self.spec = spec
        self.pool = pool
        self.group_id = group_id
        self.block_size = spec.block_size
        self.align = scheduler_block_size  # cache-hit alignment; lowered when fine-grained
        self.use_eagle = False
        self.shared_prefix_checkpoint = False
        self.req_blocks: dict[str, list[Block]] = {}
        self.num_cached: dict[str, int] = {}
        self.partial_hit: dict[str, tuple[int, Block]] = {}
        self.pending_cow: list[tuple[Block, Block]] = []

    # sizing ------------------------------------------------------------------
    def num_skipped_tokens(self, num_computed: int) -> int:
        return 0

    def _has_partial_local_hit(self, new_computed: list[Block], num_local: int) -> bool:
        return len(new_computed) > 0 and num_local % self.block_size != 0

    @staticmethod
    def _evictable(blocks) -> int:
        return sum(1 for b in blocks if b.ref_cnt == 0 and not b.is_null)

    admission_cap: int | None = None  # SWA: per-request block cap of the admission gate

    def blocks_to_allocate(self, rid: str, num_tokens: int, new_computed: list[Block],
                           total_computed: int, num_local: int, num_tokens_main: int,
                           admission: bool = False) -> int:
        required = cdiv(num_tokens, self.block_size)
        if admission and self.admission_cap is not None:
            required = min(required, self.admission_cap)
        have = len(self.req_blocks.get(rid, ()))
        if rid in self.num_cached:
            return max(required - have, 0)
        skipped_blocks = self.num_skipped_tokens(total_computed) // self.block_size
        local_blocks = len(new_computed) + have
        new = max(required - max(skipped_blocks, local_blocks), 0)
        skip_new = max(0, skipped_blocks - have)
        evictable = self._evictable(new_computed[skip_new:])
        if self._has_partial_local_hit(new_computed, num_local):
            new += 1
        return new + evictable

    # allocation --------------------------------------------------------------
    def add_local_computed(self, rid: str, new_computed: list[Block], num_local: int) -> None:
        blocks = self.req_blocks.setdefault(rid, [])
        assert not blocks
        skipped = self.num_skipped_tokens(num_local) // self.block_size
        if skipped > 0:
            new_computed = new_computed[skipped:]
        self.pool.touch(new_computed)
        blocks.extend([self.pool.null_block] * skipped)
        blocks.extend(new_computed)
        self.num_cached[rid] = len(blocks)
        if self._has_partial_local_hit(new_computed, num_local):
            idx = num_local // self.block_size
            self.partial_hit[rid] = (idx, new_computed[-1])
            self.num_cached[rid] = idx

    def _apply_cow(self, rid: str, idx: int, src: Block, cow: Block) -> None:
        blocks = self.req_blocks[rid]
        assert blocks[idx] is src
        blocks[idx] = cow
        self.pending_cow.append((src, cow))
        cow.ref_cnt += 1

    def allocate_new(self, rid: str, num_tokens: int, num_tokens_main: int) -> list[Block]:
        cow_blocks: list[Block] = []
        if rid in self.partial_hit:
            idx, src = self.partial_hit.pop(rid)
            cow = self.pool.get_new_blocks(1, self.group_id)[0]
            self._apply_cow(rid, idx, src, cow)
            cow_blocks.append(cow)
        blocks = self.req_blocks.setdefault(rid, [])
        new = cdiv(num_tokens, self.block_size) - len(blocks)
        if new <= 0:
            return cow_blocks
        got = self.pool.get_new_blocks(new, self.group_id)
        blocks.extend(got)
        return cow_blocks + got

    def take_pending_cow(self) -> list[tuple[Block, Block]]:
        out, self.pending_cow = self.pending_cow, []
        return out

    # caching -----------------------------------------------------------------
    def reachable_mask(self, start: int, end: int, retention: int | None,
                       boundaries: list[int]) -> list[bool] | None:
        return None

    def cache_blocks(self, req, num_tokens: int, retention: int | None,
                     replay: tuple[int, ...]) -> None:
        rid = req.request_id
        num_cached = self.num_cached.get(rid, 0)
        hashed = len(req.block_hashes) * self.pool.hash_block_size
        num_full = min(num_tokens, hashed) // self.block_size
        if num_cached >= num_full:
            return
        boundaries = list(replay)
        if req.shared_prefix_boundary:
            boundaries.append(req.shared_prefix_boundary)
            if self.use_eagle:
                boundaries.append(req.shared_prefix_boundary - self.block_size)
        mask = self.reachable_mask(num_cached, num_full, retention, boundaries)
        self.pool.cache_full_blocks(req.block_hashes, self.req_blocks[rid], num_cached,
                                    num_full, self.block_size, self.group_id, mask)
        self.num_cached[rid] = num_full

    # freeing -----------------------------------------------------------------
    def pop_blocks_for_free(self, rid: str) -> list[Block]:
        blocks = self.req_blocks.pop(rid, [])
        self.num_cached.pop(rid, None)
        self.partial_hit.pop(rid, None)
        i = 0
        while i < len(blocks) and blocks[i].is_null:
            i += 1
        return blocks[i:]

    def free(self, rid: str) -> None:
        self.pool.free_blocks(reversed(self.pop_blocks_for_free(rid)))

    def _remove_range(self, rid: str, first: int, last: int) -> None:
        blocks = self.req_blocks.get(rid)
        if blocks is None or first >= last:
            return
        last = min(last, len(blocks))
        freed = []
        null = self.pool.null_block
        for i in range(last - 1, first - 1, -1):
            if blocks[i] is null:
                break
            freed.append(blocks[i])
            blocks[i] = null
        if freed:
            self.pool.free_blocks(freed)

    def remove_skipped_blocks(self, rid: str, processed: int) -> None:
        skipped = self.num_skipped_tokens(processed)
        if skipped <= 0:
            return
        blocks = self.req_blocks.setdefault(rid, [])
        n = min(skipped // self.block_size, len(blocks))
        self._remove_range(rid, 0, n)

    def new_step_starts(self) -> None:
        return None


class FullAttentionManager(SingleTypeManager):
    fine_lookup = True

    def find(self, hashes, max_length, group_ids, drop_eagle, align):
        return find_full(self.pool, hashes, max_length, group_ids, self.block_size,
                         drop_eagle, align)

    def cache_blocks(self, req, num_tokens, retention, replay) -> None:
        super().cache_blocks(req, num_tokens, retention, replay)
        h = self.pool.hash_block_size
        if self.block_size == h:
            return
        limit = req.num_prompt_tokens if self.use_eagle else req.num_prompt_tokens - 1
        boundary = min(limit // h, len(req.block_hashes)) * h
        if boundary == 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return
        blocks = self.req_blocks[req.request_id]
        idx = boundary // self.block_size
        if idx >= len(blocks):
            return
        self.pool.cache_partial_block(req.block_hashes, blocks[idx], boundary, self.group_id)


class SlidingWindowManager(SingleTypeManager):
    def find(self, hashes, max_length, group_ids, drop_eagle, align):
        return find_swa(self.pool, hashes, max_length, group_ids, self.block_size,
                        self.spec.window, drop_eagle, align)

    def num_skipped_tokens(self, num_computed: int) -> int:
        return max(0, num_computed - self.spec.window + 1)

    def reachable_mask(self, start, end, retention, boundaries):
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


class MambaManager(SingleTypeManager):
    """Mamba in ``align`` mode: one running state block per request; cached
    states only where a chunk ends at a registered position."""

    fine_lookup = True

    def __init__(self, spec: GroupSpec, pool: BlockPool, group_id: int,
                 scheduler_block_size: int, num_speculative_blocks: int = 0,
                 checkpoint_rule: str = "v0.33"):
        super().__init__(spec, pool, group_id, scheduler_block_size)
        if spec.mamba_mode != "align":
            raise AssertionError("Mamba prefix caching requires mamba_cache_mode='align'")
        self.num_spec_blocks = num_speculative_blocks
        self.checkpoint_rule = checkpoint_rule
        self.drop_eagle_checkpoint = False
        self.cached_this_step: set[int] = set()
        self.last_state_idx: dict[str, int] = {}
        self.retired: dict[str, int] = {}
        self.allocated: set[str] = set()
        self.states_written: dict[str, int] = {}   # states this request registered

    def find(self, hashes, max_length, group_ids, drop_eagle, align):
        return find_mamba(self.pool, hashes, max_length, group_ids, self.block_size, align)

    def num_skipped_tokens(self, num_computed: int) -> int:
        return num_computed - 1

    def reachable_mask(self, start, end, retention, boundaries):
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

    def _remove_range(self, rid, first, last):
        blocks = self.req_blocks.get(rid, [])
        first = max(first, self.retired.get(rid, 0))
        last = min(last, len(blocks))
        if first >= last:
            return
        freed = []
        null = self.pool.null_block
        for i in range(last - 1, first - 1, -1):
            if blocks[i].is_null:
                continue
            freed.append(blocks[i])
            blocks[i] = null
        if freed:
            self.pool.free_blocks(freed)
        self.retired[rid] = last

    def remove_skipped_blocks(self, rid, processed):
        super().remove_skipped_blocks(rid, processed)
        last = self.last_state_idx.get(rid)
        if last is not None and last < cdiv(processed, self.block_size) - 1:
            blocks = self.req_blocks[rid]
            if not blocks[last].is_null:
                self.pool.free_blocks([blocks[last]])
                blocks[last] = self.pool.null_block

    def blocks_to_allocate(self, rid, num_tokens, new_computed, total_computed, num_local,
                           num_tokens_main, admission: bool = False):
        if new_computed and new_computed[-1].key in self.cached_this_step:
            # A state cached by another request in this same step is not handed
            # out: report "no room" so the request waits for the next step.
            return self.pool.num_blocks + 1
        required = cdiv(num_tokens_main, self.block_size) + self.num_spec_blocks
        new = required - len(new_computed) - len(self.req_blocks.get(rid, ()))
        has_partial = self._has_partial_local_hit(new_computed, num_local) or rid in self.partial_hit
        if has_partial:
            new = max(new, 0) + 1
        if new > 0:
            cap = 1 + int(has_partial)
            if rid not in self.allocated:
                cap += self.num_spec_blocks
            new = min(new, cap)
        return new + self._evictable(new_computed)

    def allocate_new(self, rid, num_tokens, num_tokens_main):
        blocks = self.req_blocks.setdefault(rid, [])
        required = cdiv(num_tokens_main, self.block_size) + self.num_spec_blocks
        partial = self.partial_hit.get(rid)
        if required <= len(blocks) and partial is None:
            self.allocated.add(rid)
            return []
        prev = len(blocks)
        was_allocated = rid in self.allocated
        if was_allocated:
            self.last_state_idx[rid] = prev - 1 - self.num_spec_blocks
        elif prev > 0:
            self.last_state_idx[rid] = prev - 1
        skipped = required - self.num_spec_blocks - 1
        null = self.pool.null_block
        if prev < skipped:
            blocks.extend([null] * (skipped - prev))
        if was_allocated:
            for idx in range(prev - self.num_spec_blocks, prev):
                if idx < skipped:
                    blocks.append(blocks[idx])
                    blocks[idx] = null
                else:
                    break
        new = max(required - len(blocks), 0)
        if partial is not None:
            new += 1
        got = self.pool.get_new_blocks(new, self.group_id)
        returned = blocks[prev:]
        if partial is not None:
            idx, src = partial
            cow, got = got[0], got[1:]
            if was_allocated:
                # The running request keeps writing into src: the cache entry
                # moves to a private copy instead.
                assert blocks[idx] is src
                self.pool.move_keys(src, cow)
                self.pending_cow.append((src, cow))
                src.ref_cnt += 1
                if cow.key is not None:
                    self.cached_this_step.add(cow.key)
            else:
                self._apply_cow(rid, idx, src, cow)
                returned = [cow] + returned
        blocks.extend(got)
        self.allocated.add(rid)
        self.partial_hit.pop(rid, None)
        return returned + got

    def pop_blocks_for_free(self, rid):
        self.allocated.discard(rid)
        self.last_state_idx.pop(rid, None)
        self.retired.pop(rid, None)
        self.states_written.pop(rid, None)
        return super().pop_blocks_for_free(rid)

    def cache_blocks(self, req, num_tokens, retention, replay) -> None:
        rid = req.request_id
        before = self.num_cached.get(rid, 0)
        super().cache_blocks(req, num_tokens, retention, replay)
        after = self.num_cached.get(rid, 0)
        written = 0
        key = self._cache_partial_tail(req, num_tokens)
        if key is not None:
            self.cached_this_step.add(key)
            written += 1
        if after > before:
            blocks = self.req_blocks[rid]
            for i in range(before, after):
                b = blocks[i]
                if b.is_null or b.key is None:
                    continue
                self.cached_this_step.add(b.key)
                written += 1
        if written:
            self.states_written[rid] = self.states_written.get(rid, 0) + written

    def new_step_starts(self) -> None:
        self.cached_this_step.clear()

    def _cache_partial_tail(self, req, num_tokens: int) -> int | None:
        h = self.pool.hash_block_size
        if num_tokens <= 0 or num_tokens % h != 0:
            return None
        latest = mamba_checkpoint_position(req.num_prompt_tokens, h, self.drop_eagle_checkpoint,
                                           self.pool.lookahead, self.checkpoint_rule)
        at_junction = (self.shared_prefix_checkpoint
                       and num_tokens == req.shared_prefix_boundary
                       and req.num_computed_tokens < num_tokens <= req.num_prompt_tokens)
        if num_tokens != latest and not at_junction:
            return None
        idx = cdiv(num_tokens, self.block_size) - 1
        blocks = self.req_blocks[req.request_id]
        if idx >= len(blocks):
            return None
        src = blocks[idx]
        if src.is_null or src.key_tokens == num_tokens:
            return None
        key = self.pool.cache_partial_block(req.block_hashes, src, num_tokens, self.group_id)
        if key is not None and num_tokens % self.block_size:
            self.partial_hit[req.request_id] = (idx, src)
            self.num_cached[req.request_id] = idx
        return key
