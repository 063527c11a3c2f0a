"""What a KV-aware router counts of each worker's load itself, as Dynamo's KV router does
(``ActiveSequences`` in ``lib/llm/src/kv_router/sequence.rs``, its cost in ``scheduler.rs``;
ai-dynamo/dynamo, July 2025 cost model, PRs #1731 and #1895):

* prefill tokens: each request routed to the worker and not yet past its first token
  counts the prompt tokens it had to compute (its prompt less the overlap the router
  saw when routing it); cleared once the request's first token is out;
* decode blocks: the distinct full prompt blocks of the worker's active requests (routed,
  not finished), output tokens not counted (Dynamo's default).

``costs`` combines them as Dynamo's scheduler does: ``overlap_score_weight x prefill
tokens / block size + decode blocks``, the candidate request included.

The router asks this on every arrival, of every worker: the counts live in machine
integers (a ``KeyMap`` of block key -> active requests per worker, vecs of prefill
tokens), so the compiled build answers in a few instructions a worker and block.

A request's ``blocks`` are its prompt's block keys, which repeat no key: each key chains
the whole prefix before it (``PrefixKeys``), as Dynamo's sequence hashes do, so two
positions of one prompt never share one.  No request's blocks are deduplicated here.
"""
from __future__ import annotations

from typing import Final

from librt.vecs import append, vec
from mypy_extensions import i64

from sim.cache.key_map import KeyMap
from sim.engine.request import SimRequest

MASK_WORKERS: Final = 62      # workers a holder mask has bits for (a positive i64)


def _with_new(active: KeyMap, distinct: vec[i64]) -> i64:
    """Distinct keys ``active`` holds once ``distinct`` (no repeats) is added."""
    n = active.size
    for k in distinct:
        if active.only(k) < 0:
            n += 1
    return n


def least(costs: vec[float]) -> list[int]:
    """The workers of least cost, in order."""
    lo = costs[0]
    for c in costs:
        if c < lo:
            lo = c
    out: list[int] = []
    for i in range(len(costs)):
        if costs[i] == lo:
            out.append(i)
    return out


