"""What a backend reads per step, what it must answer, and the backends by name.

The engine hands a backend a **step plan** (plain data: one ``StepItem`` per scheduled
request, as vLLM's ``SchedulerOutput`` hands the model runner) and gets the step's duration
back.  A backend never imports the engine or the scheduler and never reads their state:
everything it may know about a step is here, draft acceptance included (decided once per
step in ``sim/engine`` and handed over per item).  ``StepItem`` is the neutral entity both
sides import (as Vidur's ``Batch``): the scheduler's own item is a subclass that adds its
handle on the request, so handing the plan over copies nothing.

Compiled with the hot path (``sim/native.py``): the scheduler's item inherits from
``StepItem``, and a compiled class can only inherit from a compiled one.

Backends by ``backend.kind`` (``BACKENDS``): each entry names the module whose
``build_backend(scenario, deployment, plant)`` makes it, imported only when that kind is
used (so torch is imported only by a torch run).
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Final, Protocol

from mypy_extensions import i64

from sim.cache.request import CacheRequest
from sim.errors import ConfigError


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


class StepBackend(Protocol):
    """What the engine asks of a backend."""

    @property
    def jumps(self) -> bool:
        """Whether a pure-decode stretch may be timed from batch sums
        (``time_from_sums``) and run as one jump instead of one plan per step."""
        ...

    def step_time(self, plan: StepPlan) -> float:
        """Seconds the step takes."""
        ...

    def time_from_sums(self, n: int, T: int, C: int, TC: int, TT: int) -> float:
        """Seconds of one pure-decode step of ``n`` items from integer sums
        (T = sum t, C = sum c, TC = sum t*c, TT = sum t*(t+1)); called only when
        ``jumps``, and must equal ``step_time`` of the same items."""
        ...


class FixedStep:
    """Every step lasts ``seconds`` (``sim steps``: one time unit per step; tests)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    @property
    def jumps(self) -> bool:
        return True

    def step_time(self, plan: StepPlan) -> float:
        return self.seconds

    def time_from_sums(self, n: int, T: int, C: int, TC: int, TT: int) -> float:
        return self.seconds


# ------------------------------------------------------------------- registry --
# backend.kind -> the module holding its ``build_backend(scenario, deployment, plant)``
BACKENDS: Final = {
    "analytical": "backends.analytical",
    "torch": "backends.torch_backend.backend",
}
# a backend's third-party import that may be missing -> how to install it
INSTALL: Final = {
    "torch": 'pip install -e ".[torch]" (on a machine without a GPU first: pip install torch '
             '--index-url https://download.pytorch.org/whl/cpu)',
}


def backend_factory(kind: str) -> Callable[..., Any]:
    """The builder of ``kind``; a ``ConfigError`` naming ``backend.kind`` when no backend
    has that name or what it needs is not installed."""
    module = BACKENDS.get(kind)
    if module is None:
        raise ConfigError("backend.kind", f"unknown backend {kind!r} "
                                          f"(available: {', '.join(BACKENDS)})")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        if missing not in INSTALL:
            raise
        raise ConfigError("backend.kind", f"{missing} is not installed: {INSTALL[missing]}"
                          ) from None
    build: Callable[..., Any] = mod.build_backend
    return build


def build_backend(scenario: Any, deployment: Any, plant: str | None = None) -> StepBackend:
    """The backend ``scenario.backend.kind`` names, over ``deployment``'s cache
    (``plant``: a deliberate fault for the torch backend's self-check, see its module)."""
    backend: StepBackend = backend_factory(scenario.backend.kind)(scenario, deployment, plant)
    return backend
