"""``cache.policy: marconi``: the admission and eviction of Marconi (Pan et al., "Marconi:
Prefix Caching for the Era of Hybrid LLMs", MLSys 2025) on vLLM 0.33.0's block pool and
align-mode grid.  Written from the paper (its public code is non-commercially licensed:
nothing of it is read or copied here); the paper's own token-level cache is
``sim/marconi`` (the reference), whose utility, costs and alpha tuning this file reuses, with
the reference's default rules (``sim.marconi.rules``; where Marconi's published code reads the
paper otherwise is listed in ``docs/marconi.md``).

Admission (paper section 4.1, "judicious admission"): a Mamba state is kept only

* at a branch point -- where a request leaves what the cache holds.  On the block grid
  that is vLLM's junction (``Lookup.junction``: where the prompt leaves the cached
  attention KV), floored to the align grid as vLLM's split stops the chunk there (exact
  with ``enable_mamba_shared_prefix_checkpoint``);
* at a sequence end -- the prompt's last block-aligned state (vLLM's replay boundaries:
  with EAGLE the block below the resend and the extension boundary, so up to two) and the
  finished sequence's: each state computed past the prompt (decode) replaces the one the
  request kept before it, so when it finishes only its last stays (``Admission.
  sequence_end``, ``MambaManager._keep_sequence_end``).

Every other state the align grid computes (chunk ends, decode block boundaries) is freed
uncached, as vLLM's ``prefix_cache_retention_interval: 0`` frees them: on the block grid
Marconi's branch-point and prompt-end admission *is* vLLM's sparse retention, and what
Marconi adds is the finished sequence's state (so the switch is not read: the policy runs
retention 0).  Attention KV is kept for every computed block, as in Marconi's tree.

Eviction (section 4.2, FLOP-aware): among the cached free blocks (attention and Mamba
alike; uncached free blocks are always reused first, as vLLM does) the one with the lowest
utility ``recency + alpha x FLOP efficiency`` goes first, both terms min-max normalised over
the candidates and the candidates scored again after each eviction, exactly as the
reference (``sim.marconi.eviction.FlopAware``, reused as is) scores tree nodes.  Where the
block grid forces a difference from the paper's token-level tree:

* the tree evicts nodes (a leaf with its edge's KV and state; a one-child node loses its
  state); the pool evicts blocks, one group's KV or state at a time, and knows no parent:
  a block is priced as the Marconi node of the longest cached prefix released with it --
  ``prefill_flops(0, L) / (kv_bytes(L) + state_bytes)`` (Eq. 1 with the root as parent).
  A request's free releases its whole chain at once, so the chain's attention blocks share
  one price and LRU's tail-first order among them (a tree evicts leaves first); a Mamba
  state freed on its own (a junction state, when the request moves past it) is priced at
  its own depth;
* recency is the release (or hit) order on a logical clock that ticks per block released,
  so ``alpha = 0`` is exactly vLLM's LRU queue;
* alpha (``marconi_alpha: auto``) is tuned as the paper does -- serve with alpha 0, replay a
  bootstrap window with every alpha of the paper's grid 0, 0.1 .. 2.0, adopt the best token
  hit rate (ties to the smaller) -- but the window is the first ``marconi_bootstrap_requests``
  requests the cache serves (the paper: 5-15x the requests before the first eviction), tuned
  once all of them have finished, and replayed through the reference token-level tree
  (``sim.marconi.tuning``) with the pool's bytes as its budget, not through the block pool.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sim.cache.kv_manager import KVCacheManager
from sim.cache.policies.base import CacheSwitches, PoolShape
from sim.cache.policies.vllm import VllmPolicy
from sim.cache.request import CacheRequest
from sim.cache.seams import Admission, EvictionOrder
from sim.cache.utility_pool import UtilityBlockPool
from sim.errors import ConfigError
from sim.marconi.costs import CostModel
from sim.marconi.eviction import FlopAware
from sim.marconi.runs import Request, split
from sim.marconi.tuning import ALPHA_GRID, best_alpha, window_hit_rates


@dataclass(frozen=True)
class MarconiOptions:
    """The ``marconi`` policy's own keys under ``cache:``."""

    marconi_alpha: float | str = "auto"     # auto (tuned on the bootstrap window) | a number >= 0
    marconi_bootstrap_requests: int = 500   # the bootstrap window: the first N requests served

    def validate(self, prefix: str) -> None:
        a = self.marconi_alpha
        if isinstance(a, str):
            if a != "auto":
                raise ConfigError(prefix + "marconi_alpha", f"must be auto or a number >= 0, "
                                                            f"got {a!r}")
        elif isinstance(a, bool) or not a >= 0 or a == float("inf"):
            raise ConfigError(prefix + "marconi_alpha", f"must be auto or a number >= 0, got {a!r}")
        n = self.marconi_bootstrap_requests
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(prefix + "marconi_bootstrap_requests",
                              f"must be an integer >= 1, got {n!r}")


