"""vLLM 0.33.0's native KV offloading (``--kv-offloading-size``) as its scheduler sees it:
the ``OffloadingConnector``'s scheduler side beside the KV-cache manager, over the host
pool of ``sim/cache/offload_pool.py``.

Every KV-cache group is offloaded under its own keys, one key per *chunk* of
``blocks_per_chunk`` GPU blocks: chunk ``i`` of group ``g`` is keyed by the prefix key of
its last hash unit in group ``g``.  What the scheduler asks of it, step by step:

* at every admission that looks the prefix up (``num_computed_tokens == 0``: a first
  admission or one after a preemption) ``get_num_new_matched_tokens(request, local)``
  from the block-aligned GPU hit ``local``: attention groups need every chunk from there
  (an EAGLE-flagged group gives one trailing chunk up), every Mamba group needs a state
  keyed exactly at the hit boundary, the hit is capped at ``num_tokens - 1`` rounded down
  to the Mamba chunk (when a Mamba group exists), less than one chunk past the GPU hit is
  never loaded, and with partial tails (one block per chunk, one block size, a Mamba block
  wider than the hash unit) a hit may end on the hash grid inside a block.  The answer is
  None (try again next step) while the request still has transfers in flight, while a
  chunk it would need is still being written, or while one is being loaded for another
  request;
* ``update_state_after_alloc`` after the admission's allocation: a load job for the GPU
  blocks past the local hit (``prepare_load`` pins the keys); the request then waits
  (vLLM's ``WAITING_FOR_REMOTE_KVS``) until the load is reported done;
* ``build`` once per ``schedule()``: stores of the Mamba states the GPU cache committed
  on an offload-chunk boundary within the prompt (and the partial-tail copy), then a sweep
  per scheduled (or just finished) request storing every complete prompt chunk whose last
  token this step schedules; flushes of jobs whose source blocks are reused; the
  recency of the requests that finished.

A transfer completes after a fixed number of steps (``StepTransfers``: the oracle's
stand-in worker) or when its bytes have crossed the host link (``TimedTransfers``: the
analytical backend's model, see ``backends/analytical.py``).  Completions are taken at the
start of the next ``schedule()`` (vLLM takes them at the end of the step that reports
them, and nothing reads them in between).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from librt.vecs import append, vec
from mypy_extensions import i64

from sim.cache.block_pool import GROUP_BITS
from sim.cache.offload_jobs import (GroupOffload, Job, ReqOffload, StepTransfers,
                                    TimedTransfers, Transfers)
from sim.cache.offload_store import ConnectorStores
from sim.cache.rules import cdiv

if TYPE_CHECKING:
    from sim.cache.request import CacheRequest

__all__ = ["GroupOffload", "Job", "OffloadConnector", "ReqOffload", "StepTransfers",
           "TimedTransfers", "Transfers"]


class OffloadConnector(ConnectorStores):
    """The scheduler side of vLLM's ``OffloadingConnector`` over a ``HostPool``: its
    state and lookup (``ConnectorLookup``), its stores (``ConnectorStores``), and here the
    requests' lifecycle, the admissions and the step."""

    # ---------------------------------------------------------------- requests --
    def add_request(self, req: CacheRequest) -> None:
        spare = self.spare
        if spare:
            rs = spare.pop()
            rs.reuse(req, self.pool.arc)
        else:
            rs = ReqOffload(req, len(self.groups), len(self.hpcs), self.pool.arc)
        self.reqs[req.request_id] = rs
        req.offload = rs
        if self.req_log is not None:
            self.req_log[req.request_id] = {"admissions": [], "lookups": [],
                                            "load_done_step": None}

    def request_finished(self, req: CacheRequest) -> None:
        """The request finished (before its blocks are freed): its final keys, and the
        fences of its stores in flight."""
        rs = req.offload
        if rs is None:
            return
        rs.finished = True
        self._update_keys(rs)
        for jid in rs.jobs:
            job = self.jobs.get(jid)
            assert job is not None
            for bid in job.deferred:
                self._fence(bid, jid)
        self.finished.append(rs)

    def preempted(self, req: CacheRequest) -> None:
        self.preempted_ids.append(req.request_id)


    # -------------------------------------------------------------- admission --
    def update_state_after_alloc(self, req: CacheRequest, ext: int, looked_up: bool,
                                 local: int) -> None:
        """After a waiting request's allocation: ``ext`` tokens to load (0: none);
        ``looked_up``: an admission that looked the prefix up, ``local`` GPU tokens."""
        rid = req.request_id
        rs = req.offload
        assert rs is not None
        self.admitted.append(rs)
        rs.fresh = True
        if looked_up and self.req_log is not None:
            adm = self.req_log[rid]["admissions"]
            adm.append({"step": self.now, "local": local, "external": ext,
                        "async": ext > 0, "resume": bool(adm)})
        if ext == 0:
            return
        rs.loaded = True
        local = rs.num_local
        cached = local + ext
        tail = rs.tail
        assert tail is None or tail == cached
        tables = self.kv.group_tables(rid)
        keys_to_load = vec[i64]()
        kpos = vec[i64]()            # (each key's end token)
        nblocks = 0
        groups: dict[str, Any] | None = {} if self.log is not None else None
        for gi, gc in enumerate(self.groups):
            table = tables[gi]
            tpb = gc.tpb
            ngpu = cdiv(cached, tpb)
            start = ngpu
            for i in range(cdiv(local, tpb), ngpu):
                b = table[i]
                if not b.is_null and b.key < 0:
                    start = i
                    break
            npending = ngpu - start
            nchunks = cdiv(cached, gc.tpc)
            if npending:
                first = len(keys_to_load)
                pks = rs.keys_of(gc.pki)
                hi = nchunks - (tail is not None)
                if hi > len(pks):
                    hi = len(pks)
                gid = gc.gid
                for c in range(start // self.bpc, hi):
                    keys_to_load = append(keys_to_load, (pks[c] << GROUP_BITS) | gid)
                    kpos = append(kpos, (c + 1) * gc.tpc)
                if tail is not None:
                    t = tail + gc.margin
                    keys_to_load = append(keys_to_load, self._boundary_key(rs, gid, t))
                    kpos = append(kpos, t)
                nblocks += npending
                if groups is not None:
                    ends = [kpos[j] for j in range(first, len(kpos))]
                    groups[str(gid)] = {"chunks": len(ends), "blocks": npending,
                                        "start_block": start, "ends": sorted(ends)}
            rs.next_stored[gi] = nchunks
        self.pool.prepare_load(keys_to_load, rs, kpos)
        job = self._new_job(rs, keys_to_load, False)
        job.blocks = nblocks
        job.groups = groups
        rs.add_job(job.jid)
        self.load_jobs.append(job)
        lk = self.loading_keys
        for key in keys_to_load:
            lk.put(key, 0)
        rs.tail = None
        rs.loading = True
        self.loaded_chunks += len(keys_to_load)
        self.loaded_blocks += nblocks
        self.worker.load(job, nblocks * self.block_bytes, self.now)
        self._watch(job)

    def load_done(self, rid: str) -> bool:
        return rid in self.recving

    def promoted(self, rid: str) -> None:
        self.recving.discard(rid)
        rs = self.reqs.get(rid)
        if rs is not None:
            rs.loading = False

    # ---------------------------------------------------------------- the step --
    def start_step(self, now: int) -> None:
        """Before ``schedule()``: the completions reported since the last one."""
        self.now = now
        self.step_no += 1
        worker = self.worker
        ns = worker.start_step(now)
        if ns:
            started = worker.started
            for j in range(ns):
                self._watch(started[j])
        self.kv.pool.start_popping()
        heap = self.due
        if not heap.n or heap.first() > now:
            return
        # (the completions, in (store, job id) order: loads first; an insertion, the list
        # is short; the first nd entries of a list kept, overwritten)
        done = self.done
        nd: i64 = 0
        while heap.n and heap.first() <= now:
            seen, jid = heap.pop()
            job = self.jobs.get(jid)
            if job is not None and job.seen == seen:
                job.seen = -3            # (taken: a second entry of the job is stale)
                k = nd
                if nd < len(done):
                    done[nd] = job
                else:
                    done.append(job)
                nd += 1
                while k > 0 and (done[k - 1].store > job.store
                                 or (done[k - 1].store == job.store
                                     and done[k - 1].jid > job.jid)):
                    done[k] = done[k - 1]
                    k -= 1
                done[k] = job
        if nd == 0:
            return
        for d in range(nd):
            job = done[d]
            rs = job.rs
            if job.store:
                self.pool.complete_store(job.keys)
            else:
                self.pool.complete_load(job.keys)
                lk = self.loading_keys
                for key in job.keys:
                    lk.remove(key, 0)
            if self.n_fenced:
                self._unfence(job.jid, job.fenced)
                if rs.finished:
                    self._unfence(job.jid, job.deferred)
            self.jobs.remove(job.jid)
            rs.drop_job(job.jid)
            if rs.signaled and len(rs.jobs) == 0:
                self._forget(rs)
            if not job.store:
                if rs.loading:
                    self.recving.add(job.rid)
                if self.req_log is not None and job.rid in self.req_log:
                    self.req_log[job.rid]["load_done_step"] = job.due
            if self.log is not None:
                self._done_rec(job)
            self._spare_job(job)


    def _done_rec(self, job: Job) -> None:
        """A completion in the step log, at the step that reported it (in steps)."""
        step = job.due if self.worker.steps else self.now
        recs = self.log
        assert recs is not None
        k = len(recs)
        while k > 0 and recs[k - 1]["step"] > step:
            k -= 1
        if k > 0 and recs[k - 1]["step"] == step:
            r = recs[k - 1]
        else:
            r = {"step": step}
            recs.insert(k, r)
        r.setdefault("done_stores" if job.store else "done_loads", []).append(job.jid)

    def build(self, scheduled: list[ReqOffload], n: i64 = -1, handoffs: bool = True) -> None:
        """vLLM's ``build_connector_meta``.  Every request this step schedules has its
        ``step_tokens`` and ``sched_step`` (this step's ``step_no``) set; ``scheduled``
        lists (its first ``n`` entries; -1: all), in scheduling order, those of them still
        sweeping or ``fresh`` (from the waiting queue): the others' part here is only their
        tokens, read by the partial tails (most of a step's requests are decoding, their
        sweeps over).  ``handoffs``: False when the caller knows the cache committed no
        Mamba state for the connector since the last step (none to take)."""
        if n < 0:
            n = len(scheduled)
        self.n_sched = n
        kv = self.kv
        now = self.now
        allocated: set[int] | None = None
        # the scheduled requests' keys and (attention) block tables; those whose sweeps
        # are not over
        # (the first n_sw entries of a list kept, overwritten)
        sweep_rs = self.sweep_rs
        n_sw: i64 = 0
        for k in range(n):
            srs = scheduled[k]
            if srs.fresh:
                rid = srs.req.request_id
                for gi in self.full:
                    srs.tables[gi] = kv.group_table(rid, gi)
            if not srs.swept:
                self._update_keys(srs)
                if n_sw < len(sweep_rs):
                    sweep_rs[n_sw] = srs
                else:
                    sweep_rs.append(srs)
                n_sw += 1
        # flushes: preempted requests' jobs, jobs whose source blocks come back
        for rid in self.preempted_ids:
            rs = self.reqs.get(rid)
            if rs is None:
                continue
            self.flush_jobs.update(j for j in rs.jobs if not self._is_batch_load(j))
        if self.n_fenced:
            self._flush_allocated(scheduled)
        if handoffs and kv.take_offload_handoffs():
            rids = self._handoff_rids(kv.handoff_lists)
            self._boundary_stores(rids, kv.handoff_groups, kv.handoff_lists)
            if self.partial:
                self._tail_stores(rids, kv.handoff_groups, kv.handoff_lists)
            kv.clear_offload_handoffs()
        for k in range(n_sw):
            rs = sweep_rs[k]
            if not rs.swept:
                allocated = self._sweep(rs, rs.req.num_computed_tokens + rs.step_tokens,
                                        allocated, scheduled)
        finished = self.finished
        if len(finished) > 1:
            # vLLM walks the finished ids as a Python set (hash order, which varies from
            # process to process); here in the order they finished (the ties recorded for
            # the step log's readers, who may replay them in other orders)
            if self.log is not None:
                self.finish_ties.append((now, [f.req.request_id for f in finished]))
            if self.finish_orders is not None and now in self.finish_orders:
                by_id = {f.req.request_id: f for f in finished}
                finished = [by_id[rid] for rid in self.finish_orders[now] if rid in by_id]
        # (a state still its request's: not forgotten, as ``reqs`` holds it)
        for rs in finished:
            if rs.req.offload is rs:
                req = rs.req
                after = req.num_tokens - 1
                if after < req.num_prompt_tokens:
                    after = req.num_prompt_tokens
                allocated = self._sweep(rs, after, allocated, scheduled)
        for rs in finished:
            if rs.req.offload is not rs:
                continue
            rs.signaled = True
            self.pool.request_finished(rs)
            if len(rs.jobs) == 0:
                self._forget(rs)
        if len(self.finished):
            self.finished.clear()
        if len(self.flush_jobs):
            rec = self._rec() if self.log is not None else None
            for jid in sorted(self.flush_jobs):
                job = self.jobs.get(jid)
                if job is not None and not 0 <= job.seen <= now:
                    self.worker.flush(job, now)
                    self._watch(job)
            if rec is not None:
                rec["flush"] = sorted(self.flush_jobs)
        if self.log is not None:
            rec = self._rec()
            if self.load_jobs:
                rec["loads"] = [self._job_rec(j) for j in self.load_jobs]
            if len(rec) > 1:
                self.log.append(rec)
            self._step_rec = None
        # (the step's lists and set, emptied in place: no new objects every step)
        if self.load_jobs:
            self.load_jobs.clear()
        if len(self.flush_jobs):
            self.flush_jobs.clear()
        if len(self.admitted):
            for ars in self.admitted:
                ars.fresh = False
            self.admitted.clear()
        if self.preempted_ids:
            self.preempted_ids.clear()
        kv.pool.stop_popping()

    def _forget(self, rs: ReqOffload) -> None:
        """The request's state is done with (finished, no job left); the request and its
        state stop pointing at each other (no cycle left for the garbage collector), and
        the state waits to be reused by a new request (a few kept)."""
        del self.reqs[rs.req.request_id]
        rs.req.offload = None
        if len(self.spare) < 64:
            self.spare.append(rs)

    def _is_batch_load(self, jid: int) -> bool:
        for j in self.load_jobs:
            if j.jid == jid:
                return True
        return False
