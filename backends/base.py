"""What a backend reads per step, what it must answer, and the backends by name.

The engine hands a backend a **step plan** (plain data: one ``StepItem`` per scheduled
request, as vLLM's ``SchedulerOutput`` hands the model runner) and gets the step's duration
back.  A backend never imports the engine or the scheduler and never reads their state:
everything it may know about a step is in the plan.  The plan's classes live with the
engine (``sim/engine/step_plan.py``, as vLLM keeps ``SchedulerOutput`` in
``v1/core/sched/output.py``: the scheduler's item extends ``StepItem``) and are re-exported
here for backend authors: ``from backends.base import StepItem, StepPlan``.

Backends by ``backend.kind`` (``BACKENDS``): each entry names the module whose
``build_backend(scenario, deployment, plant)`` makes it, imported only when that kind is
used (so torch is imported only by a torch run).
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Final, Protocol

from sim.engine.step_plan import StepItem, StepPlan
from sim.errors import ConfigError

__all__ = ["BACKENDS", "INSTALL", "FixedStep", "StepBackend", "StepItem", "StepPlan",
           "backend_factory", "build_backend"]


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
