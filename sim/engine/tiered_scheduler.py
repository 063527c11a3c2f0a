"""The scheduler with vLLM 0.33.0's KV connector (the CPU tier, ``kv_offloading``): the
admission that asks the connector for external hits, loads asynchronously and holds
blocks while waiting (``Scheduler.schedule``'s ``_admit_with_tier``), the blocks the
admitted prefills still reserve, and the connector's part of each step (vLLM's
``build_connector_meta``).  ``Scheduler`` calls these only when a connector is attached,
which only this subclass does."""
from __future__ import annotations

from librt.vecs import append, vec
from mypy_extensions import i64

from sim.cache.kv_manager import Lookup
from sim.cache.offload import OffloadConnector
from sim.engine.request import ScheduledItem, SimRequest
from sim.engine.scheduler import Scheduler


class TieredScheduler(Scheduler):
    """``Scheduler`` serving with the CPU tier's connector."""

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
        # the requests allocated in the waiting loop whose sweep may not be over (in the
        # order allocated; pruned as sweeps end), and the connector step's scratch
        self.sweeping: list[SimRequest] = []
        self.sched_pos = vec[i64]()
        self.gone: list[SimRequest] = []

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
        obs = self.observers
        sbs: i64 = kv.scheduler_block_size
        held = self.held                   # (lists kept, emptied below)
        passed = self.passed
        while budget > 0:
            queue = self.holding if self.holding else self.waiting
            if not queue:
                break
            if len(self.running) >= self.max_num_seqs:
                break
            # (the plain FCFS queue's head read directly, as in ``Scheduler.schedule``)
            r = queue[0] if type(queue) is self._fcfs_type else queue.peek_request()
            watched = bool(self.watchers) and queue is self.waiting
            if watched:
                for qw in self.watchers:
                    qw.looking_at(r)
            c = r.cache
            rid = c.request_id
            if r.loading:
                if not conn.load_done(rid):
                    queue.pop_request()
                    held.append(r)
                    continue
                self._promote(r)
            looked_up = c.num_computed_tokens == 0
            lookup = None
            new_local: i64 = 0
            ext: i64 = 0
            hit_blocks = None
            if looked_up:
                conn.prime_keys(c)
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
                n, padded = self._tier_tokens(r, budget, computed, new_local + ext,
                                              num_running_scheduled, prefill_scheduled)
                if n < 0:
                    break
            attn_alone = 0
            if lookup is not None and r.hit_tokens < 0:
                attn_alone = (lookup.full_alone if lookup.full_alone >= 0
                              else self._attention_alone(c))
                for o in obs:   # (miss attribution: r.miss)
                    o.on_lookup(r, lookup)
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
            rs = c.offload
            if rs is not None and not rs.listed:
                rs.listed = True
                self.sweeping.append(r)
            first = looked_up and r.hit_tokens < 0
            if first:
                self._first_admission(r, lookup, new_local, ext, attn_alone, computed + n)
            if is_async:
                r.loading = True
                c.num_computed_tokens = computed
                self.inflight[rid] = r
                r.in_flight = True
                queue.pop_request()
                if watched:
                    self._tell_admitted(r, first)
                held.append(r)
                continue
            queue.pop_request()
            if watched:
                self._tell_admitted(r, first)
            self.running.append(r)
            if r.first_scheduled_ns < 0:
                r.first_scheduled_ns = now
            c.num_computed_tokens = computed
            if computed + n < c.num_tokens:
                self.inflight[rid] = r
                r.in_flight = True
            kp: i64 = 0
            if padded:
                kp = self.num_speculative_tokens
            self._emit(out, r, n, computed, not padded, kp, new_local, padded)
            budget -= n
        if held:
            for k in range(len(held) - 1, -1, -1):
                self.holding.prepend_request(held[k])
            held.clear()
        if passed:
            for k in range(len(passed) - 1, -1, -1):
                if self.watchers:
                    for qw in self.watchers:
                        qw.put_back(passed[k])
                self.waiting.prepend_request(passed[k])
            passed.clear()
        return budget

    def _first_admission(self, r: SimRequest, lookup: Lookup | None, new_local: i64, ext: i64,
                         attn_alone: int, end: i64) -> None:
        """A request's figures at its first admission: its GPU and host hits, the tokens
        the host held in every attention group past them but could not serve, its junction,
        attention's hit alone; the scheduler's observers told (miss attribution: its
        admitted keys up to ``end``)."""
        conn = self.connector
        assert conn is not None
        c = r.cache
        sbs: i64 = self.kv.scheduler_block_size
        r.hit_tokens = new_local
        r.cpu_hit_tokens = ext
        reach = conn.attention_reach(c, c.num_computed_tokens + new_local - new_local % sbs)
        if reach > new_local + ext:
            r.cpu_no_state_tokens = reach - new_local - ext
        r.junction = lookup.junction if lookup is not None else 0
        r.attention_hit_tokens = attn_alone
        for o in self.observers:
            o.on_admit(r, end)

    def _promote(self, r: SimRequest) -> None:
        """A request whose load is done: its blocks enter the GPU prefix cache, and it is
        scheduled with no new lookup."""
        conn = self.connector
        assert conn is not None
        c = r.cache
        self.kv.cache_blocks(c, c.num_computed_tokens)
        if c.num_computed_tokens == c.num_tokens:
            c.num_computed_tokens = c.num_tokens - 1
        conn.promoted(c.request_id)
        r.loading = False

    def _tell_admitted(self, r: SimRequest, first: bool) -> None:
        for qw in self.watchers:
            qw.admitted(r, first)

    def _tier_tokens(self, r: SimRequest, budget: i64, computed: i64, hit: i64,
                     num_running_scheduled: i64, prefill_scheduled: bool) -> tuple[i64, bool]:
        """The tokens a request admitted without a load gets this step, and whether they
        are padded to 1 + K (as ``schedule``'s waiting loop gives them); -1: it does not
        fit, and admission stops for this step."""
        c = r.cache
        K = self.num_speculative_tokens
        mml = self.max_model_len
        n: i64 = c.num_tokens - computed
        padded = False
        if (K > 0 and n == 1 and not prefill_scheduled
                and (num_running_scheduled > 0 or computed > 0)
                and (mml is None or computed + 1 + K + 1 <= mml)):
            if 1 + K > budget:
                return -1, False
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
            n = self._split(r, n, hit, lpt)
            if n == 0:
                return -1, False
        return n, padded

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
        in-flight prefills.  The connector's part needs, in scheduling order, the
        scheduled requests admitted in this step or still sweeping (``sweeping``: every
        request allocated in the waiting loop, until its sweep is over) and every
        scheduled request's tokens -- those of the others are read only by the Mamba
        hand-offs' tail stores, so only a step with hand-offs (or a preemption, which
        moves items in ``out``) walks every item; the others find their few requests by
        ``ScheduledItem.pos``."""
        conn = self.connector
        assert conn is not None
        sched = self.step_states     # (one list kept: its first n entries, overwritten)
        n: i64 = 0
        stamp = conn.step_no
        handoffs = self.kv.has_offload_handoffs()
        if handoffs or conn.preempted_ids:
            for it in out:
                rs = it.req.cache.offload
                assert rs is not None
                rs.step_tokens = it.num_tokens
                rs.sched_step = stamp
                if rs.fresh or not rs.swept:   # (the others: their tokens only)
                    if n < len(sched):
                        sched[n] = rs
                    else:
                        sched.append(rs)
                    n += 1
            self._prune_sweeping()
            conn.build(sched, n, handoffs)
            if self.inflight:
                for it in out:
                    r = it.req
                    if r.in_flight and not r.is_prefill_chunk:
                        del self.inflight[r.cache.request_id]
                        r.in_flight = False
            return
        # (the listed requests scheduled in this step, by their index in ``out``: an
        # insertion, there are few; their indices beside them in ``sched_pos``)
        n_out: i64 = len(out)
        self._prune_sweeping()
        spos = self.sched_pos
        for r in self.sweeping:
            rs = r.cache.offload
            item = r.item
            if rs is None or item is None:
                continue
            k: i64 = item.pos
            if k < 0 or k >= n_out or out[k] is not item:
                continue
            rs.step_tokens = item.num_tokens
            rs.sched_step = stamp
            if n == len(sched):
                sched.append(rs)
            if n == len(spos):
                spos = self.sched_pos = append(spos, k)
            i = n
            while i > 0 and spos[i - 1] > k:
                sched[i] = sched[i - 1]
                spos[i] = spos[i - 1]
                i -= 1
            sched[i] = rs
            spos[i] = k
            n += 1
        conn.build(sched, n, False)
        if self.inflight:
            gone = self.gone               # (kept; its first ng entries)
            ng: i64 = 0
            for r in self.inflight.values():
                if r.is_prefill_chunk:
                    continue
                item = r.item
                if item is None:
                    continue
                k = item.pos
                if k < 0 or k >= n_out or out[k] is not item:
                    continue
                if ng < len(gone):
                    gone[ng] = r
                else:
                    gone.append(r)
                ng += 1
            for j in range(ng):
                r = gone[j]
                del self.inflight[r.cache.request_id]
                r.in_flight = False

    def _prune_sweeping(self) -> None:
        """``sweeping`` without the requests whose sweep is over (or that finished)."""
        cands = self.sweeping
        m: i64 = 0
        for j in range(len(cands)):
            r = cands[j]
            rs = r.cache.offload
            if rs is None or rs.finished or (rs.swept and not rs.fresh):
                if rs is not None:
                    rs.listed = False
                continue
            if m != j:
                cands[m] = r
            m += 1
        if m < len(cands):
            del cands[m:]
