"""The step plan: what the engine hands a backend each step, as vLLM's scheduler hands
its model runner a ``SchedulerOutput`` (``vllm/v1/core/sched/output.py``).

Plain data: one ``StepItem`` per scheduled request, in a ``StepPlan`` refilled every step.
A backend reads it and answers the step's duration (``backends.base.StepBackend``); it never
imports the engine or the scheduler and never reads their state: everything it may know
about a step is here, draft acceptance included (decided once per step in ``sim/engine``
and handed over per item).  ``StepItem`` is the neutral entity both sides import (as
Vidur's ``Batch``): the scheduler's own item (``sim.engine.request.ScheduledItem``) is a
subclass that adds its handle on the request, so handing the plan over copies nothing.
``backends/base.py`` re-exports both classes for backend authors.

Compiled with the engine (``sim/native.py``): the scheduler's item inherits from
``StepItem``, and a compiled class can only inherit from a compiled one.  This module
imports nothing of the engine (a backend importing it loads no scheduler).
"""
from __future__ import annotations

from mypy_extensions import i64

from sim.cache.request import CacheRequest


class StepItem:
    """One request's share of a step.

    Set by the scheduler when it schedules the request: ``num_tokens``, ``context``,
    ``is_prefill``, ``spec_tokens``, ``new_hit``, ``padded``.  Set by the engine when it
    builds the plan (what the step will do to the sequence): ``accepted``, ``kept``,
    ``finishes``, ``first_prefill``.  ``request_id``, ``tokens`` and ``out_stream`` never
    change.  The object is reused step after step: read it during ``step_time``, do not keep
    it.
    """

    __slots__ = ("request_id", "tokens", "out_stream", "num_tokens", "context", "is_prefill",
                 "spec_tokens", "new_hit", "padded", "accepted", "kept", "finishes",
                 "first_prefill")

    def __init__(self, tokens: CacheRequest, out_stream: int, num_tokens: int = 0,
                 context: int = 0, is_prefill: bool = True, spec_tokens: int = 0,
                 new_hit: int = 0, padded: bool = False):
        self.request_id: str = tokens.request_id
        # the token view: the cache model's request (token runs, prompt length, tokens so
        # far, block tables through the cache manager); read-only to a backend
        self.tokens = tokens
        self.out_stream: i64 = out_stream       # stream of the request's output tokens
        self.num_tokens: i64 = num_tokens       # tokens computed this step (drafts included)
        self.context: i64 = context             # tokens already in the KV cache before this step
        self.is_prefill = is_prefill       # prompt tokens (a chunk) rather than a decode step
        self.spec_tokens: i64 = spec_tokens     # drafts scheduled for verification (decode)
        self.new_hit: i64 = new_hit             # prefix-cache hit found when first scheduled now
        self.padded = padded               # a new request padded to 1 + K with never-accepted
                                           # drafts (vLLM keeps the decode batch uniform)
        self.accepted: i64 = 0                  # drafts accepted this step (0: prefill, padded)
        self.kept: i64 = 0                      # tokens the sequence keeps: a whole prefill chunk;
                                           # of a decode step the last sampled token and the
                                           # accepted drafts, cut at the request's max_tokens
        self.finishes = False              # this step samples the request's last token
        self.first_prefill = False         # before the request's first token: a chunk of
                                           # its first prefill (or of its recompute after a
                                           # preemption then), or its padded last token


class StepPlan:
    """One engine step as a backend sees it (one object, refilled every step)."""

    __slots__ = ("items", "index", "start_ns", "finished")

    def __init__(self) -> None:
        self.items: list[StepItem] = []    # in scheduling order; empty: an idle retry
        self.index = 0                     # engine steps before this one (jumps counted)
        self.start_ns = 0                  # engine clock at the step's start (integer ns)
        # requests finished since the previous plan: a backend drops what it keeps for
        # them (vLLM's ``finished_req_ids``)
        self.finished: list[str] = []
