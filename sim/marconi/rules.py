"""Where Marconi's published code and this reference read the paper differently: :class:`Rules`.

At unbounded capacity the reference and Marconi's code (github.com/ruipeterpan/marconi,
``radix_cache_hybrid.py``, ``radix_cache_vllm.py``, ``config_tuner.py``, read for behaviour
only: it is non-commercially licensed and nothing of it is copied here) give the same hit on
every request.  Once eviction binds, a few rules differ.  Each is a setting; the default is
this reference's reading of the paper, ``MARCONI_CODE`` sets every one to the code's:

============================  =====================  ========================================
setting                       default (reference)    Marconi's code
============================  =====================  ========================================
``evict``                     ``after-insert``       ``before-insert``
``lru_refresh`` (SGLang+)     ``hit``                ``descended``
``merge_time``                ``child``              ``later``
``flops``                     ``catalogue``          ``marconi``
``efficiency_bytes``          ``edge``               ``prefix``
``tune_objective``            ``token-hit``          ``flops``
``tune_last``                 ``0`` (whole window)   ``500``
``tune_at``                   ``after-window``       ``last-insert``
``partial_block`` (vLLM+)     ``false``              ``true``
============================  =====================  ========================================

* ``evict``: ``after-insert`` inserts the finished request and then evicts to the budget, the
  request's own path protected (its nodes are in use, as SGLang locks a running request's
  nodes) and the bytes exact.  ``before-insert`` evicts first, nothing protected, the bytes to
  free estimated as the code does (radix tree: one state, two when the sequence leaves an edge
  in the middle, plus the KV of the tokens past the longest match; vLLM+: a state and the KV of
  a block for every block past the matched blocks *and the root*, so one block short), on the
  code's logical clock (one tick per lookup, insertion, pre-insertion match and eviction round;
  the pre-insertion match refreshes nodes as a lookup does).  Exact ties in the eviction
  score go, as in the code's FLOP-aware eviction, to the first candidate in depth-first order
  (children in the order they were first cached; the code's LRU pops a heap, whose order among
  equal times is its own); the default takes the first in the tree's slot order.
* ``lru_refresh`` (SGLang+): ``hit`` refreshes the nodes a hit reuses (every node of the
  matched path; an insertion refreshes its path).  ``descended`` also refreshes the node whose
  edge the match leaves in the middle, as the code refreshes every node its match descends into.
* ``merge_time``: when a node with one child is evicted, its edge joins the child's.  ``child``
  keeps the child's last access (the merged node holds the child's state); ``later`` takes the
  later of the two.
* ``flops``: the FLOPs a hit saves.  ``catalogue`` prices prefill from the model catalogue
  (``CostModel.prefill_flops``); ``marconi`` with the code's per-layer formulas
  (``sim.marconi.costs.LayerFlops``, integers; the model's width, state size and layer counts).
  Used for the FLOP efficiency of a node and for the ``flops`` tuning objective.
* ``efficiency_bytes``: the bytes a node's FLOP efficiency divides by.  ``edge``: its state and
  its edge's KV (what evicting it frees); ``prefix``: its state and the KV of its whole prefix
  (the code's denominator).  The numerator is the saving over the parent in both.
* ``tune_objective`` / ``tune_last``: each alpha of the grid replays the bootstrap window from
  an empty cache and is scored by ``token-hit`` (tokens hit over prompt tokens) or ``flops``
  (FLOPs saved, by ``flops``'s formulas) over the window's last ``tune_last`` requests (``0``:
  all of them).  Ties go to the smaller alpha in both (the code keeps whichever replay of its
  process pool finished first: not deterministic).
* ``tune_at``: ``after-window`` adopts the tuned alpha from the request after the window;
  ``last-insert`` adopts it for the eviction made while inserting the window's last request,
  as the code tunes inside that insertion.
* ``partial_block`` (vLLM+): ``false`` caches whole blocks only (vLLM hashes full blocks);
  ``true`` also caches a sequence's last, partial block (its KV and a state), which a later
  prompt containing all of it hits and a later sequence extending it fills, as the code does.

Not modelled, and documented in ``docs/marconi.md``: the code's FLOP-aware eviction counts, for
an evicted leaf, the KV bytes of the *last candidate scored* rather than of the leaf it evicts
(a defect: it frees more or fewer bytes than it counts); its match, after leaving an edge in
the middle, goes on matching the rest of the sequence against that edge's children (a match
that cannot recur when tokens are positions of streams, as in every trace here).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

from sim.errors import ConfigError

_CHOICES: dict[str, tuple[Any, ...]] = {
    "evict": ("after-insert", "before-insert"),
    "lru_refresh": ("hit", "descended"),
    "merge_time": ("child", "later"),
    "flops": ("catalogue", "marconi"),
    "efficiency_bytes": ("edge", "prefix"),
    "tune_objective": ("token-hit", "flops"),
    "tune_at": ("after-window", "last-insert"),
    "partial_block": (False, True),
}


@dataclass(frozen=True)
class Rules:
    """One value per rule (see the module docstring); the defaults are the reference's."""

    evict: str = "after-insert"
    lru_refresh: str = "hit"
    merge_time: str = "child"
    flops: str = "catalogue"
    efficiency_bytes: str = "edge"
    tune_objective: str = "token-hit"
    tune_last: int = 0
    tune_at: str = "after-window"
    partial_block: bool = False

    def __post_init__(self) -> None:
        for name, choices in _CHOICES.items():
            v = getattr(self, name)
            if isinstance(v, bool) is not isinstance(choices[0], bool) or v not in choices:
                shown = ", ".join(str(c).lower() for c in choices)
                raise ConfigError(f"marconi.rules.{name}", f"must be one of {shown}, got {v!r}")
        n = self.tune_last
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError("marconi.rules.tune_last", f"must be an integer >= 0, got {n!r}")

    @property
    def before_insert(self) -> bool:
        return self.evict == "before-insert"

    def changed(self) -> dict[str, Any]:
        """The rules set away from the default, by name (empty for the default)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) != f.default}

    def with_pairs(self, pairs: Iterable[str]) -> Rules:
        """These rules with ``name=value`` settings applied in order (the CLI's ``--rule``)."""
        kw: dict[str, Any] = {}
        names = {f.name for f in fields(self)}
        for pair in pairs:
            name, sep, text = pair.partition("=")
            name = name.strip().replace("-", "_")
            text = text.strip()
            if not sep or name not in names:
                raise ConfigError("marconi.rules", f"expected NAME=VALUE with NAME one of "
                                  f"{', '.join(sorted(names))}, got {pair!r}")
            if name == "tune_last":
                try:
                    kw[name] = int(text)
                except ValueError:
                    raise ConfigError("marconi.rules.tune_last",
                                      f"must be an integer >= 0, got {text!r}") from None
            elif name == "partial_block":
                kw[name] = {"true": True, "false": False}.get(text.lower(), text)
            else:
                kw[name] = text
        return replace(self, **kw)


DEFAULT = Rules()

#: every rule set to what Marconi's published code does
MARCONI_CODE = Rules(evict="before-insert", lru_refresh="descended", merge_time="later",
                     flops="marconi", efficiency_bytes="prefix", tune_objective="flops",
                     tune_last=500, tune_at="last-insert", partial_block=True)
