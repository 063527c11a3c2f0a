"""The SimPy replay: the engine is a SimPy process, a loop of steps; arrivals
come off the engine's own heap.

The engine process runs the scheduler one step at a time; each step lasts what
the backend says.  While the batch is pure decode and nothing can change (no
arrival, no finish, no block boundary, no waiting request) the engine advances
many steps in one jump instead of one event per step.

Arrivals are not SimPy processes (one process per request cost ~6 SimPy events
each).  The engine reads the workload lazily, as a feeder process would, and
keeps the events a process-per-request replay would schedule -- the feeder's
wake-ups, a follow-up turn's think time (it starts ``think_s`` after its
previous turn *finishes*: closed loop), the done event of each finished or
rejected turn -- on a heap of virtual events keyed as SimPy keys its queue
(time, priority, creation order).  Wherever the engine would take its next
event (the end of a step another event precedes, a finish, a wait) it first
handles every virtual event SimPy would have run before that one, so each
schedule() and update sees the same requests, added in the same order, at the
same integer-ns instants, as with one process per request (ties included: a
request arriving as a step ends joins before the next schedule(); a follow-up
turn whose previous turn finishes at that instant with no think time arrives
then, after the step planned at that instant).  SimPy carries the engine's waits
(idle, nothing fits) and its clock follows when arrivals were handled; a step
that only finishes requests costs it nothing.

Each step the engine hands the backend a step plan (``backends.base.StepPlan``: the
scheduled items, with the drafts each accepts, the tokens it keeps and whether it finishes)
and gets the step's duration back; the backend sees nothing else of the engine or the
scheduler.

Time is kept in integer nanoseconds so that a jump over k steps lands on
exactly the instant k single steps would reach (float sums are not
associative); outputs convert back to seconds.

(Over ~600 lines on purpose: the step loop and the arrival heap decide together which
event runs first at an instant; split, the ordering rules would live in two places.)
"""
from __future__ import annotations

import heapq
import math
from typing import Any, Callable, Final, Generator, Iterable, Iterator, Protocol, cast

import simpy
from mypy_extensions import i64

from backends.analytical import CostModel, DecodeTimes
from backends.base import StepBackend, StepItem, StepPlan
from sim.config.errors import CapacityError
from sim.engine.record import Recorder, RequestMaker, StepSampler
from sim.engine.scheduler import ScheduledItem, Scheduler, SimRequest

Process = Generator[simpy.Event, Any, None]
NEVER: Final = (1 << 62) - 1   # "no such time" on the integer-ns clock (146 years; the
                               # largest machine-size int of the compiled build)
# Empty steps in a row, with no other event pending, after which the replay cannot
# progress: a retry sees the same state (the one thing an empty step changes is a Mamba
# state cached in the step before, handed out one step later; a request that preempted
# itself is re-admitted a step later).
STALL_LIMIT: Final = 3


def ns(seconds: float) -> int:
    """``round(seconds * 1e9)`` exactly (Python's round: halves to even), without
    the generic ``round`` call, which costs ~650 CPU instructions a time in the
    compiled build (this runs once per engine step).  ``x - floor(x)`` is exact
    for every float, so the three cases decide as ``round`` does."""
    x = seconds * 1e9
    f = math.floor(x)
    d = x - f
    if d > 0.5:
        return f + 1
    if d < 0.5:
        return f
    return f + (f & 1)


class Arrival(Protocol):
    """What the engine reads of a workload record (``workloads.base.TraceRequest``)."""

    request_id: str
    arrival_s: float
    after: str | None
    think_s: float


# SimPy's event priorities, and the kinds of virtual events (see Engine, "arrivals")
URGENT: Final = 0
NORMAL: Final = 1
FEED: Final = 0       # the feeder wakes at the next record's arrival
DONE: Final = 1       # a finished turn's done event
ARRIVE: Final = 2     # a follow-up turn's think time is over: it arrives
REJECTED: Final = 3   # the done event of a turn rejected on arrival
RESUME: Final = 4     # a follow-up whose previous turn had already finished resumes
START: Final = 5      # the turns of the feeder's first run (before the engine's start)
STALE: Final = 6      # the engine's timeout, unused: its wait ended on an arrival
# the engine's wait for an arrival: none, waiting, woken, ended otherwise (a wake-up is a no-op)
WAKE_NONE: Final = 0
WAKE_ARMED: Final = 1
WAKE_FIRED: Final = 2
WAKE_LATE: Final = 3


