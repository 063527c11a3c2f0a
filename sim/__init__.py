"""hybrid-cache-sim: exact vLLM hybrid prefix caching, replayed over traces.

For notebooks: ``sim.run(scenario, set={...}, out=None)``, ``sim.load(run_dir)`` and
``sim.sweep(sweep_file, ...)`` (``sim/entrypoints/api.py``), imported on first use so that
``import sim`` stays cheap.

The rooms: ``sim/cache`` and ``sim/engine`` (the compiled core: vLLM's v1/core and its
scheduler), ``sim/config`` (typed scenario sections), ``sim/models`` (shapes and pool
layout), ``sim/cluster`` (fleets and routers), ``sim/rundir`` (the run-folder contract),
``sim/commands`` (the work behind each command), ``sim/entrypoints`` (the CLI and the
notebook API)."""
from sim import native as _native

_native.select()   # compiled hot path when its build matches the sources (sim/native.py)

API = ("run", "sweep", "load", "Run")


def __getattr__(name: str):
    """The notebook API on first use (PEP 562), from ``sim/entrypoints/api.py``."""
    import importlib   # (not ``from sim.entrypoints import api``: the mypyc build would
                       # follow it into pandas and every package it imports)

    if name in API:
        return getattr(importlib.import_module("sim.entrypoints.api"), name)
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
