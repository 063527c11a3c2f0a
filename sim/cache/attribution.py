"""Why a request missed: its prompt split into disjoint classes at its first admission.

Issue #17.  At a request's first admission lookup, on the full-attention group's key
chain (capped at ``num_tokens - 1`` and floored to the hit alignment, as the lookup
caps a hit), five prefix lengths are ordered::

    P_all >= P_done >= A_pool >= H_noeagle >= hit

* ``P_all``: the longest prefix whose keys were ever cached *or* belong to the prompt of
  a request admitted before (running, or preempted: still to be computed) -- what an
  unlimited attention-only cache would reuse;
* ``P_done``: the same over keys ever cached (cached now, or evicted: ``EvictionLog``);
* ``A_pool``: full attention's hit alone in this pool, without the EAGLE drop;
* ``H_noeagle``: the reconciled hit of the same lookup without the EAGLE drop (the same
  pool state; = ``hit`` when no group drops);
* ``hit``: the lookup's reconciled hit.

The classes are their differences: ``compulsory = prompt - P_all``, ``in_flight = P_all -
P_done``, ``capacity = P_done - A_pool``, ``checkpoint = A_pool - H_noeagle`` (full
attention held it, the other groups -- Mamba states, a sliding window -- did not),
``speculative = H_noeagle - hit``; with ``hit`` they add up to the prompt.

Keys are the pool's (lookahead hashes included: what lookahead alignment costs cannot be
told on the same pool, so it stays inside the chain).  A full-attention group registers a
partial (sub-block) key only at a prompt's tail and drops it when the block fills; such a
key counts as ever cached while it is cached or was evicted, and partial keys of admitted
prompts do not count as pending (their last < one block of tokens is then compulsory).

``cache.policy: none`` caches nothing: what the trace would reuse (``P_all``) is
``capacity`` (a cache of no capacity), the rest compulsory.  ``ideal`` keeps every
computed prefix: ``P_done = A_pool = H_noeagle = hit``, so capacity, checkpoint and
speculative are 0 and ``in_flight`` is what was admitted but not yet computed (or, with
Mamba, computed this step: visible at the next).

Counterfactual lookups run only when the hit falls short of ``P_all``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from mypy_extensions import i64

from sim.cache.block_pool import GROUP_BITS
from sim.cache.coordinator import Coordinator, HybridCoordinator, IdealCoordinator, SpecGroup
from sim.cache.evictions import EvictionLog
from sim.cache.key_map import KeyMap
from sim.cache.hashing import PrefixKeys, unit_end
from sim.cache.mamba_manager import MambaManager
from sim.cache.managers import SingleTypeManager

if TYPE_CHECKING:
    from sim.cache.kv_manager import KVCacheManager, Lookup
    from sim.cache.request import CacheRequest

# classes, in requests.csv column order (hit is the existing hit_tokens)
CLASSES = ("compulsory", "capacity", "checkpoint", "speculative", "in_flight")
# why full attention's reach had no usable state (checkpoint_reason column)
EVICTED = "evicted"        # a Mamba state past the hit was evicted
RETENTION = "retention"    # sparse retention keeps states only at its boundaries
JUNCTION = "junction"      # the prompt leaves the cached prefix there; no junction state
ALIGN = "align"            # states sit only at chunk ends on the block grid / the checkpoint
WINDOW = "window"          # a sliding-window group did not hold the window
REASON_SCAN = 32           # Mamba positions looked at for an evicted state (cheap bound)
ROOT = -1                  # the "block before block 0" (pool keys are >= 0)


class Miss:
    """One request's split (tokens).  ``reason``: checkpoint sub-reason, "" if none."""

    __slots__ = ("compulsory", "capacity", "checkpoint", "speculative", "in_flight",
                 "reason", "p_all", "p_done", "a_pool", "h_noeagle", "hit", "evicted_by",
                 "evicted_at")

    def __init__(self, prompt: int, hit: int, p_all: int, p_done: int, a_pool: int,
                 h_noeagle: int, reason: str = ""):
        self.hit = hit
        self.p_all = p_all
        self.p_done = p_done
        self.a_pool = a_pool
        self.h_noeagle = h_noeagle
        self.compulsory = prompt - p_all
        self.in_flight = p_all - p_done
        self.capacity = p_done - a_pool
        self.checkpoint = a_pool - h_noeagle
        self.speculative = h_noeagle - hit
        self.reason = reason
        self.evicted_by = ""   # a capacity miss: the request whose allocation evicted it,
        self.evicted_at = -1   # and when (ns; -1: none)

    def classes(self) -> tuple[int, int, int, int, int]:
        return (self.compulsory, self.capacity, self.checkpoint, self.speculative,
                self.in_flight)

    def __repr__(self) -> str:
        return (f"Miss(hit={self.hit}, compulsory={self.compulsory}, capacity={self.capacity}, "
                f"checkpoint={self.checkpoint}, speculative={self.speculative}, "
                f"in_flight={self.in_flight}, reason={self.reason!r})")


