"""The SimPy replay of one replica: the engine is a SimPy process, a loop of steps.

The engine process runs the scheduler one step at a time; each step lasts what
the backend says.  While the batch is pure decode and nothing can change (no
arrival, no finish, no block boundary, no waiting request) the engine advances
many steps in one jump instead of one event per step.

Arrivals come off a heap of virtual events ordered as SimPy orders them
(``sim/engine/arrivals.py``).  The engine's clock runs ahead of the time of the event
it last resumed on while nothing else can happen; wherever it would take its next
event (the end of a step another event precedes, a finish, a wait) the arrivals
ordered before that event are handled first, so every schedule() and update sees the
requests a process per request would have added by then.  SimPy carries the engine's
waits (idle, nothing fits) and its clock follows when arrivals were handled; a step
that only finishes requests costs it nothing.

In a fleet (``sim/cluster``) several engines share one heap on one SimPy environment
through a ``Gate`` (``sim/engine/gate.py``): the heap's events run as SimPy events at
their exact keys, and an engine runs ahead only while no arrival (and, when follow-up
turns close the loop, no other engine's step end) comes first; otherwise it takes its
next event as a SimPy event at its key.  Without follow-up turns a decode jump runs past
the arrivals, and one routed to its engine cuts it (``cuttable``).  Each replica then steps
exactly as it would alone on the arrivals it was handed.

Each step the engine hands the backend a step plan (``sim.engine.step_plan.StepPlan``: the
scheduled items, with the drafts each accepts, the tokens it keeps and whether it finishes)
and gets the step's duration back; the backend sees nothing else of the engine or the
scheduler.  Observers (``EngineObserver``) see each step and each finish; none costs
nothing.

Time is kept in integer nanoseconds so that a jump over k steps lands on
exactly the instant k single steps would reach (float sums are not
associative); outputs convert back to seconds.
"""
from __future__ import annotations

from typing import Any, Callable, Final, Generator, Iterable, Protocol, cast

import simpy
from librt.vecs import append
from mypy_extensions import i64

from backends.analytical import CostModel
from backends.base import StepBackend
from sim.errors import CapacityError
from sim.engine.arrivals import (NEVER, NORMAL, WAKE_ARMED, WAKE_NONE, Arrival, Arrivals, Inlet,
                                 Turn, ns)
from sim.engine.gate import Gate
from sim.engine.record import Recorder, RequestMaker, StepSampler
from sim.engine.scheduler import ScheduledItem, Scheduler, SimRequest
from sim.engine.step_cost import DecodeTimes, StepCost
from sim.engine.step_plan import StepItem, StepPlan

Process = Generator[simpy.Event, Any, None]
# Empty steps in a row, with no other event pending, after which the replay cannot
# progress: a retry sees the same state (the one thing an empty step changes is a Mamba
# state cached in the step before, handed out one step later; a request that preempted
# itself is re-admitted a step later).
STALL_LIMIT: Final = 3


class EngineObserver(Protocol):
    """What watches an engine: each step as planned (its items, start and end ns, how
    many steps it stands for) and each finished request.  Held as a list; an empty list
    costs nothing."""

    def on_step(self, items: list[ScheduledItem], start: int, end: int, k: int) -> None: ...

    def on_finish(self, req: SimRequest, now: int) -> None: ...


class FinishObserver(Protocol):
    """What watches an engine's finished requests only."""

    def on_finish(self, req: SimRequest, now: int) -> None: ...


