"""What watches the scheduler: one observer protocol, held as a list on the scheduler.

``Scheduler.observers`` (``SchedulerObserver``) hears a request's first admission lookup
(``on_lookup``), its first admission (``on_admit``) and each step as scheduled
(``on_step``); every call site tests the list first, so with no observer (``sim steps``
without ``--per-step``, a run with ``attribution: false``) a site costs one truth test.
Beside it, ``Scheduler.watchers`` (``QueueWatcher``: the waiting queue, ``sim explain``),
``Engine.observers`` (``EngineObserver``: each step's plan, each finished request) and the
block pool's observers (``sim/cache/observers.py``: KV events, the eviction log).

``SchedulerObserver`` is a plain (compiled) base class whose hooks do nothing, so the
compiled scheduler calls them through the class's method table; two observers live here:

* ``MissObserver``: miss attribution (``sim/cache/attribution.py``): a request's miss
  classes at its lookup (``SimRequest.miss``), its admitted keys at its admission;
* ``StepLog``: each step's decisions as ``sched_oracle.py`` reports them (``sim steps
  --per-step`` and the step tester).
"""
from __future__ import annotations

from typing import Any

from sim.cache.attribution import MissAttribution
from sim.cache.kv_manager import Lookup
from sim.engine.request import ScheduledItem, SimRequest


class SchedulerObserver:
    """What watches the scheduler (see the module docstring); every hook is a no-op."""

    def on_lookup(self, r: SimRequest, lookup: Lookup) -> None:
        """``r``'s first admission lookup found ``lookup`` (its allocation comes next; if
        that fails, the request is looked up again at a later step)."""

    def on_admit(self, r: SimRequest, end: int) -> None:
        """``r`` was admitted for the first time; its first step computes up to ``end``
        tokens (an asynchronous load from the CPU tier: up to the load's end)."""

    def on_step(self, now: int, items: list[ScheduledItem]) -> None:
        """``schedule(now)`` planned ``items`` (the scheduler's own list, refilled by the
        next step)."""


class MissObserver(SchedulerObserver):
    """Miss attribution (``sim/cache/attribution.py``) as a scheduler observer: each
    request split into miss classes at its first admission lookup, its prompt's keys
    pending from its admission."""

    def __init__(self, attr: MissAttribution):
        self.attr = attr

    def on_lookup(self, r: SimRequest, lookup: Lookup) -> None:
        r.miss = self.attr.classify(r.cache, lookup)

    def on_admit(self, r: SimRequest, end: int) -> None:
        self.attr.admit(r.cache, end)


class StepLog(SchedulerObserver):
    """Each step's decisions (``steps``, one record a step that scheduled something):
    tokens scheduled per request (drafts included), their total, and the drafts scheduled
    per request (a request without drafts left out, as vLLM leaves it out of
    ``scheduled_spec_decode_tokens``)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []

    def on_step(self, now: int, items: list[ScheduledItem]) -> None:
        if items:
            self.steps.append({"step": now,
                               "scheduled": {it.req.rid: it.num_tokens for it in items},
                               "num_scheduled_tokens": sum(it.num_tokens for it in items),
                               "spec_tokens": {it.req.rid: it.spec_tokens for it in items
                                               if it.spec_tokens}})


def miss_attribution(observers: list[SchedulerObserver]) -> MissAttribution | None:
    """The miss attribution among a scheduler's observers (None: attribution off)."""
    for o in observers:
        if isinstance(o, MissObserver):
            return o.attr
    return None
