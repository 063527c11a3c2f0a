"""``lor``: Vidur's least-outstanding-requests global scheduler, as its code runs it.

Upstream: microsoft/vidur ``vidur/scheduler/global_scheduler/lor_global_scheduler.py``
(@ 7d475133, 2024-11-19).  Each request goes to the replica whose scheduler holds the
fewest pending requests -- ``num_pending_requests``, its request queue: routed and not yet
admitted to a batch, a preempted request put back counting again; running requests do not
count -- the lowest replica id on ties.  Vidur takes that count once per global schedule
and adds one locally per request routed; requests routed at one instant reach their
replica's queue at once here, which gives the same counts.  (So "least outstanding" is
really "shortest admission queue": an idle replica and one running a hundred requests with
an empty queue look alike.)
"""
from __future__ import annotations

from operator import attrgetter

from sim.cluster.routers.base import NoOptions, RouteRequest, Stateless, least

WAITING = attrgetter("waiting")   # (a view's load: no lambda called per replica)


class _Lor(Stateless):
    def __init__(self, views):
        self.views = views

    def choose(self, req: RouteRequest) -> int:
        return least(self.views, WAITING)


class LeastOutstandingRequests:
    name = "lor"
    options = NoOptions

    def build(self, options, seed, fleet):
        return _Lor(fleet.loads)
