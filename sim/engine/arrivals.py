"""Arrivals as SimPy would order them: the workload's records, read lazily, on the engine's
own heap of virtual events (the step loop is ``sim/engine/engine.py``).

Arrivals are not SimPy processes (one process per request cost ~6 SimPy events each).
``Arrivals`` reads the workload lazily, as a feeder process would, and keeps the events a
process-per-request replay would schedule -- the feeder's wake-ups, a follow-up turn's
think time (it starts ``think_s`` after its previous turn *finishes*: closed loop), the
done event of each finished or rejected turn -- on a heap of virtual events keyed as SimPy
keys its queue (time, priority, creation order: ``seq`` counts creations as SimPy's event
ids do, the engine's own included).  Wherever an engine would take its next event (the
end of a step another event precedes, a finish, a wait) it first handles every virtual
event SimPy would have run before that one (``sync``, ``await_arrival``), so each
schedule() and update sees the same requests, added in the same order, at the same
integer-ns instants, as with one process per request (ties included: a request arriving
as a step ends joins before the next schedule(); a follow-up turn whose previous turn
finishes at that instant with no think time arrives then, after the step planned at that
instant).

An engine reaches the heap through its ``Inlet`` (its scheduler, its request maker, the
key of the event it last resumed on, its wait for an arrival).  One engine alone owns the
heap and drains it itself.  A fleet (``sim/cluster``) shares one heap among several
engines: a ``router`` names the inlet each arrival goes to, and a ``gate``
(``sim/engine/gate.py``) runs the heap's events as SimPy events at their exact keys, so
that every engine and the router see one order of events, as in one SimPy replay.
"""
from __future__ import annotations

import heapq
import math
from typing import Any, Callable, Final, Iterator, Protocol, cast

from librt.vecs import vec
from mypy_extensions import i64

from sim.engine.record import RequestMaker
from sim.engine.scheduler import Scheduler, SimRequest

NEVER: Final = (1 << 62) - 1   # "no such time" on the integer-ns clock (146 years; the
                               # largest machine-size int of the compiled build)

# SimPy's event priorities, and the kinds of virtual events
URGENT: Final = 0
NORMAL: Final = 1
FEED: Final = 0       # the feeder wakes at the next record's arrival
DONE: Final = 1       # a finished turn's done event
ARRIVE: Final = 2     # a follow-up turn's think time is over: it arrives
REJECTED: Final = 3   # the done event of a turn rejected on arrival
RESUME: Final = 4     # a follow-up whose previous turn had already finished resumes
START: Final = 5      # the turns of the feeder's first run (before the engine's start)
STALE: Final = 6      # the engine's timeout, unused: its wait ended on an arrival
# an engine's wait for an arrival: none, waiting, woken, ended otherwise (a wake-up is a no-op)
WAKE_NONE: Final = 0
WAKE_ARMED: Final = 1
WAKE_FIRED: Final = 2
WAKE_LATE: Final = 3


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
    index: int


class Turn:
    """One workload record on its way in: the request's process of a
    process-per-request replay, as state (its follow-ups wait in ``waiters``)."""

    __slots__ = ("trace", "index", "prev", "waiters", "batch")

    def __init__(self, trace: Arrival, index: int):
        self.trace = trace
        self.index = index
        self.prev: Turn | None = None            # the previous turn it waits for
        self.waiters: list[Turn] | None = None   # follow-ups waiting for this one
        self.batch: list[Turn] | None = None     # (START: the feeder's first run)


