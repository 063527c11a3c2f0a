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

import heapq
from typing import TYPE_CHECKING, Any

from sim.cache.block_pool import GROUP_BITS
from sim.cache.offload_stop import ConnectorAssertion
from sim.cache.offload_pool import GROUP_MASK, HIT, HIT_PENDING, MISS, AccessState, HostPool
from sim.cache.rules import cdiv, eagle_proof_margin

if TYPE_CHECKING:
    from sim.cache.block_pool import Block
    from sim.cache.kv_manager import KVCacheManager
    from sim.cache.request import CacheRequest


class GroupOffload:
    """One KV-cache group as the connector offloads it."""

    __slots__ = ("gid", "tpb", "tpc", "hpc", "window", "eagle", "cow", "pki")

    def __init__(self, gid: int, tpb: int, bpc: int, unit: int, mamba: bool, eagle: bool):
        self.gid = gid
        self.tpb = tpb                   # tokens per GPU block
        self.tpc = tpb * bpc             # tokens per chunk
        self.hpc = self.tpc // unit      # hash units per chunk
        self.window: int | None = 1 if mamba else None   # chunks a hit needs at its end
        self.eagle = eagle               # is_eagle_group: one trailing chunk is volatile
        self.cow = mamba                 # Mamba align: states come from the GPU hand-off
        self.pki = 0                     # which of the request's prefix-key lists (by hpc)


def _done_order(job: Job) -> tuple[bool, int]:
    return (job.store, job.jid)


class Job:
    __slots__ = ("jid", "rid", "keys", "store", "fenced", "deferred", "chunks", "blocks",
                 "due", "seen", "nbytes", "groups")

    def __init__(self, jid: int, rid: str, keys: list[int], store: bool):
        self.jid = jid
        self.rid = rid
        self.keys = keys
        self.store = store
        self.fenced: list[int] = []      # source blocks watched from the job's creation
        self.deferred: list[int] = []    # ... watched once the request has finished
        self.chunks = len(keys)
        self.blocks = 0                  # GPU blocks moved
        self.due = -1                    # when it completes (the worker's unit)
        self.seen = -1                   # the engine time its completion is seen from
        self.nbytes = 0                  # bytes over one GPU's host link
        self.groups: dict[str, Any] | None = None   # per group, for step logs


class ReqOffload:
    """One request's offload state (vLLM's ``RequestOffloadState``)."""

    __slots__ = ("req", "st", "pk", "tables", "next_stored", "hit_end", "num_local",
                 "jobs", "tail", "loaded", "finished", "signaled", "loading", "swept")

    def __init__(self, req: CacheRequest, ngroups: int, nlists: int):
        self.req = req
        self.st = AccessState()
        # the prefix keys of its chunks, one list per chunk size (a group's chunk key is
        # its prefix key with the group in the low bits: groups of one chunk size share one)
        self.pk: list[list[int]] = [[] for _ in range(nlists)]
        # its block table in each attention group as vLLM's connector holds it (from the
        # step it is scheduled after a lookup; the table itself: it only grows while the
        # request runs, and stays as it was once the request has finished)
        self.tables: list[list[Block]] = [[] for _ in range(ngroups)]
        self.next_stored = [0] * ngroups
        self.hit_end = [0] * ngroups
        self.num_local = 0
        self.jobs: set[int] = set()
        self.tail: int | None = None     # partial-tail boundary of the pending load
        self.loaded = False              # loaded from the tier at some admission
        self.finished = False
        self.signaled = False            # the manager saw its finish
        self.loading = False             # admitted, waiting for its load (scheduler side)
        self.swept = False               # every prompt chunk the sweep may store is behind it


class Transfers:
    """How long transfers take.  A job's ``seen`` is the earliest engine time at which the
    next ``schedule()`` sees it done (-1: not known yet)."""

    def __init__(self) -> None:
        self.steps = False       # (times in steps, the oracle's; else in engine ns)

    def load(self, job: Job, nbytes: int, now: int) -> None:
        raise NotImplementedError

    def store(self, job: Job, nbytes: int, now: int) -> None:
        raise NotImplementedError

    def flush(self, job: Job, now: int) -> None:
        raise NotImplementedError

    def start_step(self, now: int) -> list[Job]:
        """At a step's start: the jobs whose completion time became known."""
        return []

    def stall_ns(self) -> int:
        return 0

    def waiting_to_start(self) -> bool:
        """Whether jobs wait for the next step to be submitted."""
        return False


