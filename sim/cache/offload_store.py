"""The CPU tier's stores: vLLM 0.33.0's ``OffloadingConnector`` scheduler side
(``offloading/scheduler.py``) building its store jobs (``_build_store_jobs``: every complete
prompt chunk a scheduled or finished request has not stored yet), the Mamba states the GPU
cache hands off on a chunk boundary and the partial-tail copies, and the blocks whose reuse
flushes a job; see ``sim/cache/offload.py`` for the whole connector.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from librt.vecs import append, vec
from mypy_extensions import i64

from sim.cache.block_pool import GROUP_BITS
from sim.cache.key_map import grown
from sim.cache.offload_jobs import Job, ReqOffload
from sim.cache.offload_lookup import ConnectorLookup
from sim.cache.offload_pool import GROUP_MASK
from sim.cache.offload_stop import ConnectorAssertion

if TYPE_CHECKING:
    from sim.cache.block_pool import Block
    from sim.cache.mamba_manager import Handoffs


class ConnectorStores(ConnectorLookup):
    """The connector's store side (``OffloadConnector``'s base)."""

    def _allocated_ids(self, scheduled: list[ReqOffload]) -> set[int]:
        """Block ids allocated in this step as vLLM's connector counts them: the tables of
        the requests allocated in the waiting loop, the blocks handed out this step
        (running requests' new blocks, copy-on-write copies)."""
        kv = self.kv
        pool = kv.pool
        out: set[int] = set()
        pv = pool.popped
        for j in range(pool.n_popped):
            out.add(pv[j])
        for ars in self.admitted:
            for t in kv.group_tables(ars.req.request_id):
                for b in t:
                    if not b.is_null:
                        out.add(b.block_id)
        for k in range(self.n_sched):
            srs = scheduled[k]
            if srs.fresh:
                for t in kv.group_tables(srs.req.request_id):
                    for b in t:
                        if not b.is_null:
                            out.add(b.block_id)
        out.discard(0)
        return out

    def _flush_allocated(self, scheduled: list[ReqOffload]) -> None:
        """Flush the jobs fenced on a block allocated in this step (``_allocated_ids``'s
        blocks, visited without building their set)."""
        kv = self.kv
        pool = kv.pool
        pv = pool.popped
        f = self.fence_job
        nf: i64 = len(f)
        for j in range(pool.n_popped):
            bid = pv[j]
            # (_flush_block's first test inline: most blocks fence nothing)
            if bid != 0 and bid < nf and f[bid] != -1:
                self._flush_block(bid)
        for ars in self.admitted:
            self._flush_tables(kv.group_tables(ars.req.request_id))
        for k in range(self.n_sched):
            srs = scheduled[k]
            if srs.fresh:
                self._flush_tables(kv.group_tables(srs.req.request_id))

    def _flush_tables(self, tables: list[list[Block]]) -> None:
        f = self.fence_job
        nf: i64 = len(f)
        for t in tables:
            for b in t:
                bid: i64 = b.block_id
                # (_flush_block's first test inline: most blocks fence nothing)
                if bid != 0 and bid < nf and f[bid] != -1 and not b.is_null:
                    self._flush_block(bid)

    def _store_job(self, rs: ReqOffload, keys: vec[i64], blocks: int,
                   groups: dict[str, Any] | None) -> Job:
        job = self._new_job(rs, keys, True)
        job.blocks = blocks
        job.groups = groups
        rs.add_job(job.jid)
        self.stored_chunks += len(keys)
        self.stored_blocks += blocks
        self.worker.store(job, blocks * self.block_bytes, self.now)
        self._watch(job)
        if self.log is not None:
            self._rec().setdefault("stores", []).append(self._job_rec(job))
        return job

    def _prepare_store(self, keys: vec[i64], kpos: vec[i64], rs: ReqOffload,
                       n: i64 = -1) -> vec[i64]:
        """The host pool's ``prepare_store`` (the keys' end tokens in ``kpos``; the first
        ``n`` of both, -1: all): the keys to store (``pool.offered``, a new vec; when the
        pool cannot take them, ``offer_failed`` is set and none are)."""
        pool = self.pool
        ok = pool.offer(keys, kpos, rs, n)
        self.offer_failed = not ok
        if ok and self.n_tail > 0:
            # (an evicted key off its group's chunk grid is a partial-tail key)
            ev = pool.ev_keys
            ep = pool.evicted_pos
            tpc_of = self.tpc_of
            for j in range(pool.n_evicted):
                gi = ev[j] & GROUP_MASK
                p = ep[j]
                if p % tpc_of[gi]:
                    self._tail_add(gi, p, -1)
                    self.n_tail -= 1
        if self.log is not None:
            if not ok:
                r = self._rec()
                r["alloc_fail"] = r.get("alloc_fail", 0) + 1
            elif pool.n_evicted > 0:
                r = self._rec()
                r["evicted"] = r.get("evicted", 0) + pool.n_evicted
        if not ok:
            return vec[i64]()
        return pool.offered

    @staticmethod
    def _handoff_rids(lists: list[Handoffs]) -> list[str]:
        """The requests of this step's handed-off Mamba states, in the order first met
        (group by group): the order vLLM's connector takes them in."""
        rids: list[str] = []
        last: str | None = None    # (the last one met: a request's states come in runs)
        for h in lists:
            hr = h.rids
            for j in range(h.n):
                rid = hr[j]
                if rid is last:
                    continue
                last = rid
                # (a request's states name it by one string object: met by identity
                # first, compared by value only when that fails)
                met = False
                for x in rids:
                    if x is rid:
                        met = True
                        break
                if not met and rid not in rids:
                    rids.append(rid)
        return rids

    def _boundary_stores(self, rids: list[str], gids: list[int],
                         lists: list[Handoffs]) -> None:
        """One store job per Mamba state committed on a chunk boundary within what the
        request may offload, request by request, its groups in order."""
        single = len(rids) == 1      # (most steps: every state is one request's)
        for rid in rids:
            rs = self.reqs.get(rid)
            if rs is None:
                continue
            top = self._offloadable(rs, rs.req.num_tokens)
            for li in range(len(lists)):
                gid = gids[li]
                gc = self.groups[gid]
                h = lists[li]
                for j in range(h.n):
                    if not single:
                        hj = h.rids[j]
                        if hj is not rid and hj != rid:
                            continue
                    block = h.blocks[j]
                    boundary = h.ends[j]
                    if block.is_null or boundary > top or boundary % gc.tpc:
                        continue
                    self.one_key[0] = self._boundary_key(rs, gid, boundary)
                    self.one_pos[0] = boundary
                    one = self._prepare_store(self.one_key, self.one_pos, rs, 1)
                    if len(one) == 0:
                        continue
                    groups = ({str(gid): {"chunks": 1, "blocks": 1,
                                          "start_block": boundary // gc.tpb - 1,
                                          "ends": [boundary]}}
                              if self.log is not None else None)
                    job = self._store_job(rs, one, 1, groups)
                    job.fenced = append(job.fenced, block.block_id)
                    self._fence(block.block_id, job.jid)

    def _tail_stores(self, rids: list[str], gids: list[int], lists: list[Handoffs]) -> None:
        if self.max_margin:
            # (most steps: no request here loaded from the tier, and without a load
            # there is no tail store -- known before walking the states)
            some = False
            for rid in rids:
                known = self.reqs.get(rid)
                if known is None or known.loaded:
                    some = True
                    break
            if not some:
                return
        B = self.pblock
        any_tail = False
        for h in lists:
            he = h.ends
            for j in range(h.n):
                if he[j] % B:
                    any_tail = True
                    break
        if not any_tail:
            return
        for rid in rids:
            known = self.reqs.get(rid)
            if known is not None and self.max_margin and not known.loaded:
                continue     # (most requests: no tail store without a load, known at once)
            # (this request's states inside a block: (group, block, boundary), groups in
            # order)
            entries: list[tuple[int, Block, int]] = []
            for li in range(len(lists)):
                h = lists[li]
                for j in range(h.n):
                    if h.rids[j] == rid and h.ends[j] % B:
                        entries.append((gids[li], h.blocks[j], h.ends[j]))
            if not entries:
                continue
            rs = self.reqs[rid]
            boundary = entries[0][2]
            if any(e[2] != boundary for e in entries):
                # (an internal prefill checkpoint's state, keyed inside its block and
                # committed since, offered beside the copy of the prompt's tail state)
                raise ConnectorAssertion.at(self.now, self.worker.steps, (
                    f"its offloading connector fails an assertion (one partial-tail boundary "
                    f"per request and step): request {rid!r} hands the CPU tier Mamba states "
                    f"inside blocks at {sorted({e[2] for e in entries})} tokens in one step "
                    f"(an internal prefill checkpoint's and the prompt tail's); vLLM serves "
                    f"this only without kv_offloading, without internal prefill checkpoints "
                    f"(kv_cache.num_prefill_checkpoint_blocks: 0) or with a hash unit equal "
                    f"to the Mamba block"))
            req = rs.req
            if self.max_margin:
                after = req.num_computed_tokens
                if rs.sched_step == self.step_no:     # (scheduled in this step)
                    after += rs.step_tokens
                if after > req.num_prompt_tokens:
                    after = req.num_prompt_tokens
                if boundary + self.max_margin > after:
                    continue
            cow = {gid: block for gid, block, _ in entries}
            idx = boundary // B
            if any(not gc.cow and idx >= len(rs.tables[gi])
                   for gi, gc in enumerate(self.groups)):
                continue
            ends = vec[i64]([boundary + gc.margin for gc in self.groups])
            keys = vec[i64]([self._boundary_key(rs, gc.gid, ends[gi])
                             for gi, gc in enumerate(self.groups)])
            bids = [cow[gc.gid].block_id if gc.cow else rs.tables[gi][idx].block_id
                    for gi, gc in enumerate(self.groups)]
            took = self._prepare_store(keys, ends, rs)
            if len(took) == 0:
                continue
            # (which groups' keys the pool takes: a subsequence of ``keys``, in order)
            stored = vec[i64]()
            src = vec[i64]()
            j = 0
            for gi, gc in enumerate(self.groups):
                k = keys[gi]
                if j < len(took) and took[j] == k:
                    j += 1
                    stored = append(stored, gi)
                    src = append(src, bids[gi])
                    t = ends[gi]
                    if t % gc.tpc:
                        self.n_tail += 1
                        self._tail_add(gi, t, 1)
            groups = None
            if self.log is not None:
                groups = {str(self.groups[gi].gid): {"chunks": 1, "blocks": 1,
                                                     "start_block": idx, "ends": [ends[gi]]}
                          for gi in stored}
            job = self._store_job(rs, took, len(src), groups)
            job.fenced = src
            for bid in src:
                self._fence(bid, job.jid)

    def _storable(self, rs: ReqOffload, gi: int, offl: i64) -> i64:
        gc = self.groups[gi]
        tpc: i64 = gc.tpc
        n: i64 = offl // tpc
        if gc.eagle and offl > rs.req.num_prompt_tokens and not rs.finished:
            if n > 0:
                n -= 1
        bpc: i64 = self.bpc
        a: i64 = len(rs.tables[gi]) // bpc
        if a < n:
            n = a
        k: i64 = len(rs.keys_of(gc.pki))
        if k < n:
            n = k
        return n

    def _advance_to(self, rs: ReqOffload, tops: vec[i64]) -> None:
        """Every attention group's chunks below ``tops`` (in ``full``'s order) count as
        stored."""
        full = self.full_v
        ns = rs.next_stored
        for fi in range(len(full)):
            gi = full[fi]
            n = tops[fi]
            if n > ns[gi]:
                ns[gi] = n

    def _check_swept(self, rs: ReqOffload) -> None:
        """Prompt chunks only (vLLM's default): once every attention group stored its last
        complete prompt chunk, the request's sweeps store nothing more (until a new lookup
        starts them again)."""
        if not self.prompt_only:
            return
        prompt: i64 = rs.req.num_prompt_tokens
        full = self.full_v
        ns = rs.next_stored
        for fi in range(len(full)):
            gi = full[fi]
            if ns[gi] < prompt // self.groups[gi].tpc:
                return
        rs.swept = True

    def _sweep(self, rs: ReqOffload, after: int, allocated: set[int] | None,
               scheduled: list[ReqOffload]) -> set[int] | None:
        """Store the request's complete prompt chunks not stored yet (vLLM's
        ``_build_store_jobs`` for one request); returns the allocated-ids set (built when
        first needed)."""
        if rs.swept:
            return allocated
        offl = self._offloadable(rs, after)
        bpc: i64 = self.bpc
        # (buffers kept, their first n_new entries: the keys to offer, their end tokens,
        # and each one's attention group (its index in ``full``) and chunk)
        new_keys = self.sweep_keys
        new_pos = self.sweep_pos
        new_fi = self.sweep_fi
        new_c = self.sweep_c
        n_new: i64 = 0
        # (the attention groups only: a Mamba group's states are stored as the GPU cache
        # hands them off, and its count of stored chunks is never read)
        full = self.full_v
        tops = self.sweep_tops
        for fi in range(len(full)):
            gi = full[fi]
            gc = self.groups[gi]
            n: i64 = self._storable(rs, gi, offl)
            tops[fi] = n
            start: i64 = rs.next_stored[gi]
            if n <= start:
                continue
            pks = rs.keys_of(gc.pki)
            gid: i64 = gc.gid
            tpc: i64 = gc.tpc
            tbl = rs.tables[gi]
            for c in range(start, n):
                first = c * bpc
                ok = True
                for b in range(bpc):
                    if tbl[first + b].is_null:
                        ok = False
                        break
                if ok:
                    if n_new == len(new_keys):
                        new_keys = self.sweep_keys = grown(new_keys, n_new + 1)
                        new_pos = self.sweep_pos = grown(new_pos, n_new + 1)
                        new_fi = self.sweep_fi = grown(new_fi, n_new + 1)
                        new_c = self.sweep_c = grown(new_c, n_new + 1)
                    new_keys[n_new] = (pks[c] << GROUP_BITS) | gid
                    new_pos[n_new] = (c + 1) * tpc
                    new_fi[n_new] = fi
                    new_c[n_new] = c
                    n_new += 1
        if n_new == 0:
            self._advance_to(rs, tops)
            self._check_swept(rs)
            return allocated
        stored = self._prepare_store(new_keys, new_pos, rs, n_new)
        if self.offer_failed:
            return allocated
        self._advance_to(rs, tops)
        nst: i64 = len(stored)
        if nst == 0:
            self._check_swept(rs)
            return allocated
        # the source blocks of the keys stored (in the order offered, a subsequence of them)
        src = vec[i64](capacity=nst * bpc)
        j: i64 = 0
        tfi: i64 = -1        # (the group whose table ``tbl`` is: most sweeps have one)
        for k in range(n_new):
            if j < nst and stored[j] == new_keys[k]:
                j += 1
                if new_fi[k] != tfi:
                    tfi = new_fi[k]
                    tbl = rs.tables[full[tfi]]
                first = new_c[k] * bpc
                for b in range(bpc):
                    bid = tbl[first + b].block_id
                    if bid != 0:
                        src = append(src, bid)
        groups = self._sweep_groups(rs, stored, n_new) if self.log is not None else None
        job = self._store_job(rs, stored, len(src), groups)
        job.deferred = src
        self._check_swept(rs)
        if rs.finished:
            if allocated is None:
                allocated = self._allocated_ids(scheduled)
            for bid in src:
                self._fence(bid, job.jid)
                if bid in allocated:
                    self.flush_jobs.add(job.jid)
        return allocated

    def _sweep_groups(self, rs: ReqOffload, stored: vec[i64], n_new: i64) -> dict[str, Any]:
        """A sweep's store job per group, for the step log (``sweep_*`` hold its keys)."""
        groups: dict[str, Any] = {}
        bpc = self.bpc
        j = 0
        for fi, gi in enumerate(self.full):
            gc = self.groups[gi]
            tbl = rs.tables[gi]
            nb = 0
            first_blk = -1
            ends = []
            for k in range(n_new):
                if self.sweep_fi[k] != fi:
                    continue
                if j >= len(stored) or stored[j] != self.sweep_keys[k]:
                    continue
                j += 1
                c = self.sweep_c[k]
                ends.append(self.sweep_pos[k])
                for b in range(bpc):
                    if tbl[c * bpc + b].block_id == 0:
                        continue
                    if first_blk < 0:
                        first_blk = c * bpc + b
                    nb += 1
            if ends:
                groups[str(gc.gid)] = {"chunks": len(ends), "blocks": nb,
                                       "start_block": first_blk if first_blk >= 0 else 0,
                                       "ends": sorted(ends)}
        return groups