class Inlet:
    """One engine's door for arrivals: where a request is made and queued, the key of the
    event the engine last resumed on, and its wait for an arrival."""

    def __init__(self, sched: Scheduler, maker: RequestMaker | None,
                 make_request: Callable[[Any, int], SimRequest]):
        self.sched = sched
        self.maker = maker
        self.make_request = make_request
        self.rejected: list[SimRequest] = []   # refused on arrival (see Scheduler.add)
        self.cur_t: i64 = 0         # key (time, seq) of the event the engine resumed on
        self.cur_s: i64 = 0
        self.done_quiet = False     # a turn's done event was handled at once (see done)
        self.wake_state: i64 = WAKE_NONE
        self.wake_t: i64 = 0        # key of the wake-up event, once fired
        self.wake_s: i64 = 0
        # a fleet's (sim/engine/gate.py): the engine's place, the limit of its wait (-1:
        # none, -2: not waiting), the SimPy event it waits on, its pending resume key
        self.replica: i64 = 0
        self.wait_limit: i64 = -2
        self.wait_id: i64 = 0
        self.stalls: i64 = 0        # empty retries in a row (the progress guard's count)
        self.bell: Any = None
        self.pend_t: i64 = NEVER
        self.pend_s: i64 = 0
        # a decode jump that runs past the fleet's arrivals (``Gate.jump_wait``): its steps
        # (0: none), end, the step index it began at, each step's end ns (filled by the
        # engine)
        self.jump_k: i64 = 0
        self.jump_end: i64 = 0
        self.jump_s0: i64 = 0
        self.jump_ends: vec[i64] = vec[i64]()
        self.jump_cut = False       # an arrival routed here fell inside it
        self.proc: Any = None       # the engine's SimPy process (a cut moves its wait)