class Engine:
    def __init__(self, scheduler: Scheduler, backend: StepBackend,
                 make_request: Callable[[Any, int], SimRequest],
                 on_finish: Callable[[SimRequest], None], jump: bool = True,
                 progress: Callable[[int], None] | None = None,
                 env: simpy.Environment | None = None):
        self.env = env if env is not None else simpy.Environment()
        self.sched = scheduler
        self.backend = backend
        # The analytical model is timed natively by its compiled twin (a call through the
        # protocol costs ~550 CPU instructions in the compiled build, a few times a step;
        # the model itself, interpreted, far more): sim/engine/step_cost.py
        self.cost: StepCost | None = StepCost(backend) if isinstance(backend, CostModel) \
            else None
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
        # arrivals: the heap of virtual events (this engine's own, or a fleet's shared one)
        # and this engine's door to it
        self.inlet = Inlet(scheduler, None, make_request)
        self.arrivals = Arrivals(self.inlet)
        self.gate: Gate | None = None   # a fleet's (sim/engine/gate.py); None: alone
        # a fleet's without follow-up turns: decode jumps run past arrivals routed to other
        # replicas, cut back by one routed here (Gate.jump_wait / Gate.cut)
        self.cuttable = False
        self.steps = 0
        self.busy_ns: i64 = 0       # the steps' durations, summed (a fleet's per-replica busy)
        self.finished = 0
        self.rejected: list[SimRequest] = self.inlet.rejected   # refused on arrival
        self.on_step: Callable[[list[ScheduledItem], int, int, int], None] | None = None
        self.observers: list[EngineObserver] = []   # each step and finish (empty: no cost)
        # what wants the finished requests alone (a fleet's router counters): never
        # called per step (a call of a Python method costs ~600 CPU instructions)
        self.finish_observers: list[FinishObserver] = []
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
        conn = self.sched.connector
        if conn is not None:
            d += conn.step_stall()   # (the CPU tier: stores this step must flush first)
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

    # ------------------------------------------------------------------ engine --
    def _loop(self) -> Process:
        env = self.env
        sched = self.sched
        A = self.arrivals
        inlet = self.inlet
        gate = self.gate
        # The engine's clock.  It runs ahead of the time of the event it last resumed
        # on (``cur_t``) while nothing else can happen: when the next event (``peek``)
        # lies after the end of a step, that step's timeout would be the next event
        # anyway, so the engine applies the step at once and keeps going; it takes
        # its next event (``sync``, which first handles the arrivals ordered before
        # it) before anything a request could see: a finish (its done event), an
        # idle wait, or an event due by the end of the next step.  Every schedule()
        # and update sees the time it would have seen stepping one event at a time.
        # SimPy's clock follows when an arrival was handled, and carries every wait.
        # (In a fleet, ``sync`` and the waits go through the gate: see _fleet_*.)
        now = inlet.cur_t
        stalls = 0
        while True:
            if not sched.has_work():
                if gate is None:
                    if now > inlet.cur_t and A.sync(now):
                        yield env.timeout(now - int(env.now))
                    t = A.await_arrival(-1)   # (``yield wake``: the next arrival)
                    if t < 0:   # nothing will ever arrive: the replay is over
                        t = A.vq_now if A.vq_now > inlet.cur_t else inlet.cur_t
                        if t > env.now:
                            yield env.timeout(t - int(env.now))
                        return
                    yield env.timeout(t - int(env.now))
                else:
                    if now > inlet.cur_t and self._fleet_sync(now):
                        yield gate.at(inlet.cur_t, NORMAL, inlet.cur_s)
                    t = yield from self._fleet_wait(-1)
                    if t < 0:   # nothing will ever arrive in the fleet: the replay is over
                        inlet.pend_t = NEVER
                        t = inlet.cur_t
                        if t > env.now:
                            yield env.timeout(t - int(env.now))
                        return
                now = t
            items = sched.schedule(now)
            if not items:
                # Nothing fits this step (e.g. waiting on a state cached this
                # step): let time pass one step's overhead and retry.
                if now > inlet.cur_t:
                    if gate is None:
                        if A.sync(now):
                            yield env.timeout(now - int(env.now))
                    elif self._fleet_sync(now):
                        yield gate.at(inlet.cur_t, NORMAL, inlet.cur_s)
                # The progress guard: nothing else will ever happen (no arrival, no
                # follow-up turn, nothing finishing) and retries keep scheduling nothing.
                # vLLM would keep the request waiting forever; stop and say why.
                if ((A.peek() if gate is None else gate.quiet(inlet)) == NEVER
                        and not sched.transfers_pending()):
                    stalls += 1
                    if stalls >= STALL_LIMIT:
                        raise CapacityError(self.stuck_reason())
                else:
                    stalls = 0
                inlet.stalls = stalls
                # (``wake | timeout``: the step's overhead, or an arrival before it)
                limit = now + self.step_time(self.no_items, now)
                if gate is None:
                    A.seq += 1   # (the timeout)
                    s = A.seq
                    t = A.await_arrival(limit)
                    if t < limit:   # (the timeout stays queued, to no effect)
                        A.stale(limit, s)
                    yield env.timeout(t - int(env.now))
                else:
                    t = yield from self._fleet_wait(limit)
                now = t
                continue
            stalls = 0
            k, total = self._jump_steps(items, now) if self.jump else (1, 0)
            end = now + (total if k > 1 else self.step_time(items, now))
            if k > 1 and self.cuttable and end >= cast(Gate, gate).bound(inlet):
                # a jump past the fleet's arrivals (an arrival routed here cuts it)
                now = yield from self._fleet_jump(items, now, k, end)
            else:   # (_tell's body inline: the single engine's hot path)
                self.busy_ns += end - now
                sampler = self.sampler
                if sampler is not None:
                    sampler.step(items, now, end, k)
                if self.on_step is not None: self.on_step(items, now, end, k)  # noqa: E701
                if self.observers:
                    for o in self.observers:
                        o.on_step(items, now, end, k)
                # another event is due by the end of this step: take the step's end as an event
                if gate is None:
                    if end >= A.peek() and A.sync(end):
                        yield env.timeout(end - int(env.now))
                elif end >= gate.bound(inlet) and self._fleet_sync(end):
                    yield gate.at(end, NORMAL, inlet.cur_s)
                now = end
                if k > 1:
                    self._run_jump(items, k)
                else:
                    self.steps += 1
                    finished = sched.update_from_output(items, now)
                    if finished:
                        if now > inlet.cur_t:   # finish at its time
                            if gate is None:
                                if A.sync(now):
                                    yield env.timeout(now - int(env.now))
                            elif self._fleet_sync(now):
                                yield gate.at(now, NORMAL, inlet.cur_s)
                        self._record_finished(finished, now)
            # Requests arriving at this very instant join before the next
            # schedule(), as vLLM adds new requests before each step: every
            # event already queued for this instant runs first (done events
            # included).  (When the clock ran ahead, nothing is due before the
            # next step's end.)
            if now == inlet.cur_t:
                if gate is None:
                    if (inlet.done_quiet or A.peek() <= now) and A.sync(now):
                        yield env.timeout(now - int(env.now))
                elif (inlet.done_quiet or gate.bound(inlet) <= now) and self._fleet_sync(now):
                    yield gate.at(now, NORMAL, inlet.cur_s)

    def _fleet_jump(self, items: list[ScheduledItem], now: int, k: int, end: int
                    ) -> Generator[simpy.Event, Any, int]:
        """A decode jump of ``k`` steps from ``now`` to ``end`` that runs past the fleet's
        arrivals: it waits for its end as one SimPy event, which an arrival routed here moves
        back to the end of the step the arrival falls in (the gate's ``cut``).  Its steps
        are then told and applied as the replica alone would have run them: the steps before
        that one as one jump, then that one alone; with the queue as it stood at their start
        (nobody waited: a jump).  Returns the time the engine goes on from."""
        sched = self.sched
        inlet = self.inlet
        gate = cast(Gate, self.gate)
        queued: i64 = len(sched.waiting) + len(sched.holding)
        self._fleet_sync(end)
        inlet.jump_k = k
        inlet.jump_end = end
        inlet.jump_s0 = sched.step_index
        yield gate.jump_wait(inlet)
        k = inlet.jump_k
        end = inlet.jump_end
        inlet.jump_k = 0
        if inlet.jump_cut:
            inlet.jump_cut = False
            if k > 1:
                mid: i64 = inlet.jump_ends[k - 2]
                self._tell(items, now, mid, k - 1, queued)
                self._run_jump(items, k - 1)
                now = mid
                k = 1
        self._tell(items, now, end, k, queued)
        # (the last step's drafts: as the jump accepts them, whatever schedule() decided)
        self._run_jump(items, k)
        return end

    def _tell(self, items: list[ScheduledItem], start: int, end: int, k: int,
              queued: i64) -> None:
        """A step (``k`` > 1: a jump of k) to its watchers: the busy time, the sampler (with
        the queue at its start when told, -1: read it), the plan hook, the observers."""
        self.busy_ns += end - start
        sampler = self.sampler
        if sampler is not None:
            sampler.step(items, start, end, k, queued)
        if self.on_step is not None: self.on_step(items, start, end, k)  # noqa: E701 (planned)
        if self.observers:
            for o in self.observers:
                o.on_step(items, start, end, k)

    def _record_finished(self, finished: list[SimRequest], now: int) -> None:
        """The requests a step finished, in order: recorded, told to the observers, their
        turns done (a follow-up turn may now arrive), their references dropped."""
        A = self.arrivals
        inlet = self.inlet
        for r in finished:
            self.finished += 1
            if self.cost is None:   # (a backend that reads plans)
                self.plan.finished.append(r.cache.request_id)
            rec = self.recorder
            if rec is not None:
                rec.finish(r)
            else:
                self.on_finish(r)
            if self.observers:
                for o in self.observers:
                    o.on_finish(r, now)
            if self.finish_observers:
                for f in self.finish_observers:
                    f.on_finish(r, now)
            A.done(inlet, now, cast(Turn, r.done_event))
            r.done_event = None   # (the turn holds its record: let it go)
            # (and the request and its step item, which point at each other,
            # go by reference counting, not as cyclic garbage)
            r.item = None
            if self.progress is not None:
                self.progress(self.finished)

    # ------------------------------------------------------------------ fleet --
    def _fleet_sync(self, t: int) -> bool:
        """In a fleet: the engine's timeout to ``t`` (the event it resumes on), created now;
        True when it must be taken as a SimPy event at its key (an arrival, or with
        follow-up turns another engine's step end, comes first: the gate runs those),
        False when nothing comes first and the engine goes on at once."""
        A = self.arrivals
        inlet = self.inlet
        gate = cast(Gate, self.gate)
        A.seq += 1
        s = A.seq
        inlet.cur_t = t
        inlet.cur_s = s
        if inlet.done_quiet:   # (the ends of the processes of turns done at once)
            inlet.done_quiet = False
            A.noop(t)
        if gate.bound(inlet) <= t:
            inlet.pend_t = t
            inlet.pend_s = s
            return True
        return False

    def _fleet_wait(self, limit: int) -> Generator[simpy.Event, Any, int]:
        """In a fleet: wait for an arrival (``limit`` < 0), or for an arrival or the
        timeout to ``limit``; returns the time the engine resumes (the gate sets its
        key), -1 when nothing will ever arrive."""
        inlet = self.inlet
        gate = cast(Gate, self.gate)
        inlet.bell = simpy.Event(self.env)
        inlet.wake_state = WAKE_ARMED
        if limit >= 0:
            A = self.arrivals
            A.seq += 1   # (the timeout)
            gate.wait(inlet, limit, A.seq)
        else:
            gate.wait(inlet, -1, 0)
        ended = yield inlet.bell
        inlet.wake_state = WAKE_NONE
        inlet.wait_limit = -2
        if ended:
            return -1
        return inlet.cur_t

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
        if not sched.quiet() or len(items) != len(sched.running):
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
        # KV events published: no step of the jump may cache at its update either (with
        # drafts, update_from_output caches once the computed tokens leave the request's
        # cache mark), so that each event is published at its own step
        marks = sched.kv.event_log is not None and K > 0
        cm: i64 = NEVER     # max advance A(k) keeping every computed count below its mark
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
            if marks:
                m = r.cache_mark_end - 1 - comp
                if m < cm:
                    cm = m
            C0 += comp
        n = len(items)
        T = n * t
        TT = n * t * (t + 1)
        cuttable = self.cuttable
        horizon: i64 = (self.arrivals.horizon() if self.gate is None
                        else NEVER if cuttable else self.gate.bound(self.inlet))
        ends = self.inlet.jump_ends   # (each step's end: where an arrival may cut the jump)
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
            if a_next > fin or a_next > cm:
                break
            C = C0 + n * a_prev
            d: i64 = ns(times.at(C) if times is not None
                        else backend.time_from_sums(n, T, C, t * C, TT))
            if d < 1:
                d = 1
            if start + total + d >= horizon:
                break
            total += d
            if cuttable:
                if k < len(ends):
                    ends[k] = start + total
                else:
                    ends = append(ends, start + total)
            k += 1
            a_prev = a_next
        if cuttable:
            self.inlet.jump_ends = ends
        if k <= 1:
            return 1, 0
        return k, total

    def _decode_times(self, cost: StepCost, n: int, t: int) -> DecodeTimes:
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
        """Replay ``traces`` alone on this engine's own SimPy environment."""
        self.inlet.maker = self.maker
        self.arrivals.start(iter(traces))
        self.env.process(self._loop())
        self.env.run()

    def process(self) -> simpy.Process:
        """Start this engine's loop as a process on its environment (a fleet's, shared):
        the gate has started the shared arrivals."""
        self.inlet.maker = self.maker
        proc = self.env.process(self._loop())
        self.inlet.proc = proc
        return proc
