"""The per-request glue of ``sim run``: building each arriving request and
recording each finished one (compiled: both run once per request, and
interpreted closures cost several thousand CPU instructions each time).

``RequestMaker.make`` and ``Recorder.finish`` are what ``Engine`` calls as
``make_request`` and ``on_finish``, ``StepSampler.step`` once per step; ``sim run`` hands
the three objects over (``Engine.maker``, ``recorder``, ``sampler``) and the engine calls
them natively."""
from __future__ import annotations

from typing import Any, Callable, Final

from librt.vecs import append, vec
from mypy_extensions import i64

from sim.cache.kv_manager import KVCacheManager
from sim.cache.prompt import StreamRegistry
from sim.engine.scheduler import ScheduledItem, Scheduler, SimRequest

NS: Final = 1e-9   # engine times are integer nanoseconds
MS_PER_NS: Final = 1e-6
MEMORY_ROWS: Final = 20_000   # memory.csv holds between half this and this many rows
ROW_FIELDS: Final = 6         # a memory row: start ns, attention, Mamba, in use, running, waiting
ITL_DENSE: Final = 1 << 18    # inter-token gaps below this many whole us: counted in a vec
KEEP_BATCH: Final = 4096      # Recorder: finished rows handed to ``keep`` at a time


class RequestMaker:
    """Builds a ``SimRequest`` from a workload record (``workloads.base.TraceRequest``)."""

    def __init__(self, kv: KVCacheManager, streams: StreamRegistry):
        self.kv = kv
        self.streams = streams

    def make(self, trace: Any, index: int) -> SimRequest:
        rid: str = trace.request_id
        keys = self.streams.keys_of(trace.segments, self.kv.hasher)
        r = SimRequest(self.kv.make_request(rid, keys), trace.output_tokens, index)
        r.out_stream = self.streams.id(f"out/{rid}")
        r.priority = getattr(trace, "priority", 0)   # scheduler.policy priority (default 0)
        r.session = trace.session   # (for its row: the request carries it, no map by index)
        return r