class Arrivals:
    """The virtual event heap ``vq`` of ``(time ns, priority, seq, kind, turn)``, ordered as
    SimPy would order the events of a process-per-request replay (time, then URGENT before
    NORMAL, then creation order), and the lazy feeder that fills it."""

    def __init__(self, inlet: Inlet):
        self.inlet = inlet          # the engine alone (a fleet's router names one per arrival)
        self.router: Any = None     # a fleet's: route(t, trace) -> Inlet; placed(inlet, req, ok)
        self.gate: Any = None       # a fleet's: runs the heap's events at their SimPy keys
        self.vq: list[tuple[int, int, int, int, Turn]] = []
        self.seq = 0
        self.done_events: dict[str, Turn] = {}   # turns not yet finished, by request id
        self.feed: Iterator[Arrival] = iter(())
        self.feed_index = 0
        # a fleet's pre-routed feed: each record carries its place in the fleet's arrival
        # order (``index``), the order its request is kept in
        self.indexed = False
        self.vq_now = 0             # time of the latest virtual event handled
        self.noop_t = -1            # key of the latest no-op event (see noop)
        self.noop_s = -1
        self.next_arrival = NEVER   # time of the next known arrival (ns)
        self.pending_followups: list[int] = []   # heap of known follow-up arrival times (ns)
        self.nobody = Turn(cast(Arrival, None), -1)   # (payload of STALE events)

    def _push(self, t: int, prio: int, s: int, kind: int, turn: Turn) -> None:
        heapq.heappush(self.vq, (t, prio, s, kind, turn))
        if self.gate is not None:   # (a fleet: the event runs at its SimPy key)
            self.gate.pushed(t, prio, s)

    # ------------------------------------------------------------------ feeder --
    def start(self, traces: Iterator[Arrival], engines: int = 1) -> None:
        """The feeder's first run at time 0: the records due then, behind the engines'
        own starts (SimPy starts the feeder's process, then each engine's)."""
        self.feed = traces
        self.seq = 1 + engines
        self.inlet.cur_t = 0
        self.inlet.cur_s = self.seq
        batch = self.feed_at(0, None)
        if batch:   # the first run's turns start behind the engines' own start (URGENT)
            self.seq += 1
            batch[0].batch = batch
            self._push(0, URGENT, self.seq, START, batch[0])

    def feed_at(self, t: int, turn: Turn | None) -> list[Turn]:
        """The feeder at ``t``: ``turn`` (the record it waited for; None: its first
        run) and every following record due by ``t`` or following up a previous turn,
        read lazily; returns them, in trace order, and arms its next wake-up."""
        batch: list[Turn] = []
        if turn is None:
            turn = self._next_turn(t)
        done = self.done_events
        while turn is not None:
            trace = turn.trace
            if trace.after:   # (a follow-up turn: it waits for the previous one to finish)
                prev = done.get(trace.after)
                if prev is None:   # previous turn already finished: it resumes at once
                    self.seq += 1
                    self._push(t, NORMAL, self.seq, RESUME, turn)
                else:
                    turn.prev = prev
            # registered now, not when the turn arrives: the next record may be its follow-up
            done[trace.request_id] = turn
            batch.append(turn)
            turn = self._next_turn(t)
        return batch

    def _next_turn(self, t: int) -> Turn | None:
        """The feeder's next record, when it joins at ``t``; None when it arrives later
        (the feeder's wake-up is armed) or the workload is over."""
        nxt = next(self.feed, None)
        if nxt is None:
            self.next_arrival = NEVER
            self.noop(t)   # (the feeder process's end)
            return None
        turn = Turn(nxt, nxt.index if self.indexed else self.feed_index)
        self.feed_index += 1
        if nxt.after is None:
            arrival = ns(nxt.arrival_s)
            if arrival > t:
                self.next_arrival = arrival
                self.seq += 1
                self._push(arrival, NORMAL, self.seq, FEED, turn)
                return None
        return turn

    def noop(self, t: int) -> None:
        """An event that only occupies SimPy's queue (a process's end, an unused wake):
        remembered for ``peek`` (the progress guard sees it)."""
        self.seq += 1
        self.noop_t = t
        self.noop_s = self.seq

    def _start(self, t: int, batch: list[Turn]) -> None:
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

    def _arrive(self, t: int, turn: Turn) -> None:
        router = self.router
        inlet = self.inlet if router is None else cast(Inlet, router.route(t, turn.trace))
        maker = inlet.maker
        r = (maker.make(turn.trace, turn.index) if maker is not None
             else inlet.make_request(turn.trace, turn.index))
        r.arrival_ns = t
        r.done_event = turn
        ok = inlet.sched.add(r)
        if ok and inlet.jump_k > 0:   # (its engine is inside a jump past the arrivals)
            cast(Any, self.gate).cut(inlet, t, r)
        if router is not None:
            router.placed(inlet, r, ok)
        if not ok:
            # rejected on arrival (prompt too long for max_model_len): never scheduled;
            # a follow-up turn still comes after its think time
            r.done_event = None
            inlet.rejected.append(r)
            self.seq += 1
            self._push(t, NORMAL, self.seq, REJECTED, turn)
            rid = turn.trace.request_id
            if rid in self.done_events:   # (in + del: dict.pop is a generic call when compiled)
                del self.done_events[rid]
            self.noop(t)
        else:
            w = inlet.wake_state
            if w == WAKE_ARMED:           # the engine waits for an arrival: resume it here
                self.seq += 1
                inlet.wake_t = t
                inlet.wake_s = self.seq
                inlet.wake_state = WAKE_FIRED
                if self.gate is not None:
                    self.gate.woken(inlet)
            elif w == WAKE_LATE:          # its wait already ended: the wake-up is a no-op
                self.noop(t)
                inlet.wake_state = WAKE_FIRED

    def _resume_followups(self, t: int, waiters: list[Turn]) -> None:
        """Previous turn finished at ``t``: each follow-up arrives its think time later."""
        for turn in waiters:
            a = t + ns(turn.trace.think_s)
            heapq.heappush(self.pending_followups, a)
            self.seq += 1
            self._push(a, NORMAL, self.seq, ARRIVE, turn)

    def _handle(self, ev: tuple[int, int, int, int, Turn]) -> None:
        t, _, _, kind, turn = ev
        if t > self.vq_now:
            self.vq_now = t
        if kind == FEED:
            self._start(t, self.feed_at(t, turn))
        elif kind == DONE:   # a finished turn's done event: its process ends, follow-ups resume
            rid = turn.trace.request_id
            if rid in self.done_events:
                del self.done_events[rid]
            self.noop(t)
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

    def drain(self, t: int, prio: int, s: int) -> bool:
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

    # ----------------------------------------------------------- engine alone --
    def sync(self, t: int) -> bool:
        """The engine's timeout to ``t`` (the event it resumes on): the arrivals ordered
        before it are handled first.  True when there were any (SimPy's clock follows
        then; otherwise nothing but the engine ran in between)."""
        self.seq += 1
        s = self.seq
        handled = self.drain(t, NORMAL, s)
        inlet = self.inlet
        inlet.cur_t = t
        inlet.cur_s = s
        if inlet.done_quiet:   # (the ends of the processes of turns done at once)
            inlet.done_quiet = False
            self.noop(t)
        return handled

    def await_arrival(self, limit: int) -> int:
        """Handle arrivals until one wakes the engine (``wake``; with ``limit`` >= 0,
        ``wake | timeout`` to ``limit``, that timeout being the newest event); returns
        the time the engine resumes, -1 when nothing will ever wake it."""
        inlet = self.inlet
        s_lim = self.seq
        inlet.wake_state = WAKE_ARMED
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
            if inlet.wake_state == WAKE_FIRED and inlet.wake_t != limit:
                t = inlet.wake_t
                s = inlet.wake_s
                self.drain(t, NORMAL, s)
                if limit >= 0:   # the condition event, scheduled as the wake is handled
                    self.seq += 1
                    s = self.seq
                    self.drain(t, NORMAL, s)
                inlet.cur_t = t
                inlet.cur_s = s
                inlet.wake_state = WAKE_NONE
                return t
        if limit < 0:
            inlet.wake_state = WAKE_NONE
            return -1
        # the timeout fires first: the condition event is scheduled then (a wake-up
        # from now on, before the engine resumes, is a no-op)
        if inlet.wake_state == WAKE_ARMED:
            inlet.wake_state = WAKE_LATE
        self.seq += 1
        s = self.seq
        self.drain(limit, NORMAL, s)
        inlet.cur_t = limit
        inlet.cur_s = s
        inlet.wake_state = WAKE_NONE
        return limit

    def peek(self) -> int:
        """The time of the next event a process-per-request replay would have on
        SimPy's queue (NEVER: none): the virtual events (an unused timeout of the
        engine's included) and a no-op not yet handled."""
        vq = self.vq
        t = vq[0][0] if vq else NEVER
        inlet = self.inlet
        if self.noop_t == inlet.cur_t and self.noop_s > inlet.cur_s and self.noop_t < t:
            t = self.noop_t
        return t

    def stale(self, limit: int, s: int) -> None:
        """The engine's timeout to ``limit`` (created as ``s``), unused: its wait ended on
        an arrival; it stays queued, to no effect (``peek`` sees it)."""
        heapq.heappush(self.vq, (limit, NORMAL, s, STALE, self.nobody))

    def horizon(self) -> int:
        """The next known arrival (a record's or a follow-up turn's): a decode jump ends
        strictly before it."""
        h = self.next_arrival
        pf = self.pending_followups
        if pf and pf[0] < h:
            h = pf[0]
        return h

    def done(self, inlet: Inlet, t: int, turn: Turn) -> None:
        """The done event of ``turn``, finished at ``t`` on ``inlet``'s engine.  Handled at
        once when nobody could be waiting for it (no follow-up registered, no feeder
        wake-up due at ``t`` that could register one): its one effect, besides the end of
        the turn's process (a no-op after the next event, ``done_quiet``), is that a later
        follow-up record finds the turn finished."""
        if turn.waiters is None and self.next_arrival != t:
            rid = turn.trace.request_id
            if rid in self.done_events:
                del self.done_events[rid]
            inlet.done_quiet = True
        else:
            self.seq += 1
            self._push(t, NORMAL, self.seq, DONE, turn)