class ActiveSequences:
    """Per worker: the prefill tokens of its requests not past their first token, and
    the active requests holding each of its prompt blocks."""

    def __init__(self, workers: int) -> None:
        self.workers: i64 = workers
        self.prefill = vec[i64]()
        self.pending: list[list[SimRequest]] = []     # routed, first token not out yet
        self.pending_tokens: list[vec[i64]] = []      # ... the prefill tokens of each
        self.active: list[KeyMap] = []                # block key -> active requests
        for _ in range(workers):
            self.prefill = append(self.prefill, 0)
            self.pending.append([])
            self.pending_tokens.append(vec[i64]())
            self.active.append(KeyMap(64))
        self.blocks_of: dict[int, vec[i64]] = {}      # request index -> its block keys
        # block key -> the workers holding it active, one bit each (up to MASK_WORKERS
        # workers; more are asked one by one)
        self.masked = workers <= MASK_WORKERS
        self.holders = KeyMap(256)
        # (what decode_all and costs answer: the book's own vecs, rewritten by the next
        # call -- no vec grown a worker at a time on every arrival)
        self.counts = vec[i64]([0] * workers)
        self.cost_out = vec[float]([0.0] * workers)

    def refresh(self) -> None:
        """Clear the prefill tokens of every request now past its first token."""
        for i in range(self.workers):
            reqs = self.pending[i]
            n = len(reqs)
            if n == 0:
                continue
            out = False
            for r in reqs:
                if r.first_token_ns >= 0:
                    out = True
                    break
            if not out:
                continue
            toks = self.pending_tokens[i]
            keep: list[SimRequest] = []
            keep_tokens = vec[i64]()
            total: i64 = 0
            for j in range(n):
                r = reqs[j]
                if r.first_token_ns < 0:
                    keep.append(r)
                    keep_tokens = append(keep_tokens, toks[j])
                    total += toks[j]
            self.prefill[i] = total
            self.pending[i] = keep
            self.pending_tokens[i] = keep_tokens

    def _bit(self, i: i64) -> i64:
        """Worker ``i``'s bit in a holder mask (0: the masks are not kept)."""
        return 1 << i if self.masked else 0

    def add(self, i: i64, index: int, sim_req: SimRequest, prefill: i64,
            blocks: vec[i64]) -> None:
        """Request ``index`` (``sim_req``) was placed on worker ``i``."""
        self.pending[i].append(sim_req)
        self.pending_tokens[i] = append(self.pending_tokens[i], prefill)
        self.prefill[i] += prefill
        act = self.active[i]
        holders = self.holders
        bit = self._bit(i)
        for k in blocks:
            # (one probe each: the worker's count of active requests holding k, and, when
            # it starts holding k, its bit added to k's holder mask -- a bit not set yet,
            # so the sum is the union)
            if act.bump(k, 1) == 1 and bit:
                holders.bump(k, bit)
        self.blocks_of[index] = blocks

    def finish(self, i: i64, index: int) -> None:
        """Request ``index`` finished on worker ``i``: its blocks are no longer active."""
        blocks = self.blocks_of.get(index)
        if blocks is None:
            return
        del self.blocks_of[index]
        bit = self._bit(i)
        holders = self.holders
        act = self.active[i]
        for k in blocks:
            # (KeyError for a block the worker does not hold; at 0 the key is dropped,
            # and the worker's bit, set, taken out of the mask)
            if act.bump(k, -1) == 0 and bit:
                holders.bump(k, -bit)

    def decode_blocks(self, i: i64, blocks: vec[i64]) -> i64:
        """Distinct active blocks of worker ``i`` with ``blocks`` (a prompt's: no
        repeats) added."""
        return _with_new(self.active[i], blocks)

    def decode_all(self, new: vec[i64]) -> vec[i64]:
        """``decode_blocks`` of every worker with the prompt's blocks ``new`` added, in
        the book's own vec (rewritten by the next call)."""
        counts = self.counts
        n_new: i64 = len(new)
        if self.masked:
            for i in range(self.workers):
                counts[i] = self.active[i].size + n_new
            # (a prompt's blocks held by one set of workers come in runs -- a prefix's
            # deeper blocks are held by fewer -- so a mask's bits are walked once a run)
            holders = self.holders
            run_mask: i64 = 0
            run: i64 = 0
            for k in new:
                m = holders.only(k)
                if m < 0:
                    m = 0
                if m != run_mask:
                    self._held(counts, run_mask, run)
                    run_mask = m
                    run = 0
                run += 1
            self._held(counts, run_mask, run)
            return counts
        for i in range(self.workers):
            counts[i] = _with_new(self.active[i], new)
        return counts

    def _held(self, counts: vec[i64], mask: i64, n: i64) -> None:
        """``n`` new blocks are already held by the workers of ``mask``."""
        if mask > 0 and n > 0:
            for i in range(self.workers):
                if (mask >> i) & 1:
                    counts[i] -= n

    def cost(self, i: i64, prompt_tokens: i64, overlap_tokens: float, blocks: vec[i64],
             block_size: i64, weight: float) -> float:
        """Dynamo's cost of sending the request to worker ``i``, which holds
        ``overlap_tokens`` of its prompt."""
        prefill = float(self.prefill[i] + prompt_tokens) - overlap_tokens
        return weight * prefill / float(block_size) + float(self.decode_blocks(i, blocks))

    def costs(self, prompt_tokens: i64, overlaps: vec[i64], blocks: vec[i64],
              block_size: i64, weight: float) -> vec[float]:
        """``cost`` of every worker (``overlaps``: the whole blocks of the prompt each
        holds), in the book's own vec (no float object a worker; rewritten by the next
        call)."""
        dec = self.decode_all(blocks)
        pre = self.prefill
        out = self.cost_out
        for i in range(self.workers):
            p: i64 = pre[i] + prompt_tokens - overlaps[i] * block_size
            out[i] = weight * float(p) / float(block_size) + float(dec[i])
        return out