class StepSampler:
    """What the engine's steps show and no request row can: the pool's memory over time
    and every inter-token latency (ITL).  ``Engine`` calls ``step`` once per loop
    iteration, after the scheduler planned the step and before its outputs apply, with
    the step's start and end (ns) and how many identical decode steps it stands for
    (``k`` > 1: a decode jump).

    Memory: one row per step, ``(start ns, attention blocks held, Mamba blocks held,
    blocks in use, running, waiting)`` (held = in use or cached); past ``MEMORY_ROWS``
    rows every other row is dropped and the stride doubles, so a run of any length
    keeps a bounded, evenly thinned series (deterministic: it depends on the step count
    only).  The peaks (``occupied_peak``, ``in_use_peak``) see every step.

    ITL: a request that delivers tokens at a step's end adds the time since its previous
    delivery (a step with speculative decoding delivers several tokens at once, as one
    chunk of a streamed response: one ITL, as ``vllm bench serve`` counts).  The gaps are
    kept as a histogram of whole microseconds (``itl_hist``: bounded by the distinct
    values, not the token count) with their exact sum in ns.  Inside a decode jump the
    k steps are counted as ``(end - start) / k`` each (the first ``k - r`` steps the
    quotient, the last ``r`` one ns more: the jump's total is kept exactly)."""

    def __init__(self, sched: Scheduler,
                 occupancy: Callable[[], tuple[int, int, int]] | None = None):
        self.sched = sched
        # the pool's (attention occupied, Mamba occupied, in use) now: one a test sets by
        # hand, or (None) the cache manager's, called natively (a tuple of three ints is
        # no object then; through a callable it is one, boxed, every step)
        self.occupancy = occupancy
        self.kv = sched.kv
        # the memory rows, ROW_FIELDS machine integers each, one after the other (a tuple
        # of six boxed ints a step was most of what a step cost here); ``rows`` reads them
        self.row_data = vec[i64]()
        self.stride = 1
        self.countdown = 1
        self.occupied_peak = 0
        self.in_use_peak = 0
        # (each request's last delivery and delivery count are its own fields,
        # ``SimRequest.last_delivery_ns`` / ``deliveries``: no map lookup per item)
        # gap in whole us -> count (``itl_hist``): gaps below ITL_DENSE us in a vec indexed
        # by the gap (grown as longer gaps come), longer ones in a dict
        self.itl_dense = vec[i64]()
        self.itl_sparse: dict[int, int] = {}
        self.itl_sum_ns = 0
        self.itl_count = 0

    @property
    def rows(self) -> list[tuple[int, int, int, int, int, int]]:
        """The memory rows kept so far, oldest first: (start ns, attention blocks held,
        Mamba blocks held, blocks in use, running, waiting)."""
        d = self.row_data
        return [(d[i], d[i + 1], d[i + 2], d[i + 3], d[i + 4], d[i + 5])
                for i in range(0, len(d), ROW_FIELDS)]

    @property
    def itl_hist(self) -> dict[int, int]:
        """Inter-token gaps in whole microseconds -> how many (a new dict each read)."""
        d = self.itl_dense
        out: dict[int, int] = {}
        for us in range(len(d)):
            if d[us]:
                out[us] = d[us]
        out.update(self.itl_sparse)
        return out

    def _itl_add(self, us: i64, n: i64) -> None:
        """``n`` more gaps of ``us`` whole microseconds."""
        if us >= ITL_DENSE or us < 0:
            sp = self.itl_sparse
            sp[us] = sp.get(us, 0) + n
            return
        d = self.itl_dense
        if us >= len(d):
            size: i64 = 2 * len(d) if len(d) else 1024
            while size <= us:
                size *= 2
            if size > ITL_DENSE:
                size = ITL_DENSE
            grown = vec[i64]([0] * size)
            for i in range(len(d)):
                grown[i] = d[i]
            d = self.itl_dense = grown
        d[us] = d[us] + n

    def _thin(self) -> None:
        """Keep rows 0, 2, 4, ... (in place)."""
        d = self.row_data
        out = vec[i64](capacity=len(d) // 2 + ROW_FIELDS)
        i: i64 = 0
        while i < len(d):
            for j in range(ROW_FIELDS):
                out = append(out, d[i + j])
            i += 2 * ROW_FIELDS
        self.row_data = out

    def step(self, items: list[ScheduledItem], start: int, end: int, k: int) -> None:
        occ = self.occupancy
        if occ is None:
            a, m, in_use = self.kv.occupancy()
        else:
            a, m, in_use = occ()
        if a + m > self.occupied_peak:
            self.occupied_peak = a + m
        if in_use > self.in_use_peak:
            self.in_use_peak = in_use
        self.countdown -= 1
        if self.countdown <= 0:
            sched = self.sched
            d = self.row_data
            d = append(d, start)
            d = append(d, a)
            d = append(d, m)
            d = append(d, in_use)
            d = append(d, len(sched.running))
            d = append(d, len(sched.waiting))
            self.row_data = d
            self.countdown = self.stride
            if len(d) >= MEMORY_ROWS * ROW_FIELDS:
                # keep rows 0, 2, 4, ... (MEMORY_ROWS is even: the row just taken goes, and
                # the next is due one old stride on, where the kept series continues)
                self._thin()
                self.stride *= 2
        total = 0
        count = 0
        run_gap = -1          # run-length of equal gaps: most requests of a step share one
        run_n = 0
        first_end = end
        q = 0
        r = 0
        if k > 1:
            q = (end - start) // k
            r = (end - start) - q * k
            first_end = start + q
        for it in items:
            req = it.req
            if it.is_prefill:
                c = req.cache
                if c.num_computed_tokens + it.num_tokens < c.num_tokens:
                    continue          # a chunk that is not the prompt's last samples nothing
            last = req.last_delivery_ns
            req.last_delivery_ns = end
            req.deliveries += k
            if last < 0:
                continue                          # its first token
            g = first_end - last
            if g != run_gap:
                if run_n:
                    self._itl_add((run_gap + 500) // 1000, run_n)
                    total += run_gap * run_n
                    count += run_n
                run_gap = g
                run_n = 1
            else:
                run_n += 1
        if run_n:
            self._itl_add((run_gap + 500) // 1000, run_n)
            total += run_gap * run_n
            count += run_n
        if k > 1:
            n = len(items)      # a jump: every item decodes in each of its k steps
            plain = n * (k - 1 - r)
            if plain:
                self._itl_add((q + 500) // 1000, plain)
            if r:
                self._itl_add((q + 1 + 500) // 1000, n * r)
            total += n * (q * (k - 1) + r)
            count += n * (k - 1)
        self.itl_sum_ns += total
        self.itl_count += count

    @staticmethod
    def deliveries(r: SimRequest) -> int:
        """How many times ``r`` delivered tokens (its output chunks)."""
        return r.deliveries


class Recorder:
    """One ``requests.csv`` row per finished request: a plain tuple, the arrival index
    first, then the columns of ``sim.records.RequestRecord`` in order up to
    ``output_chunks`` (``slo_ok`` is left to ``sim/run.py``, which knows the SLOs and
    makes the records once the replay is over), then, with miss attribution on, its
    classes (``sim/cache/attribution.py``; defaults "" otherwise).

    With ``keep`` (``sim.request_table.RequestColumns.add``), every ``KEEP_BATCH`` rows
    are handed over and dropped here: a million tuples of boxed numbers would be most of
    a long run's memory, their columns a fraction of it.  ``flush()`` hands over the rest
    (refused requests' rows included); without ``keep`` the rows stay in ``rows`` and
    ``rejected_rows``."""

    def __init__(self, maker: RequestMaker, sampler: StepSampler,
                 keep: Callable[[list[tuple]], None] | None = None):
        self.maker = maker
        self.sampler = sampler
        self.keep = keep
        self.rows: list[tuple] = []
        self.rejected_rows: list[tuple] = []

    def reject(self, r: SimRequest) -> None:
        """The row of a request refused on arrival: what it asked for, no measurements
        (empty fields), and why (the ``rejected`` column)."""
        session = r.session
        c = r.cache
        self.rejected_rows.append((r.index, c.request_id, session or "", r.arrival_ns * NS,
                                   c.num_prompt_tokens) + ("",) * 11 + (r.rejected, "", "", ""))

    def finish(self, r: SimRequest) -> None:
        session = r.session
        c = r.cache
        ns = NS
        chunks = self.sampler.deliveries(r)
        decode_ns = r.finish_ns - r.first_token_ns     # first delivery to last
        tpot: float | str = decode_ns * MS_PER_NS / (r.num_output - 1) if r.num_output > 1 else ""
        itl: float | str = decode_ns * MS_PER_NS / (chunks - 1) if chunks > 1 else ""
        row: tuple[Any, ...] = (
            r.index, c.request_id, session or "", r.arrival_ns * ns, c.num_prompt_tokens,
            r.hit_tokens, r.attention_hit_tokens, max(r.attention_hit_tokens - r.hit_tokens, 0),
            r.junction, r.recomputed_tokens, (r.first_scheduled_ns - r.arrival_ns) * ns,
            (r.first_token_ns - r.arrival_ns) * ns, (r.finish_ns - r.arrival_ns) * ns,
            r.num_output, r.preemptions, r.mamba_states_written, "", tpot, itl, chunks)
        m = r.miss
        if m is not None:
            # slo_ok (sim/run.py fills it), then the miss attribution's columns
            row = row + ("", m.compulsory, m.capacity, m.checkpoint, m.speculative,
                         m.in_flight, m.reason, m.evicted_by)
        self.rows.append(row)
        if len(self.rows) >= KEEP_BATCH and self.keep is not None:
            self.flush()

    def flush(self) -> None:
        """Hand the rows held so far to ``keep`` (nothing without one)."""
        keep = self.keep
        if keep is None:
            return
        if self.rows:
            keep(self.rows)
            self.rows = []
        if self.rejected_rows:
            keep(self.rejected_rows)
            self.rejected_rows = []
