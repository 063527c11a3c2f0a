"""The SimPy replay: requests are processes, the engine is a loop of steps.

A *feeder* process reads the workload lazily and starts each request's
process at its arrival (a follow-up turn starts when its previous turn
finishes, plus think time).  The engine process runs the scheduler one step
at a time; each step lasts what the backend says.  While the batch is pure
decode and nothing can change (no arrival, no finish, no block boundary, no
waiting request) the engine advances many steps in one jump instead of one
event per step.

Time is kept in integer nanoseconds so that a jump over k steps lands on
exactly the instant k single steps would reach (float sums are not
associative); outputs convert back to seconds.
"""
from __future__ import annotations

import heapq
from typing import Callable, Iterable, Iterator

import simpy

from sim.cache.rules import cdiv
from sim.engine.scheduler import ScheduledItem, Scheduler, SimRequest


class Engine:
    def __init__(self, scheduler: Scheduler, step_time: Callable[[list[ScheduledItem]], float],
                 make_request: Callable[[object, int], SimRequest],
                 on_finish: Callable[[SimRequest], None], jump: bool = True,
                 progress: Callable[[int], None] | None = None):
        self.env = simpy.Environment()
        self.sched = scheduler
        self._step_time_s = step_time
        self.make_request = make_request
        self.on_finish = on_finish
        self.jump = jump
        self.progress = progress
        self.wake: simpy.Event | None = None
        self.next_arrival = float("inf")
        self.pending_followups: list[float] = []   # heap of known follow-up arrival times
        self.done_events: dict[str, simpy.Event] = {}
        self.steps = 0
        self.finished = 0

    def step_time(self, items) -> int:
        """Step duration in integer nanoseconds (at least 1)."""
        return max(1, round(self._step_time_s(items) * 1e9))

    # ---------------------------------------------------------------- requests --
    def _wake(self) -> None:
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def _request(self, trace, index: int, prev_done: simpy.Event | None):
        env = self.env
        if prev_done is not None:
            yield prev_done
            think = round(trace.think_s * 1e9)
            t = env.now + think
            heapq.heappush(self.pending_followups, t)
            yield env.timeout(think)
            heapq.heappop(self.pending_followups)
        r = self.make_request(trace, index)
        r.arrival_s = env.now
        r.done_event = env.event()
        self.done_events[trace.request_id] = r.done_event
        self.sched.add(r)
        self._wake()
        yield r.done_event
        self.done_events.pop(trace.request_id, None)

    def _feeder(self, traces: Iterator):
        env = self.env
        index = 0
        nxt = next(traces, None)
        while nxt is not None:
            trace = nxt
            arrival = round(trace.arrival_s * 1e9)
            if trace.after is None and arrival > env.now:
                self.next_arrival = arrival
                yield env.timeout(arrival - env.now)
            prev = self.done_events.get(trace.after) if trace.after else None
            if trace.after and prev is None:
                prev = env.event().succeed()  # previous turn already finished
            env.process(self._request(trace, index, prev))
            index += 1
            nxt = next(traces, None)
        self.next_arrival = float("inf")

    # ------------------------------------------------------------------ engine --
    def _loop(self):
        env = self.env
        sched = self.sched
        while True:
            if not sched.has_work():
                self.wake = env.event()
                yield self.wake
                self.wake = None
            items = sched.schedule(env.now)
            if not items:
                # Nothing fits this step (e.g. waiting on a state cached this
                # step): let time pass one step's overhead and retry.
                self.wake = env.event()
                yield self.wake | env.timeout(self.step_time([]))
                self.wake = None
                continue
            k = self._jump_steps(items) if self.jump else 1
            if k > 1:
                yield env.timeout(self._run_jump(items, k))
                continue
            yield env.timeout(self.step_time(items))
            self.steps += 1
            for r in sched.update_from_output(items, env.now):
                self.finished += 1
                self.on_finish(r)
                r.done_event.succeed()
                if self.progress is not None:
                    self.progress(self.finished)

    def _jump_steps(self, items: list[ScheduledItem]) -> int:
        """How many identical pure-decode steps can run without any event."""
        sched = self.sched
        if sched.waiting or len(items) != len(sched.running):
            return 1
        K = sched.cfg.num_speculative_tokens
        adv = 1 + K
        coord = sched.kv.coordinator
        if any(s.kind == "swa" for s in coord.specs):
            return 1  # the window slides inside a block: step it exactly
        bs = coord.scheduler_block_size
        k = 1 << 30
        for it in items:
            if it.is_prefill:
                return 1
            r = it.req
            c = r.cache
            remaining = r.max_tokens - r.num_output
            k = min(k, (remaining - 1) // adv)          # nobody finishes inside the jump
            slots = c.num_tokens + K        # slots the first step already allocated
            k = min(k, (cdiv(slots, bs) * bs - slots) // adv + 1)
        if k <= 1:
            return 1
        # the budget must not bind
        if len(items) * adv > sched.cfg.max_num_batched_tokens:
            return 1
        horizon = min(self.next_arrival,
                      self.pending_followups[0] if self.pending_followups else float("inf"))
        if horizon < float("inf"):
            t = self.env.now
            steps = 0
            while steps < k:
                t += self.step_time(items)
                if t >= horizon:
                    break
                steps += 1
            k = steps
        return max(k, 1)

    def _run_jump(self, items: list[ScheduledItem], k: int) -> float:
        """Run ``k`` decode steps without events; returns their total duration.

        The first step's slots were already allocated by ``schedule``; the
        following steps stay inside the same blocks, so allocation is a no-op
        and is skipped.
        """
        sched = self.sched
        total = 0
        for step in range(k):
            total += self.step_time(items)
            sched.update_from_output(items, self.env.now + total)
            self.steps += 1
            if step + 1 < k:
                for it in items:
                    it.context = it.req.cache.num_computed_tokens
        return total

    def run(self, traces: Iterable) -> None:
        self.env.process(self._feeder(iter(traces)))
        self.env.process(self._loop())
        self.env.run()
