"""A continuous-batching scheduler shaped like vLLM v1's ``Scheduler.schedule``.

Each step: running requests first (in order), each gets its remaining tokens
(prefill chunk, or 1 + K speculative tokens in decode) capped by the long-
prefill threshold (ignored while only one request is in the system, as vLLM
does), the step token budget and the align-mode split; if blocks run out the
newest running request is preempted (recompute) until the allocation fits.
Then, unless someone was preempted, waiting requests in the order of the
scheduler policy (``sim/engine/request_queue.py``: arrival order under ``fcfs``): the
prefix lookup on first admission, the same caps and split, ``max_num_seqs``.  The
policy also names the preemption victim (``fcfs``: the newest running request).

The scheduler knows nothing about time; the engine calls ``schedule`` and
``update_from_output`` once per step.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Any, Final

from librt.vecs import append, vec
from mypy_extensions import i64

from backends.base import StepItem
from sim.cache.attribution import Miss, MissAttribution
from sim.cache.kv_manager import KVCacheManager
from sim.cache.offload import OffloadConnector
from sim.cache.request import CacheRequest
from sim.config.scheduler import SchedulerConfig
from sim.engine.request_queue import FCFSQueue, RequestQueue, make_queue

# why a request is refused on arrival (requests.csv ``rejected``)
EXCEEDS_MAX_MODEL_LEN: Final = "exceeds_max_model_len"   # prompt >= max_model_len
TOO_LONG_FOR_POOL: Final = "too_long_for_pool"           # the pool can never hold it


class SimRequest:
    """A request inside the engine: cache view plus serving progress.

    A plain class with slots (not a dataclass: a dataclass's generated
    ``__init__`` is interpreted Python even in the compiled build, several
    thousand CPU instructions per request with this many fields)."""

    __slots__ = ("cache", "max_tokens", "index", "arrival_ns", "num_output", "hit_tokens",
                 "attention_hit_tokens", "junction", "first_scheduled_ns", "first_token_ns",
                 "finish_ns", "preemptions", "recomputed_tokens", "mamba_states_written",
                 "chunk_ends", "chunk_end_steps", "first_prefill_done", "done_event",
                 "out_stream", "fast_n", "fast_until", "item", "has_drafts",
                 "is_prefill_chunk", "recording", "cache_mark", "cache_mark_end", "rejected",
                 "priority",
                 "arrival_step", "miss", "last_delivery_ns", "deliveries", "session",
                 "cpu_hit_tokens", "cpu_no_state_tokens", "loading")

    def __init__(self, cache: CacheRequest, max_tokens: int, index: int):
        # (integer fields are machine integers: no tagged-int checks in the compiled
        # scheduler's per-step arithmetic)
        self.cache = cache
        self.max_tokens: i64 = max_tokens
        self.index: i64 = index                 # arrival order (tie-break, output order)
        # engine clock (integer ns; one per step in `sim steps`), -1 until it happens
        self.arrival_ns: i64 = -1
        self.num_output: i64 = 0
        self.hit_tokens: i64 = -1               # prefix hit at first admission
        self.attention_hit_tokens: i64 = 0      # full attention alone
        self.junction: i64 = 0
        self.first_scheduled_ns: i64 = -1
        self.first_token_ns: i64 = -1
        self.finish_ns: i64 = -1
        self.preemptions: i64 = 0
        self.recomputed_tokens: i64 = 0
        self.mamba_states_written: i64 = 0
        # (machine integers: an int object and a list slot a chunk end otherwise)
        self.chunk_ends = vec[i64]()
        self.chunk_end_steps = vec[i64]()   # step index of each chunk end
        self.first_prefill_done = False
        self.done_event: Any = None        # the engine's turn record until it finishes
        self.out_stream: i64 = 0                # stream id of this request's output tokens
        self.fast_n: i64 = -1                   # decode fast path: tokens per step at the last allocation
        self.fast_until: i64 = -1               # ... and the computed count up to which it stays valid
        self.item: ScheduledItem | None = None   # reused per step (scheduled once per step)
        self.has_drafts = False            # drafter proposed K tokens after its last sampling step
        self.is_prefill_chunk = False      # its last scheduled step left prompt tokens uncomputed
        self.recording = True              # first prefill's chunk ends (stops at a preemption)
        # the block of min(computed, hashed) at the last update-time cache_blocks, as its
        # token range [cache_mark, cache_mark_end) (later calls before the next block
        # completes are no-ops and are skipped; a comparison, not a division, a step)
        self.cache_mark: i64 = -1
        self.cache_mark_end: i64 = -1
        self.rejected = ""                 # why it was refused on arrival (a reason token), or ""
        self.priority: i64 = 0                  # scheduler.policy priority: lower goes first
        self.arrival_step: i64 = 0              # scheduler step at arrival (lpm's starvation bound)
        self.miss: Miss | None = None      # why its first admission missed (attribution on)
        # the step sampler's (sim/engine/record.py): end of the step that last delivered
        # tokens (-1: none yet) and how many deliveries so far (inter-token latencies)
        self.last_delivery_ns: i64 = -1
        self.deliveries: i64 = 0
        self.session: str | None = None    # the workload record's session (requests.csv)
        # the CPU tier (kv_offloading): tokens its first admission loaded from the host
        # pool, and whether it waits for a load now (vLLM's WAITING_FOR_REMOTE_KVS)
        self.cpu_hit_tokens: i64 = 0
        self.cpu_no_state_tokens: i64 = 0     # held in attention groups past the hit
        self.loading = False

    def __repr__(self) -> str:
        return (f"SimRequest({self.cache.request_id!r}, index={self.index}, "
                f"output={self.num_output}/{self.max_tokens})")

    @property
    def rid(self) -> str:
        return self.cache.request_id

    @property
    def num_computed(self) -> int:
        return self.cache.num_computed_tokens

    @property
    def decoding(self) -> bool:
        """Prompt (and any replayed outputs) computed: each step samples."""
        return self.num_output > 0 and self.cache.num_computed_tokens >= self.cache.num_tokens - 1


class ScheduledItem(StepItem):
    """One request's share of a step (the object is reused step after step): the step
    plan's item, which the engine hands to the backend, plus the scheduler's own handle
    on the request (no backend reads it)."""

    __slots__ = ("req",)

    def __init__(self, req: SimRequest, num_tokens: int, context: int, is_prefill: bool,
                 spec_tokens: int = 0, new_hit: int = 0, padded: bool = False):
        super().__init__(req.cache, req.out_stream, num_tokens, context, is_prefill,
                         spec_tokens, new_hit, padded)
        self.req = req


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, kv: KVCacheManager, accepted_per_step: float = 0.0,
                 fast_decode: bool = True, eagle_family: bool = True,
                 reject_unservable: bool = False):
        self.cfg = cfg
        # the config's fields as typed attributes of this (compiled) class: read every step
        self.max_num_batched_tokens: i64 = cfg.max_num_batched_tokens
        self.max_num_seqs: i64 = cfg.max_num_seqs
        self.long_prefill_token_threshold: i64 = cfg.long_prefill_token_threshold
        self.num_speculative_tokens: i64 = cfg.num_speculative_tokens
        self.kv = kv
        self.split = kv.split_policy()
        self.aligned = kv.needs_aligned_split
        # Drafts accepted per decode step follow one deterministic global
        # pattern: step s accepts P(s + 1) - P(s) with P(s) = floor(s x mean),
        # in exact integers (as the step oracle scripts ``accepted_tokens``).
        frac = Fraction(accepted_per_step).limit_denominator(1000)
        if frac > self.num_speculative_tokens:
            raise ValueError("mean accepted tokens exceed num_speculative_tokens")
        self.acc_num, self.acc_den = frac.numerator, frac.denominator
        self.step_index = 0
        self.publish_time: i64 = 0      # when the latest KV events were published (ns)
        self.accept_list: list[int] | None = None   # per-step acceptance (step cases)
        self.step_accepted = 0   # drafts a decode item accepts in the step being scheduled
        # ``sim steps --per-step`` (and the step tester): each step's decisions as
        # sched_oracle.py reports them, when a list is set here (None: nothing recorded)
        self.step_log: list[dict[str, Any]] | None = None
        self.sched_time = 0
        # drafter slots allocated past the scheduled tokens (vLLM's num_lookahead_tokens:
        # K for EAGLE-family and draft-model drafters, 0 for n-gram)
        self.num_lookahead = self.num_speculative_tokens if eagle_family else 0
        # the fast path reasons about block boundaries only; a sliding window also
        # frees blocks as it slides, so step those exactly
        self.group_kinds = kv.group_kinds
        self.has_swa = "swa" in self.group_kinds
        self.fast_decode = fast_decode and not self.has_swa
        self.has_full = "full" in self.group_kinds
        # smallest group block: allocation only changes when a position crosses one
        self.min_block = kv.min_block_size
        self.running: list[SimRequest] = []
        # the waiting queue is the scheduler policy (order, return after preemption, victim)
        self.waiting: RequestQueue = make_queue(cfg)
        # (the class, read off the instance: a module global is a dict lookup a read)
        self._fcfs_type: type = FCFSQueue
        self.reorders: bool = self.waiting.reorders
        self.preemptions = 0
        self.max_model_len = cfg.max_model_len
        # sim run: refuse on arrival a request the pool can never hold (vLLM refuses a
        # max_model_len the pool cannot hold at start-up, and its API a request longer
        # than max_model_len); step cases keep it waiting, as vLLM's scheduler would (the
        # engine's progress guard then stops the replay)
        self.reject_unservable = reject_unservable
        self.usable_blocks = kv.usable_blocks   # (block 0 is the null block)
        # miss attribution (sim/cache/attribution.py): None = off
        self.attribution: MissAttribution | None = None
        # the CPU tier's connector (sim/cache/offload.py; None: no tier).  With one, the
        # requests that hold blocks while waiting (an async load, or one done and not yet
        # scheduled) wait in ``holding``, drained before ``waiting``; ``inflight`` are the
        # requests admitted with prompt left to compute (an async load's reservation)
        self.connector: OffloadConnector | None = None
        self.holding: RequestQueue = make_queue(cfg)
        self.inflight: dict[str, SimRequest] = {}
        self.spec_step_blocks: i64 = 0
        self.fresh: list[str] = []
        # what schedule() and update_from_output() return: one list each, refilled every
        # step (a new list a step was an allocation, its growth and its free; every
        # caller reads them before the next step).  schedule() overwrites ``out`` in
        # place, its first ``n_out`` entries being this step's so far, and cuts the
        # rest at its end: list.clear() would free the list's storage, and the step's
        # appends would grow it again, reallocating several times a step.
        self.out: list[ScheduledItem] = []
        self.n_out: i64 = 0
        self.done: list[SimRequest] = []

    # ----------------------------------------------------------------- helpers --
    def add(self, req: SimRequest) -> bool:
        """Queue an arriving request; False (``req.rejected`` says why) when vLLM's input
        checks reject it (a prompt of ``max_model_len`` tokens or more: no room for one
        output token) or, with ``reject_unservable``, when the pool can never hold it."""
        mml = self.max_model_len
        if mml is not None:
            prompt = req.cache.num_prompt_tokens
            if prompt >= mml:
                req.rejected = EXCEEDS_MAX_MODEL_LEN
                return False
            # generation stops once prompt + outputs reach max_model_len (check_stop)
            if req.max_tokens > mml - prompt:
                req.max_tokens = mml - prompt
        if self.reject_unservable and self.blocks_needed(req) > self.usable_blocks:
            req.rejected = TOO_LONG_FOR_POOL
            return False
        req.arrival_step = self.step_index
        self.waiting.add_request(req)
        if self.connector is not None:
            self.connector.add_request(req.cache)
        return True

    def longest_slots(self, req: SimRequest) -> int:
        """The most slots ``req`` can ask for: at its last step (prompt + outputs - 1
        tokens, K drafts to verify, the drafter's lookahead slots past them), or the
        prompt plus lookahead when it samples one token only; capped at max_model_len."""
        n = req.cache.num_prompt_tokens + self.num_lookahead
        if req.max_tokens > 1:
            n += req.max_tokens - 1 + self.num_speculative_tokens
        mml = self.max_model_len
        return n if mml is None or n < mml else mml

    def blocks_needed(self, req: SimRequest) -> int:
        """Pool blocks ``req`` holds at most if it runs alone (an upper bound: vLLM's
        per-request accounting at its longest sequence, ``blocks_per_request``)."""
        return self.kv.blocks_per_request(self.longest_slots(req))

    def admission_blocks(self, req: SimRequest) -> int:
        """Blocks the admission gate asks for ``req`` now without a prefix hit: its whole
        sequence so far (what a waiting request is refused on)."""
        return self.kv.admission_blocks(req.cache)

    def has_work(self) -> bool:
        if self.connector is not None:
            return bool(self.running or self.waiting or self.holding
                        or self.connector.busy())
        return bool(self.running or self.waiting)

    def transfers_pending(self) -> bool:
        """Whether the CPU tier has transfers in flight (the replay progresses when they
        complete, though nothing is scheduled meanwhile)."""
        return self.connector is not None and bool(self.connector.jobs)

    def quiet(self) -> bool:
        """Nothing but the running requests (a decode jump may run)."""
        if self.waiting:
            return False
        if self.connector is not None:
            return not self.holding and self.connector.quiet(self.running)
        return True

    def attach_connector(self, connector: OffloadConnector) -> None:
        """Serve with the CPU tier's connector (``sim/cache/offload.py``)."""
        self.connector = connector
        K = self.num_speculative_tokens
        n = 1 + K + self.num_lookahead if K else 0
        blocks = 0
        if n:
            for kind, bs in zip(self.group_kinds, self.kv.group_block_sizes):
                if kind != "mamba":
                    blocks += -(-n // bs)
        self.spec_step_blocks = blocks

    def _split(self, r: SimRequest, num_new: int, new_local: int, lpt: int) -> int:
        c = r.cache
        return self.split.split(c.num_prompt_tokens, c.num_tokens, c.num_computed_tokens,
                                c.shared_prefix_boundary, num_new, new_local,
                                self.max_num_batched_tokens, lpt)

    # ---------------------------------------------------------------- schedule --
    def schedule(self, now: int) -> list[ScheduledItem]:
        """This step's items, in scheduling order: the scheduler's own list (``out``),
        refilled by the next call."""
        self.sched_time = now
        attr = self.attribution
        evl = self.kv.eviction_log
        if evl is not None:
            evl.now_ns = now   # (the time of the evictions this step's allocations make)
        # the step's draft acceptance, decided once: update_from_output applies it and the
        # engine hands it to the backend in the step plan
        al = self.accept_list
        self.step_accepted = (al[min(now, len(al) - 1)] if al is not None
                              else self.accepted_at(self.step_index))
        kv = self.kv
        conn = self.connector
        if conn is not None:
            conn.start_step(now)
        kv.new_step_starts()
        budget = self.max_num_batched_tokens
        K = self.num_speculative_tokens
        # (machine integers throughout: a conditional expression of an i64 and a literal
        # would box its value in the compiled build)
        lpt: i64 = 0
        if len(self.running) + len(self.waiting) + len(self.holding) > 1:
            lpt = self.long_prefill_token_threshold
        out = self.out
        self.n_out = 0
        preempted = False
        i = 0
        running = self.running
        aligned = self.aligned
        fast = self.fast_decode
        prefill_scheduled = False
        mml = self.max_model_len
        while i < len(running) and budget > 0:
            r = running[i]
            c = r.cache
            comp = c.num_computed_tokens
            decode = r.num_output > 0 and comp >= c.num_tokens - 1
            sk: i64 = 0
            if decode:
                nt = c.num_tokens
                n = nt - comp
                if r.has_drafts:
                    n += K
                if 0 < lpt < n:
                    n = lpt
                if n > budget:
                    n = budget
                if mml is not None and n > mml - comp - 1:
                    n = mml - comp - 1   # positions stay below max_model_len
                # drafts scheduled: what the caps left of them after the tokens to verify
                sk = comp + n - nt
                if sk < 0:
                    sk = 0
                # (the align split never cuts a decode step: it starts past the prompt)
                if fast and n == r.fast_n and comp <= r.fast_until:
                    # positions stay inside the blocks of the last allocation:
                    # allocate_slots would allocate, free and cache nothing
                    prefill_scheduled |= r.is_prefill_chunk
                    it = r.item
                    if it is None:
                        self._emit(out, r, n, comp, False, sk)
                    else:   # (_emit, inline: the step most requests of a batch take)
                        it.num_tokens = n
                        it.context = comp
                        it.is_prefill = False
                        it.spec_tokens = sk
                        it.new_hit = 0
                        it.padded = False
                        k_out = self.n_out    # (_put, inline too)
                        if k_out < len(out):
                            out[k_out] = it
                        else:
                            out.append(it)
                        self.n_out = k_out + 1
                        r.is_prefill_chunk = comp + n < nt
                    budget -= n
                    i += 1
                    continue
            else:
                n = c.num_tokens - comp
                if 0 < lpt < n:
                    n = lpt
                if n > budget:
                    n = budget
                if mml is not None and n > mml - comp - 1:
                    n = mml - comp - 1
                if aligned:
                    n = self._split(r, n, 0, lpt)
            if n <= 0:
                i += 1
                continue
            while True:
                ok = kv.allocate_slots(c, n, num_lookahead_tokens=self.num_lookahead)
                if ok:
                    if decode and fast:
                        r.fast_n = n
                        r.fast_until = comp + self.alloc_margin(c, comp, n)
                    else:
                        r.fast_n = -1
                    break
                # the policy's victim (fcfs: the newest, running[-1]); one scheduled
                # earlier in this step gives its tokens back to the budget (priority)
                v = self.waiting.victim(running)
                victim = running[v]
                del running[v]
                if v < i:
                    i -= 1
                budget += self._preempt(victim, out)
                preempted = True
                if victim is r:
                    break
            if not ok:
                # r preempted itself; those after it may still fit (under fcfs there
                # are none: r was the newest)
                continue
            prefill_scheduled |= r.is_prefill_chunk
            self._emit(out, r, n, comp, not decode, sk)
            budget -= n
            i += 1
        num_running_scheduled = self.n_out   # (vLLM's scheduled_running_reqs: padding reads it)
        if conn is not None:
            if not preempted:
                budget = self._admit_with_tier(now, budget, out, num_running_scheduled,
                                               prefill_scheduled)
        elif not preempted:
            if (self.reorders and budget > 0 and len(self.waiting) > 1
                    and len(running) < self.max_num_seqs):
                self.waiting.order(kv, self.step_index)
            while budget > 0 and self.waiting:
                if len(self.running) >= self.max_num_seqs:
                    break
                # (through the policy's peek_request, not ``[0]``: ``sim explain`` watches
                # this call to read the pool as the admission lookup sees it; the plain
                # FCFS queue's is its first element, read directly: its peek_request is
                # an interpreted method, ~450 CPU instructions more a call)
                # (the test on a copy: mypy narrows what it tests, and a narrowed deque
                # reads Any, which would box the arithmetic below)
                w = self.waiting
                r = self.waiting[0] if type(w) is self._fcfs_type else self.waiting.peek_request()
                c = r.cache
                lookup = None
                new_local = 0
                attn_alone = 0
                if c.num_computed_tokens == 0:
                    lookup = kv.get_computed_blocks(c)
                    c.shared_prefix_boundary = lookup.junction
                    new_local = lookup.hit
                computed = c.num_computed_tokens + new_local
                n = c.num_tokens - computed
                padded = False
                if (K > 0 and n == 1 and not prefill_scheduled
                        and (num_running_scheduled > 0 or computed > 0)
                        and (mml is None or computed + 1 + K + 1 <= mml)):
                    # vLLM pads a new request with one token left to 1 + K (drafts
                    # that are never accepted) to keep the decode batch uniform,
                    # and would rather not schedule it than schedule it unpadded
                    if 1 + K > budget:
                        break
                    n = 1 + K
                    padded = True
                if 0 < lpt < n:
                    n = lpt
                if budget < n:
                    n = budget
                if self.aligned and not padded:
                    n = self._split(r, n, new_local, lpt)
                    if n == 0:
                        break
                if lookup is not None and r.hit_tokens < 0:
                    # (the cache is as the lookup saw it: nothing changed since, so
                    # the lookup's own first pass answers when it could tell)
                    attn_alone = (lookup.full_alone if lookup.full_alone >= 0
                                  else self._attention_alone(c))
                    if attr is not None:
                        r.miss = attr.classify(c, lookup)
                ok = kv.allocate_slots(c, n, new_local,
                                       lookup.blocks if lookup is not None and lookup.hit else None,
                                       num_lookahead_tokens=self.num_lookahead,
                                       full_sequence_must_fit=True)
                if not ok:
                    break
                self.waiting.pop_request()
                self.running.append(r)
                if r.hit_tokens < 0:
                    r.hit_tokens = new_local
                    r.junction = lookup.junction if lookup else 0
                    r.attention_hit_tokens = attn_alone
                    r.first_scheduled_ns = now
                    if attr is not None:
                        attr.admit(c, new_local + n)   # (what this step schedules)
                c.num_computed_tokens += new_local
                kp: i64 = 0
                if padded:
                    kp = K
                self._emit(out, r, n, c.num_computed_tokens, not padded, kp,
                           new_local, padded)
                budget -= n
        while len(out) > self.n_out:
            out.pop()   # (the entries of an earlier step past this one's: no slice object)
        # vLLM frees the refs retained for copy-on-write at the end of schedule()
        kv.release_cow_copies()
        if conn is not None:
            self._connector_step(out)
        if self.step_log is not None and out:
            self._log_step(now, out)
        return out

    # -------------------------------------------------------------- the CPU tier --
    def _admit_with_tier(self, now: int, budget: i64, out: list[ScheduledItem],
                         num_running_scheduled: i64, prefill_scheduled: bool) -> i64:
        """The waiting loop with a KV connector (vLLM 0.33.0's ``Scheduler.schedule``):
        requests holding blocks first; a request the connector cannot answer for yet, or
        still loading, is set aside for this step (the others may still be admitted); an
        admission that loads from the tier allocates its blocks and waits, scheduling
        nothing, until the load is done."""
        conn = self.connector
        assert conn is not None
        kv = self.kv
        attr = self.attribution
        K = self.num_speculative_tokens
        mml = self.max_model_len
        sbs: i64 = kv.scheduler_block_size
        held: list[SimRequest] = []
        passed: list[SimRequest] = []
        fresh = self.fresh
        fresh.clear()
        while budget > 0:
            queue = self.holding if self.holding else self.waiting
            if not queue:
                break
            if len(self.running) >= self.max_num_seqs:
                break
            r = queue.peek_request()
            c = r.cache
            rid = c.request_id
            if r.loading:
                if not conn.load_done(rid):
                    queue.pop_request()
                    held.append(r)
                    continue
                # the load is done: its blocks enter the GPU prefix cache
                kv.cache_blocks(c, c.num_computed_tokens)
                if c.num_computed_tokens == c.num_tokens:
                    c.num_computed_tokens = c.num_tokens - 1
                conn.promoted(rid)
                r.loading = False
            looked_up = c.num_computed_tokens == 0
            lookup = None
            new_local: i64 = 0
            ext: i64 = 0
            hit_blocks = None
            if looked_up:
                lookup = kv.get_computed_blocks(c)
                c.shared_prefix_boundary = lookup.junction
                new_local = lookup.hit
                partial = new_local % sbs
                got = conn.get_num_new_matched_tokens(c, new_local - partial)
                if got is None:
                    queue.pop_request()
                    passed.append(r)
                    continue
                if lookup.hit:
                    hit_blocks = lookup.blocks
                if partial and got > partial:
                    # a longer load from the tier replaces the GPU hit's partial block
                    new_local -= partial
                    hit_blocks = kv.truncate_hit(lookup.blocks, new_local)
                    ext = got
                elif not partial:
                    ext = got
            is_async = ext > 0
            computed = c.num_computed_tokens + new_local + ext
            n: i64 = 0
            padded = False
            if not is_async:
                n = c.num_tokens - computed
                if (K > 0 and n == 1 and not prefill_scheduled
                        and (num_running_scheduled > 0 or computed > 0)
                        and (mml is None or computed + 1 + K + 1 <= mml)):
                    if 1 + K > budget:
                        break
                    n = 1 + K
                    padded = True
                lpt: i64 = 0
                if len(self.running) + len(self.waiting) + len(self.holding) > 1:
                    lpt = self.long_prefill_token_threshold
                if 0 < lpt < n:
                    n = lpt
                if budget < n:
                    n = budget
                if self.aligned and not padded:
                    n = self._split(r, n, new_local + ext, lpt)
                    if n == 0:
                        break
            attn_alone = 0
            if lookup is not None and r.hit_tokens < 0:
                attn_alone = (lookup.full_alone if lookup.full_alone >= 0
                              else self._attention_alone(c))
                if attr is not None:
                    r.miss = attr.classify(c, lookup)
            reserved: i64 = 0
            lookahead = self.num_lookahead
            if is_async:
                reserved = self._inflight_reserved() + self.spec_step_blocks
                lookahead = 0
            ok = kv.allocate_slots(c, n, new_local, hit_blocks, num_lookahead_tokens=lookahead,
                                   full_sequence_must_fit=True, num_external=ext,
                                   delay_cache=is_async, reserved=reserved)
            if not ok:
                break
            conn.update_state_after_alloc(c, ext, looked_up, new_local)
            if looked_up and r.hit_tokens < 0:
                r.hit_tokens = new_local
                r.cpu_hit_tokens = ext
                reach = conn.attention_reach(c, c.num_computed_tokens + new_local - new_local % sbs)
                if reach > new_local + ext:
                    r.cpu_no_state_tokens = reach - new_local - ext
                r.junction = lookup.junction if lookup is not None else 0
                r.attention_hit_tokens = attn_alone
                if attr is not None:
                    attr.admit(c, computed + n)
            if is_async:
                r.loading = True
                c.num_computed_tokens = computed
                self.inflight[rid] = r
                queue.pop_request()
                held.append(r)
                continue
            queue.pop_request()
            self.running.append(r)
            if r.first_scheduled_ns < 0:
                r.first_scheduled_ns = now
            c.num_computed_tokens = computed
            if computed + n < c.num_tokens:
                self.inflight[rid] = r
            kp: i64 = 0
            if padded:
                kp = K
            self._emit(out, r, n, computed, not padded, kp, new_local, padded)
            fresh.append(rid)
            budget -= n
        for k in range(len(held) - 1, -1, -1):
            self.holding.prepend_request(held[k])
        for k in range(len(passed) - 1, -1, -1):
            self.waiting.prepend_request(passed[k])
        return budget

    def _inflight_reserved(self) -> i64:
        """Blocks the admitted prefills still need to hold their whole sequence (vLLM's
        ``_inflight_prefill_reserved_blocks``)."""
        kv = self.kv
        K = self.num_speculative_tokens
        mml = self.max_model_len
        extra: i64 = 0
        if K:
            extra = 1 + K + self.num_lookahead
        total: i64 = 0
        for r in self.inflight.values():
            c = r.cache
            full = c.num_tokens
            if mml is not None and full > mml:
                full = mml
            end = c.num_tokens - 1
            if end < c.num_prompt_tokens:
                end = c.num_prompt_tokens
            total += kv.remaining_blocks(c, full + extra, full, end)
        return total

    def _connector_step(self, out: list[ScheduledItem]) -> None:
        """After the step is scheduled: the connector's part of it (stores, flushes, the
        finished requests' recency), then the requests done prefilling leave the set of
        in-flight prefills."""
        conn = self.connector
        assert conn is not None
        fresh = self.fresh
        sched: list[tuple[str, int, bool]] = []
        if fresh:
            for it in out:
                rid = it.req.cache.request_id
                sched.append((rid, it.num_tokens, rid in fresh))
        else:             # (most steps admit nothing)
            for it in out:
                sched.append((it.req.cache.request_id, it.num_tokens, False))
        conn.build(sched)
        fresh.clear()
        if self.inflight:
            for it in out:
                if not it.req.is_prefill_chunk:
                    rid = it.req.cache.request_id
                    if rid in self.inflight:
                        del self.inflight[rid]

    def _log_step(self, now: int, out: list[ScheduledItem]) -> None:
        """Tokens scheduled per request (drafts included), their total, and the drafts
        scheduled per request (a request without drafts left out, as vLLM leaves it out of
        ``scheduled_spec_decode_tokens``)."""
        log = self.step_log
        assert log is not None
        log.append({"step": now,
                    "scheduled": {it.req.rid: it.num_tokens for it in out},
                    "num_scheduled_tokens": sum(it.num_tokens for it in out),
                    "spec_tokens": {it.req.rid: it.spec_tokens for it in out
                                    if it.spec_tokens}})

    def _emit(self, out: list, r: SimRequest, n: i64, context: i64, prefill: bool, spec: i64,
              new_hit: i64 = 0, padded: bool = False) -> None:
        """Schedule ``n`` tokens of ``r`` this step (its item object is reused): entry
        ``n_out`` of ``out``."""
        it = r.item
        if it is None:
            it = r.item = ScheduledItem(r, 0, 0, True)
        it.num_tokens = n
        it.context = context
        it.is_prefill = prefill
        it.spec_tokens = spec
        it.new_hit = new_hit
        it.padded = padded
        self._put(out, it)
        r.is_prefill_chunk = context + n < r.cache.num_tokens

    def _put(self, out: list, it: ScheduledItem) -> None:
        """``it`` as entry ``n_out`` of ``out`` (over an earlier step's entry, if any)."""
        k = self.n_out
        if k < len(out):
            out[k] = it
        else:
            out.append(it)
        self.n_out = k + 1

    def alloc_margin(self, c: CacheRequest, comp: i64, n: i64) -> i64:
        """Tokens a decoding request can advance before ``allocate_slots`` would
        do anything: every position it reads (computed, scheduled and slot
        ends, prompt+output length, hashed length) stays inside its current
        block of the smallest group block size.  Used by the decode fast path
        and by engine jumps."""
        b: i64 = self.min_block
        main = comp + n
        slot = main + self.num_lookahead
        nt = c.num_tokens
        lh: i64 = c.hasher.lookahead
        # (the least of six margins, compared one by one: no tuple, no boxing)
        m = -(-slot // b) * b - slot
        x = -(-main // b) * b - main
        if x < m:
            m = x
        x = b - 1 - (comp - 1) % b
        if x < m:
            m = x
        x = -(-comp // b) * b - comp
        if x < m:
            m = x
        x = b - 1 - nt % b
        if x < m:
            m = x
        x = b - 1 - (nt - lh) % b
        return x if x < m else m

    def _attention_alone(self, c: CacheRequest) -> int:
        if not self.has_full:
            return 0
        per = self.kv.per_group_hits(c, kinds=("full",))
        best = 0
        for gid, kind in enumerate(self.group_kinds):
            if kind == "full" and per[gid] > best:
                best = per[gid]
        return best

    def _preempt(self, r: SimRequest, out: list[ScheduledItem]) -> int:
        """Recompute preemption: free everything, back to waiting (fcfs: the front).
        Returns the tokens it had been scheduled in this step (0 if none)."""
        r.mamba_states_written += self.kv.states_written(r.cache)
        self.kv.free(r.cache)
        if self.connector is not None:
            self.connector.preempted(r.cache)
            if r.cache.request_id in self.inflight:
                del self.inflight[r.cache.request_id]
        r.fast_n = -1
        r.cache_mark = -1
        r.cache_mark_end = -1
        r.has_drafts = False
        r.recording = False   # the first prefill's chunk list ends at the first preemption
        r.recomputed_tokens += r.cache.num_computed_tokens
        r.cache.num_computed_tokens = 0
        r.cache.shared_prefix_boundary = 0
        r.preemptions += 1
        self.preemptions += 1
        given_back = 0
        for k in range(self.n_out):
            it = out[k]
            if it.req is r:
                given_back = it.num_tokens
                del out[k]
                self.n_out -= 1
                break
        self.waiting.prepend_request(r)
        return given_back

    # ------------------------------------------------------------- acceptance --
    def accepted_before(self, s: int) -> int:
        """Drafts accepted per request over global steps ``[0, s)``."""
        return s * self.acc_num // self.acc_den

    def accepted_at(self, s: int) -> int:
        return self.accepted_before(s + 1) - self.accepted_before(s)

    def set_accept_pattern(self, per_step: list[int]) -> None:
        """Drafts accepted in step i = per_step[i] (last value repeats), where i
        is the engine time of the step (step cases run one time unit per step).
        Decode jumps need the global pattern and are off in this mode."""
        self.accept_list = list(per_step)

    def advance(self, k: int) -> int:
        """Tokens a decoding request gains over the next ``k`` steps."""
        s = self.step_index
        return k + self.accepted_before(s + k) - self.accepted_before(s)

    def jump_decode(self, items: list[ScheduledItem], k: int) -> None:
        """Apply ``k`` pure-decode steps at once (the engine checked that no
        request finishes, crosses a block or changes its allocation)."""
        a = self.advance(k)
        for it in items:
            r = it.req
            c = r.cache
            c.num_computed_tokens += a
            start = r.num_output
            r.num_output += a
            c.append_run(r.out_stream, start, a)
        self.step_index += k

    # ------------------------------------------------------------------ update --
    def update_from_output(self, items: list[ScheduledItem], now: int) -> list[SimRequest]:
        """Advance every scheduled request; returns the requests that finished (the
        scheduler's own list, ``done``, refilled by the next call)."""
        finished = self.done
        if finished:
            finished.clear()
        kv = self.kv
        K = self.num_speculative_tokens
        drafts = K > 0
        unit = kv.hasher.unit
        min_block: i64 = self.min_block
        step_time = self.sched_time
        acc_step: i64 = self.step_accepted
        for it in items:
            r = it.req
            c = r.cache
            comp = c.num_computed_tokens + it.num_tokens
            if it.is_prefill:
                c.num_computed_tokens = comp
                if r.recording and not r.first_prefill_done:
                    r.chunk_ends = append(r.chunk_ends, comp)
                    r.chunk_end_steps = append(r.chunk_end_steps, step_time)
                if comp < c.num_tokens:
                    r.has_drafts = False
                    continue  # non-final chunk: samples nothing
                r.first_prefill_done = True
                new_tokens: i64 = 1
            else:
                spec = it.spec_tokens
                if it.padded:
                    acc: i64 = 0   # padding drafts are never accepted
                    comp -= spec
                    c.num_computed_tokens = comp
                    if r.recording and not r.first_prefill_done:
                        r.chunk_ends = append(r.chunk_ends, comp)
                        r.chunk_end_steps = append(r.chunk_end_steps, step_time)
                        r.first_prefill_done = True
                else:
                    acc = spec
                    if acc_step < spec:
                        acc = acc_step
                    comp -= spec - acc
                    c.num_computed_tokens = comp
                new_tokens = 1 + acc
            left = r.max_tokens - r.num_output
            if new_tokens > left:
                # vLLM trims the tokens past the stop and uncounts them: num_computed
                # stays one below num_tokens (what update-time caching then sees)
                comp -= new_tokens - left
                c.num_computed_tokens = comp
                new_tokens = left
            if r.first_token_ns < 0:
                r.first_token_ns = now
            start = r.num_output
            r.num_output = start + new_tokens
            # (CacheRequest.append_run, inline: once per request per step)
            c.block_hashes.append_run(r.out_stream, start, new_tokens)
            c.num_tokens += new_tokens
            if drafts:
                # with speculative decoding vLLM caches what accepted drafts completed
                # right away (update_from_output), not at the next allocation; until
                # another block of the smallest group completes the call changes nothing
                lim: i64 = c.block_hashes.count * unit   # (hashed tokens)
                if comp < lim:
                    lim = comp
                if lim < r.cache_mark or lim >= r.cache_mark_end:
                    mark: i64 = lim // min_block * min_block
                    r.cache_mark = mark
                    r.cache_mark_end = mark + min_block
                    kv.cache_blocks(c, comp)
            if r.num_output >= r.max_tokens:
                r.finish_ns = now
                finished.append(r)
            else:
                r.has_drafts = drafts
        self.step_index += 1
        if finished:
            # (finish_ns is set above and only here: the running requests that have one
            # are exactly those finishing now; no id() set, which boxes an int per
            # running request every step someone finishes)
            running = self.running
            if len(finished) == 1:
                f = finished[0]
                for i in range(len(running)):
                    if running[i] is f:   # (identity: list.remove would call __eq__)
                        del running[i]
                        break
            else:
                self.running = [r for r in self.running if r.finish_ns < 0]
            conn = self.connector
            for r in finished:
                r.mamba_states_written += kv.states_written(r.cache)
                if conn is not None:
                    # vLLM frees what no group needs any more before the connector sees
                    # the table, then the rest
                    c = r.cache
                    kv.remove_skipped(c, c.num_computed_tokens)
                    conn.request_finished(c)
                    if c.request_id in self.inflight:
                        del self.inflight[c.request_id]
                kv.free(r.cache)
        if kv.pool.events is not None:
            # vLLM publishes a step's KV events once its outputs are processed (the
            # engine core's take_events after update_from_output): a router indexing them
            # sees this step's from now on (the batch and its step are those published
            # at the next step's start otherwise: the same stream)
            self.publish_time = now
            kv.pool.events.flush()
        return finished
