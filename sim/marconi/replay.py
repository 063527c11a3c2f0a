"""``replay(requests, model, budget_bytes, variant, alpha=None)``: one trace through one of
the paper's caches, in arrival order, one request at a time, without timing -- the way
Marconi's own evaluation replays traces (its token hit rates are those of a cache-only
replay), so its comparisons can be rerun here in seconds.

Each request: look its prompt up (the hit), insert prompt + output, evict to the budget.
A hit is counted whole, up to the full prompt (interpretation: the paper's token hit rate is
tokens whose prefill is skipped over prompt tokens; it does not hold back the last token as
vLLM's scheduler does).

``rules`` (``sim.marconi.rules``) sets, one by one, the rules where Marconi's published code
reads the paper otherwise than this reference; ``rules.MARCONI_CODE`` sets them all to the
code's (see ``docs/marconi.md`` for the check against the code).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from math import inf
from typing import Any

from sim.errors import ConfigError
from sim.marconi.costs import CostModel, cost_model
from sim.marconi.eviction import FlopAware, LruLeaves
from sim.marconi.rules import DEFAULT, Rules
from sim.marconi.runs import Request, as_request
from sim.marconi.tree import RadixTree
from sim.marconi.tuning import ALPHA_GRID, best_alpha, window_scores
from sim.marconi.vllm_plus import BlockTree

#: the paper's three caches: vLLM+ (a state every block, LRU), SGLang+ (Marconi's admission,
#: LRU on leaves), Marconi (its admission and FLOP-aware eviction)
VARIANTS: tuple[str, ...] = ("vllm+", "sglang+", "marconi")


@dataclass(frozen=True)
class Result:
    """One replay.  Per request (in replay order): ``request_ids``, ``prompt_tokens``,
    ``hit_tokens``.  ``evictions``: nodes evicted (vLLM+: blocks); ``states_admitted``: SSM
    states the cache took in; ``alpha``: Marconi's alpha at the end (None for the others),
    ``alpha_tuned_after``: requests served when it was tuned (None: given, or never tuned),
    ``alpha_rates``: the bootstrap window's score per alpha tried (its token hit rate, or the
    FLOPs saved under ``tune_objective: flops``); ``rules``: the rules it ran under;
    ``first_eviction_request``: requests served when eviction first ran (None: never)."""

    variant: str
    model: str
    budget_bytes: int
    request_ids: tuple[str, ...]
    prompt_tokens: tuple[int, ...]
    hit_tokens: tuple[int, ...]
    evictions: int
    states_admitted: int
    bytes_held: int
    flops_saved: float
    flops_total: float
    alpha: float | None = None
    alpha_tuned_after: int | None = None
    alpha_rates: dict[float, float] = field(default_factory=dict, hash=False)
    rules: Rules = DEFAULT
    first_eviction_request: int | None = None

    @property
    def num_requests(self) -> int:
        return len(self.hit_tokens)

    @property
    def token_hit_rate(self) -> float:
        total = sum(self.prompt_tokens)
        return sum(self.hit_tokens) / total if total else 0.0

    @property
    def request_hit_rate(self) -> float:
        n = len(self.hit_tokens)
        return sum(1 for h in self.hit_tokens if h) / n if n else 0.0

    @property
    def flops_saved_fraction(self) -> float:
        return self.flops_saved / self.flops_total if self.flops_total else 0.0


def _check(variant: str, budget_bytes: Any, alpha: Any, block_size: Any,
           bootstrap_multiplier: Any, rules: Any) -> None:
    def is_int(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if variant not in VARIANTS:
        raise ConfigError("marconi.variant", f"must be one of {', '.join(VARIANTS)}, got {variant!r}")
    if not is_int(budget_bytes) or budget_bytes < 0:
        raise ConfigError("marconi.budget_bytes", f"must be an integer >= 0, got {budget_bytes!r}")
    if alpha is not None:
        if variant != "marconi":
            raise ConfigError("marconi.alpha", f"only the marconi variant has an alpha ({variant} given)")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha < inf:
            raise ConfigError("marconi.alpha", f"must be a number >= 0, got {alpha!r}")
    if not is_int(block_size) or block_size < 1:
        raise ConfigError("marconi.block_size", f"must be an integer >= 1, got {block_size!r}")
    if not is_int(bootstrap_multiplier) or bootstrap_multiplier < 1:
        raise ConfigError("marconi.bootstrap_multiplier",
                          f"must be an integer >= 1, got {bootstrap_multiplier!r}")
    if not isinstance(rules, Rules):
        raise ConfigError("marconi.rules", f"must be a sim.marconi.rules.Rules, got {rules!r}")


def replay(requests: Iterable[Any], model: CostModel | Any, budget_bytes: int, variant: str,
           alpha: float | None = None, *, block_size: int = 32, bootstrap_multiplier: int = 5,
           alpha_grid: Sequence[float] = ALPHA_GRID, rules: Rules = DEFAULT) -> Result:
    """Replay ``requests`` (``Request``, workload ``TraceRequest``, token-id lists or
    (prompt ids, output ids) pairs) through ``variant``'s cache of ``budget_bytes`` for
    ``model`` (a :class:`CostModel`, a catalogue ``ModelSpec`` or its name).

    ``alpha``: Marconi only; given, it is used throughout; None tunes it on the bootstrap
    window (``bootstrap_multiplier``, ``alpha_grid``; see ``sim.marconi.tuning``).
    ``block_size``: vLLM+ only (the paper's 32).  ``rules``: see ``sim.marconi.rules``."""
    _check(variant, budget_bytes, alpha, block_size, bootstrap_multiplier, rules)
    costs = cost_model(model)
    reqs = [as_request(x, k) for k, x in enumerate(requests)]
    cache: Any
    policy: FlopAware | None = None
    if variant == "vllm+":
        cache = BlockTree(costs, budget_bytes, block_size, rules)
    elif variant == "sglang+":
        cache = RadixTree(costs, budget_bytes, LruLeaves(), rules)
    else:
        policy = FlopAware(alpha or 0.0)
        cache = RadixTree(costs, budget_bytes, policy, rules)
    tune = policy is not None and alpha is None
    in_insert = tune and rules.tune_at == "last-insert"
    window: int | None = None
    tuned_after: int | None = None
    rates: dict[float, float] = {}
    hits: list[int] = []

    def tune_at(n: int, window_hits: list[int]) -> None:
        """Tune after ``n`` requests (the ``n``-th's hit known) if ``n`` closes the window."""
        nonlocal window, tuned_after, rates
        if window is None and cache.first_eviction_request is not None:
            window = bootstrap_multiplier * cache.first_eviction_request
        if window is not None and tuned_after is None and n == window:
            rates = window_scores(reqs[:window], costs, budget_bytes, alpha_grid, rules,
                                  window_hits)
            policy.alpha = best_alpha(rates)
            tuned_after = window

    for k, req in enumerate(reqs):
        if in_insert and tuned_after is None:
            hits.append(cache.serve(req, lambda: tune_at(k + 1, [*hits, cache.last_hit])))
            continue
        hits.append(cache.serve(req))
        if tune and not in_insert:
            tune_at(k + 1, hits)
    prompts = [r.prompt_tokens for r in reqs]
    return Result(
        variant=variant, model=costs.name, budget_bytes=budget_bytes,
        request_ids=tuple(r.request_id for r in reqs), prompt_tokens=tuple(prompts),
        hit_tokens=tuple(hits), evictions=cache.evictions,
        states_admitted=cache.states_admitted, bytes_held=cache.used,
        flops_saved=sum(costs.prefill_flops(0, h) for h in hits),
        flops_total=sum(costs.prefill_flops(0, n) for n in prompts),
        alpha=policy.alpha if policy is not None else None,
        alpha_tuned_after=tuned_after, alpha_rates=rates, rules=rules,
        first_eviction_request=cache.first_eviction_request)
