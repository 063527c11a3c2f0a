"""What a KV-aware router counts of each worker's load itself, as Dynamo's KV router does
(``lib/llm/src/kv_router/sequence.rs``, ``scheduler.rs``; ai-dynamo/dynamo, July 2025
cost model, PRs #1731 and #1895):

* prefill tokens: each request routed to the worker and not yet past its first token
  counts the prompt tokens it had to compute (its prompt less the overlap the router
  saw when routing it); cleared once the request's first token is out;
* decode blocks: the distinct full prompt blocks of the worker's active requests (routed,
  not finished), output tokens not counted (Dynamo's default).

``cost`` combines them as Dynamo's scheduler does: ``overlap_score_weight x prefill tokens
/ block size + decode blocks``, the candidate request included.
"""
from __future__ import annotations

from typing import Any


class LoadBook:
    def __init__(self, replicas: int):
        self.pending: list[list[tuple[Any, int]]] = [[] for _ in range(replicas)]
        self.prefill = [0] * replicas
        self.active: list[dict[int, int]] = [{} for _ in range(replicas)]
        self.holders: dict[int, set[int]] = {}        # block key -> replicas holding it active
        self.blocks_of: dict[int, list[int]] = {}     # request index -> its block keys

    def refresh(self) -> None:
        """Clear the prefill tokens of every request now past its first token."""
        for i, pend in enumerate(self.pending):
            if not pend:
                continue
            keep = [(r, n) for r, n in pend if r.first_token_ns < 0]
            if len(keep) != len(pend):
                self.prefill[i] = sum(n for _, n in keep)
                self.pending[i] = keep

    def add(self, i: int, index: int, sim_req: Any, prefill: int, blocks: list[int]) -> None:
        self.pending[i].append((sim_req, prefill))
        self.prefill[i] += prefill
        act = self.active[i]
        for k in blocks:
            n = act.get(k, 0)
            if not n:
                self.holders.setdefault(k, set()).add(i)
            act[k] = n + 1
        self.blocks_of[index] = blocks

    def finish(self, i: int, index: int) -> None:
        act = self.active[i]
        for k in self.blocks_of.pop(index, ()):
            n = act[k] - 1
            if n:
                act[k] = n
            else:
                del act[k]
                h = self.holders[k]
                h.discard(i)
                if not h:
                    del self.holders[k]

    def decode_blocks(self, i: int, blocks: list[int]) -> int:
        """Distinct active blocks of worker ``i`` with ``blocks`` added."""
        act = self.active[i]
        return len(act) + sum(1 for k in set(blocks) if k not in act)

    def decode_all(self, blocks: list[int]) -> list[int]:
        """``decode_blocks`` of every worker at once (one pass over the new blocks)."""
        new = set(blocks)
        out = [len(a) + len(new) for a in self.active]
        holders = self.holders
        for k in new:
            h = holders.get(k)
            if h:
                for i in h:
                    out[i] -= 1
        return out

    def cost(self, i: int, prompt_tokens: int, overlap_tokens: int, blocks: list[int],
             block_size: int, weight: float) -> float:
        prefill = self.prefill[i] + prompt_tokens - overlap_tokens
        return weight * prefill / block_size + self.decode_blocks(i, blocks)

    def costs(self, prompt_tokens: int, overlaps: list[float], blocks: list[int],
              block_size: int, weight: float) -> list[float]:
        """``cost`` of every worker (``overlaps``: tokens each holds)."""
        dec = self.decode_all(blocks)
        pre = self.prefill
        return [weight * (pre[i] + prompt_tokens - overlaps[i]) / block_size + dec[i]
                for i in range(len(dec))]


def pick_by_cost(costs: list[float], sizes: list[int], temperature: float, rng) -> int:
    """Dynamo's selection: at temperature 0 the least cost, ties to the smallest index
    tree, then uniformly at random; above 0 a draw with probability proportional to
    ``exp(-(cost - min) / ((max - min) x temperature))`` (uniform when all are equal)."""
    import math

    lo = min(costs)
    if temperature <= 0:
        tied = [i for i, c in enumerate(costs) if c == lo]
        if len(tied) > 1:
            small = min(sizes[i] for i in tied)
            tied = [i for i in tied if sizes[i] == small]
        return tied[0] if len(tied) == 1 else tied[rng.randrange(len(tied))]
    hi = max(costs)
    if hi == lo:
        return rng.randrange(len(costs))
    w = [math.exp(-(c - lo) / ((hi - lo) * temperature)) for c in costs]
    x = rng.random() * sum(w)
    for i, wi in enumerate(w):
        x -= wi
        if x < 0:
            return i
    return len(w) - 1
