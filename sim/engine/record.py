"""The per-request glue of ``sim run``: building each arriving request and
recording each finished one (compiled: both run once per request, and
interpreted closures cost several thousand CPU instructions each time).

``RequestMaker.make`` and ``Recorder.finish`` are what ``Engine`` calls as
``make_request`` and ``on_finish``, ``StepSampler.step`` once per step; ``sim run`` hands
the three objects over (``Engine.maker``, ``recorder``, ``sampler``) and the engine calls
them natively."""
from __future__ import annotations

from typing import Any, Callable, Final

from librt.strings import BytesWriter, write_i64_le
from librt.vecs import append, vec
from mypy_extensions import i64

from sim.cache.hashing import PrefixKeys
from sim.cache.kv_manager import KVCacheManager
from sim.cache.offload_pool import HostPool
from sim.cache.prompt import HashIdPrompt, Segment, StreamRegistry
from sim.engine.scheduler import ScheduledItem, Scheduler, SimRequest

NS: Final = 1e-9   # engine times are integer nanoseconds
MS_PER_NS: Final = 1e-6
MEMORY_ROWS: Final = 20_000   # memory.csv holds between half this and this many rows
ROW_FIELDS: Final = 6         # a memory row: start ns, attention, Mamba, in use, running, waiting
ITL_DENSE: Final = 1 << 18    # inter-token gaps below this many whole us: counted in a vec
KEEP_BATCH: Final = 4096      # Recorder: finished rows handed to ``keep`` at a time


def prompt_of(segments: Any) -> list[Segment] | HashIdPrompt:
    """The cache's form of a workload record's prompt (``TraceRequest.segments``): a
    list of segments as it is; a block-hash trace's plain id record
    (``workloads.base.HashIds``: ``ids``, ``n_in``, ``block``, ``tail_name``) as a
    ``HashIdPrompt``, whose keys are built straight from the ids."""
    if isinstance(segments, list):
        return segments
    return HashIdPrompt(segments.ids, segments.n_in, segments.block, segments.tail_name)


class RequestMaker:
    """Builds a ``SimRequest`` from a workload record (``workloads.base.TraceRequest``)."""

    def __init__(self, kv: KVCacheManager, streams: StreamRegistry):
        self.kv = kv
        self.streams = streams
        # the next request's prompt keys when a fleet's router already built them under
        # this manager's hash unit and lookahead (handed over once: the request owns them)
        self.next_keys: PrefixKeys | None = None

    def make(self, trace: Any, index: int) -> SimRequest:
        rid: str = trace.request_id
        keys = self.next_keys
        if keys is None:
            keys = self.streams.keys_of(prompt_of(trace.segments), self.kv.hasher)
        else:
            self.next_keys = None
        r = SimRequest(self.kv.make_request(rid, keys), trace.output_tokens, index)
        r.out_stream = self.streams.id(f"out/{rid}")
        r.priority = getattr(trace, "priority", 0)   # scheduler.policy priority (default 0)
        r.session = trace.session   # (for its row: the request carries it, no map by index)
        return r



