"""hybrid-cache-sim: exact vLLM hybrid prefix caching, replayed over traces.

For notebooks: ``sim.run(scenario, set={...}, out=None)``, ``sim.load(run_dir)`` and
``sim.sweep(sweep_file, ...)`` (``sim/api.py``), imported on first use so that ``import
sim`` stays cheap."""
from sim import native as _native

_native.select()   # compiled hot path when its build matches the sources (sim/native.py)


def __getattr__(name: str):
    """The notebook API on first use (PEP 562): ``sim.run`` and ``sim.sweep`` are the
    modules, callable (``sim/run.py``, ``sim/sweep.py``); ``load`` and ``Run`` come from
    ``sim/api.py``."""
    import importlib   # (not ``from sim import api``: the mypyc build would follow it into
                       # pandas and every package it imports, minutes of type analysis)

    if name in ("run", "sweep"):
        return importlib.import_module(f"sim.{name}")
    if name in ("load", "Run"):
        return getattr(importlib.import_module("sim.api"), name)
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
