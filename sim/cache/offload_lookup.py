"""The CPU tier's connector, its state and its lookup: vLLM 0.33.0's
``OffloadingConnector`` scheduler side (``offloading/scheduler.py``) building its chunk keys
and answering ``get_num_new_matched_tokens`` (attention groups need every chunk from the GPU
hit on, a Mamba group a state at the hit's end, EAGLE groups one trailing chunk less, and
the partial-tail hits inside a block); see ``sim/cache/offload.py`` for the whole
connector.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from librt.vecs import append, vec
from mypy_extensions import i64

from sim.cache.block_pool import GROUP_BITS
from sim.cache.key_map import KeyMap, PairHeap
from sim.cache.offload_jobs import (NO_TABLE, GroupOffload, Job, JobTable, ReqOffload,
                                    StepTransfers, Transfers)
from sim.cache.offload_pool import HIT, MISS, HostPool
from sim.cache.rules import cdiv, eagle_proof_margin

if TYPE_CHECKING:
    from sim.cache.kv_manager import KVCacheManager
    from sim.cache.request import CacheRequest


class ConnectorLookup:
    """The connector's state, its keys and its lookup (``OffloadConnector``'s base)."""

    def __init__(self, kv: KVCacheManager, num_chunks: int, policy: str = "lru",
                 blocks_per_chunk: int = 1, eagle_groups: tuple[int, ...] = (),
                 worker: Transfers | None = None, offload_prompt_only: bool = True,
                 block_bytes: int = 0, num_gpus: int = 1):
        self.kv = kv
        self.pool = HostPool(num_chunks, policy)
        self.worker: Transfers = worker if worker is not None else StepTransfers()
        self.bpc = blocks_per_chunk
        self.prompt_only = offload_prompt_only
        # bytes of one GPU block of one group on one GPU (what a GPU's host link moves per
        # block; each GPU moves its own shard at once), and the GPUs
        self.block_bytes = block_bytes
        self.num_gpus = num_gpus
        self.unit = kv.hash_block_size
        specs = kv.coordinator.specs
        for s in specs:
            if s.kind == "swa":
                raise ValueError("kv_offloading: sliding-window groups are not simulated "
                                 "with the CPU tier")
        self.groups = [GroupOffload(g, s.block_size, blocks_per_chunk, self.unit,
                                    s.kind == "mamba", g in eagle_groups)
                       for g, s in enumerate(specs)]
        for gc in self.groups:
            if gc.tpc % self.unit:
                raise ValueError("kv_offloading: a chunk must hold whole hash units")
        hpcs: list[int] = []
        for gc in self.groups:
            if gc.hpc not in hpcs:
                hpcs.append(gc.hpc)
            gc.pki = hpcs.index(gc.hpc)
        self.hpcs = hpcs
        self.full = tuple(i for i, gc in enumerate(self.groups) if gc.window is None)
        self.full_v = vec[i64](list(self.full))    # (the same, for the sweeps' loops)
        self.sliding = tuple(i for i, gc in enumerate(self.groups) if gc.window is not None)
        self.lookup_groups = self.full + self.sliding
        aligns = {gc.tpc for gc in self.groups if gc.cow}
        assert len(aligns) <= 1
        self.mamba_align = aligns.pop() if aligns else None
        sizes = {gc.tpb for gc in self.groups}
        self.partial = (blocks_per_chunk == 1 and len(sizes) == 1
                        and any(gc.cow and gc.tpb > self.unit for gc in self.groups))
        self.pblock = self.groups[0].tpb if self.partial else 0
        partial_hash_hits = kv.partial_hits and self.unit < self.pblock
        # (each group's partial-tail key lies ``gc.margin`` tokens past the tail)
        if self.partial:
            for gc in self.groups:
                if gc.eagle and not gc.cow:
                    gc.margin = eagle_proof_margin(self.pblock, self.unit, partial_hash_hits)
        self.max_margin = max((gc.margin for gc in self.groups), default=0)
        self.reqs: dict[str, ReqOffload] = {}
        self.spare: list[ReqOffload] = []        # states done with, to reuse
        self.jobs = JobTable()                   # the jobs in flight, by id
        self.spare_jobs: list[Job] = []          # completed jobs, to reuse
        self.n_spare_jobs: i64 = 0
        self.due = PairHeap()                    # (seen, job): completions, as a heap
        self.next_job = 0
        # keys of async loads in flight (a key map used as a set of machine integers)
        self.loading_keys = KeyMap()
        # the partial-tail keys the pool holds (the only keys off their group's chunk
        # grid): per group, how many at each hash-grid position (indexed by tokens //
        # unit); and each one's position
        self.tail_pos: list[vec[i64]] = [vec[i64]() for _ in self.groups]
        # (the first group's: per chunk, how many of its positions hold one -- a lookup's
        # walk down the hash grid skips a chunk without any at once)
        self.tail_chunks0 = vec[i64]()
        # (buffers kept: a sweep's keys to offer and their end tokens, a boundary store's)
        self.sweep_keys = vec[i64]()
        self.sweep_pos = vec[i64]()
        self.sweep_fi = vec[i64]()
        self.sweep_c = vec[i64]()
        self.sweep_tops = vec[i64]([0 for _ in self.full])   # (per attention group)
        self.unconfirmed = vec[i64]([0 for _ in self.groups])
        self.one_key = vec[i64]([0])
        self.one_pos = vec[i64]([0])
        self.n_tail: i64 = 0                     # partial-tail keys the pool holds
        self.tpc_of = vec[i64]([gc.tpc for gc in self.groups])   # group -> tokens a chunk
        # the jobs each GPU block fences (flushed if the block is handed out again before
        # they complete): per block id the one job (-1: none; -2: several, listed in
        # ``fence_more``), machine integers; ``n_fenced`` blocks have one
        self.fence_job = vec[i64]()
        self.fence_more: dict[int, list[int]] = {}
        self.n_fenced: i64 = 0
        # this step's
        self.load_jobs: list[Job] = []
        self.done: list[Job] = []                # (start_step's completions)
        self.sweep_rs: list[ReqOffload] = []     # the scheduled requests still sweeping
        self.n_sched: i64 = 0                    # (build's: the scheduled requests listed)
        self.flush_jobs: set[int] = set()
        self.admitted: list[ReqOffload] = []     # requests allocated in the waiting loop
        self.recving: set[str] = set()           # loads reported done, not yet promoted
        self.finished: list[ReqOffload] = []     # finished since the last build
        self.preempted_ids: list[str] = []       # preempted in this step
        # totals
        self.loaded_chunks = 0
        self.stored_chunks = 0
        self.loaded_blocks = 0
        self.stored_blocks = 0
        self.log: list[dict] | None = None       # per-step records (sim steps --per-step)
        # steps whose build saw several finished requests, and (tests) the order to take
        # them in at given steps
        self.finish_ties: list[tuple[int, list[str]]] = []
        self.finish_orders: dict[int, list[str]] | None = None
        self.req_log: dict[str, dict] | None = None   # per-request records (ditto)
        self._step_rec: dict | None = None
        self.now = 0
        self.step_no: i64 = 0                    # connector steps begun (``start_step``)
        self.offer_failed = False                # the last store offer did not fit
        kv.enable_offload_handoffs()

    # ------------------------------------------------------------------ helpers --
    def prime_keys(self, req: CacheRequest) -> None:
        """The request's chunk keys computed before the GPU cache's lookup (the same
        keys either way: that lookup then reads them rather than hashing them again)."""
        rs = req.offload
        if rs is not None:
            self._update_keys(rs)

    def _update_keys(self, rs: ReqOffload) -> None:
        """The request's chunk keys for every complete chunk of its hashes (prompt and
        outputs); chunk ``c`` of a list ends at token ``(c + 1) * hpc * unit``."""
        req = rs.req
        bh = req.block_hashes
        n = bh.count
        for li, hpc in enumerate(self.hpcs):
            pks = rs.keys_of(li)
            want = n // hpc
            k = len(pks)
            if k >= want:
                continue
            ms: i64 = bh.memo_scale
            if ms == 0 or ms == hpc:
                # (kept on the request's keys too: the GPU cache's walks at this scale
                # read them there)
                rs.set_keys(li, bh.memo_block_keys(want, hpc))
            else:
                rs.set_keys(li, bh.add_block_keys(pks, k, want, hpc))

    def _gkeys(self, rs: ReqOffload, gi: int, lo: int, hi: int) -> list[int]:
        """Group ``gi``'s chunk keys ``lo`` .. ``hi - 1``."""
        gid = self.groups[gi].gid
        pks = rs.keys_of(self.groups[gi].pki)
        if hi > len(pks):
            hi = len(pks)
        return [(pks[i] << GROUP_BITS) | gid for i in range(lo, hi)]

    def _boundary_key(self, rs: ReqOffload, gid: i64, tokens: i64) -> i64:
        """Group ``gid``'s key of the prefix ending at ``tokens`` (on the hash grid)."""
        u: i64 = self.unit
        pk = rs.req.block_hashes.key(tokens // u - 1)
        return (pk << GROUP_BITS) | gid

    def _offloadable(self, rs: ReqOffload, n: i64) -> i64:
        req = rs.req
        if n > req.num_tokens:
            n = req.num_tokens
        if self.prompt_only and n > req.num_prompt_tokens:
            n = req.num_prompt_tokens
        return n

    def _new_job(self, rs: ReqOffload, keys: vec[i64], store: bool) -> Job:
        n = self.n_spare_jobs
        if n:
            n -= 1
            job = self.spare_jobs[n]
            self.n_spare_jobs = n
            job.reuse(self.next_job, rs, keys, store)
        else:
            job = Job(self.next_job, rs, keys, store)
        self.next_job += 1
        self.jobs.add(job)
        return job

    def _spare_job(self, job: Job) -> None:
        """A completed job (out of ``jobs``: only stale heap entries name its id), kept
        for the next ``_new_job`` (up to 256: the first ``n_spare_jobs`` entries)."""
        n = self.n_spare_jobs
        spare = self.spare_jobs
        if n < len(spare):
            spare[n] = job
        elif n < 256:
            spare.append(job)
        else:
            return
        self.n_spare_jobs = n + 1

    def step_stall(self) -> int:
        """ns this step's forward waits for flushed stores (timed transfers only)."""
        return self.worker.stall_ns()

    @property
    def loaded_bytes(self) -> int:
        """Bytes loaded into the GPUs so far, over every GPU of the replica."""
        return self.loaded_blocks * self.block_bytes * self.num_gpus

    @property
    def stored_bytes(self) -> int:
        return self.stored_blocks * self.block_bytes * self.num_gpus

    def quiet(self) -> int:
        """Whether the next steps of the running requests (a decode jump) would do nothing
        here but let transfers complete: 0 no (a finished request to wrap up, a store
        waiting for the next step's start), 1 yes, 2 yes if every running request's sweep
        is over (``ReqOffload.swept``: the scheduler looks)."""
        if len(self.finished):
            return 0
        if self.jobs.n == 0:
            return 1
        if self.worker.waiting_to_start():
            return 0
        return 2

    def busy(self) -> bool:
        """Whether the engine must keep stepping (vLLM's ``has_pending_push_work`` and
        finished requests whose last stores are still to be built)."""
        return self.jobs.n > 0 or len(self.finished) > 0

    def cached_positions(self, req: CacheRequest) -> dict[str, list[int]]:
        """Per group, the hash-grid positions of ``req``'s prompt whose key the host pool
        holds written (a chunk key, or a boundary key)."""
        out: dict[str, list[int]] = {}
        u = self.unit
        bh = req.block_hashes
        n = min(req.num_prompt_tokens // u, bh.count)
        for gc in self.groups:
            have = []
            for i in range(n):
                if self.pool.is_ready((bh.key(i) << GROUP_BITS) | gc.gid):
                    have.append((i + 1) * u)
            out[str(gc.gid)] = have
        return out

    def attention_reach(self, req: CacheRequest, start: int) -> int:
        """How far past ``start`` every attention group's chunks are written in the host
        pool, one after the other (an EAGLE group's last one left out), within the lookup's
        cap: what the tier held for attention whatever the Mamba groups hold."""
        if not self.full:
            return start
        rs = req.offload
        assert rs is not None
        self._update_keys(rs)
        cap = req.num_tokens - 1 if self.sliding else req.num_tokens
        pool = self.pool
        reach = cap
        for gi in self.full:
            gc = self.groups[gi]
            pks = rs.keys_of(gc.pki)
            gid = gc.gid
            first = start // gc.tpc
            i = first
            while i < len(pks) and pool.lookup((pks[i] << GROUP_BITS) | gid) == HIT:
                i += 1
            if gc.eagle and i > first:
                i -= 1
            end = i * gc.tpc
            if end > cap // gc.tpc * gc.tpc:
                end = cap // gc.tpc * gc.tpc
            if end < reach:
                reach = end
        return reach if reach > start else start


    def _fence(self, bid: i64, jid: i64) -> None:
        """Job ``jid`` is flushed if block ``bid`` is allocated again before it completes."""
        f = self.fence_job
        if len(f) <= bid:
            while len(f) <= bid:
                f = append(f, -1)
            self.fence_job = f
        cur = f[bid]
        if cur == -1:
            f[bid] = jid
            self.n_fenced += 1
        elif cur == -2:
            more = self.fence_more[bid]
            if jid not in more:
                more.append(jid)
        elif cur != jid:
            f[bid] = -2
            self.fence_more[bid] = [cur, jid]

    def _unfence(self, jid: i64, bids: vec[i64]) -> None:
        """Job ``jid`` no longer fences ``bids``."""
        f = self.fence_job
        for bid in bids:
            if bid >= len(f):
                continue
            cur = f[bid]
            if cur == jid:
                f[bid] = -1
                self.n_fenced -= 1
            elif cur == -2:
                more = self.fence_more[bid]
                if jid in more:
                    more.remove(jid)
                if len(more) == 1:
                    f[bid] = more[0]
                    del self.fence_more[bid]

    def _tail_count(self, gi: int, t: i64) -> i64:
        """Partial-tail keys of group ``gi`` the pool holds ending at token ``t`` (on the
        hash grid)."""
        v = self.tail_pos[gi]
        i = t // self.unit
        return v[i] if i < len(v) else 0

    def _tail_add(self, gi: int, t: i64, d: i64) -> None:
        """``d`` more partial-tail keys of group ``gi`` end at token ``t`` (a count below 0,
        none, counts as 0 when one is added)."""
        u: i64 = self.unit
        assert t % u == 0, "a partial-tail key off the hash grid"
        v = self.tail_pos[gi]
        i = t // u
        if i >= len(v):
            while len(v) <= i:
                v = append(v, 0)
            self.tail_pos[gi] = v
        c = v[i]
        if d > 0 and c < 0:
            c = 0
        v[i] = c + d
        if gi == 0 and (c > 0) != (c + d > 0):
            q = t // self.groups[0].tpc
            tc = self.tail_chunks0
            if q >= len(tc):
                while len(tc) <= q:
                    tc = append(tc, 0)
                self.tail_chunks0 = tc
            tc[q] += 1 if c + d > 0 else -1

    def _flush_block(self, bid: i64) -> None:
        """The jobs block ``bid`` fences are flushed (it is allocated again)."""
        f = self.fence_job
        if bid >= len(f):
            return
        cur = f[bid]
        if cur >= 0:
            self.flush_jobs.add(cur)
        elif cur == -2:
            self.flush_jobs.update(self.fence_more[bid])

    def _watch(self, job: Job) -> None:
        """Watch for ``job``'s completion (its ``seen`` known)."""
        if job.seen >= 0:
            self.due.push(job.seen, job.jid)


    def _rec(self) -> dict:
        # a step's offload record: filled as things happen, kept if non-empty
        r = self._step_rec
        if r is None or r["step"] != self.now:
            r = self._step_rec = {"step": self.now}
        return r

    def _job_rec(self, job: Job) -> dict:
        return {"job": job.jid, "req": job.rid, "groups": job.groups or {}}

    # ------------------------------------------------------------------ lookup --
    def get_num_new_matched_tokens(self, req: CacheRequest, local: int) -> int | None:
        rid = req.request_id
        rs = req.offload
        assert rs is not None
        # (the attention groups' tables and stored counts: the only ones ever read)
        full = self.full_v
        tables = rs.tables
        ns = rs.next_stored
        for fi in range(len(full)):
            gi = full[fi]
            if len(tables[gi]):
                tables[gi] = NO_TABLE
            ns[gi] = 0
        rs.swept = False
        if len(rs.jobs) > 0:
            hit: int | None = None
        else:
            self._update_keys(rs)
            rs.num_local = local
            hit = self._lookup(rs)
        if self.req_log is not None:
            self.req_log[rid]["lookups"].append([self.now, local, hit, bool(hit)])
        return hit

    def _prefix_lookup(self, pks: vec[i64], lo: i64, hi: i64, gid: i64) -> i64:
        """Chunks ``lo`` .. ``hi - 1`` of a group: how many, from ``lo``, the pool holds
        (being written counts, but makes the answer -1: deferred)."""
        n: i64 = 0
        defer = False
        # (HostPool.lookup read straight from its index and counts: a slot held, and
        # being written while its count is below 0)
        index = self.pool.index
        sref = self.pool.sref
        for i in range(lo, hi):
            s = index.only((pks[i] << GROUP_BITS) | gid)
            if s < 0:
                break
            n += 1
            if sref[s] < 0:
                defer = True
        if defer:
            return -1
        return n

    def _window_lookup(self, pks: vec[i64], lo: i64, hi: i64, gid: i64, window: i64,
                       first_window: i64) -> i64:
        """Chunks ``lo`` .. ``hi - 1`` of a group with a window (Mamba: one chunk), from the
        end: the end (from ``lo``) of the last run of ``window`` chunks held (-1:
        deferred)."""
        pending = False
        run: i64 = 0
        need: i64 = first_window if first_window else window
        index = self.pool.index      # (HostPool.lookup read straight, as above)
        sref = self.pool.sref
        for idx in range(hi - lo - 1, -1, -1):
            s = index.only((pks[lo + idx] << GROUP_BITS) | gid)
            if s >= 0 and sref[s] >= 0:
                run += 1
            elif s >= 0:
                pending = True
                run += 1
            else:
                run = 0
                pending = False
                need = window
            if run == need:
                if pending:
                    return -1
                return idx + need
        if pending:
            return -1
        return run

    def _lookup_complete(self, rs: ReqOffload) -> int | None:
        req = rs.req
        c0: i64 = rs.num_local
        cap: i64 = req.num_tokens
        if self.sliding:
            cap -= 1
            if self.mamba_align is not None:
                align: i64 = self.mamba_align
                cap = cap // align * align
        num_hit: i64 = 0
        defer = False
        for gi in range(len(self.groups)):
            rs.hit_end[gi] = 0
        verified: i64 = 0            # (bit gi: group gi's EAGLE chunk verified)
        groups = self.lookup_groups
        while groups:
            looked_sw = False
            current = groups
            groups = ()
            for gi in current:
                gc = self.groups[gi]
                tpc: i64 = gc.tpc
                pks = rs.keys_of(gc.pki)
                nk: i64 = len(pks)
                unverified = gc.eagle and not (verified >> gi) & 1
                if cap > nk * tpc:
                    cap = nk * tpc
                if cap - c0 < tpc:
                    return 0
                query_max: i64 = cap
                if unverified:
                    query_max = cap + tpc
                    if query_max > nk * tpc:
                        query_max = nk * tpc
                nchunks: i64 = (query_max + tpc - 1) // tpc
                if nchunks > nk:
                    nchunks = nk
                start: i64 = c0 // tpc
                window = gc.window
                nh: i64 = 0
                if window is None:
                    nh = self._prefix_lookup(pks, start, nchunks, gc.gid)
                    if nh > 0:
                        rs.hit_end[gi] = start + nh
                    else:
                        rs.hit_end[gi] = start
                else:
                    w: i64 = window
                    if unverified:
                        w += 1
                    nh = self._window_lookup(pks, start, nchunks, gc.gid, w, w)
                if nh == 0:
                    return 0
                if nh < 0:
                    defer = True
                else:
                    if unverified:
                        nh -= 1
                        verified |= 1 << gi
                    if cap > tpc * (start + nh):
                        cap = tpc * (start + nh)
                new: i64 = cap - c0
                if new < tpc:
                    return 0
                if new < num_hit:
                    if not gc.eagle:
                        verified = 0
                    if defer:
                        defer = False
                        groups = self.lookup_groups
                    elif looked_sw and not groups:
                        groups = self.sliding
                looked_sw = looked_sw or gc.window is not None
                num_hit = new
        if defer:
            return None
        if self.loading_keys.size:
            end = c0 + num_hit
            for gi, gc in enumerate(self.groups):
                sub = self._gkeys(rs, gi, c0 // gc.tpc, cdiv(end, gc.tpc))
                if gc.window is not None:
                    sub = sub[-gc.window:]
                for key in sub:
                    if self.loading_keys.has(key):
                        return None
        return num_hit

    def _lookup(self, rs: ReqOffload) -> int | None:
        complete = self._lookup_complete(rs)
        rs.tail = None
        if complete is None or not self.partial:
            return complete
        req = rs.req
        u = self.unit
        local = rs.num_local
        cb = local + complete
        nblocks = 2 if self.max_margin else 1
        maxb = min(req.num_prompt_tokens - 1, cb + nblocks * self.pblock - 1)
        if self.max_margin:
            maxb = min(maxb, req.block_hashes.count * u - self.max_margin)
        maxb = maxb // u * u
        if maxb <= cb:
            return complete
        B = self.pblock
        bridge = cb // B
        bridge_end = (bridge + 1) * B
        pending = False
        if maxb >= bridge_end:
            # (the attention groups' keys of the bridging block not confirmed by the
            # complete lookup: the first n_unc of a buffer kept)
            unc = self.unconfirmed
            n_unc: i64 = 0
            lk = self.loading_keys
            watch = lk.size > 0     # (loads in flight are rare: no probe then)
            for gi, gc in enumerate(self.groups):
                if gc.cow:
                    continue
                key = (rs.keys_of(gc.pki)[bridge] << GROUP_BITS) | gc.gid
                if watch and lk.has(key):
                    pending = True
                if rs.hit_end[gi] <= bridge:
                    unc[n_unc] = key
                    n_unc += 1
            for j in range(n_unc):
                r = self.pool.lookup(unc[j])
                if r == MISS:
                    maxb = bridge_end - u
                    break
                pending = pending or r != HIT
        bridge_pending = pending
        first = self.groups[0]
        m0: i64 = first.margin
        tpc0: i64 = first.tpc
        hpc0: i64 = first.hpc
        tp0 = self.tail_pos[0]
        n0: i64 = len(tp0)
        tc0 = self.tail_chunks0
        nc0: i64 = len(tc0)
        b: i64 = maxb
        stop: i64 = cb
        step: i64 = u
        # (b = maxb, maxb - u, ... above cb; the first group's position t0 = b + m0 on the
        # hash grid, its index i0 = t0 // u and its offset in a chunk rem = t0 % tpc0
        # stepped along, not divided out each time.  Off the chunk grid the first group's
        # key would be a partial-tail key: a miss at once where the pool holds none there
        # -- and where its chunk holds none, every position down to the chunk grid is
        # one, skipped together.  A miss at b >= bridge_end with the bridge pending makes
        # the answer pending: maxb is such a b whenever the bridge is, so it is pending
        # from the start.)
        i0: i64 = (b + m0) // step
        rem: i64 = (b + m0) % tpc0
        while b > stop:
            if rem != 0:
                q = i0 // hpc0
                if q >= nc0 or tc0[q] <= 0:
                    b -= rem
                    i0 -= rem // step
                    rem = 0
                    continue
                if i0 >= n0 or tp0[i0] <= 0:
                    b -= step
                    i0 -= 1
                    rem -= step
                    continue
            hit, bpend = self._lookup_tail(rs, b, b >= bridge_end and bridge_pending)
            if hit:
                rs.tail = b
                return b - local
            pending = pending or bpend
            b -= step
            i0 -= 1
            rem -= step
            if rem < 0:
                rem += tpc0
        if pending and complete == 0:
            return None
        return complete

    def _lookup_tail(self, rs: ReqOffload, b: int, pending: bool) -> tuple[bool, bool]:
        first = self.groups[0]
        t0 = b + first.margin
        if t0 % first.tpc and self._tail_count(0, t0) <= 0:
            # (the first group's key there would be a partial-tail key, and the pool holds
            # none at that position: a miss, known without computing the key)
            return False, pending
        bh = rs.req.block_hashes
        u = self.unit
        pool = self.pool
        at_b = -1             # (the prefix key at b, shared by the groups without a margin)
        for gc in self.groups:
            t = b + gc.margin
            if t != b:
                pk = bh.key(t // u - 1)
            else:
                if at_b < 0:
                    at_b = bh.key(b // u - 1)
                pk = at_b
            r = pool.lookup((pk << GROUP_BITS) | gc.gid)
            if r == MISS:
                return False, pending
            pending = pending or r != HIT
        if pending:
            return False, True
        return True, False