def vec_bytes(d: vec[i64]) -> bytes:
    """The machine integers of ``d`` as little-endian int64 bytes."""
    w = BytesWriter()
    i: i64 = 0
    n: i64 = len(d)
    while i < n:
        write_i64_le(w, d[i])
        i += 1
    return w.getvalue()


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
        # (machine integers: read and written every step)
        self.stride: i64 = 1
        self.countdown: i64 = 1
        self.occupied_peak: i64 = 0
        self.in_use_peak: i64 = 0
        # (each request's last delivery and delivery count are its own fields,
        # ``SimRequest.last_delivery_ns`` / ``deliveries``: no map lookup per item)
        # gap in whole us -> count (``itl_hist``): gaps below ITL_DENSE us in a vec indexed
        # by the gap (grown as longer gaps come), longer ones in a dict
        self.itl_dense = vec[i64]()
        self.itl_sparse: dict[int, int] = {}
        self.itl_sum_ns = 0
        self.itl_count = 0
        # the CPU tier's host pool (sim/cache/offload_pool.py), when on: its chunks in use
        # at each memory row (a column of memory.csv)
        self.host: HostPool | None = None
        self.host_data = vec[i64]()

    @property
    def rows(self) -> list[tuple[int, int, int, int, int, int]]:
        """The memory rows kept so far, oldest first: (start ns, attention blocks held,
        Mamba blocks held, blocks in use, running, waiting)."""
        d = self.row_data
        return [(d[i], d[i + 1], d[i + 2], d[i + 3], d[i + 4], d[i + 5])
                for i in range(0, len(d), ROW_FIELDS)]

    def row_bytes(self) -> bytes:
        """``rows``' values as little-endian int64 bytes, row after row (what
        ``sim.rundir.memory.memory_fields`` reads, with numpy: no tuple and no int object a
        value)."""
        return vec_bytes(self.row_data)

    def itl_dense_bytes(self) -> bytes:
        """``itl_hist``'s counts of the gaps below ``ITL_DENSE`` us, indexed by the gap,
        as little-endian int64 bytes (``sim.rundir.summary.latency_fields`` reads them with numpy;
        the gaps from there on: ``itl_sparse``)."""
        return vec_bytes(self.itl_dense)

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
        if self.host is not None:
            h = self.host_data
            kept = vec[i64](capacity=len(h) // 2 + 1)
            i = 0
            while i < len(h):
                kept = append(kept, h[i])
                i += 2
            self.host_data = kept

    def step(self, items: list[ScheduledItem], start: i64, end: i64, k: i64,
             queued: i64 = -1) -> None:
        """A step (``k`` > 1: a jump of k) from ``start`` to ``end``: a memory row every
        ``stride`` steps and the inter-token gaps it delivers.  ``queued``: the requests
        waiting at its start, when told (a fleet's jump is told once its end is known)."""
        occ = self.occupancy
        got = self.kv.occupancy() if occ is None else occ()
        a: i64 = got[0]
        m: i64 = got[1]
        in_use: i64 = got[2]
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
            d = append(d, queued if queued >= 0 else len(sched.waiting) + len(sched.holding))
            self.row_data = d
            host = self.host
            if host is not None:
                used: i64 = host.used
                self.host_data = append(self.host_data, used)
            self.countdown = self.stride
            if len(d) >= MEMORY_ROWS * ROW_FIELDS:
                # keep rows 0, 2, 4, ... (MEMORY_ROWS is even: the row just taken goes, and
                # the next is due one old stride on, where the kept series continues)
                self._thin()
                self.stride *= 2
        total: i64 = 0
        count: i64 = 0
        run_gap: i64 = -1     # run-length of equal gaps: most requests of a step share one
        run_n: i64 = 0
        first_end: i64 = end
        q: i64 = 0
        r: i64 = 0
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


class RowBatch:
    """Finished requests' ``requests.csv`` fields column by column, in machine types: a
    vec of 64-bit integers per integer column, of doubles per float column (a blank
    "" is a 0 there and a 1 in the column's blank flags), a list per text column.
    ``RequestColumns.add_batch`` (``sim/rundir/request_table.py``) reads the vecs as buffers:
    no boxed number and no row tuple per request (a tuple of ~28 boxed values, then
    taken apart again column by column, was ~15 k CPU instructions a request).  The
    columns are ``sim.rundir.records.REQUEST_COLUMNS``' (``columns()``); ``slo_ok`` is blank
    (``sim/commands/run.py`` fills it), the miss attribution's columns blank for a request
    without attribution (``attributed`` 0)."""

    def __init__(self) -> None:
        self.n = 0
        self.index = vec[i64]()
        self.request_id: list[str] = []
        self.session: list[str] = []
        self.arrival_s = vec[float]()
        self.prompt_tokens = vec[i64]()
        self.hit_tokens = vec[i64]()
        self.attention_hit_tokens = vec[i64]()
        self.lost_tokens = vec[i64]()
        self.junction = vec[i64]()
        self.recomputed_tokens = vec[i64]()
        self.queue_s = vec[float]()
        self.ttft_s = vec[float]()
        self.e2e_s = vec[float]()
        self.output_tokens = vec[i64]()
        self.preemptions = vec[i64]()
        self.mamba_states_written = vec[i64]()
        self.tpot_ms = vec[float]()
        self.tpot_blank = vec[i64]()
        self.itl_ms = vec[float]()
        self.itl_blank = vec[i64]()
        self.output_chunks = vec[i64]()
        self.unattributed = vec[i64]()    # 1: no miss attribution (its columns blank)
        self.any_attributed = False
        self.compulsory_tokens = vec[i64]()
        self.capacity_tokens = vec[i64]()
        self.checkpoint_tokens = vec[i64]()
        self.speculative_tokens = vec[i64]()
        self.in_flight_tokens = vec[i64]()
        self.checkpoint_reason: list[str] = []
        self.capacity_evicted_by: list[str] = []

    def columns(self) -> list[tuple[str, str, object, object]]:
        """(column, kind, values, blanks) in ``REQUEST_COLUMNS`` order: kind "i" (a vec
        of i64) or "d" (of doubles), with their blank flags (a vec of 0/1; None: none
        blank); "t" (a list of str); "-": every value blank."""
        un: object = self.unattributed if self.any_attributed else None
        miss = "i" if self.any_attributed else "-"
        text = "t" if self.any_attributed else "-"
        return [("request_id", "t", self.request_id, None), ("session", "t", self.session, None),
                ("arrival_s", "d", self.arrival_s, None),
                ("prompt_tokens", "i", self.prompt_tokens, None),
                ("hit_tokens", "i", self.hit_tokens, None),
                ("attention_hit_tokens", "i", self.attention_hit_tokens, None),
                ("lost_tokens", "i", self.lost_tokens, None),
                ("junction", "i", self.junction, None),
                ("recomputed_tokens", "i", self.recomputed_tokens, None),
                ("queue_s", "d", self.queue_s, None), ("ttft_s", "d", self.ttft_s, None),
                ("e2e_s", "d", self.e2e_s, None),
                ("output_tokens", "i", self.output_tokens, None),
                ("preemptions", "i", self.preemptions, None),
                ("mamba_states_written", "i", self.mamba_states_written, None),
                ("rejected", "-", None, None),
                ("tpot_ms", "d", self.tpot_ms, self.tpot_blank),
                ("itl_ms", "d", self.itl_ms, self.itl_blank),
                ("output_chunks", "i", self.output_chunks, None),
                ("slo_ok", "-", None, None),
                ("compulsory_tokens", miss, self.compulsory_tokens, un),
                ("capacity_tokens", miss, self.capacity_tokens, un),
                ("checkpoint_tokens", miss, self.checkpoint_tokens, un),
                ("speculative_tokens", miss, self.speculative_tokens, un),
                ("in_flight_tokens", miss, self.in_flight_tokens, un),
                ("checkpoint_reason", text, self.checkpoint_reason, None),
                ("capacity_evicted_by", text, self.capacity_evicted_by, None)]


class TierFigures:
    """The CPU tier's per-request figures (``cpu_hit_tokens``, ``cpu_no_state_tokens``),
    taken by the recorder as each request finishes (only with the tier on): machine
    integers, with the request's arrival index."""

    def __init__(self) -> None:
        self.index = vec[i64]()
        self.cpu_hit = vec[i64]()
        self.no_state = vec[i64]()

    def add(self, r: SimRequest) -> None:
        self.index = append(self.index, r.index)
        self.cpu_hit = append(self.cpu_hit, r.cpu_hit_tokens)
        self.no_state = append(self.no_state, r.cpu_no_state_tokens)


class Recorder:
    """One ``requests.csv`` row per finished request: the arrival index first, then the
    columns of ``sim.rundir.records.RequestRecord`` in order up to ``output_chunks``
    (``slo_ok`` is left to ``sim/commands/run.py``, which knows the SLOs and makes the records
    once the replay is over), then, with miss attribution on, its classes
    (``sim/cache/attribution.py``; defaults "" otherwise).

    With ``keep_batch`` (``sim.rundir.request_table.RequestColumns.add_batch``) the rows are
    kept column by column in a ``RowBatch`` and handed over every ``KEEP_BATCH`` rows;
    without it each row is a plain tuple in ``rows``, handed to ``keep``
    (``RequestColumns.add``) as often.  A refused request's row is always a tuple
    (``rejected_rows``, given to ``keep``).  Either way a million tuples or a million
    boxed numbers never pile up here; ``flush()`` hands over the rest; without ``keep``
    the tuples stay in ``rows`` and ``rejected_rows``."""

    def __init__(self, maker: RequestMaker, sampler: StepSampler,
                 keep: Callable[[list[tuple]], None] | None = None,
                 keep_batch: Callable[[RowBatch], None] | None = None):
        self.maker = maker
        self.sampler = sampler
        self.keep = keep
        self.keep_batch = keep_batch
        self.batch = RowBatch()
        self.rows: list[tuple] = []
        self.rejected_rows: list[tuple] = []
        self.tier: TierFigures | None = None   # (the CPU tier's figures, when it is on)

    @property
    def pending(self) -> int:
        """Finished requests recorded and not handed over yet."""
        return len(self.rows) + self.batch.n

    def reject(self, r: SimRequest) -> None:
        """The row of a request refused on arrival: what it asked for, no measurements
        (empty fields), and why (the ``rejected`` column)."""
        session = r.session
        c = r.cache
        self.rejected_rows.append((r.index, c.request_id, session or "", float(r.arrival_ns) * NS,
                                   c.num_prompt_tokens) + ("",) * 11 + (r.rejected, "", "", ""))

    def finish(self, r: SimRequest) -> None:
        tier = self.tier
        if tier is not None:
            tier.add(r)
        if self.keep_batch is not None:
            self._add(r)
            return
        session = r.session
        c = r.cache
        ns = NS
        chunks = self.sampler.deliveries(r)
        decode_ns = r.finish_ns - r.first_token_ns     # first delivery to last
        tpot: float | str = float(decode_ns) * MS_PER_NS / float(r.num_output - 1) if r.num_output > 1 else ""
        itl: float | str = float(decode_ns) * MS_PER_NS / float(chunks - 1) if chunks > 1 else ""
        row: tuple[Any, ...] = (
            r.index, c.request_id, session or "", float(r.arrival_ns) * ns, c.num_prompt_tokens,
            r.hit_tokens, r.attention_hit_tokens, max(r.attention_hit_tokens - r.hit_tokens, 0),
            r.junction, r.recomputed_tokens, float(r.first_scheduled_ns - r.arrival_ns) * ns,
            float(r.first_token_ns - r.arrival_ns) * ns, float(r.finish_ns - r.arrival_ns) * ns,
            r.num_output, r.preemptions, r.mamba_states_written, "", tpot, itl, chunks)
        m = r.miss
        if m is not None:
            # slo_ok (sim/commands/run.py fills it), then the miss attribution's columns
            row = row + ("", m.compulsory, m.capacity, m.checkpoint, m.speculative,
                         m.in_flight, m.reason, m.evicted_by)
        self.rows.append(row)
        if len(self.rows) >= KEEP_BATCH and self.keep is not None:
            self.flush()

    def _add(self, r: SimRequest) -> None:
        """``finish``'s row, column by column (the same values as its tuple)."""
        b = self.batch
        session = r.session
        c = r.cache
        ns = NS
        chunks = self.sampler.deliveries(r)
        decode_ns = r.finish_ns - r.first_token_ns     # first delivery to last
        b.index = append(b.index, r.index)
        b.request_id.append(c.request_id)
        b.session.append(session or "")
        b.arrival_s = append(b.arrival_s, float(r.arrival_ns) * ns)
        b.prompt_tokens = append(b.prompt_tokens, c.num_prompt_tokens)
        b.hit_tokens = append(b.hit_tokens, r.hit_tokens)
        b.attention_hit_tokens = append(b.attention_hit_tokens, r.attention_hit_tokens)
        b.lost_tokens = append(b.lost_tokens, max(r.attention_hit_tokens - r.hit_tokens, 0))
        b.junction = append(b.junction, r.junction)
        b.recomputed_tokens = append(b.recomputed_tokens, r.recomputed_tokens)
        b.queue_s = append(b.queue_s, float(r.first_scheduled_ns - r.arrival_ns) * ns)
        b.ttft_s = append(b.ttft_s, float(r.first_token_ns - r.arrival_ns) * ns)
        b.e2e_s = append(b.e2e_s, float(r.finish_ns - r.arrival_ns) * ns)
        b.output_tokens = append(b.output_tokens, r.num_output)
        b.preemptions = append(b.preemptions, r.preemptions)
        b.mamba_states_written = append(b.mamba_states_written, r.mamba_states_written)
        if r.num_output > 1:
            b.tpot_ms = append(b.tpot_ms, float(decode_ns) * MS_PER_NS / float(r.num_output - 1))
            b.tpot_blank = append(b.tpot_blank, 0)
        else:
            b.tpot_ms = append(b.tpot_ms, 0.0)
            b.tpot_blank = append(b.tpot_blank, 1)
        if chunks > 1:
            b.itl_ms = append(b.itl_ms, float(decode_ns) * MS_PER_NS / float(chunks - 1))
            b.itl_blank = append(b.itl_blank, 0)
        else:
            b.itl_ms = append(b.itl_ms, 0.0)
            b.itl_blank = append(b.itl_blank, 1)
        b.output_chunks = append(b.output_chunks, chunks)
        m = r.miss
        if m is not None:
            b.any_attributed = True
            b.unattributed = append(b.unattributed, 0)
            b.compulsory_tokens = append(b.compulsory_tokens, m.compulsory)
            b.capacity_tokens = append(b.capacity_tokens, m.capacity)
            b.checkpoint_tokens = append(b.checkpoint_tokens, m.checkpoint)
            b.speculative_tokens = append(b.speculative_tokens, m.speculative)
            b.in_flight_tokens = append(b.in_flight_tokens, m.in_flight)
            b.checkpoint_reason.append(m.reason)
            b.capacity_evicted_by.append(m.evicted_by)
        else:
            b.unattributed = append(b.unattributed, 1)
            b.compulsory_tokens = append(b.compulsory_tokens, 0)
            b.capacity_tokens = append(b.capacity_tokens, 0)
            b.checkpoint_tokens = append(b.checkpoint_tokens, 0)
            b.speculative_tokens = append(b.speculative_tokens, 0)
            b.in_flight_tokens = append(b.in_flight_tokens, 0)
            b.checkpoint_reason.append("")
            b.capacity_evicted_by.append("")
        b.n += 1
        if b.n >= KEEP_BATCH:
            self.flush()

    def flush(self) -> None:
        """Hand the rows held so far to ``keep`` / ``keep_batch`` (nothing without)."""
        kb = self.keep_batch
        if kb is not None and self.batch.n:
            kb(self.batch)
            self.batch = RowBatch()
        keep = self.keep
        if keep is None:
            return
        if self.rows:
            keep(self.rows)
            self.rows = []
        if self.rejected_rows:
            keep(self.rejected_rows)
            self.rejected_rows = []
