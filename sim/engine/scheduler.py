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
from typing import Final, Protocol

from librt.vecs import append
from mypy_extensions import i64

from sim.cache.kv_manager import KVCacheManager
from sim.cache.offload import OffloadConnector, ReqOffload
from sim.cache.request import CacheRequest
from sim.config.scheduler import SchedulerConfig
from sim.engine.observers import SchedulerObserver
from sim.engine.request import ScheduledItem, SimRequest
from sim.engine.request_queue import FCFSQueue, RequestQueue, make_queue

class QueueWatcher(Protocol):
    """What watches the waiting queue as the scheduler uses it (``sim explain`` reads the
    pool as one request's admission lookup sees it): a request arriving, put back
    (preempted, or passed over for a step), looked at for admission (its lookup comes
    next, on this pool), taken off to run (``first``: its first admission).  A watcher may
    end the replay there by raising ``StopReplay``."""

    def arrived(self, r: SimRequest) -> None: ...

    def put_back(self, r: SimRequest) -> None: ...

    def looking_at(self, r: SimRequest) -> None: ...

    def admitted(self, r: SimRequest, first: bool) -> None: ...


class StopReplay(Exception):
    """Raised by a ``QueueWatcher`` to end a replay where it stands."""


# why a request is refused on arrival (requests.csv ``rejected``)
EXCEEDS_MAX_MODEL_LEN: Final = "exceeds_max_model_len"   # prompt >= max_model_len
TOO_LONG_FOR_POOL: Final = "too_long_for_pool"           # the pool can never hold it


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
        # what watches the scheduler (sim/engine/observers.py: a request's first lookup
        # and admission, each step: miss attribution, the step log); empty: nobody
        self.observers: list[SchedulerObserver] = []
        # what watches the waiting queue (``QueueWatcher``; empty: nobody, one test a call)
        self.watchers: list[QueueWatcher] = []
        # the CPU tier's connector (sim/cache/offload.py; None: no tier; set by
        # ``TieredScheduler.attach_connector``).  With one, the
        # requests that hold blocks while waiting (an async load, or one done and not yet
        # scheduled) wait in ``holding``, drained before ``waiting``; ``inflight`` are the
        # requests admitted with prompt left to compute (an async load's reservation)
        self.connector: OffloadConnector | None = None
        self.holding: RequestQueue = make_queue(cfg)
        self.inflight: dict[str, SimRequest] = {}
        self.spec_step_blocks: i64 = 0
        self.step_states: list[ReqOffload] = []   # (the connector's step: its scheduled requests)
        # (the tier's waiting loop: the requests it sets aside for this step, emptied after)
        self.held: list[SimRequest] = []
        self.passed: list[SimRequest] = []
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
        if self.watchers:
            for w in self.watchers:
                w.arrived(req)
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
        return self.connector is not None and self.connector.jobs.n > 0

    def quiet(self) -> bool:
        """Nothing but the running requests (a decode jump may run): nobody waits, and no
        KV event this step queued waits to be published at its end (a jump's steps queue
        none: no block is cached, freed or evicted in them)."""
        if self.waiting:
            return False
        log = self.kv.event_log   # (the KV event log among the pool's observers)
        if log is not None and log.queued():
            return False
        conn = self.connector
        if conn is not None:
            if self.holding:
                return False
            q = conn.quiet()
            if q == 2:
                for r in self.running:
                    rs = r.cache.offload
                    if rs is None or not rs.swept:
                        return False
                return True
            return q == 1
        return True

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
        obs = self.observers
        # the step's draft acceptance, decided once: update_from_output applies it and the
        # engine hands it to the backend in the step plan
        al = self.accept_list
        self.step_accepted = (al[min(now, len(al) - 1)] if al is not None
                              else self.accepted_at(self.step_index))
        kv = self.kv
        conn = self.connector
        if conn is not None:
            conn.start_step(now)
        kv.new_step_starts(now)   # (the time of the evictions this step's allocations make)
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
                    else:   # inline of Scheduler._emit (the step most requests take)
                        it.num_tokens = n
                        it.context = comp
                        it.is_prefill = False
                        it.spec_tokens = sk
                        it.new_hit = 0
                        it.padded = False
                        k_out = self.n_out    # inline of Scheduler._put
                        it.pos = k_out
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
                # (the plain FCFS queue's head is its first element, read directly: its
                # peek_request is an interpreted method, ~450 CPU instructions more a call)
                # (the test on a copy: mypy narrows what it tests, and a narrowed deque
                # reads Any, which would box the arithmetic below)
                w = self.waiting
                r = self.waiting[0] if type(w) is self._fcfs_type else self.waiting.peek_request()
                if self.watchers:
                    for qw in self.watchers:
                        qw.looking_at(r)
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
                    for o in obs:   # (miss attribution: r.miss)
                        o.on_lookup(r, lookup)
                ok = kv.allocate_slots(c, n, new_local,
                                       lookup.blocks if lookup is not None and lookup.hit else None,
                                       num_lookahead_tokens=self.num_lookahead,
                                       full_sequence_must_fit=True)
                if not ok:
                    break
                self.waiting.pop_request()
                if self.watchers:
                    for qw in self.watchers:
                        qw.admitted(r, r.hit_tokens < 0)
                self.running.append(r)
                if r.hit_tokens < 0:
                    r.hit_tokens = new_local
                    r.junction = lookup.junction if lookup else 0
                    r.attention_hit_tokens = attn_alone
                    r.first_scheduled_ns = now
                    for o in obs:
                        o.on_admit(r, new_local + n)   # (what this step schedules)
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
        for o in obs:   # (the step log)
            o.on_step(now, out)
        return out

    # -------------------------------------------------------------- the CPU tier --
    # (``sim/engine/tiered_scheduler.py``: a scheduler with a connector is a
    # ``TieredScheduler``, which defines these two)
    def _admit_with_tier(self, now: int, budget: i64, out: list[ScheduledItem],
                         num_running_scheduled: i64, prefill_scheduled: bool) -> i64:
        raise NotImplementedError("a scheduler with a KV connector is a TieredScheduler")

    def _connector_step(self, out: list[ScheduledItem]) -> None:
        raise NotImplementedError("a scheduler with a KV connector is a TieredScheduler")

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
        it.pos = k
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
            if r.in_flight:
                del self.inflight[r.cache.request_id]
                r.in_flight = False
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
        if self.watchers:
            for w in self.watchers:
                w.put_back(r)
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
            # inline of CacheRequest.append_run (once per request per step)
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
                    if r.in_flight:
                        del self.inflight[c.request_id]
                        r.in_flight = False
                kv.free(r.cache)
        obs = kv.pool.key_observers
        if obs:
            # vLLM publishes a step's KV events once its outputs are processed (the
            # engine core's take_events after update_from_output): a router indexing them
            # sees this step's from now on (the batch and its step are those published
            # at the next step's start otherwise: the same stream)
            self.publish_time = now
            for o in obs:
                o.flush(now)
        return finished
