"""The CPU tier's per-request state, its transfer jobs and how long they take: the
records vLLM 0.33.0's ``OffloadingConnector`` scheduler side keeps
(``offloading/scheduler.py``: ``RequestOffloadState``, one transfer job per load or store
with its keys) and the completion timing of its worker (``offloading/worker.py``, or the
host links' bandwidth: ``HostLinks``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from librt.vecs import append, remove, vec
from mypy_extensions import i64

from sim.cache.offload_pool import AccessState

if TYPE_CHECKING:
    from sim.cache.block_pool import Block
    from sim.cache.request import CacheRequest


class GroupOffload:
    """One KV-cache group as the connector offloads it."""

    __slots__ = ("gid", "tpb", "tpc", "hpc", "window", "eagle", "cow", "pki", "margin")

    def __init__(self, gid: int, tpb: int, bpc: int, unit: int, mamba: bool, eagle: bool):
        # (machine integers: read in every sweep and lookup, divided and multiplied)
        self.gid: i64 = gid
        self.tpb: i64 = tpb              # tokens per GPU block
        self.tpc: i64 = tpb * bpc        # tokens per chunk
        self.hpc: i64 = self.tpc // unit # hash units per chunk
        self.window: int | None = 1 if mamba else None   # chunks a hit needs at its end
        self.eagle = eagle               # is_eagle_group: one trailing chunk is volatile
        self.cow = mamba                 # Mamba align: states come from the GPU hand-off
        self.pki: i64 = 0                # which of the request's prefix-key lists (by hpc)
        self.margin: i64 = 0             # tokens its partial-tail key lies past the tail


class Job:
    __slots__ = ("jid", "rid", "rs", "keys", "store", "fenced", "deferred", "chunks", "blocks",
                 "due", "seen", "nbytes", "groups")

    def __init__(self, jid: int, rs: ReqOffload, keys: vec[i64], store: bool):
        self.jid = jid
        self.rs = rs
        self.rid = rs.req.request_id
        self.keys = keys
        self.store = store
        self.fenced = vec[i64]()         # source blocks watched from the job's creation
        self.deferred = vec[i64]()       # ... watched once the request has finished
        self.chunks = len(keys)
        self.blocks = 0                  # GPU blocks moved
        self.due = -1                    # when it completes (the worker's unit)
        self.seen = -1                   # the engine time its completion is seen from
        self.nbytes = 0                  # bytes over one GPU's host link
        self.groups: dict[str, Any] | None = None   # per group, for step logs

    def reuse(self, jid: int, rs: ReqOffload, keys: vec[i64], store: bool) -> None:
        """This job, completed (nothing holds its id any more), as a new one."""
        self.jid = jid
        self.rs = rs
        self.rid = rs.req.request_id
        self.keys = keys
        self.store = store
        self.fenced = vec[i64]()
        self.deferred = vec[i64]()
        self.chunks = len(keys)
        self.blocks = 0
        self.due = -1
        self.seen = -1
        self.nbytes = 0
        self.groups = None


class JobTable:
    """The connector's jobs in flight by id.  Ids are handed out in order and jobs
    complete within their transfer time, so they sit in a list from the oldest id that
    may still be in flight (``base``): a lookup is an index, not a dict probe with a
    boxed key; the completed head is dropped as it grows."""

    def __init__(self) -> None:
        self.slots: list[Job | None] = []
        self.base: i64 = 0          # the id of slots[0]
        self.head: i64 = 0          # slots before it are all None
        self.n: i64 = 0             # jobs in flight

    def __len__(self) -> int:
        return self.n

    def add(self, job: Job) -> None:
        assert job.jid == self.base + len(self.slots), "job ids out of order"
        self.slots.append(job)
        self.n += 1

    def get(self, jid: i64) -> Job | None:
        i = jid - self.base
        if i < 0 or i >= len(self.slots):
            return None
        return self.slots[i]

    def remove(self, jid: i64) -> None:
        slots = self.slots
        i = jid - self.base
        assert 0 <= i < len(slots) and slots[i] is not None, "no such job in flight"
        slots[i] = None
        self.n -= 1
        if self.n == 0:
            self.base += len(slots)
            slots.clear()
            self.head = 0
            return
        h = self.head
        while slots[h] is None:
            h += 1
        self.head = h
        if h >= 64 and 2 * h >= len(slots):
            del slots[:h]
            self.base += h
            self.head = 0


# (a request's block table before the connector holds one: shared, never written)
NO_TABLE: Final[list[Block]] = []


class ReqOffload(AccessState):
    """One request's offload state (vLLM's ``RequestOffloadState``), and what it did to
    the host pool (``AccessState``: one object a request, not two)."""

    __slots__ = ("req", "pk", "pk0", "tables", "next_stored", "hit_end", "num_local",
                 "jobs", "tail", "loaded", "finished", "signaled", "loading", "swept",
                 "fresh", "step_tokens", "sched_step", "listed")

    def __init__(self, req: CacheRequest, ngroups: int, nlists: int, arc: bool = True):
        super().__init__(arc)
        self.req = req
        # the prefix keys of its chunks, one list per chunk size (a group's chunk key is
        # its prefix key with the group in the low bits: groups of one chunk size share
        # one): the first in ``pk0`` (a vec attribute, no box to make and open), any others
        # in ``pk`` at their index (``keys_of``, ``set_keys``)
        self.pk0 = vec[i64]()
        self.pk: list[vec[i64]] = [vec[i64]() for _ in range(nlists)]
        # its block table in each attention group as vLLM's connector holds it (from the
        # step it is scheduled after a lookup; the table itself: it only grows while the
        # request runs, and stays as it was once the request has finished)
        self.tables: list[list[Block]] = [NO_TABLE] * ngroups
        self.next_stored = vec[i64]([0] * ngroups)
        self.hit_end = vec[i64]([0] * ngroups)
        self.num_local = 0
        self.jobs = vec[i64]()           # its jobs in flight (ids; a request has a few)
        self.tail: int | None = None     # partial-tail boundary of the pending load
        self.loaded = False              # loaded from the tier at some admission
        self.finished = False
        self.signaled = False            # the manager saw its finish
        self.loading = False             # admitted, waiting for its load (scheduler side)
        self.swept = False               # every prompt chunk the sweep may store is behind it
        self.fresh = False               # allocated in this step's waiting loop
        self.step_tokens = 0             # tokens scheduled in this step (``build``)
        self.sched_step: i64 = -1        # the connector step it was last scheduled in
        self.listed = False              # among the scheduler's sweeping requests

    def reuse(self, req: CacheRequest, arc: bool) -> None:
        """This state, done with (``OffloadConnector._forget``), now ``req``'s: as new,
        its lists kept (no objects made and freed a request)."""
        self.reset(arc)
        self.req = req
        self.pk0 = vec[i64]()
        pk = self.pk
        for i in range(1, len(pk)):
            pk[i] = vec[i64]()
        tables = self.tables
        ns = self.next_stored
        he = self.hit_end
        for gi in range(len(tables)):
            tables[gi] = NO_TABLE
            ns[gi] = 0
            he[gi] = 0
        self.num_local = 0
        self.jobs = vec[i64]()
        self.tail = None
        self.loaded = False
        self.finished = False
        self.signaled = False
        self.loading = False
        self.swept = False
        self.fresh = False
        self.step_tokens = 0
        self.sched_step = -1
        self.listed = False

    def keys_of(self, li: i64) -> vec[i64]:
        """Its chunk keys of chunk-size list ``li``."""
        if li == 0:
            return self.pk0
        return self.pk[li]

    def set_keys(self, li: i64, keys: vec[i64]) -> None:
        if li == 0:
            self.pk0 = keys
        else:
            self.pk[li] = keys

    def add_job(self, jid: i64) -> None:
        self.jobs = append(self.jobs, jid)

    def drop_job(self, jid: i64) -> None:
        """Job ``jid`` is done (its id leaves ``jobs``; the order of the rest is kept)."""
        if jid in self.jobs:
            self.jobs = remove(self.jobs, jid)


class Transfers:
    """How long transfers take.  A job's ``seen`` is the earliest engine time at which the
    next ``schedule()`` sees it done (-1: not known yet)."""

    def __init__(self) -> None:
        self.steps = False       # (times in steps, the oracle's; else in engine ns)
        self.started: list[Job] = []

    def load(self, job: Job, nbytes: int, now: int) -> None:
        raise NotImplementedError

    def store(self, job: Job, nbytes: int, now: int) -> None:
        raise NotImplementedError

    def flush(self, job: Job, now: int) -> None:
        raise NotImplementedError

    def start_step(self, now: int) -> i64:
        """At a step's start: how many jobs' completion times became known; they are the
        first that many entries of ``started`` (until the next step's start)."""
        return 0

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


class HostLinks:
    """Each GPU's host link, one direction for loads (host -> GPU) and one for stores (GPU
    -> host), PCIe being full duplex; the KV offloading tier's transfers cross them in the
    order they are submitted, while the GPU computes (vLLM's offloading worker copies on
    its own streams: a step waits only for the stores it must flush).  Every GPU of a
    replica moves its own shard of a block at once, so one link's bytes are one GPU's.
    Times in ns."""

    def __init__(self, load_bytes_per_s: float, store_bytes_per_s: float):
        self.load_ns_per_byte = 1e9 / load_bytes_per_s
        self.store_ns_per_byte = 1e9 / store_bytes_per_s
        self.load_free: i64 = 0       # when the load direction is idle again
        self.store_free: i64 = 0

    def load(self, nbytes: i64, start: i64) -> i64:
        """A load of ``nbytes`` submitted at ``start``: when it is done."""
        if self.load_free > start:
            start = self.load_free
        end: i64 = start + int(float(nbytes) * self.load_ns_per_byte + 0.5)
        self.load_free = end
        return end

    def store(self, nbytes: i64, start: i64) -> i64:
        if self.store_free > start:
            start = self.store_free
        end: i64 = start + int(float(nbytes) * self.store_ns_per_byte + 0.5)
        self.store_free = end
        return end


class TimedTransfers(Transfers):
    """Jobs cross the host links at their bandwidth (``HostLinks``), as
    vLLM's offloading worker submits them: a load when its step starts, a store after the
    step's forward -- at the start of the next step (a flushed store at once, and the
    step's forward waits for it).  Times in engine ns; a job's completion is seen by the
    first ``schedule()`` at or after it (vLLM polls at each step's end)."""

    def __init__(self, load_bytes_per_s: float, store_bytes_per_s: float):
        super().__init__()
        self.links = HostLinks(load_bytes_per_s, store_bytes_per_s)
        # stores waiting for the next step: the first nq entries of a list kept (at a
        # step's start they are ``started``)
        self.queued: list[Job] = []
        self.nq: i64 = 0
        self.stall = 0                   # ns the step waits for flushed jobs

    def load(self, job: Job, nbytes: int, now: int) -> None:
        job.nbytes = nbytes
        job.due = job.seen = self.links.load(nbytes, now)

    def store(self, job: Job, nbytes: int, now: int) -> None:
        job.nbytes = nbytes
        # (submitted with the next step: seen unknown)
        q = self.queued
        n = self.nq
        if n < len(q):
            q[n] = job
        else:
            q.append(job)
        self.nq = n + 1

    def start_step(self, now: int) -> i64:
        self.stall = 0
        n = self.nq
        if n == 0:
            return 0
        q = self.queued
        links = self.links
        for j in range(n):
            job = q[j]
            job.due = job.seen = links.store(job.nbytes, now)
        self.started = q
        self.nq = 0
        return n

    def flush(self, job: Job, now: int) -> None:
        if job.seen < 0:
            q = self.queued
            n = self.nq
            k: i64 = 0
            while k < n and q[k] is not job:
                k += 1
            assert k < n, "a flushed store neither started nor queued"
            while k + 1 < n:
                q[k] = q[k + 1]
                k += 1
            self.nq = n - 1
            job.due = job.seen = self.links.store(job.nbytes, now)
        wait = job.due - now
        if wait > self.stall:
            self.stall = wait

    def stall_ns(self) -> int:
        return self.stall

    def waiting_to_start(self) -> bool:
        return self.nq > 0
