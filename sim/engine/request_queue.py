"""Scheduler policies (``scheduler.policy``): the order of the waiting queue and the
choice of whom to preempt, one class per policy behind one small protocol, registered
by name.  Shaped like vLLM's ``vllm/v1/core/sched/request_queue.py`` (``add_request``,
``pop_request``, ``peek_request``, ``prepend_request``); vLLM keeps the preemption
victim in ``Scheduler.schedule`` behind an ``if policy``, here it is the policy's own
``victim`` so the scheduler has no policy branches.

* ``fcfs`` — vLLM's default: arrival order; a preempted request goes back to the front;
  the victim is the newest running request (``running[-1]``).
* ``priority`` — vLLM's ``--scheduling-policy priority``: a heap on (priority, arrival,
  arrival index), lower first; a preempted request goes back into the heap by the same
  key (there is no "front"); the victim is the running request with the largest
  (priority, arrival), whether or not it was already scheduled in this step.
* ``lpm`` — longest prefix match first (SGLang's cache-aware ``lpm`` policy; vLLM has no
  such policy): before each step's admissions the waiting requests are ordered by the
  prefix-cache hit they would get now, longest first, ties by arrival.  What it trades:
  requests that share nothing cached can wait without bound while a stream of cache
  hits keeps arriving, so a request that has waited ``lpm_max_wait_steps`` scheduler
  steps since it arrived goes ahead of every prefix ordering (in arrival order); and
  matching every waiting request costs one prefix lookup each per step, so past
  ``lpm_max_queue`` waiting requests it stops re-sorting: the queue keeps its last order,
  arrivals at the back (SGLang falls back the same way, past 128).  The starvation bound
  is ours (SGLang's LPM has none).  Victims and the return of a preempted request are
  FCFS's.

The FCFS queue subclasses ``deque`` and binds its protocol names to the C methods, so
the default policy costs what the plain deque did (this module is not compiled: mypyc
cannot subclass ``deque``).
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

if TYPE_CHECKING:
    from sim.cache.kv_manager import KVCacheManager
    from sim.config.scheduler import SchedulerConfig
    from sim.engine.scheduler import SimRequest


class RequestQueue(Protocol):
    """What the scheduler (and the engine's stuck report) use of a waiting queue."""

    #: True when ``order`` must run before each step's admissions (the scheduler reads
    #: it once; a queue that keeps its order as it goes leaves it False)
    reorders: bool

    def add_request(self, r: SimRequest) -> None: ...
    def pop_request(self) -> SimRequest: ...
    def peek_request(self) -> SimRequest: ...
    def prepend_request(self, r: SimRequest) -> None:
        """A preempted request returns (FCFS: to the front)."""
    def victim(self, running: list[SimRequest]) -> int:
        """Index in ``running`` of the request to preempt when blocks run out."""
    def order(self, kv: KVCacheManager, step: int) -> None:
        """Re-sort before this step's admissions (only called when ``reorders``)."""
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[SimRequest]: ...
    def __getitem__(self, i: int) -> SimRequest:
        """The ``i``-th request in policy order (0: the next ``pop_request``)."""


class FCFSQueue(deque):
    """``fcfs``: a deque in arrival order (vLLM's ``FCFSRequestQueue``)."""

    reorders = False
    add_request = deque.append
    pop_request = deque.popleft
    prepend_request = deque.appendleft

    @classmethod
    def build(cls, cfg: SchedulerConfig) -> FCFSQueue:
        return cls()

    def peek_request(self) -> SimRequest:
        return self[0]

    @staticmethod
    def victim(running: list[SimRequest]) -> int:
        return len(running) - 1

    def order(self, kv: KVCacheManager, step: int) -> None:
        pass


def _priority_key(r: SimRequest) -> tuple[int, int, int]:
    # vLLM's Request.__lt__: priority, then arrival_time (the index breaks equal times:
    # it is the arrival order, as the oracle's arrival + index * 1e-6 is)
    return (r.priority, r.arrival_ns, r.index)


class PriorityQueue:
    """``priority``: a heap on (priority, arrival), lower first (vLLM's
    ``PriorityRequestQueue``); entries carry their key so the heap never compares
    requests."""

    reorders = False

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int, SimRequest]] = []

    @classmethod
    def build(cls, cfg: SchedulerConfig) -> PriorityQueue:
        return cls()

    def add_request(self, r: SimRequest) -> None:
        heapq.heappush(self._heap, (r.priority, r.arrival_ns, r.index, r))

    # no front in a heap: a preempted request goes back by its key
    prepend_request = add_request

    def pop_request(self) -> SimRequest:
        return heapq.heappop(self._heap)[3]

    def peek_request(self) -> SimRequest:
        return self._heap[0][3]

    @staticmethod
    def victim(running: list[SimRequest]) -> int:
        # max(running, key=(priority, arrival_time)); keys are unique (index)
        best = 0
        best_key = _priority_key(running[0])
        for k in range(1, len(running)):
            key = _priority_key(running[k])
            if key > best_key:
                best, best_key = k, key
        return best

    def order(self, kv: KVCacheManager, step: int) -> None:
        pass

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[SimRequest]:
        return iter([e[3] for e in sorted(self._heap)])

    def __getitem__(self, i: int) -> SimRequest:
        return self._heap[0][3] if i == 0 else sorted(self._heap)[i][3]


class LPMQueue(FCFSQueue):
    """``lpm``: FCFS storage, re-sorted by prefix hit before each step's admissions."""

    reorders = True

    def __init__(self, max_wait_steps: int | None = None, max_queue: int = 128) -> None:
        super().__init__()
        self.max_wait_steps = max_wait_steps
        self.max_queue = max_queue

    @classmethod
    def build(cls, cfg: SchedulerConfig) -> LPMQueue:
        return cls(cfg.lpm_max_wait_steps, cfg.lpm_max_queue)

    def order(self, kv: KVCacheManager, step: int) -> None:
        if len(self) < 2 or len(self) > self.max_queue:
            return
        bound = self.max_wait_steps
        keyed = []
        for r in self:
            if bound is not None and step - r.arrival_step >= bound:
                keyed.append(((0, 0, r.index), r))       # starving: first, by arrival
                continue
            c = r.cache
            hit = kv.get_computed_blocks(c).hit if c.num_computed_tokens == 0 else 0
            keyed.append(((1, -hit, r.index), r))
        keyed.sort(key=lambda e: e[0])
        self.clear()
        self.extend(e[1] for e in keyed)


#: scheduler.policy -> queue builder
QUEUE_POLICIES: dict[str, Callable[[SchedulerConfig], Any]] = {
    "fcfs": FCFSQueue.build,
    "priority": PriorityQueue.build,
    "lpm": LPMQueue.build,
}


def make_queue(cfg: SchedulerConfig) -> RequestQueue:
    """The waiting queue of ``cfg.policy`` (validated when the config was built)."""
    return QUEUE_POLICIES[cfg.policy](cfg)