class MissAttribution:
    """Tracks what the split needs (the eviction log, admitted prompts' keys) and splits
    a request at its first admission (``classify``, then ``admit`` once it is in)."""

    def __init__(self, kv: KVCacheManager):
        c = kv.coordinator
        self.kv = kv
        self.coordinator: Coordinator = c
        self.pool = c.pool
        # (one log per pool: an eviction log already enabled is shared, not replaced)
        existing = kv.eviction_log
        self.log: EvictionLog = existing if existing is not None else EvictionLog()
        self.mode: str = ("ideal" if isinstance(c, IdealCoordinator)
                          else "pool" if kv.enable_caching else "none")
        # pool keys (ideal: unit keys) of admitted prompts (``none`` and ``ideal``)
        self.admitted: set[int] = set()
        # pool mode: admitted requests whose prompt was not scheduled whole (their blocks
        # past it are pending until scheduled: vLLM caches a block as it is scheduled);
        # dropped lazily once their prompt is computed
        self.prefilling: list[CacheRequest] = []
        self.compact_at = 64   # the list's length at which admit drops computed prompts
        self.violations = 0               # orderings that did not hold (clamped; tests read it)
        # tools and tests may set a list here: every admitted request, in admission order
        self.admissions: list[CacheRequest] | None = None
        # fine-grained hits: the unit indices where full attention may register a
        # partial key at an admitted prompt's tail, by the key of the block before them,
        # as a bit mask of their offsets in their block (bit ``i``: unit ``b * units per
        # block + i`` of block ``b``; one key names one block, so one base per key)
        # (``loose``: those whose block before reaches past the prompt's keys)
        self.tails: dict[int, int] = {}
        self.loose: set[int] = set()
        self.unit: int = c.hash_block_size
        full = [g for g in c.spec_groups if g.spec.kind == "full"]
        self.group: SpecGroup | None = None
        self.group_ids: list[int] = []
        self.gid = 0
        self.block_size = self.unit
        if self.mode == "none":
            full_ids = [i for i, s in enumerate(c.specs) if s.kind == "full"]
            self.gid = full_ids[0] if full_ids else 0
            self.block_size = c.specs[self.gid].block_size
        elif self.mode == "pool":
            self.group = full[0] if full else (c.spec_groups[0] if c.spec_groups else None)
            self.gid = self.group.group_ids[0] if self.group is not None else 0
            self.group_ids = self.group.group_ids if self.group is not None else []
            self.block_size = c.manager_of[self.gid].block_size
        self.applicable = self.mode == "ideal" or bool(full) or (
            self.mode == "none" and any(s.kind == "full" for s in c.specs))
        self.align: int = c.align if self.mode == "pool" else self.block_size
        self.fine = self.mode == "pool" and self.align < self.block_size \
            and self.block_size % self.align == 0
        self.scale = max(self.block_size // self.unit, 1)
        self.eagle = self.mode == "pool" and any(g.use_eagle for g in c.spec_groups)
        m: SingleTypeManager | None = c.manager_of[self.gid] if self.mode == "pool" else None
        # a full-attention group keys the prompt tail (below a block) at this limit
        self.tail_eagle = bool(m is not None and m.use_eagle)
        mamba = [g for g in c.spec_groups if g.spec.kind == "mamba"] if self.mode == "pool" else []
        self.mamba_gid = mamba[0].group_ids[0] if mamba else -1
        self.has_swa = any(g.spec.kind == "swa" for g in c.spec_groups) \
            if self.mode == "pool" else False
        self.retention: int | None = c.retention
        self.junction_state: bool = kv.shared_prefix_checkpoint
        if self.mode == "pool":
            kv.enable_eviction_log(self.log)
        # ``tails`` in machine integers when a block's masks fit in 62 bits (the hit grid
        # is the hash unit and a block has at most 62 units: 17 on Mooncake's grid; a
        # bit then stands for a unit of its block): key = parent key + 1 (ROOT -> 0)
        self.tail_map: KeyMap | None = None
        if self.fine and self.align == self.unit and self.block_size // self.align <= 62:
            self.tail_map = KeyMap(1024)

    # ------------------------------------------------------------------ keys --
    def _num_blocks(self, req: CacheRequest, limit: int) -> int:
        """Full-attention blocks of ``req`` ending at or before ``limit`` tokens."""
        return min(limit // self.block_size, req.block_hashes.count // self.scale)

    def _block_key(self, req: CacheRequest, j: int) -> int:
        """Pool key of full-attention block ``j`` of ``req`` (computed on demand: a walk
        usually stops a block or two past the hit, so keys are not listed up front)."""
        return (req.block_hashes.key((j + 1) * self.scale - 1) << GROUP_BITS) | self.gid

    def _block_keys(self, req: CacheRequest, limit: int, first: int = 0) -> list[int]:
        """Pool keys of the full-attention blocks ``first`` .. ending at or before
        ``limit`` tokens."""
        keys = req.block_hashes
        nb = self._num_blocks(req, limit)
        if nb <= first:
            return []
        s = self.scale
        gid = self.gid
        return [(k << GROUP_BITS) | gid for k in keys.keys_at([(j + 1) * s - 1
                                                               for j in range(first, nb)])]

    def admit(self, req: CacheRequest, scheduled_end: int = -1) -> None:
        """``req`` was admitted: its prompt's keys are pending until computed.

        ``scheduled_end``: the tokens its first step computes (-1: unknown, all pending).
        The blocks that step covers are cached as it is scheduled (as vLLM caches them at
        allocation), so they count as ever cached from then on: only a prompt not
        scheduled whole has pending blocks, and the walks ask it for its key at a block
        only where the pool never held one (``_pending``) -- most prompts are scheduled
        whole and cost nothing here."""
        if not self.applicable:
            return
        # (a Python int: the tails below are bit masks of any width, which a machine
        # integer would cut at 64 bits)
        n: int = req.num_prompt_tokens
        keys = req.block_hashes
        if self.admissions is not None:
            self.admissions.append(req)
        if self.mode == "ideal":
            units = min(n // self.unit, keys.count)
            self.admitted.update(keys.keys_at([i for i in range(units)]))
            return
        if self.mode == "none":
            self.admitted.update(self._block_keys(req, n))
        elif scheduled_end < 0 or scheduled_end < n:
            lst = self.prefilling
            lst.append(req)
            if len(lst) >= self.compact_at:
                # drop the computed ones here too (walks drop them only when they look):
                # a replay of a million requests must not hold every chunked prompt
                self.prefilling = [q for q in lst if q.num_computed_tokens < q.num_prompt_tokens]
                self.compact_at = 2 * len(self.prefilling) + 64
        nbp = self._num_blocks(req, n)
        if self.fine:
            # where the group may key a partial prefix of this prompt: its tail, at
            # n - 1 or n, capped by the keys it has when it caches (lookahead: more
            # than now) (FullAttentionManager.cache_blocks); the only places
            # find_full's partial search can ever meet a key
            h = self.unit
            bs = self.block_size
            per = bs // self.align
            last_b = -1          # (both limits usually end in one block: one parent key)
            parent = ROOT
            for back in range(2):       # limits n, then n - 1 (no tuple iterated)
                top = (n - back) // h
                u: int = top            # (ints: ``1 << u`` below is any width)
                if keys.count < u:
                    u = int(keys.count)
                while u <= top:
                    if u > 0 and (u * h) % bs:
                        b = u * h // bs
                        if b <= nbp:
                            if b != last_b:
                                parent = self._block_key(req, b - 1) if b > 0 else ROOT
                                last_b = b
                            bit = 1 << (u - 1 - b * per)
                            tm = self.tail_map
                            if tm is not None:
                                had = tm.first(parent + 1)
                                tm.put(parent + 1, bit | had if had > 0 else bit)
                            else:
                                self.tails[parent] = self.tails.get(parent, 0) | bit
                        else:
                            self.loose.add(u - 1)
                    u += 1

    # ----------------------------------------------------------------- walks --
    def _walk_blocks(self, req: CacheRequest, nb: int, j: int, pending: bool) -> int:
        """``find_full``'s walk over whole blocks ``j`` .. ``nb`` - 1 (those below ``j``
        are known to qualify) on keys ever cached (+ admitted prompts' pending blocks if
        ``pending``): the first block that does not qualify.  (Keys one at a time:
        computing a few ahead costs more than it saves, as walks stop early.)"""
        km = self.pool.key_map
        evt = self.log.table
        keys = req.block_hashes
        gid = self.gid
        # block ends' keys run by run (PrefixKeys.key without the search, as find_full)
        step = self.scale * keys.unit
        e = (j + 1) * step + keys.lookahead
        pre: i64 = 0
        b0: i64 = 0
        nxt: i64 = -1    # last token of the located run (-1: none located yet)
        while j < nb:
            if e > nxt:
                pre, b0, nxt = keys.run_at(e)
            k = (unit_end(pre, e - b0) << GROUP_BITS) | gid
            if km.has(k) or evt.has(k) or (pending and self._pending(j, k)):
                j += 1
                e += step
            else:
                return j
        return j

    def _walk_tail(self, req: CacheRequest, nbp: int, j: int, max_len: int,
                   a_told: int = -1) -> int:
        """The walk's end once whole blocks stop at block ``j``: the partial keys inside
        it (never pending), aligned as the lookup aligns a hit.  ``a_told``: full
        attention's hit alone (-1: unknown); when it ends inside block ``j`` (one group),
        its own partial search found no cached key above it there: only the eviction
        log is asked there."""
        km = self.pool.key_map
        ev = self.log
        bs = self.block_size
        hit = j * bs
        if self.fine:
            # the highest partial key inside the first missing block (never pending)
            keys = req.block_hashes
            first = j * (bs // self.align)
            hi = min(first + bs // self.align - 1, max_len // self.align)
            hi = min(hi, keys.count)      # (two-argument mins: no builtin call)
            gid = self.gid
            parent = self._block_key(req, j - 1) if 0 < j <= nbp else ROOT
            evt = ev.table
            # (units ending above ``above`` are known not cached now)
            above = a_told if a_told >= 0 and a_told // bs == j \
                and len(self.group_ids) == 1 else max_len + bs
            # keys computed run by run, highest first (PrefixKeys.key without the search)
            unit = keys.unit
            la = keys.lookahead
            pre: i64 = 0
            b0: i64 = 0
            nxt: i64 = -1    # last token of the located run (-1: none located yet)
            bits = self._tail_bits(parent, first, first, hi)
            while bits:
                top = bits.bit_length() - 1
                bits ^= 1 << top
                fi = first + top
                e = (fi + 1) * unit + la
                if e > nxt or e <= b0:
                    pre, b0, nxt = keys.run_at(e)
                k = (unit_end(pre, e - b0) << GROUP_BITS) | gid
                if ((fi + 1) * self.align <= above and km.has(k)) or evt.has(k):
                    hit = (fi + 1) * self.align
                    break
        return hit - hit % self.align

    def _pending(self, j: int, k: int) -> bool:
        """Whether block ``j`` keyed ``k`` belongs to the prompt of an admitted request
        still computing it (running, or preempted): same key at the same block, same
        prefix.  Requests whose prompt is computed leave the list here."""
        lst = self.prefilling
        i = 0
        while i < len(lst):
            q = lst[i]
            if q.num_computed_tokens >= q.num_prompt_tokens:
                lst[i] = lst[len(lst) - 1]   # (done: every block of it was scheduled)
                lst.pop()
                continue
            if j < self._num_blocks(q, q.num_prompt_tokens) and self._block_key(q, j) == k:
                return True
            i += 1
        return False

    def _tail_bits(self, parent: int, base: int, first: int, hi: int) -> int:
        """Units in ``[first, hi)`` (inside block ``j``, whose first unit is ``base``)
        where an admitted prompt's tail may have keyed a partial prefix under this
        request's block ``j - 1`` (key ``parent``; ``ROOT`` for block 0 or past the
        prompt's blocks), as a bit mask (bit ``i``: unit ``first + i``): the only units
        ``find_full``'s partial search can find a key at."""
        if hi <= first:
            return 0
        bits = 0
        if parent != ROOT or base == 0:    # (ROOT's units lie in block 0)
            tm = self.tail_map
            got: int | None = None   # (an int: the dict's masks may pass 64 bits)
            if tm is not None:
                had = tm.first(parent + 1)
                if had > 0:
                    got = had
            else:
                got = self.tails.get(parent)
            if got is not None:
                bits = (got >> (first - base)) & ((1 << (hi - first)) - 1)
        loose = self.loose
        if loose:
            for fi in range(first, hi):
                if fi in loose:
                    bits |= 1 << (fi - first)
        return bits

    def _tail_units(self, parent: int, base: int, first: int, hi: int) -> list[int]:
        """``_tail_bits`` as a list of units, highest first."""
        out: list[int] = []
        bits = self._tail_bits(parent, base, first, hi)
        while bits:
            top = bits.bit_length() - 1
            out.append(first + top)
            bits ^= 1 << top
        return out

    def _walk_ideal(self, req: CacheRequest, max_len: int) -> int:
        keys = req.block_hashes
        units = min(max_len // self.unit, keys.count)
        adm = self.admitted
        c = self.coordinator
        assert isinstance(c, IdealCoordinator)
        index = c.index
        pend = set(c.pending) if c.pending else None
        i = 0
        for k in keys.keys_at([u for u in range(units)]):
            if k in adm or index.has(k) or (pend is not None and k in pend):
                i += 1
            else:
                break
        return i * self.unit

    # -------------------------------------------------------------- classify --
    def classify(self, req: CacheRequest, lookup: Lookup) -> Miss | None:
        """The split of ``req`` at this lookup (the pool as the lookup saw it); None when
        the layout has no full-attention group to measure against."""
        if not self.applicable:
            return None
        prompt = req.num_prompt_tokens
        hit = lookup.hit
        max_len = req.num_tokens - 1
        if self.mode == "ideal":
            p_all = self._walk_ideal(req, max_len)
            if p_all < hit:
                self.violations += 1
                p_all = hit
            return Miss(prompt, hit, p_all, hit, hit, hit)
        bs = self.block_size
        nbp = self._num_blocks(req, prompt)
        nb = min(max_len // bs, nbp)
        if self.mode == "none":
            adm = self.admitted
            j = 0
            while j < nb and self._block_key(req, j) in adm:
                j += 1
            p_all = j * bs
            return Miss(prompt, hit, p_all, p_all, 0, 0)
        j0 = hit // bs
        if j0 > nb:
            j0 = nb
        # one walk: ever cached up to j_done, then on with pending blocks (a block that
        # qualifies without them qualifies with them: the same stop as walking from j0)
        j_done = self._walk_blocks(req, nb, j0, False)
        j_all = self._walk_blocks(req, nb, j_done, True)
        # full attention's hit alone when the lookup tells it (-1: look it up below); its
        # partial search already found no cached key above it in its first missing block
        a_told = self._attention_told(req, max_len, lookup.full_alone)
        p_done = self._walk_tail(req, nbp, j_done, max_len, a_told)
        p_all = p_done if j_all == j_done else self._walk_tail(req, nbp, j_all, max_len, a_told)
        if p_all <= hit:
            if p_all < hit:
                self.violations += 1
            return Miss(prompt, hit, hit, hit, hit, hit)
        c = self.coordinator
        g = self.group
        assert g is not None
        # (hit <= H <= A <= P_done: a bound already met needs no lookup)
        a_pool = p_done if p_done == hit else a_told if a_told >= 0 \
            else c._find(g, req.block_hashes, max_len, False)[1]
        h_no = hit
        if self.eagle and a_pool > hit:
            h_no = self._hit_without_eagle(req, max_len, a_pool, hit, lookup.full_alone)
        # the order the definitions promise (a break is a bug: counted, clamped)
        vals = [p_all, p_done, a_pool, h_no, hit]
        for i in range(3, -1, -1):
            if vals[i] < vals[i + 1]:
                self.violations += 1
                vals[i] = vals[i + 1]
        p_all, p_done, a_pool, h_no = vals[0], vals[1], vals[2], vals[3]
        reason = self._reason(req, h_no, a_pool, lookup.junction) if a_pool > h_no else ""
        m = Miss(prompt, hit, p_all, p_done, a_pool, h_no, reason)
        if p_done > a_pool:
            got = self._evicted_by(req, nbp, a_pool, p_done)
            if got is not None:
                m.evicted_at = got[0]
                m.evicted_by = got[1]
        return m

    def _attention_told(self, req: CacheRequest, max_len: int, full_alone: int) -> int:
        """Full attention's hit alone in the pool, without the EAGLE drop, where the
        lookup tells it; -1 where it does not.

        A hybrid lookup with one full-attention group looks it up first, alone, with
        the whole limit (``full_alone``, >= 0 when known): that is the answer without a
        drop.  With one, that group looked up ``min(limit + margin, keys)`` and dropped
        one ``align``: its walk reached ``full_alone + align`` (when > 0).  A group's
        lookup depends on its limit only up to the keys' end (``keys.count`` units),
        and a reach within ``min(max_len, keys)`` is the same walk's end under that
        limit (the block walk and the partial search inside the first missing block
        stop at the same key)."""
        c = self.coordinator
        g = self.group
        assert g is not None
        if full_alone >= 0 and isinstance(c, HybridCoordinator) and c.spec_groups \
                and c.spec_groups[0] is g:
            if not g.use_eagle:
                return full_alone
            align = c.align
            bs = self.block_size
            h = c.hash_block_size
            if full_alone > 0 and bs % h == 0 and (align == h or align == bs):
                reach = full_alone + align
                lim = req.block_hashes.count * h
                if reach <= (max_len if max_len < lim else lim):
                    return reach
        return -1

    def _evicted_by(self, req: CacheRequest, nbp: int, a_pool: int,
                    p_done: int) -> tuple[int, str] | None:
        """The request whose allocation evicted the first key full attention lost past
        its hit: a tail key inside the first missing block, else the lowest evicted
        whole block in ``(a_pool, p_done]``."""
        ev = self.log
        bs = self.block_size
        j = a_pool // bs
        if self.fine:
            keys = req.block_hashes
            lo = a_pool // self.unit
            first = j * (bs // self.align)
            hi = min(first + bs // self.align - 1, p_done // self.unit)
            hi = min(hi, keys.count)
            parent = self._block_key(req, j - 1) if 0 < j <= nbp else ROOT
            for fi in reversed(self._tail_units(parent, first, max(first, lo), hi)):
                got = ev.get((keys.key(fi) << GROUP_BITS) | self.gid)
                if got is not None:
                    return got
        while j < nbp and (j + 1) * bs <= p_done:
            got = ev.get(self._block_key(req, j))
            if got is not None:
                return got
            j += 1
        return None

    def _hit_without_eagle(self, req: CacheRequest, max_len: int, a_pool: int, hit: int,
                           full_alone: int) -> int:
        """The same reconciled lookup with every group's EAGLE drop off (same pool).

        A hybrid lookup's fixed point, drops off, looks the full-attention group up
        first with the whole limit: that is ``a_pool`` (``classify`` just computed it),
        so only the other groups are looked up here, pass after pass as
        ``HybridCoordinator.find_longest_cache_hit`` does (a full-attention group's hit
        stays as found on its first pass).  Other coordinators redo their lookup.

        Full attention + one Mamba group (one pass): the lookup's Mamba hit ``hit`` is
        the highest state at or below full attention's dropped hit ``full_alone`` (the
        Mamba lookup takes no drop), so without the drop the hit is the highest state in
        ``(full_alone, a_pool]``, else ``hit``: usually one unit to look at."""
        c = self.coordinator
        groups = c.spec_groups
        if not isinstance(c, HybridCoordinator) or not groups or groups[0] is not self.group:
            return self._lookup_without_eagle(req, max_len)
        hashes = req.block_hashes
        simple = len(groups) == 2 and groups[0].spec.kind == "full"
        if simple and full_alone >= 0 and groups[1].cls is MambaManager:
            if a_pool <= full_alone:
                return hit
            got = self._mamba_state_in(groups[1], hashes, full_alone, a_pool)
            if got != -2:
                return got if got >= 0 else hit
        full_len: dict[int, int] = {groups[0].group_ids[0]: a_pool}
        hit_length = max_len
        while True:
            curr = hit_length
            for g in groups:
                first = g.group_ids[0]
                is_full = g.spec.kind == "full"
                if is_full:
                    known = full_len.get(first)
                    if known is not None:
                        if known < curr:
                            curr = known
                        continue
                curr = c._find(g, hashes, curr, False)[1]
                if is_full:
                    full_len[first] = curr
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break
        return hit_length

    def _mamba_state_in(self, g: SpecGroup, hashes: PrefixKeys, lo: int, hi: int) -> int:
        """The highest end in ``(lo, hi]`` of a state ``find_mamba`` would return for
        group ``g`` (its align walk, bounded below), -1 if none; -2 where the walk is
        not the align one (the caller looks up instead)."""
        c = self.coordinator
        pool = self.pool
        align = c.align
        bs = c.manager_of[g.group_ids[0]].block_size
        if not (align < bs and bs % align == 0) or align != hashes.unit:
            return -2
        km = pool.key_map
        ids = g.group_ids
        g0 = ids[0]
        fi = min(hi // align, hashes.count) - 1
        while fi >= 0 and (fi + 1) * align > lo:
            kf = hashes.key(fi)
            if km.has((kf << GROUP_BITS) | g0) and pool.get_cached_block(kf, ids):
                return (fi + 1) * align
            fi -= 1
        return -1

    def _lookup_without_eagle(self, req: CacheRequest, max_len: int) -> int:
        """The coordinator's own lookup rerun with every group's EAGLE drop off."""
        c = self.coordinator
        saved = [g.use_eagle for g in c.spec_groups]
        alone = c.full_alone
        h = 0
        try:
            for g in c.spec_groups:
                g.use_eagle = False
            h = c.find_longest_cache_hit(req.block_hashes, max_len)[1]
        finally:
            for g, u in zip(c.spec_groups, saved):
                g.use_eagle = u
            c.full_alone = alone
        return h

    def _reason(self, req: CacheRequest, h_no: int, a_pool: int, junction: int) -> str:
        """Why no state served between the hit and full attention's reach (cheap checks,
        in this order: an evicted Mamba state, sparse retention, a missing junction
        state, else the chunk/block grid)."""
        if self.mamba_gid < 0:
            return WINDOW if self.has_swa else ALIGN
        keys = req.block_hashes
        unit = self.unit
        evt = self.log.table
        mg = self.mamba_gid
        hi = min(a_pool // unit, keys.count)         # units (h_no, a_pool], the top ones
        lo = max(h_no // unit, hi - REASON_SCAN)
        if hi > lo and len(evt) > 0:
            # keys run by run, from the top down (PrefixKeys.key without the search),
            # stopping at the first evicted one
            u = keys.unit
            la = keys.lookahead
            pre: i64 = 0
            b0: i64 = 0
            nxt: i64 = -1    # last token of the located run (-1: none located yet)
            i = hi - 1
            while i >= lo:
                e = (i + 1) * u + la
                if e > nxt or e <= b0:
                    pre, b0, nxt = keys.run_at(e)
                if evt.has((unit_end(pre, e - b0) << GROUP_BITS) | mg):
                    return EVICTED
                i -= 1
        if self.retention is not None:
            return RETENTION
        if not self.junction_state and h_no < junction <= a_pool:
            return JUNCTION
        return ALIGN
