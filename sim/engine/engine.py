"""The SimPy replay: requests are processes, the engine is a loop of steps.

A *feeder* process reads the workload lazily and starts each request's
process at its arrival (a follow-up turn starts when its previous turn
finishes, plus think time).  The engine process runs the scheduler one step
at a time; each step lasts what the backend says.  While the batch is pure
decode and nothing can change (no arrival, no finish, no block boundary, no
waiting request) the engine advances many steps in one jump instead of one
event per step.

Each step the engine hands the backend a step plan (``backends.base.StepPlan``: the
scheduled items, with the drafts each accepts, the tokens it keeps and whether it finishes)
and gets the step's duration back; the backend sees nothing else of the engine or the
scheduler.

Time is kept in integer nanoseconds so that a jump over k steps lands on
exactly the instant k single steps would reach (float sums are not
associative); outputs convert back to seconds.
"""
from __future__ import annotations

import heapq
import math
from typing import Any, Callable, Final, Generator, Iterable, Iterator, Protocol, cast

import simpy

from backends.analytical import CostModel
from backends.base import StepBackend, StepItem, StepPlan
from sim.config.errors import CapacityError
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
        self.plan = StepPlan()   # refilled every step
        self.no_items: list[ScheduledItem] = []
        self.make_request = make_request
        self.on_finish = on_finish
        self.jump = jump and backend.jumps
        self.progress = progress
        self.wake: simpy.Event | None = None
        self.next_arrival = NEVER   # time of the next known arrival (ns)
        self.pending_followups: list[int] = []   # heap of known follow-up arrival times (ns)
        self.done_events: dict[str, simpy.Event] = {}
        self.steps = 0
        self.finished = 0
        self.rejected: list[SimRequest] = []   # refused on arrival (see Scheduler.add)
        self.on_step: Callable[[list[ScheduledItem], int, int, int], None] | None = None

    def step_time(self, items: list[ScheduledItem], now: int) -> int:
        """Duration (integer nanoseconds, at least 1) of the step of ``items`` starting at
        ``now``, as the backend times its plan."""
        plan = self.make_plan(items, now)
        cost = self.cost
        d = ns(cost.step_time(plan) if cost is not None else self.backend.step_time(plan))
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

    # ---------------------------------------------------------------- requests --
    def _wake(self) -> None:
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def _request(self, trace: Arrival, index: int, prev_done: simpy.Event | None,
                 done: simpy.Event) -> Process:
        env = self.env
        if prev_done is not None:
            yield prev_done
            think = ns(trace.think_s)
            t = int(env.now) + think   # (the clock is integer ns throughout)
            heapq.heappush(self.pending_followups, t)
            yield env.timeout(think)
            heapq.heappop(self.pending_followups)
        r = self.make_request(trace, index)
        r.arrival_ns = int(env.now)   # (always an int: every delay is integer ns)
        r.done_event = done
        if not self.sched.add(r):
            # rejected on arrival (prompt too long for max_model_len): never scheduled;
            # a follow-up turn still comes after its think time
            self.rejected.append(r)
            done.succeed()
        else:
            self._wake()
            yield done
        rid = trace.request_id
        if rid in self.done_events:   # (in + del: dict.pop is a generic call when compiled)
            del self.done_events[rid]

    def _feeder(self, traces: Iterator[Arrival]) -> Process:
        env = self.env
        index = 0
        nxt = next(traces, None)
        while nxt is not None:
            trace = nxt
            arrival = ns(trace.arrival_s)
            if trace.after is None and arrival > env.now:
                self.next_arrival = arrival
                yield env.timeout(arrival - env.now)
            prev = self.done_events.get(trace.after) if trace.after else None
            if trace.after and prev is None:
                prev = env.event().succeed()  # previous turn already finished
            # registered now, not when the request's process first runs: the next record
            # may be this request's follow-up, which must wait for it to finish
            done = self.done_events[trace.request_id] = env.event()
            env.process(self._request(trace, index, prev, done))
            index += 1
            nxt = next(traces, None)
        self.next_arrival = NEVER

    # ------------------------------------------------------------------ engine --
    def _loop(self) -> Process:
        env = self.env
        sched = self.sched
        # The engine's clock.  It runs ahead of env.now while nothing else can
        # happen: when the next event on SimPy's queue lies after the end of a
        # step, that step's timeout would be the next event anyway, so the
        # engine applies the step at once and keeps going; it hands the time to
        # SimPy (one timeout for all those steps) before anything another
        # process could see: a finish (its done event), an idle wait, or an
        # event due by the end of the next step.  Every schedule() and update
        # sees the time it would have seen stepping one event at a time.
        now = int(env.now)
        stalls = 0
        while True:
            if not sched.has_work():
                if now > env.now:
                    yield env.timeout(now - int(env.now))
                self.wake = env.event()
                yield self.wake
                self.wake = None
                now = int(env.now)
            items = sched.schedule(now)
            if not items:
                # Nothing fits this step (e.g. waiting on a state cached this
                # step): let time pass one step's overhead and retry.
                if now > env.now:
                    yield env.timeout(now - int(env.now))
                # The progress guard: nothing else will ever happen (no arrival, no
                # follow-up turn, nothing finishing) and retries keep scheduling nothing.
                # vLLM would keep the request waiting forever; stop and say why.
                if env.peek() == math.inf:
                    stalls += 1
                    if stalls >= STALL_LIMIT:
                        raise CapacityError(self.stuck_reason())
                else:
                    stalls = 0
                self.wake = env.event()
                yield self.wake | env.timeout(self.step_time(self.no_items, now))
                self.wake = None
                now = int(env.now)
                continue
            stalls = 0
            k, total = self._jump_steps(items, now) if self.jump else (1, 0)
            end = now + (total if k > 1 else self.step_time(items, now))
            if self.on_step is not None: self.on_step(items, now, end, k)  # noqa: E701 (planned)
            if end >= env.peek():
                # another event is due by the end of this step: SimPy orders them
                yield env.timeout(end - int(env.now))
            now = end
            if k > 1:
                self._run_jump(items, k)
            else:
                self.steps += 1
                finished = sched.update_from_output(items, now)
                if finished:
                    if now > env.now:
                        yield env.timeout(now - int(env.now))   # finish at its time
                    for r in finished:
                        self.finished += 1
                        self.plan.finished.append(r.cache.request_id)
                        self.on_finish(r)
                        r.done_event.succeed()
                        if self.progress is not None:
                            self.progress(self.finished)
            # Requests arriving at this very instant join before the next
            # schedule(), as vLLM adds new requests before each step: let every
            # event already queued for this instant run first (when there is
            # none, yielding would resume this loop at once: skip it).  (When
            # the clock ran ahead, nothing is due before the next step's end.)
            if now == env.now and env.peek() <= now:
                yield env.timeout(0)

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
        grow = NEVER        # max advance A(k-1) keeping every allocation key
        fin = NEVER         # max advance A(k) with nobody finishing
        pos = NEVER         # max advance A(k-1) keeping positions below max_model_len
        C0 = 0
        t = items[0].num_tokens
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
            g = (r.fast_until - comp if fast and r.fast_n == t and comp <= r.fast_until
                 else sched.alloc_margin(r.cache, comp, t))
            if g < grow:
                grow = g
            f = r.max_tokens - r.num_output - 1
            if f < fin:
                fin = f
            C0 += comp
        n = len(items)
        T = n * t
        TT = n * t * (t + 1)
        horizon = min(self.next_arrival,
                      self.pending_followups[0] if self.pending_followups else NEVER)
        total = 0
        k = 0
        s0 = sched.step_index
        num, den = sched.acc_num, sched.acc_den
        base = s0 * num // den
        backend = self.backend
        cost = self.cost
        a_prev = 0                      # advance before step k: positions of step k
        if pos < grow:
            grow = pos
        while True:
            if k > 0 and a_prev > grow:
                break
            a_next = k + 1 + (s0 + k + 1) * num // den - base
            if a_next > fin:
                break
            C = C0 + n * a_prev
            d = ns(cost.time_from_sums(n, T, C, t * C, TT) if cost is not None
                   else backend.time_from_sums(n, T, C, t * C, TT))
            if d < 1:
                d = 1
            if now + total + d >= horizon:
                break
            total += d
            k += 1
            a_prev = a_next
        if k <= 1:
            return 1, 0
        return k, total

    def _run_jump(self, items: list[ScheduledItem], k: int) -> None:
        self.sched.jump_decode(items, k)
        self.steps += k

    def run(self, traces: Iterable[Arrival]) -> None:
        self.env.process(self._feeder(iter(traces)))
        self.env.process(self._loop())
        self.env.run()