class _Turn:
    """One workload record on its way in: the request's process of a
    process-per-request replay, as state (its follow-ups wait in ``waiters``)."""

    __slots__ = ("trace", "index", "prev", "waiters", "batch")

    def __init__(self, trace: Arrival, index: int):
        self.trace = trace
        self.index = index
        self.prev: _Turn | None = None            # the previous turn it waits for
        self.waiters: list[_Turn] | None = None   # follow-ups waiting for this one
        self.batch: list[_Turn] | None = None     # (START: the feeder's first run)


class Engine:
    def __init__(self, scheduler: Scheduler, backend: StepBackend,
                 make_request: Callable[[Any, int], SimRequest],
                 on_finish: Callable[[SimRequest], None], jump: bool = True,
                 progress: Callable[[int], None] | None = None):
        self.env = simpy.Environment()
        self.sched = scheduler
        self.backend = backend
        # The analytical model is called natively (a call through the protocol costs ~550
        # CPU instructions in the compiled build, a few times a step)
        self.cost: CostModel | None = backend if isinstance(backend, CostModel) else None
        # the analytical model's decode-step times of a batch of n items of t tokens
        # (``_decode_times``): kept by n for the last t (they depend on n and t alone)
        self.times_by_n: list[DecodeTimes | None] = []
        self.times_t = -1
        self.plan = StepPlan()   # refilled every step
        self.no_items: list[ScheduledItem] = []
        self.make_request = make_request
        self.on_finish = on_finish
        self.jump = jump and backend.jumps
        self.progress = progress
        self.next_arrival = NEVER   # time of the next known arrival (ns)
        self.pending_followups: list[int] = []   # heap of known follow-up arrival times (ns)
        # arrivals (see "arrivals" below): the virtual events, their creation count,
        # the turns not yet finished by request id, the feeder's state
        self.vq: list[tuple[int, int, int, int, _Turn]] = []
        self.seq = 0
        self.done_events: dict[str, _Turn] = {}
        self.feed: Iterator[Arrival] = iter(())
        self.feed_index = 0
        self.vq_now = 0             # time of the latest virtual event handled
        self.cur_t = 0              # key (time, seq) of the event the engine resumed on
        self.cur_s = 0
        self.noop_t = -1            # key of the latest no-op event (see _noop)
        self.noop_s = -1
        self.wake_state = WAKE_NONE
        self.wake_t = 0             # key of the wake-up event, once fired
        self.wake_s = 0
        self.done_quiet = False     # a turn's done event was handled at once (see _done)
        self.nobody = _Turn(cast(Arrival, None), -1)   # (payload of STALE events)
        self.steps = 0
        self.finished = 0
        self.rejected: list[SimRequest] = []   # refused on arrival (see Scheduler.add)
        self.on_step: Callable[[list[ScheduledItem], int, int, int], None] | None = None
        # ``sim run``'s own request maker, recorder and step sampler, when set, are called
        # natively: instead of ``make_request`` and ``on_finish``, and before ``on_step``
        # (a call through a callable costs ~1,000 CPU instructions in the compiled
        # build, its integer arguments boxed)
        self.maker: RequestMaker | None = None
        self.recorder: Recorder | None = None
        self.sampler: StepSampler | None = None

    def step_time(self, items: list[ScheduledItem], now: int) -> int:
        """Duration (integer nanoseconds, at least 1) of the step of ``items`` starting at
        ``now``, as the backend times its plan (the analytical model times the items
        themselves: no plan is filled for it)."""
        cost = self.cost
        if cost is not None:   # (the analytical model reads the items' sizes only)
            d = ns(cost.items_time(cast("list[StepItem]", items)))
        else:
            plan = self.make_plan(items, now)
            d = ns(self.backend.step_time(plan))
            if plan.finished:
                plan.finished.clear()
        return d if d > 1 else 1

    def make_plan(self, items: list[ScheduledItem], now: int) -> StepPlan:
        """The step plan of ``items``: each item's share of the step's draft acceptance
        (decided once per step by the scheduler, applied by its update), the tokens it
        keeps, whether it finishes, whether it is part of the first prefill."""
        acc = self.sched.step_accepted
        for it in items:
            r = it.req
            out = r.num_output
            left = r.max_tokens - out
            it.first_prefill = out == 0
            if it.is_prefill:
                n = it.num_tokens
                it.accepted = 0
                it.kept = n
                # (only the last chunk samples, one token)
                it.finishes = left <= 1 and it.context + n >= r.cache.num_tokens
            else:
                s = it.spec_tokens
                a = 0 if it.padded else (acc if acc < s else s)
                k = 1 + a
                it.accepted = a
                it.kept = k if k < left else left
                it.finishes = left <= k
        plan = self.plan
        plan.items = cast("list[StepItem]", items)   # (a string: no alias built per step)
        plan.index = self.steps
        plan.start_ns = now
        return plan

    # ---------------------------------------------------------------- arrivals --
    # Arrivals run off SimPy's queue, on the engine's own heap ``self.vq`` of virtual
    # events ``(time ns, priority, seq, kind, turn)``, ordered as SimPy would order
    # the events of a process-per-request replay (time, then URGENT before NORMAL,
    # then creation order: ``seq`` counts creations as SimPy's event ids do, the
    # engine's own included).  The engine handles them ("drains" the heap) up to the
    # key of each event it would resume on (``_sync``, ``_await_arrival``), so every
    # schedule() and update sees exactly the requests a process per request would
    # have added by then, in the same order.  Events that only occupied SimPy's
    # queue (a process's end: ``_noop``; an unused timeout: STALE) are kept too: the
    # progress guard and the engine's run-ahead look at the next event's time.
    def _feed(self, t: int, turn: _Turn | None) -> list[_Turn]:
        """The feeder at ``t``: ``turn`` (the record it waited for; None: its first
        run) and every following record due by ``t`` or following up a previous turn,
        read lazily; returns them, in trace order, and arms its next wake-up."""
        batch: list[_Turn] = []
        if turn is None:
            turn = self._next_turn(t)
        done = self.done_events
        while turn is not None:
            trace = turn.trace
            if trace.after:   # (a follow-up turn: it waits for the previous one to finish)
                prev = done.get(trace.after)
                if prev is None:   # previous turn already finished: it resumes at once
                    self.seq += 1
                    heapq.heappush(self.vq, (t, NORMAL, self.seq, RESUME, turn))
                else:
                    turn.prev = prev
            # registered now, not when the turn arrives: the next record may be its follow-up
            done[trace.request_id] = turn
            batch.append(turn)
            turn = self._next_turn(t)
        return batch

    def _next_turn(self, t: int) -> _Turn | None:
        """The feeder's next record, when it joins at ``t``; None when it arrives later
        (the feeder's wake-up is armed) or the workload is over."""
        nxt = next(self.feed, None)
        if nxt is None:
            self.next_arrival = NEVER
            self._noop(t)   # (the feeder process's end)
            return None
        turn = _Turn(nxt, self.feed_index)
        self.feed_index += 1
        if nxt.after is None:
            arrival = ns(nxt.arrival_s)
            if arrival > t:
                self.next_arrival = arrival
                self.seq += 1
                heapq.heappush(self.vq, (arrival, NORMAL, self.seq, FEED, turn))
                return None
        return turn

    def _noop(self, t: int) -> None:
        """An event that only occupies SimPy's queue (a process's end, an unused wake):
        remembered for ``_peek`` (the progress guard sees it)."""
        self.seq += 1
        self.noop_t = t
        self.noop_s = self.seq

    def _start(self, t: int, batch: list[_Turn]) -> None:
        """The turns the feeder released at ``t``, in order: a first turn arrives; a
        follow-up registers with its previous turn (or waits for its own resume)."""
        for turn in batch:
            prev = turn.prev
            if prev is not None:
                if prev.waiters is None:
                    prev.waiters = [turn]
                else:
                    prev.waiters.append(turn)
                turn.prev = None
            elif not turn.trace.after:
                self._arrive(t, turn)

    def _arrive(self, t: int, turn: _Turn) -> None:
        maker = self.maker
        r = (maker.make(turn.trace, turn.index) if maker is not None
             else self.make_request(turn.trace, turn.index))
        r.arrival_ns = t
        r.done_event = turn
        if not self.sched.add(r):
            # rejected on arrival (prompt too long for max_model_len): never scheduled;
            # a follow-up turn still comes after its think time
            r.done_event = None
            self.rejected.append(r)
            self.seq += 1
            heapq.heappush(self.vq, (t, NORMAL, self.seq, REJECTED, turn))
            rid = turn.trace.request_id
            if rid in self.done_events:   # (in + del: dict.pop is a generic call when compiled)
                del self.done_events[rid]
            self._noop(t)
        else:
            w = self.wake_state
            if w == WAKE_ARMED:           # the engine waits for an arrival: resume it here
                self.seq += 1
                self.wake_t = t
                self.wake_s = self.seq
                self.wake_state = WAKE_FIRED
            elif w == WAKE_LATE:          # its wait already ended: the wake-up is a no-op
                self._noop(t)
                self.wake_state = WAKE_FIRED

    def _resume_followups(self, t: int, waiters: list[_Turn]) -> None:
        """Previous turn finished at ``t``: each follow-up arrives its think time later."""
        for turn in waiters:
            a = t + ns(turn.trace.think_s)
            heapq.heappush(self.pending_followups, a)
            self.seq += 1
            heapq.heappush(self.vq, (a, NORMAL, self.seq, ARRIVE, turn))

    def _handle(self, ev: tuple[int, int, int, int, _Turn]) -> None:
        t, _, _, kind, turn = ev
        if t > self.vq_now:
            self.vq_now = t
        if kind == FEED:
            self._start(t, self._feed(t, turn))
        elif kind == DONE:   # a finished turn's done event: its process ends, follow-ups resume
            rid = turn.trace.request_id
            if rid in self.done_events:
                del self.done_events[rid]
            self._noop(t)
            if turn.waiters is not None:
                self._resume_followups(t, turn.waiters)
        elif kind == ARRIVE:
            heapq.heappop(self.pending_followups)
            self._arrive(t, turn)
        elif kind == REJECTED:
            if turn.waiters is not None:
                self._resume_followups(t, turn.waiters)
        elif kind == RESUME:
            self._resume_followups(t, [turn])
        elif kind == STALE:
            pass
        else:   # START: the first run's turns (behind the engine's own start)
            batch = turn.batch
            turn.batch = None
            if batch is not None:
                self._start(t, batch)

    def _drain(self, t: int, prio: int, s: int) -> bool:
        """Handle every virtual event ordered before ``(t, prio, s)``; False if none."""
        vq = self.vq
        handled = False
        while vq:
            e = vq[0]
            et = e[0]
            if et > t or (et == t and (e[1] > prio or (e[1] == prio and e[2] > s))):
                break
            heapq.heappop(vq)
            self._handle(e)
            handled = True
        return handled

    def _sync(self, t: int) -> bool:
        """The engine's timeout to ``t`` (the event it resumes on): the arrivals ordered
        before it are handled first.  True when there were any (SimPy's clock follows
        then; otherwise nothing but the engine ran in between)."""
        self.seq += 1
        s = self.seq
        handled = self._drain(t, NORMAL, s)
        self.cur_t = t
        self.cur_s = s
        if self.done_quiet:   # (the ends of the processes of turns done at once)
            self.done_quiet = False
            self._noop(t)
        return handled

    def _await_arrival(self, limit: int) -> int:
        """Handle arrivals until one wakes the engine (``wake``; with ``limit`` >= 0,
        ``wake | timeout`` to ``limit``, that timeout being the newest event); returns
        the time the engine resumes, -1 when nothing will ever wake it."""
        s_lim = self.seq
        self.wake_state = WAKE_ARMED
        vq = self.vq
        while vq:
            e = vq[0]
            if limit >= 0:
                et = e[0]
                if et > limit or (et == limit and e[1] == NORMAL and e[2] > s_lim):
                    break
            heapq.heappop(vq)
            self._handle(e)
            # (a wake-up at the timeout's instant is the newer event: the timeout resumes)
            if self.wake_state == WAKE_FIRED and self.wake_t != limit:
                t = self.wake_t
                s = self.wake_s
                self._drain(t, NORMAL, s)
                if limit >= 0:   # the condition event, scheduled as the wake is handled
                    self.seq += 1
                    s = self.seq
                    self._drain(t, NORMAL, s)
                self.cur_t = t
                self.cur_s = s
                self.wake_state = WAKE_NONE
                return t
        if limit < 0:
            self.wake_state = WAKE_NONE
            return -1
        # the timeout fires first: the condition event is scheduled then (a wake-up
        # from now on, before the engine resumes, is a no-op)
        if self.wake_state == WAKE_ARMED:
            self.wake_state = WAKE_LATE
        self.seq += 1
        s = self.seq
        self._drain(limit, NORMAL, s)
        self.cur_t = limit
        self.cur_s = s
        self.wake_state = WAKE_NONE
        return limit

    def _peek(self) -> int:
        """The time of the next event a process-per-request replay would have on
        SimPy's queue (NEVER: none): the virtual events (an unused timeout of the
        engine's included) and a no-op not yet handled."""
        vq = self.vq
        t = vq[0][0] if vq else NEVER
        if self.noop_t == self.cur_t and self.noop_s > self.cur_s and self.noop_t < t:
            t = self.noop_t
        return t

    # ------------------------------------------------------------------ engine --
    def _loop(self) -> Process:
        env = self.env
        sched = self.sched
        # The engine's clock.  It runs ahead of the time of the event it last resumed
        # on (``cur_t``) while nothing else can happen: when the next event (``_peek``)
        # lies after the end of a step, that step's timeout would be the next event
        # anyway, so the engine applies the step at once and keeps going; it takes
        # its next event (``_sync``, which first handles the arrivals ordered before
        # it) before anything a request could see: a finish (its done event), an
        # idle wait, or an event due by the end of the next step.  Every schedule()
        # and update sees the time it would have seen stepping one event at a time.
        # SimPy's clock follows when an arrival was handled, and carries every wait.
        now = self.cur_t
        stalls = 0
        while True:
            if not sched.has_work():
                if now > self.cur_t and self._sync(now):
                    yield env.timeout(now - int(env.now))
                t = self._await_arrival(-1)   # (``yield wake``: the next arrival)
                if t < 0:   # nothing will ever arrive: the replay is over
                    t = self.vq_now if self.vq_now > self.cur_t else self.cur_t
                    if t > env.now:
                        yield env.timeout(t - int(env.now))
                    return
                yield env.timeout(t - int(env.now))
                now = t
            items = sched.schedule(now)
            if not items:
                # Nothing fits this step (e.g. waiting on a state cached this
                # step): let time pass one step's overhead and retry.
                if now > self.cur_t and self._sync(now):
                    yield env.timeout(now - int(env.now))
                # The progress guard: nothing else will ever happen (no arrival, no
                # follow-up turn, nothing finishing) and retries keep scheduling nothing.
                # vLLM would keep the request waiting forever; stop and say why.
                if self._peek() == NEVER:
                    stalls += 1
                    if stalls >= STALL_LIMIT:
                        raise CapacityError(self.stuck_reason())
                else:
                    stalls = 0
                # (``wake | timeout``: the step's overhead, or an arrival before it)
                limit = now + self.step_time(self.no_items, now)
                self.seq += 1   # (the timeout)
                s = self.seq
                t = self._await_arrival(limit)
                if t < limit:   # (the timeout stays queued, to no effect)
                    heapq.heappush(self.vq, (limit, NORMAL, s, STALE, self.nobody))
                yield env.timeout(t - int(env.now))
                now = t
                continue
            stalls = 0
            k, total = self._jump_steps(items, now) if self.jump else (1, 0)
            end = now + (total if k > 1 else self.step_time(items, now))
            sampler = self.sampler
            if sampler is not None:
                sampler.step(items, now, end, k)
            if self.on_step is not None: self.on_step(items, now, end, k)  # noqa: E701 (planned)
            # another event is due by the end of this step: take the step's end as an event
            if end >= self._peek() and self._sync(end):
                yield env.timeout(end - int(env.now))
            now = end
            if k > 1:
                self._run_jump(items, k)
            else:
                self.steps += 1
                finished = sched.update_from_output(items, now)
                if finished:
                    if now > self.cur_t and self._sync(now):   # finish at its time
                        yield env.timeout(now - int(env.now))
                    for r in finished:
                        self.finished += 1
                        if self.cost is None:   # (a backend that reads plans)
                            self.plan.finished.append(r.cache.request_id)
                        rec = self.recorder
                        if rec is not None:
                            rec.finish(r)
                        else:
                            self.on_finish(r)
                        self._done(now, cast(_Turn, r.done_event))
                        r.done_event = None   # (the turn holds its record: let it go)
                        # (and the request and its step item, which point at each other,
                        # go by reference counting, not as cyclic garbage)
                        r.item = None
                        if self.progress is not None:
                            self.progress(self.finished)
            # Requests arriving at this very instant join before the next
            # schedule(), as vLLM adds new requests before each step: every
            # event already queued for this instant runs first (done events
            # included).  (When the clock ran ahead, nothing is due before the
            # next step's end.)
            if now == self.cur_t and (self.done_quiet or self._peek() <= now) \
                    and self._sync(now):
                yield env.timeout(now - int(env.now))

    def _done(self, t: int, turn: _Turn) -> None:
        """The done event of ``turn``, finished at ``t``.  Handled at once when nobody
        could be waiting for it (no follow-up registered, no feeder wake-up due at
        ``t`` that could register one): its one effect, besides the end of the turn's
        process (a no-op after the next event, ``done_quiet``), is that a later
        follow-up record finds the turn finished."""
        if turn.waiters is None and self.next_arrival != t:
            rid = turn.trace.request_id
            if rid in self.done_events:
                del self.done_events[rid]
            self.done_quiet = True
        else:
            self.seq += 1
            heapq.heappush(self.vq, (t, NORMAL, self.seq, DONE, turn))

    def stuck_reason(self) -> str:
        """One line naming the request the replay is stuck on, and why."""
        sched = self.sched
        r = sched.waiting[0] if sched.waiting else sched.running[0]
        c = r.cache
        kv = sched.kv
        state = "running" if not sched.waiting else (
            "waiting" + (f", {len(sched.waiting) - 1:,} more behind it"
                         if len(sched.waiting) > 1 else ""))
        return (f"no progress: request {c.request_id!r} (prompt {c.num_prompt_tokens:,} tokens, "
                f"{r.num_output:,} of {r.max_tokens:,} output tokens, {state}) can never be "
                f"scheduled: admitting it takes {sched.admission_blocks(r):,} pool blocks and "
                f"its longest step up to {sched.blocks_needed(r):,}, but the pool has "
                f"{kv.num_free_blocks():,} free or evictable of {kv.usable_blocks:,} usable and "
                f"nothing else can change that (no other request running, arriving or finishing; "
                f"vLLM would keep it waiting forever): give the pool more blocks or shorten "
                f"the request")

    def _jump_steps(self, items: list[ScheduledItem], now: int) -> tuple[int, int]:
        """How many identical pure-decode steps can run as one jump, and their
        total duration (ns).  Returns (1, 0) when the next step must run alone.

        A jump is exact: nobody waits, everybody running is scheduled, nobody
        finishes, no position crosses a block (so allocation, freeing and
        caching would all be no-ops), and the last step ends strictly before
        the next arrival.
        """
        sched = self.sched
        if sched.waiting or len(items) != len(sched.running):
            return 1, 0
        if sched.has_swa:
            return 1, 0  # the window slides inside a block: step it exactly
        fast = sched.fast_decode
        K = sched.num_speculative_tokens
        mml = sched.max_model_len
        # (machine integers: NEVER < 2**62 fits)
        grow: i64 = NEVER   # max advance A(k-1) keeping every allocation key
        fin: i64 = NEVER    # max advance A(k) with nobody finishing
        pos: i64 = NEVER    # max advance A(k-1) keeping positions below max_model_len
        C0: i64 = 0
        t = items[0].num_tokens
        last = items[len(items) - 1]
        if last.is_prefill or last.padded:
            return 1, 0   # (a request admitted this step, scheduled last: no pass over the rest)
        for it in items:
            # (every item verifies all K drafts: the acceptance pattern applies unclipped)
            if it.is_prefill or it.padded or it.num_tokens != t or it.spec_tokens != K:
                return 1, 0
            r = it.req
            if r.num_output == 0:
                return 1, 0
            comp = it.context
            if mml is not None and mml - 1 - t - comp < pos:
                pos = mml - 1 - t - comp
            # positions advance in lockstep, so the margin left since the last
            # allocation is its recorded limit minus the progress made
            if fast and r.fast_n == t and comp <= r.fast_until:
                g = r.fast_until - comp
            else:
                g = sched.alloc_margin(r.cache, comp, t)
            if g < grow:
                grow = g
            f = r.max_tokens - r.num_output - 1
            if f < fin:
                fin = f
            C0 += comp
        n = len(items)
        T = n * t
        TT = n * t * (t + 1)
        horizon: i64 = self.next_arrival
        if self.pending_followups and self.pending_followups[0] < horizon:
            horizon = self.pending_followups[0]
        # (machine integers: a Python int's addition is a call where the compiler does
        # not inline it)
        start: i64 = now
        total: i64 = 0
        k: i64 = 0
        s0 = sched.step_index
        num, den = sched.acc_num, sched.acc_den
        base = s0 * num // den
        backend = self.backend
        cost = self.cost
        a_prev: i64 = 0                 # advance before step k: positions of step k
        if pos < grow:
            grow = pos
        times = self._decode_times(cost, n, t) if cost is not None else None
        while True:
            if k > 0 and a_prev > grow:
                break
            a_next = k + 1 + (s0 + k + 1) * num // den - base
            if a_next > fin:
                break
            C = C0 + n * a_prev
            d: i64 = ns(times.at(C) if times is not None
                        else backend.time_from_sums(n, T, C, t * C, TT))
            if d < 1:
                d = 1
            if start + total + d >= horizon:
                break
            total += d
            k += 1
            a_prev = a_next
        if k <= 1:
            return 1, 0
        return k, total

    def _decode_times(self, cost: CostModel, n: int, t: int) -> DecodeTimes:
        """``cost.decode_times(n, t)``, made once per batch size (a jump's batch is
        usually one of a few sizes: no object built per jump)."""
        memo = self.times_by_n
        if t != self.times_t:
            memo.clear()
            self.times_t = t
        while len(memo) <= n:
            memo.append(None)
        times = memo[n]
        if times is None:
            times = memo[n] = cost.decode_times(n, t)
        return times

    def _run_jump(self, items: list[ScheduledItem], k: int) -> None:
        self.sched.jump_decode(items, k)
        self.steps += k

    def run(self, traces: Iterable[Arrival]) -> None:
        self.feed = iter(traces)
        # (SimPy would start the feeder's process, then the engine's: event ids 1, 2)
        self.seq = 2
        self.cur_t = 0
        self.cur_s = 2
        batch = self._feed(0, None)
        if batch:   # the first run's turns start behind the engine's own start (URGENT)
            self.seq += 1
            batch[0].batch = batch
            heapq.heappush(self.vq, (0, URGENT, self.seq, START, batch[0]))
        self.env.process(self._loop())
        self.env.run()