class StepTransfers(Transfers):
    """The oracle's stand-in worker: a job issued by the step at ``now`` completes at the
    end of step ``now + steps`` (0: its own step), seen by the next ``schedule()``; a
    flushed job completes in the flushing step.  One step is ``unit`` engine ns."""

    def __init__(self, load_steps: int = 1, store_steps: int = 1, unit: int = 1):
        super().__init__()
        self.steps = True
        self.load_steps = load_steps
        self.store_steps = store_steps
        self.unit = unit

    def _due(self, job: Job, step: int) -> None:
        job.due = step
        job.seen = (step + 1) * self.unit

    def load(self, job: Job, nbytes: int, now: int) -> None:
        self._due(job, now // self.unit + self.load_steps)

    def store(self, job: Job, nbytes: int, now: int) -> None:
        self._due(job, now // self.unit + self.store_steps)

    def flush(self, job: Job, now: int) -> None:
        self._due(job, now // self.unit)


class TimedTransfers(Transfers):
    """Jobs cross the host links at their bandwidth (``backends.analytical.HostLinks``), as
    vLLM's offloading worker submits them: a load when its step starts, a store after the
    step's forward -- at the start of the next step (a flushed store at once, and the
    step's forward waits for it).  Times in engine ns; a job's completion is seen by the
    first ``schedule()`` at or after it (vLLM polls at each step's end)."""

    def __init__(self, load_bytes_per_s: float, store_bytes_per_s: float):
        from backends.analytical import HostLinks

        super().__init__()
        self.links = HostLinks(load_bytes_per_s, store_bytes_per_s)
        self.queued: list[Job] = []      # stores waiting for the next step
        self.stall = 0                   # ns the step waits for flushed jobs

    def load(self, job: Job, nbytes: int, now: int) -> None:
        job.nbytes = nbytes
        job.due = job.seen = self.links.load(nbytes, now)

    def store(self, job: Job, nbytes: int, now: int) -> None:
        job.nbytes = nbytes
        self.queued.append(job)          # (submitted with the next step: seen unknown)

    def start_step(self, now: int) -> list[Job]:
        self.stall = 0
        q = self.queued
        if not q:
            return q
        self.queued = []
        for job in q:
            job.due = job.seen = self.links.store(job.nbytes, now)
        return q

    def flush(self, job: Job, now: int) -> None:
        if job.seen < 0:
            self.queued.remove(job)
            job.due = job.seen = self.links.store(job.nbytes, now)
        wait = job.due - now
        if wait > self.stall:
            self.stall = wait

    def stall_ns(self) -> int:
        return self.stall

    def waiting_to_start(self) -> bool:
        return bool(self.queued)


class OffloadConnector:
    """The scheduler side of vLLM's ``OffloadingConnector`` over a ``HostPool``."""

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
        self.margins: dict[int, int] = {}
        if self.partial:
            for gc in self.groups:
                if gc.eagle and not gc.cow:
                    self.margins[gc.gid] = eagle_proof_margin(self.pblock, self.unit,
                                                              partial_hash_hits)
        self.max_margin = max(self.margins.values(), default=0)
        self.reqs: dict[str, ReqOffload] = {}
        self.jobs: dict[int, Job] = {}
        self.due: list[tuple[int, int]] = []     # (seen, job): completions, as a heap
        self.next_job = 0
        self.loading_keys: set[int] = set()      # keys of async loads in flight
        # the partial-tail keys the pool holds (the only keys off their group's chunk
        # grid): per group, how many at each position; and each one's group and position
        self.tail_pos: list[dict[int, int]] = [{} for _ in self.groups]
        self.tail_keys: dict[int, int] = {}
        self.block_jobs: dict[int, set[int]] = {}   # fenced block id -> pending jobs
        # this step's
        self.load_jobs: list[Job] = []
        self.flush_jobs: set[int] = set()
        self.admitted: list[str] = []            # requests allocated in the waiting loop
        self.recving: set[str] = set()           # loads reported done, not yet promoted
        self.finished_ids: list[str] = []        # finished since the last build
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
        kv.enable_offload_handoffs()

    # ------------------------------------------------------------------ helpers --
    def _update_keys(self, rs: ReqOffload) -> None:
        """The request's chunk keys for every complete chunk of its hashes (prompt and
        outputs), with their end tokens (the prefix order the host pool ranks by)."""
        req = rs.req
        bh = req.block_hashes
        n = bh.count
        pos = rs.st.positions
        u = self.unit
        for li, hpc in enumerate(self.hpcs):
            pks = rs.pk[li]
            want = n // hpc
            k = len(pks)
            while k < want:
                k += 1
                pk = bh.key(k * hpc - 1)
                pks.append(pk)
                pos[pk] = k * hpc * u

    def _gkeys(self, rs: ReqOffload, gi: int, lo: int, hi: int) -> list[int]:
        """Group ``gi``'s chunk keys ``lo`` .. ``hi - 1``."""
        gid = self.groups[gi].gid
        return [(pk << GROUP_BITS) | gid for pk in rs.pk[self.groups[gi].pki][lo:hi]]

    def _nkeys(self, rs: ReqOffload, gi: int) -> int:
        return len(rs.pk[self.groups[gi].pki])

    def _boundary_key(self, rs: ReqOffload, gid: int, tokens: int) -> int:
        pk = rs.req.block_hashes.key(tokens // self.unit - 1)
        rs.st.positions[pk] = tokens
        return (pk << GROUP_BITS) | gid

    def _offloadable(self, rs: ReqOffload, n: int) -> int:
        req = rs.req
        if n > req.num_tokens:
            n = req.num_tokens
        if self.prompt_only and n > req.num_prompt_tokens:
            n = req.num_prompt_tokens
        return n

    def _new_job(self, rid: str, keys: list[int], store: bool) -> Job:
        job = Job(self.next_job, rid, keys, store)
        self.next_job += 1
        self.jobs[job.jid] = job
        return job

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

    def quiet(self, running: list[Any]) -> bool:
        """Whether the next steps of the running requests (a decode jump) would do nothing
        here but let transfers complete: no finished request to wrap up, no store waiting
        for the next step's start, every running request's sweep over."""
        if self.finished_ids:
            return False
        if not self.jobs:
            return True
        if self.worker.waiting_to_start():
            return False
        reqs = self.reqs
        for r in running:
            rs = reqs.get(r.cache.request_id)
            if rs is None or not rs.swept:
                return False
        return True

    def busy(self) -> bool:
        """Whether the engine must keep stepping (vLLM's ``has_pending_push_work`` and
        finished requests whose last stores are still to be built)."""
        return bool(self.jobs or self.finished_ids)

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
        rs = self.reqs[req.request_id]
        self._update_keys(rs)
        cap = req.num_tokens - 1 if self.sliding else req.num_tokens
        lookup = self.pool.lookup
        reach = cap
        for gi in self.full:
            gc = self.groups[gi]
            pks = rs.pk[gc.pki]
            gid = gc.gid
            first = start // gc.tpc
            i = first
            while i < len(pks) and lookup((pks[i] << GROUP_BITS) | gid) == HIT:
                i += 1
            if gc.eagle and i > first:
                i -= 1
            end = i * gc.tpc
            if end > cap // gc.tpc * gc.tpc:
                end = cap // gc.tpc * gc.tpc
            if end < reach:
                reach = end
        return reach if reach > start else start

    # ---------------------------------------------------------------- requests --
    def add_request(self, req: CacheRequest) -> None:
        self.reqs[req.request_id] = ReqOffload(req, len(self.groups), len(self.hpcs))
        if self.req_log is not None:
            self.req_log[req.request_id] = {"admissions": [], "lookups": [],
                                            "load_done_step": None}

    def request_finished(self, req: CacheRequest) -> None:
        """The request finished (before its blocks are freed): its final keys, and the
        fences of its stores in flight."""
        rs = self.reqs.get(req.request_id)
        if rs is None:
            return
        rs.finished = True
        self._update_keys(rs)
        for jid in rs.jobs:
            for bid in self.jobs[jid].deferred:
                self.block_jobs.setdefault(bid, set()).add(jid)
        self.finished_ids.append(req.request_id)

    def preempted(self, req: CacheRequest) -> None:
        self.preempted_ids.append(req.request_id)

    # ------------------------------------------------------------------ lookup --
    def get_num_new_matched_tokens(self, req: CacheRequest, local: int) -> int | None:
        rid = req.request_id
        rs = self.reqs[rid]
        for gi in range(len(self.groups)):
            rs.tables[gi] = []
            rs.next_stored[gi] = 0
        rs.swept = False
        if rs.jobs:
            hit: int | None = None
        else:
            self._update_keys(rs)
            rs.num_local = local
            hit = self._lookup(rs)
        if self.req_log is not None:
            self.req_log[rid]["lookups"].append([self.now, local, hit, bool(hit)])
        return hit

    def _prefix_lookup(self, pks: list[int], lo: int, hi: int, gid: int) -> int | None:
        """Chunks ``lo`` .. ``hi - 1`` of a group: how many, from ``lo``, the pool holds
        (being written counts, but makes the answer None: deferred)."""
        n = 0
        defer = False
        lookup = self.pool.lookup
        for i in range(lo, hi):
            r = lookup((pks[i] << GROUP_BITS) | gid)
            if r == MISS:
                break
            n += 1
            if r == HIT_PENDING:
                defer = True
        return None if defer else n

    def _window_lookup(self, pks: list[int], lo: int, hi: int, gid: int, window: int,
                       first_window: int) -> int | None:
        """Chunks ``lo`` .. ``hi - 1`` of a group with a window (Mamba: one chunk), from the
        end: the end (from ``lo``) of the last run of ``window`` chunks held."""
        pending = False
        run = 0
        need = first_window or window
        lookup = self.pool.lookup
        for idx in range(hi - lo - 1, -1, -1):
            r = lookup((pks[lo + idx] << GROUP_BITS) | gid)
            if r == HIT:
                run += 1
            elif r == HIT_PENDING:
                pending = True
                run += 1
            else:
                run = 0
                pending = False
                need = window
            if run == need:
                return None if pending else idx + need
        return None if pending else run

    def _lookup_complete(self, rs: ReqOffload) -> int | None:
        req = rs.req
        c0 = rs.num_local
        cap = req.num_tokens
        if self.sliding:
            cap -= 1
            if self.mamba_align is not None:
                cap = cap // self.mamba_align * self.mamba_align
        num_hit = 0
        defer = False
        for gi in range(len(self.groups)):
            rs.hit_end[gi] = 0
        verified: set[int] = set()
        groups = self.lookup_groups
        while groups:
            looked_sw = False
            current = groups
            groups = ()
            for gi in current:
                gc = self.groups[gi]
                tpc = gc.tpc
                pks = rs.pk[gc.pki]
                nk = len(pks)
                unverified = gc.eagle and gi not in verified
                if cap > nk * tpc:
                    cap = nk * tpc
                if cap - c0 < tpc:
                    return 0
                query_max = cap
                if unverified:
                    query_max = min(cap + tpc, nk * tpc)
                nchunks = min(cdiv(query_max, tpc), nk)
                start = c0 // tpc
                if gc.window is None:
                    nh = self._prefix_lookup(pks, start, nchunks, gc.gid)
                    rs.hit_end[gi] = start + (nh or 0)
                else:
                    w = gc.window + (1 if unverified else 0)
                    nh = self._window_lookup(pks, start, nchunks, gc.gid, w, w)
                if nh == 0:
                    return 0
                if nh is None:
                    defer = True
                else:
                    if unverified:
                        nh -= 1
                        verified.add(gi)
                    if cap > tpc * (start + nh):
                        cap = tpc * (start + nh)
                new = cap - c0
                if new < tpc:
                    return 0
                if new < num_hit:
                    if not gc.eagle:
                        verified.clear()
                    if defer:
                        defer = False
                        groups = self.lookup_groups
                    elif looked_sw and not groups:
                        groups = self.sliding
                looked_sw = looked_sw or gc.window is not None
                num_hit = new
        if defer:
            return None
        if self.loading_keys:
            end = c0 + num_hit
            for gi, gc in enumerate(self.groups):
                sub = self._gkeys(rs, gi, c0 // gc.tpc, cdiv(end, gc.tpc))
                if gc.window is not None:
                    sub = sub[-gc.window:]
                for key in sub:
                    if key in self.loading_keys:
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
        unconfirmed: list[int] = []
        pending = False
        if maxb >= bridge_end:
            for gi, gc in enumerate(self.groups):
                if gc.cow:
                    continue
                key = (rs.pk[gc.pki][bridge] << GROUP_BITS) | gc.gid
                pending = pending or key in self.loading_keys
                if rs.hit_end[gi] <= bridge:
                    unconfirmed.append(key)
            for key in unconfirmed:
                r = self.pool.lookup(key)
                if r == MISS:
                    maxb = bridge_end - u
                    break
                pending = pending or r != HIT
        bridge_pending = pending
        for b in range(maxb, cb, -u):
            hit, bpend = self._lookup_tail(rs, b, b >= bridge_end and bridge_pending)
            if hit:
                rs.tail = b
                return b - local
            pending = pending or bpend
        if pending and complete == 0:
            return None
        return complete

    def _lookup_tail(self, rs: ReqOffload, b: int, pending: bool) -> tuple[bool, bool]:
        first = self.groups[0]
        t0 = b + self.margins.get(first.gid, 0)
        if t0 % first.tpc and t0 not in self.tail_pos[0]:
            # (the first group's key there would be a partial-tail key, and the pool holds
            # none at that position: a miss, known without computing the key)
            return False, pending
        bh = rs.req.block_hashes
        u = self.unit
        lookup = self.pool.lookup
        at_b = -1             # (the prefix key at b, shared by the groups without a margin)
        for gc in self.groups:
            t = b + self.margins.get(gc.gid, 0)
            if t != b:
                pk = bh.key(t // u - 1)
            else:
                if at_b < 0:
                    at_b = bh.key(b // u - 1)
                pk = at_b
            r = lookup((pk << GROUP_BITS) | gc.gid)
            if r == MISS:
                return False, pending
            pending = pending or r != HIT
        if pending:
            return False, True
        return True, False

    # -------------------------------------------------------------- admission --
    def update_state_after_alloc(self, req: CacheRequest, ext: int, looked_up: bool,
                                 local: int) -> None:
        """After a waiting request's allocation: ``ext`` tokens to load (0: none);
        ``looked_up``: an admission that looked the prefix up, ``local`` GPU tokens."""
        rid = req.request_id
        self.admitted.append(rid)
        if looked_up and self.req_log is not None:
            adm = self.req_log[rid]["admissions"]
            adm.append({"step": self.now, "local": local, "external": ext,
                        "async": ext > 0, "resume": bool(adm)})
        if ext == 0:
            return
        rs = self.reqs[rid]
        rs.loaded = True
        local = rs.num_local
        cached = local + ext
        tail = rs.tail
        assert tail is None or tail == cached
        tables = self.kv.group_tables(rid)
        keys_to_load: list[int] = []
        nblocks = 0
        groups: dict[str, Any] | None = {} if self.log is not None else None
        pos = rs.st.positions
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
                gk = self._gkeys(rs, gi, start // self.bpc, nchunks - (tail is not None))
                if tail is not None:
                    gk.append(self._boundary_key(rs, gc.gid, tail + self.margins.get(gc.gid, 0)))
                keys_to_load.extend(gk)
                nblocks += npending
                if groups is not None:
                    groups[str(gc.gid)] = {"chunks": len(gk), "blocks": npending,
                                           "start_block": start,
                                           "ends": sorted(pos[k >> GROUP_BITS] for k in gk)}
            rs.next_stored[gi] = nchunks
        self.pool.prepare_load(keys_to_load, rs.st)
        job = self._new_job(rid, keys_to_load, False)
        job.blocks = nblocks
        job.groups = groups
        rs.jobs.add(job.jid)
        self.load_jobs.append(job)
        self.loading_keys.update(keys_to_load)
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
        for started in self.worker.start_step(now):
            self._watch(started)
        self.kv.pool.popped = []
        heap = self.due
        if not heap or heap[0][0] > now:
            return
        done: list[Job] = []
        while heap and heap[0][0] <= now:
            seen, jid = heapq.heappop(heap)
            job = self.jobs.get(jid)
            if job is not None and job.seen == seen:
                job.seen = -3            # (taken: a second entry of the job is stale)
                done.append(job)
        if not done:
            return
        done.sort(key=_done_order)
        for job in done:
            rs = self.reqs[job.rid]
            if job.store:
                self.pool.complete_store(job.keys)
            else:
                self.pool.complete_load(job.keys)
                self.loading_keys.difference_update(job.keys)
            if self.block_jobs:
                self._unfence(job.jid, job.fenced)
                if rs.finished:
                    self._unfence(job.jid, job.deferred)
            del self.jobs[job.jid]
            rs.jobs.discard(job.jid)
            if rs.signaled and not rs.jobs:
                del self.reqs[job.rid]
            if not job.store:
                if rs.loading:
                    self.recving.add(job.rid)
                if self.req_log is not None and job.rid in self.req_log:
                    self.req_log[job.rid]["load_done_step"] = job.due
            if self.log is not None:
                self._done_rec(job)

    def _watch(self, job: Job) -> None:
        """Watch for ``job``'s completion (its ``seen`` known)."""
        if job.seen >= 0:
            heapq.heappush(self.due, (job.seen, job.jid))

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

    def _unfence(self, jid: int, bids: list[int]) -> None:
        bj = self.block_jobs
        for bid in bids:
            s = bj[bid]
            s.discard(jid)
            if not s:
                del bj[bid]

    def _rec(self) -> dict:
        # a step's offload record: filled as things happen, kept if non-empty
        r = self._step_rec
        if r is None or r["step"] != self.now:
            r = self._step_rec = {"step": self.now}
        return r

    def _allocated_ids(self, scheduled: list[tuple[str, int, bool]]) -> set[int]:
        """Block ids allocated in this step as vLLM's connector counts them: the tables of
        the requests allocated in the waiting loop, the blocks handed out this step
        (running requests' new blocks, copy-on-write copies)."""
        kv = self.kv
        out: set[int] = set(kv.pool.popped or ())
        for rid in self.admitted:
            for t in kv.group_tables(rid):
                for b in t:
                    if not b.is_null:
                        out.add(b.block_id)
        for rid, _, fresh in scheduled:
            if fresh:
                for t in kv.group_tables(rid):
                    for b in t:
                        if not b.is_null:
                            out.add(b.block_id)
        out.discard(0)
        return out

    def build(self, scheduled: list[tuple[str, int, bool]]) -> None:
        """vLLM's ``build_connector_meta``: ``scheduled`` is this step's (request,
        tokens, from the waiting queue) in scheduling order."""
        kv = self.kv
        now = self.now
        allocated: set[int] | None = None
        # the scheduled requests' keys and (attention) block tables
        for rid, _, fresh in scheduled:
            srs = self.reqs[rid]
            if fresh:
                for gi in self.full:
                    srs.tables[gi] = kv.group_table(rid, gi)
            if not srs.swept:
                self._update_keys(srs)
        # flushes: preempted requests' jobs, jobs whose source blocks come back
        for rid in self.preempted_ids:
            rs = self.reqs.get(rid)
            if rs is None:
                continue
            self.flush_jobs.update(j for j in rs.jobs if not self._is_batch_load(j))
        if self.block_jobs:
            allocated = self._allocated_ids(scheduled)
            for bid in allocated:
                js = self.block_jobs.get(bid)
                if js:
                    self.flush_jobs.update(js)
        handoffs = kv.take_offload_handoffs()
        if handoffs:
            self._boundary_stores(handoffs)
            if self.partial:
                self._tail_stores(handoffs, {rid: n for rid, n, _ in scheduled})
        for rid, n, _ in scheduled:
            rs = self.reqs.get(rid)
            if rs is not None and not rs.swept:
                allocated = self._sweep(rs, rs.req.num_computed_tokens + n, allocated, scheduled)
        finished = self.finished_ids
        if len(finished) > 1:
            # vLLM walks the finished ids as a Python set (hash order, which varies from
            # process to process); here in the order they finished
            self.finish_ties.append((now, list(finished)))
            if self.finish_orders is not None and now in self.finish_orders:
                finished = [rid for rid in self.finish_orders[now] if rid in finished]
        for rid in finished:
            rs = self.reqs.get(rid)
            if rs is not None:
                req = rs.req
                after = req.num_tokens - 1
                if after < req.num_prompt_tokens:
                    after = req.num_prompt_tokens
                allocated = self._sweep(rs, after, allocated, scheduled)
        for rid in finished:
            rs = self.reqs.get(rid)
            if rs is None:
                continue
            rs.signaled = True
            self.pool.request_finished(rs.st)
            if not rs.jobs:
                del self.reqs[rid]
        self.finished_ids = []
        if self.flush_jobs:
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
        self.load_jobs = []
        self.flush_jobs = set()
        self.admitted = []
        self.preempted_ids = []
        kv.pool.popped = None

    def _is_batch_load(self, jid: int) -> bool:
        for j in self.load_jobs:
            if j.jid == jid:
                return True
        return False

    def _job_rec(self, job: Job) -> dict:
        return {"job": job.jid, "req": job.rid, "groups": job.groups or {}}

    def _store_job(self, rs: ReqOffload, keys: list[int], blocks: int,
                   groups: dict[str, Any] | None) -> Job:
        job = self._new_job(rs.req.request_id, keys, True)
        job.blocks = blocks
        job.groups = groups
        rs.jobs.add(job.jid)
        self.stored_chunks += len(keys)
        self.stored_blocks += blocks
        self.worker.store(job, blocks * self.block_bytes, self.now)
        self._watch(job)
        if self.log is not None:
            self._rec().setdefault("stores", []).append(self._job_rec(job))
        return job

    def _prepare_store(self, keys: list[int], rs: ReqOffload) -> tuple[list[int], list[int]] | None:
        out = self.pool.prepare_store(keys, rs.st)
        if out is not None and self.tail_keys:
            for key in out[1]:
                t = self.tail_keys.pop(key, -1)
                if t >= 0:
                    tp = self.tail_pos[key & GROUP_MASK]
                    if tp[t] == 1:
                        del tp[t]
                    else:
                        tp[t] -= 1
        if self.log is not None:
            if out is None:
                r = self._rec()
                r["alloc_fail"] = r.get("alloc_fail", 0) + 1
            elif out[1]:
                r = self._rec()
                r["evicted"] = r.get("evicted", 0) + len(out[1])
        return out

    def _boundary_stores(self, handoffs: dict[str, list[tuple[int, Any, int]]]) -> None:
        for rid, entries in handoffs.items():
            rs = self.reqs.get(rid)
            if rs is None:
                continue
            top = self._offloadable(rs, rs.req.num_tokens)
            for gid, block, boundary in entries:
                gc = self.groups[gid]
                if block.is_null or boundary > top or boundary % gc.tpc:
                    continue
                key = self._boundary_key(rs, gid, boundary)
                out = self._prepare_store([key], rs)
                if out is None or not out[0]:
                    continue
                groups = ({str(gid): {"chunks": 1, "blocks": 1,
                                      "start_block": boundary // gc.tpb - 1,
                                      "ends": [boundary]}} if self.log is not None else None)
                job = self._store_job(rs, [key], 1, groups)
                job.fenced = [block.block_id]
                self.block_jobs.setdefault(block.block_id, set()).add(job.jid)

    def _tail_stores(self, handoffs: dict[str, list[tuple[int, Any, int]]],
                     scheduled: dict[str, int]) -> None:
        B = self.pblock
        for rid, entries in handoffs.items():
            entries = [e for e in entries if e[2] % B]
            if not entries:
                continue
            rs = self.reqs[rid]
            if self.max_margin and not rs.loaded:
                continue
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
                after = req.num_computed_tokens + scheduled.get(rid, 0)
                if after > req.num_prompt_tokens:
                    after = req.num_prompt_tokens
                if boundary + self.max_margin > after:
                    continue
            cow = {gid: block for gid, block, _ in entries}
            idx = boundary // B
            if any(not gc.cow and idx >= len(rs.tables[gi])
                   for gi, gc in enumerate(self.groups)):
                continue
            keys = [self._boundary_key(rs, gc.gid, boundary + self.margins.get(gc.gid, 0))
                    for gc in self.groups]
            bids = [cow[gc.gid].block_id if gc.cow else rs.tables[gi][idx].block_id
                    for gi, gc in enumerate(self.groups)]
            out = self._prepare_store(keys, rs)
            if out is None or not out[0]:
                continue
            stored = set(out[0])
            src = [bids[i] for i, k in enumerate(keys) if k in stored]
            for gi, gc in enumerate(self.groups):
                k = keys[gi]
                t = boundary + self.margins.get(gc.gid, 0)
                if k in stored and t % gc.tpc:
                    self.tail_keys[k] = t
                    tp = self.tail_pos[gi]
                    tp[t] = tp.get(t, 0) + 1
            groups = None
            if self.log is not None:
                pos = rs.st.positions
                groups = {str(gc.gid): {"chunks": 1, "blocks": 1, "start_block": idx,
                                        "ends": [pos[k >> GROUP_BITS]]}
                          for gc, k in zip(self.groups, keys) if k in stored}
            job = self._store_job(rs, [k for k in keys if k in stored], len(src), groups)
            job.fenced = src
            for bid in src:
                self.block_jobs.setdefault(bid, set()).add(job.jid)

    def _storable(self, rs: ReqOffload, gi: int, offl: int) -> int:
        gc = self.groups[gi]
        n = offl // gc.tpc
        if gc.eagle and offl > rs.req.num_prompt_tokens and not rs.finished:
            n = n - 1 if n > 0 else 0
        a = len(rs.tables[gi]) // self.bpc
        if a < n:
            n = a
        k = len(rs.pk[gc.pki])
        return k if k < n else n

    def _advance(self, rs: ReqOffload, offl: int) -> None:
        for gi in range(len(self.groups)):
            n = self._storable(rs, gi, offl)
            if n > rs.next_stored[gi]:
                rs.next_stored[gi] = n

    def _check_swept(self, rs: ReqOffload) -> None:
        """Prompt chunks only (vLLM's default): once every attention group stored its last
        complete prompt chunk, the request's sweeps store nothing more (until a new lookup
        starts them again)."""
        if not self.prompt_only:
            return
        prompt = rs.req.num_prompt_tokens
        for gi in self.full:
            if rs.next_stored[gi] < prompt // self.groups[gi].tpc:
                return
        rs.swept = True

    def _sweep(self, rs: ReqOffload, after: int, allocated: set[int] | None,
               scheduled: list[tuple[str, int, bool]]) -> set[int] | None:
        """Store the request's complete prompt chunks not stored yet (vLLM's
        ``_build_store_jobs`` for one request); returns the allocated-ids set (built when
        first needed)."""
        if rs.swept:
            return allocated
        offl = self._offloadable(rs, after)
        bpc = self.bpc
        new_keys: list[int] = []
        ranges: list[tuple[int, int]] = []
        for gi, gc in enumerate(self.groups):
            n = self._storable(rs, gi, offl)
            start = rs.next_stored[gi]
            ranges.append((start, n))
            if gc.cow or n <= start:
                continue
            pks = rs.pk[gc.pki]
            gid = gc.gid
            tbl = rs.tables[gi]
            for c in range(start, n):
                first = c * bpc
                ok = True
                for b in range(bpc):
                    if tbl[first + b].is_null:
                        ok = False
                        break
                if ok:
                    new_keys.append((pks[c] << GROUP_BITS) | gid)
        if not new_keys:
            self._advance(rs, offl)
            self._check_swept(rs)
            return allocated
        out = self._prepare_store(new_keys, rs)
        if out is None:
            return allocated
        if not out[0]:
            self._advance(rs, offl)
            self._check_swept(rs)
            return allocated
        stored = set(out[0])
        src: list[int] = []
        groups: dict[str, Any] | None = {} if self.log is not None else None
        pos = rs.st.positions
        for gi, gc in enumerate(self.groups):
            start, n = ranges[gi]
            pks = rs.pk[gc.pki]
            gid = gc.gid
            tbl = rs.tables[gi]
            nb = 0
            first_blk = -1
            ends = []
            for c in range(start, n):
                if gc.cow or ((pks[c] << GROUP_BITS) | gid) not in stored:
                    continue
                ends.append(pos[pks[c]])
                for b in range(bpc):
                    bid = tbl[c * bpc + b].block_id
                    if bid == 0:
                        continue
                    if first_blk < 0:
                        first_blk = c * bpc + b
                    src.append(bid)
                    nb += 1
            if groups is not None and ends:
                groups[str(gc.gid)] = {"chunks": len(ends), "blocks": nb,
                                       "start_block": first_blk if first_blk >= 0 else 0,
                                       "ends": sorted(ends)}
            if n > rs.next_stored[gi]:
                rs.next_stored[gi] = n
        job = self._store_job(rs, list(out[0]), len(src), groups)
        job.deferred = src
        self._check_swept(rs)
        if rs.finished:
            if allocated is None:
                allocated = self._allocated_ids(scheduled)
            for bid in src:
                self.block_jobs.setdefault(bid, set()).add(job.jid)
                if bid in allocated:
                    self.flush_jobs.add(job.jid)
        return allocated
