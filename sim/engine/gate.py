"""A fleet's clock: several engines sharing one heap of arrivals on one SimPy environment.

Alone, an engine drains its heap of virtual arrival events itself (``Arrivals.sync``).  In
a fleet (``sim/cluster``) the heap is shared, and who drains it decides what every replica
sees, so the gate runs each virtual event as a SimPy event at its exact key: SimPy orders
its queue by (time, priority, event id), and the gate gives each event the priority
``prio * KEY + seq``, so SimPy's order is the heap's order (time, URGENT before NORMAL,
creation order) across all engines.  An arrival is then handled, and routed, when every
engine has done exactly what comes before it.

Each engine still runs ahead of SimPy's clock while nothing can come first: until the
heap's next event (``bound``), and, when follow-up turns close the loop (a turn arrives
its think time after a previous turn finishes, maybe on another replica), until any other
engine's pending event.  Otherwise it takes its next event as a SimPy event at its key
(``at``), and waits for an arrival or a timeout on a bell the gate rings at the wake's key
(``wait``, ``woken``).  A replica thus steps exactly as it would alone on the arrivals it
was handed.

A decode jump (nobody waits, finishes, crosses a block or publishes an event) changes
nothing a router reads: the replica's queues, its pool and its events stay as they were
when it began.  Without follow-up turns an engine's jump therefore runs past the fleet's
arrivals (``jump_wait``): it ends on one event at its last step's end, and only an arrival
routed to that engine cuts it (``cut``) back to the step the arrival falls in -- the steps
that began before it run, as stepping one by one would have run them -- so arrivals sent
elsewhere cost the engine nothing.
"""
from __future__ import annotations

from typing import Any, Final, cast

import simpy
from mypy_extensions import i64

from sim.engine.arrivals import (NEVER, NORMAL, WAKE_ARMED, WAKE_FIRED, WAKE_LATE, Arrivals,
                                 Inlet)

KEY: Final = 1 << 48      # priority = prio * KEY + seq (seq < 2**48 in any run)


