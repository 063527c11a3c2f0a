"""Marconi's own cache model, as the paper describes it (Pan et al., "Marconi: Prefix Caching
for the Era of Hybrid LLMs", MLSys 2025, arXiv 2411.19379): the reference for the ``marconi``
cache policy, replayed in arrival order without timing.

Written from the paper's description.  Marconi's public code is non-commercially licensed:
it was run and read for its behaviour only (to check this model against it), and nothing of it
is copied here.  Where the paper leaves a choice open, the module that makes it says so in its
docstring ("Interpretation"); where the code chose otherwise, ``rules`` offers its choice.

* ``runs`` -- token sequences as runs of a stream (exact at the token level, fast on
  hash-block traces), and the :class:`Request` a replay serves;
* ``costs`` -- :class:`CostModel`: KV bytes per token, state bytes, prefill FLOPs (from the
  model catalogue);
* ``tree`` -- the token-level radix tree with Marconi's admission (states at branch points and
  sequence ends only);
* ``eviction`` -- its two eviction rules: LRU on leaves ("SGLang+") and FLOP-aware utility;
* ``vllm_plus`` -- the "vLLM+" baseline: a state at every 32-token block, LRU;
* ``tuning`` -- alpha from a bootstrap window;
* ``rules`` -- :class:`Rules`: each rule where Marconi's published code reads the paper
  otherwise than this model, as a setting (default: this model's reading; ``MARCONI_CODE``:
  the code's; ``docs/marconi.md`` lists every departure and how parity was checked);
* ``replay`` -- :func:`replay` and its :class:`Result`.

Why here and not in ``sim/cache``: it is a model of another system, with its own replay loop
rather than a policy behind vLLM's block pool, and it prices models from ``sim/models``,
which ``sim/cache`` does not import.
"""
from __future__ import annotations

from sim.marconi.costs import CostModel
from sim.marconi.replay import VARIANTS, Result, replay
from sim.marconi.rules import MARCONI_CODE, Rules
from sim.marconi.runs import Request
from sim.marconi.tuning import ALPHA_GRID

__all__ = ["ALPHA_GRID", "CostModel", "MARCONI_CODE", "Request", "Result", "Rules", "VARIANTS",
           "replay"]