class FlopAwareOrder(EvictionOrder):
    """Marconi's eviction order over the pool's cached free blocks (``UtilityBlockPool``).

    Per block id: its last release (``last``, the logical clock), its FLOP efficiency
    (``eff``) and whether it is a cached free block now (``free``); ``FlopAware.choose``
    reads ``last`` and ``eff`` as it reads the reference tree's slots."""

    def __init__(self, num_blocks: int, costs: CostModel, alpha: float = 0.0):
        self.rule = FlopAware(alpha)
        self.costs = costs
        self.last = np.zeros(num_blocks, dtype=np.float64)
        self.eff = np.zeros(num_blocks, dtype=np.float64)
        self.free = np.zeros(num_blocks, dtype=bool)
        self.clock = 0.0
        self._eff: dict[int, float] = {}

    def efficiency(self, tokens: int) -> float:
        """FLOPs a hit on the ``tokens``-token prefix saves per byte it holds (Eq. 1, the
        node's parent taken as the root: the grid has no tree)."""
        got = self._eff.get(tokens)
        if got is None:
            c = self.costs
            held = c.state_bytes + c.kv_bytes(tokens)
            got = self._eff[tokens] = c.prefill_flops(0, tokens) / held if held else 0.0
        return got

    def released(self, block_id: int, tokens: int) -> None:
        self.clock += 1.0
        self.last[block_id] = self.clock
        self.eff[block_id] = self.efficiency(tokens)
        self.free[block_id] = True

    def taken(self, block_id: int) -> None:
        self.free[block_id] = False

    def victims(self, k: int) -> list[int]:
        self.clock += 1.0
        idx = np.flatnonzero(self.free)
        if k > len(idx):
            raise AssertionError(f"{k} evictions asked, {len(idx)} cached free blocks known")
        if not self.rule.alpha:
            # recency alone: the oldest release first (what ``choose`` picks, k times)
            out = idx[np.argsort(self.last[idx], kind="stable")[:k]]
        else:
            picked = []
            for _ in range(k):
                j = self.rule.choose(self, idx, self.clock)
                picked.append(j)
                idx = np.delete(idx, int(np.searchsorted(idx, j)))
            out = np.asarray(picked, dtype=np.int64)
        self.free[out] = False
        return [int(b) for b in out]


class AlphaTuner:
    """Alpha from the bootstrap window (``sim.marconi.tuning``): the first ``size``
    requests the cache serves, replayed through the reference tree once all have finished."""

    def __init__(self, order: FlopAwareOrder, size: int, budget_bytes: int):
        self.order = order
        self.size = size
        self.budget_bytes = budget_bytes
        self.open = True                            # still collecting the window
        self.window: list[CacheRequest] = []
        self.seen: set[str] = set()
        self.pending: set[str] = set()             # window requests not finished yet
        self.rates: dict[float, float] = {}
        self.tuned = False

    def saw(self, req: CacheRequest) -> None:
        rid = req.request_id
        if rid in self.seen:
            return
        self.seen.add(rid)
        self.window.append(req)
        self.pending.add(rid)
        if len(self.window) >= self.size:
            self.open = False

    def finished(self, rid: str) -> None:
        if rid in self.pending:
            self.pending.discard(rid)
            if not self.open and not self.pending and not self.tuned:
                self.tune()

    def tune(self) -> None:
        reqs = []
        for r in self.window:
            runs = r.runs
            npt = r.num_prompt_tokens
            if npt >= r.num_tokens:
                reqs.append(Request(r.request_id, tuple(runs)))
            else:
                head, tail = split(runs, npt)
                reqs.append(Request(r.request_id, tuple(head), tuple(tail)))
        self.rates = window_hit_rates(reqs, self.order.costs, self.budget_bytes, ALPHA_GRID)
        self.order.rule.alpha = best_alpha(self.rates)
        self.tuned = True
        self.window = []


class MarconiAdmission(Admission):
    """Branch points (vLLM's junction) and sequence ends (the prompt's replay boundaries,
    the finished sequence's last state); feeds the alpha tuner its window."""

    sequence_end = True

    def __init__(self, tuner: AlphaTuner | None = None):
        self.tuner = tuner

    def boundaries(self, req: CacheRequest, num_tokens: int,
                   replay: tuple[int, ...]) -> tuple[int, ...]:
        t = self.tuner
        if t is not None and t.open:
            t.saw(req)
        if num_tokens > req.num_prompt_tokens:   # decode: the sequence's latest state
            return replay + (num_tokens,)
        return replay

    def finished(self, request_id: str) -> None:
        if self.tuner is not None:
            self.tuner.finished(request_id)


def cost_model(shape: PoolShape) -> tuple[CostModel, int]:
    """The model's costs and the pool's bytes.  Without a model (a hand-built shape) every
    token costs the same and a state weighs a block of KV."""
    if shape.costs is not None:
        kv, state, flops, attn = shape.costs
        costs = CostModel(kv_bytes_per_token=kv, state_bytes=state, flops_per_token=flops,
                          attn_flops_per_context_token=attn)
    else:
        costs = CostModel(kv_bytes_per_token=1, state_bytes=shape.block_size,
                          flops_per_token=1.0, attn_flops_per_context_token=0.0)
    block_bytes = shape.block_bytes or shape.block_size * max(costs.kv_bytes_per_token, 1)
    return costs, (shape.num_blocks - 1) * block_bytes


class MarconiPolicy:
    """Marconi's admission (branch points, sequence ends) and FLOP-aware eviction on
    vLLM's block pool (``cache.policy: marconi``)."""

    name = "marconi"
    options = MarconiOptions

    def build(self, switches: CacheSwitches, options: MarconiOptions,
              shape: PoolShape) -> KVCacheManager:
        cfg = VllmPolicy().cache_config(switches, shape)
        # Marconi's admission replaces vLLM's retention rule (see the module docstring)
        cfg = replace(cfg, prefix_cache_retention_interval=0)
        costs, budget = cost_model(shape)
        auto = options.marconi_alpha == "auto"
        order = FlopAwareOrder(shape.num_blocks, costs,
                               0.0 if auto else float(options.marconi_alpha))
        tuner = AlphaTuner(order, options.marconi_bootstrap_requests, budget) if auto else None

        def pool(num_blocks: int, hash_block_size: int, lookahead: int) -> Any:
            return UtilityBlockPool(num_blocks, hash_block_size, lookahead, order)

        return KVCacheManager(cfg, pool_factory=pool, admission=MarconiAdmission(tuner))