class Gate:
    """The engines of one fleet, their shared arrivals, and the SimPy keys they meet at."""

    def __init__(self, env: simpy.Environment, arrivals: Arrivals, closed_loop: bool):
        self.env = env
        self.arrivals = arrivals
        # follow-up turns may arrive on any replica after a finish on another: each engine
        # then also waits for the others' pending events
        self.closed_loop = closed_loop
        self.inlets: list[Inlet] = []
        self.idle: i64 = 0          # engines waiting for an arrival with nothing else due
        self.waits: i64 = 0         # waits begun (a timeout names its wait)
        self.ended = False
        arrivals.gate = self

    def add(self, inlet: Inlet) -> None:
        inlet.replica = len(self.inlets)
        self.inlets.append(inlet)

    def start(self) -> None:
        """Every engine resumes from the feeder's first run's key (``Arrivals.start``)."""
        A = self.arrivals
        for inlet in self.inlets:
            inlet.cur_t = 0
            inlet.cur_s = A.inlet.cur_s

    # ------------------------------------------------------------- SimPy keys --
    def at(self, t: int, prio: int, s: int) -> simpy.Event:
        """A SimPy event at key (``t``, ``prio``, ``s``): after every event ordered before
        it, whichever engine or arrival it belongs to."""
        env = self.env
        ev = simpy.Event(env)
        ev._ok = True
        ev._value = None
        cast(Any, env).schedule(ev, prio * KEY + s, t - int(env.now))
        return ev

    def pushed(self, t: int, prio: int, s: int) -> None:
        """A virtual event was queued at (``t``, ``prio``, ``s``): it runs at that key."""
        ev = self.at(t, prio, s)
        ev._value = (t, prio, s)
        ev.callbacks.append(self._run)

    def _run(self, ev: Any) -> None:
        t, prio, s = ev._value
        A = self.arrivals
        A.drain(t, prio, s)
        if not A.vq:
            self._maybe_end()

    def bound(self, inlet: Inlet) -> int:
        """The time before which ``inlet``'s engine may act without a SimPy event: the next
        arrival event, and with closed loops the other engines' pending events."""
        vq = self.arrivals.vq
        b: i64 = vq[0][0] if vq else NEVER
        if self.closed_loop:
            for o in self.inlets:
                if o is not inlet and o.pend_t < b:
                    b = o.pend_t
        return b

    def quiet(self, inlet: Inlet) -> int:
        """NEVER when nothing else can ever happen in the fleet (no arrival event, every
        other engine waiting for one or stuck retrying): the progress guard's test."""
        if self.arrivals.vq:
            return 0
        for o in self.inlets:
            if o is not inlet and o.wait_limit != -1 and not (o.wait_limit >= 0 and o.stalls > 0):
                return 0
        return NEVER

    # ------------------------------------------------------------------ waits --
    def wait(self, inlet: Inlet, limit: int, s: int) -> None:
        """``inlet``'s engine waits on its bell for an arrival (``limit`` < 0) or for an
        arrival or its timeout to ``limit`` (created as ``s``)."""
        self.waits += 1
        inlet.wait_id = self.waits
        inlet.wait_limit = limit
        if limit < 0:
            inlet.pend_t = NEVER
            self.idle += 1
            self._maybe_end()
            return
        inlet.pend_t = limit
        inlet.pend_s = s
        ev = self.at(limit, NORMAL, s)
        ev._value = (inlet, self.waits)
        ev.callbacks.append(self._timeout)

    def _timeout(self, ev: Any) -> None:
        """An engine's timeout: it resumes at ``limit`` unless an arrival woke it first."""
        inlet, wid = ev._value
        limit = inlet.wait_limit
        if inlet.wait_id != wid or limit < 0:
            return              # (its wait ended on an arrival: the timeout is no-op)
        if inlet.wake_state == WAKE_FIRED and inlet.wake_t != limit:
            return              # (woken before: it resumes at the wake)
        if inlet.wake_state == WAKE_ARMED:
            inlet.wake_state = WAKE_LATE   # (a wake-up from now on is a no-op)
        A = self.arrivals
        A.seq += 1              # the condition event, scheduled as the timeout fires
        self._resume(inlet, limit, A.seq)

    def woken(self, inlet: Inlet) -> None:
        """An arrival woke ``inlet``'s engine at its wake key (``Arrivals._arrive``)."""
        t = inlet.wake_t
        limit = inlet.wait_limit
        if limit < 0:
            self.idle -= 1
            self._resume(inlet, t, inlet.wake_s)
        elif t != limit:        # (at the timeout's instant the timeout resumes it)
            # the condition event is scheduled as the wake is handled
            ev = self.at(t, NORMAL, inlet.wake_s)
            ev._value = inlet
            ev.callbacks.append(self._condition)
        inlet.pend_t = t
        inlet.pend_s = inlet.wake_s

    def _condition(self, ev: Any) -> None:
        inlet = ev._value
        A = self.arrivals
        A.seq += 1
        self._resume(inlet, inlet.wake_t, A.seq)

    def _resume(self, inlet: Inlet, t: int, s: int) -> None:
        """Ring ``inlet``'s bell at key (``t``, NORMAL, ``s``): its engine resumes there."""
        inlet.cur_t = t
        inlet.cur_s = s
        inlet.pend_t = t
        inlet.pend_s = s
        bell = inlet.bell
        env = self.env
        bell._ok = True
        bell._value = False
        cast(Any, env).schedule(bell, NORMAL * KEY + s, t - int(env.now))

    # ------------------------------------------------------------------ jumps --
    def jump_wait(self, inlet: Inlet) -> simpy.Event:
        """``inlet``'s engine waits out its jump (``inlet.jump_*``; its resume key, the
        jump's end, set by ``_fleet_sync``): one SimPy event there, which a cut replaces."""
        return self.at(inlet.cur_t, NORMAL, inlet.cur_s)

    def cut(self, inlet: Inlet, t: int, r: Any) -> None:
        """Request ``r`` arrived at ``t`` on ``inlet``'s engine, inside its jump: the steps
        that began before ``t`` run (step 0 began at the jump's start, before any arrival it
        runs past), and ``r`` joins before the next one, as stepping would have had it;
        ``r`` saw the step index of the steps that ended before ``t``.  (An arrival at the
        jump's very end is inside too: alone, the replica's jump would have stopped a step
        short of it.  A later arrival comes after the jump's end event, which ends the jump.)"""
        inlet.jump_cut = True
        ends = inlet.jump_ends
        lo: i64 = 0
        hi: i64 = inlet.jump_k - 1      # (ends[k - 1], the jump's end, is past t)
        while lo < hi:
            mid = (lo + hi) // 2
            if ends[mid] >= t:
                hi = mid
            else:
                lo = mid + 1
        r.arrival_step = inlet.jump_s0 + lo
        if lo + 1 < inlet.jump_k:
            A = self.arrivals
            A.seq += 1
            inlet.jump_k = lo + 1
            inlet.jump_end = ends[lo]
            inlet.cur_t = ends[lo]
            inlet.cur_s = A.seq
            inlet.pend_t = ends[lo]
            inlet.pend_s = A.seq
            # the engine's process now waits for an event at the new end; the old one
            # fires to no one
            proc = inlet.proc
            old = proc._target
            old.callbacks.remove(proc._resume)
            ev = self.at(ends[lo], NORMAL, A.seq)
            ev.callbacks.append(proc._resume)
            proc._target = ev

    def _maybe_end(self) -> None:
        """Nothing queued and every engine waiting for an arrival: none will come."""
        if self.ended or self.arrivals.vq or self.idle != len(self.inlets):
            return
        self.ended = True
        for inlet in self.inlets:
            inlet.wait_limit = -2
            inlet.bell.succeed(True)
